"""AlexNet (Krizhevsky et al. 2012) in tf_cnn_benchmarks' single-tower form.

conv 11x11/4 (64, VALID), max-pool 3x3/2, conv 5x5 (192), max-pool, conv 3x3 (384, 384,
256), max-pool, two fully connected layers of 4096 with dropout, the logits. Its VALID first
convolution wants 227x227 images (tf_cnn_benchmarks pads 224 by 3), which leave a 6x6x256
map: 62,378,344 parameters at 1000 classes.
"""
import tensorflow as tf

from towers.models import layers
from towers.models.errors import ModelError, check_inputs


def inference(images, training, num_classes, dropout_rate=0.5):
    net = layers.conv2d(images, 64, 11, strides=4, padding='VALID', name='conv1')
    net = layers.max_pool(net, 3, 2, padding='VALID', name='pool1')
    net = layers.conv2d(net, 192, 5, name='conv2')
    net = layers.max_pool(net, 3, 2, padding='VALID', name='pool2')
    net = layers.conv2d(net, 384, 3, name='conv3')
    net = layers.conv2d(net, 384, 3, name='conv4')
    net = layers.conv2d(net, 256, 3, name='conv5')
    net = layers.max_pool(net, 3, 2, padding='VALID', name='pool5')
    for fc in (6, 7):
        net = layers.dense(net, 4096, activation=tf.nn.relu, name='fc%d' % fc)
        net = layers.dropout(net, dropout_rate, training)
    return layers.dense(net, num_classes, name='logits')


def build(input_shape, num_classes, dropout_rate=0.5):
    """AlexNet: model_fn(images, training) -> logits; needs an image at least 67x67."""
    if min(input_shape[:2]) < 67:  # what survives the 11x11/4 conv and three 3x3/2 pools
        raise ModelError(f'alexnet needs images at least 67x67, got input_shape '
                         f'{tuple(input_shape)}')

    def model_fn(images, training):
        images = check_inputs(images, training, input_shape, 'alexnet')
        return inference(images, training, num_classes, dropout_rate)
    return model_fn
