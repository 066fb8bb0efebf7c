"""The small convnet of the TensorFlow distributed-training tutorial.

conv1 3x3x32 + ReLU -> max-pool 2x2 -> flatten -> logits. Padding is VALID, as
in the tutorial's Keras defaults: 28x28x1 -> 26x26 -> 13x13, 32x32x3 -> 30x30 -> 15x15.
"""
import tensorflow as tf

from towers.models import layers
from towers.models.errors import ModelError, check_inputs

# Smallest side that survives a 3x3 VALID conv and then a 2x2 VALID pool.
_MIN_SIDE = 4


def inference(images, training, num_classes):
    """Builds the network on `images` in the current variable scope.

    Args:
        images: [batch, H, W, C] float32, H, W, C static and H, W >= 4.
        training: Python bool; unused (no dropout or batch norm), kept for the
            common model_fn signature.
        num_classes: number of logits.

    Returns:
        [batch, num_classes] float32 logits. Variables: conv1/{weights,biases},
        logits/{weights,biases}.
    """
    del training
    net = layers.conv2d(images, 32, 3, padding='VALID', activation=tf.nn.relu, name='conv1')
    net = layers.max_pool(net, 2, 2, padding='VALID', name='pool1')
    return layers.dense(net, num_classes, name='logits')


def build(input_shape, num_classes):
    """Returns model_fn(images, training) -> logits.

    Args:
        input_shape: (H, W, C) positive ints with H, W >= 4.
        num_classes: positive int.

    Raises:
        ModelError: images too small.
    """
    height, width, _ = input_shape
    if min(height, width) < _MIN_SIDE:
        raise ModelError(f'small_convnet needs images at least {_MIN_SIDE}x{_MIN_SIDE}, '
                         f'got input_shape {tuple(input_shape)}')

    def model_fn(images, training):
        images = check_inputs(images, training, input_shape, 'small_convnet')
        return inference(images, training, num_classes)

    return model_fn
