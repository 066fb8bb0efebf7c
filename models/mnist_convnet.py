"""The convnet of the classic TensorFlow "Deep MNIST for Experts" tutorial.

conv1 5x5x32 -> pool 2x2 -> conv2 5x5x64 -> pool 2x2 -> fc1 1024 -> dropout -> fc2.
For 28x28x1 and 10 classes it has 3,274,634 trainable parameters.
"""
import tensorflow as tf

from towers.models import layers
from towers.models.errors import ModelError, check_inputs

tf1 = tf.compat.v1

# The tutorial's initializers: a small positive bias keeps ReLUs alive at the start.
_WEIGHTS = dict(kernel_initializer=tf1.truncated_normal_initializer(stddev=0.1),
                bias_initializer=tf1.constant_initializer(0.1))


def inference(images, training, num_classes, dropout_rate=0.5):
    """Builds the network on `images` in the current variable scope.

    Args:
        images: [batch, H, W, C] float32, H, W and C static; batch may be dynamic.
        training: Python bool; dropout is applied only when True.
        num_classes: number of logits.
        dropout_rate: fraction of fc1 units dropped in training.

    Returns:
        [batch, num_classes] float32 logits. Variables: conv1/{weights,biases},
        conv2/..., fc1/..., fc2/... .
    """
    net = layers.conv2d(images, 32, 5, name='conv1', **_WEIGHTS)
    net = layers.max_pool(net, 2, 2, name='pool1')
    net = layers.conv2d(net, 64, 5, name='conv2', **_WEIGHTS)
    net = layers.max_pool(net, 2, 2, name='pool2')
    net = layers.dense(net, 1024, activation=tf.nn.relu, name='fc1', **_WEIGHTS)
    net = layers.dropout(net, dropout_rate, training)
    return layers.dense(net, num_classes, name='fc2', **_WEIGHTS)


def build(input_shape, num_classes, dropout_rate=0.5):
    """Returns model_fn(images, training) -> logits for any (H, W, C) input.

    Args:
        input_shape: (H, W, C) positive ints.
        num_classes: positive int.
        dropout_rate: fraction of fc1 units dropped in training, in [0, 1).

    Raises:
        ModelError: dropout_rate out of range.
    """
    if isinstance(dropout_rate, bool) or not isinstance(dropout_rate, (int, float)) \
            or not 0 <= dropout_rate < 1:
        raise ModelError(f'mnist_convnet: dropout_rate must be a number in [0, 1), '
                         f'got {dropout_rate!r}')

    def model_fn(images, training):
        images = check_inputs(images, training, input_shape, 'mnist_convnet')
        return inference(images, training, num_classes, dropout_rate)

    return model_fn
