"""VGG-16 (Simonyan and Zisserman 2014, configuration D), as tf_cnn_benchmarks builds it.

Five blocks of 3x3 convolutions with biases and ReLUs (2, 2, 3, 3, 3 of them; 64, 128, 256,
512, 512 filters), each block ending in a 2x2 max-pool, then two fully connected layers of
4096 with dropout and the logits: 138,357,544 parameters at 224x224 and 1000 classes, the
same as keras.applications.VGG16.
"""
import tensorflow as tf

from towers.models import layers
from towers.models.errors import ModelError, check_inputs

BLOCKS = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


def inference(images, training, num_classes, dropout_rate=0.5):
    net = images
    for block, (filters, count) in enumerate(BLOCKS, start=1):
        for conv in range(1, count + 1):
            net = layers.conv2d(net, filters, 3, name='conv%d_%d' % (block, conv))
        net = layers.max_pool(net, 2, 2, padding='VALID', name='pool%d' % block)
    for fc in (6, 7):
        net = layers.dense(net, 4096, activation=tf.nn.relu, name='fc%d' % fc)
        net = layers.dropout(net, dropout_rate, training)
    return layers.dense(net, num_classes, name='logits')


def build(input_shape, num_classes, dropout_rate=0.5):
    """VGG-16: model_fn(images, training) -> logits; needs an image at least 32x32."""
    if min(input_shape[:2]) < 32:
        raise ModelError(f'vgg16 halves the image five times: input_shape must be at least '
                         f'32x32, got {tuple(input_shape)}')

    def model_fn(images, training):
        images = check_inputs(images, training, input_shape, 'vgg16')
        return inference(images, training, num_classes, dropout_rate)
    return model_fn
