"""The convnet of the classic TensorFlow CIFAR-10 tutorial (cifar10.py `inference`).

conv1 -> pool1 -> norm1 -> conv2 -> norm2 -> pool2 -> local3 -> local4 -> softmax_linear,
with the tutorial's scope names and initializers. The tutorial also adds L2 weight
decay (0.004) on local3/local4 inside `inference`; that is left out here on
purpose, because weight decay belongs to the trainer, which will add it for every
model alike.
"""
import tensorflow as tf

from towers.models import layers
from towers.models.errors import ModelError, check_inputs

tf1 = tf.compat.v1


def _init(stddev, bias):
    return dict(kernel_initializer=tf1.truncated_normal_initializer(stddev=stddev),
                bias_initializer=tf1.constant_initializer(bias))


def _norm(x, name):
    return layers.local_response_norm(x, depth_radius=4, bias=1.0, alpha=0.001 / 9.0,
                                      beta=0.75, name=name)


def inference(images, training, num_classes):
    """Builds the network on `images` in the current variable scope.

    Args:
        images: [batch, H, W, 3] float32 (32x32 full images or 24x24 crops); batch
            may be dynamic.
        training: Python bool; unused (no dropout or batch norm), kept for the
            common model_fn signature.
        num_classes: number of logits.

    Returns:
        [batch, num_classes] float32 logits. Variables: {conv1, conv2, local3,
        local4, softmax_linear}/{weights, biases}.
    """
    del training
    net = layers.conv2d(images, 64, 5, name='conv1', **_init(5e-2, 0.0))
    net = layers.max_pool(net, 3, 2, name='pool1')
    net = _norm(net, 'norm1')
    net = layers.conv2d(net, 64, 5, name='conv2', **_init(5e-2, 0.1))
    # The tutorial normalises before pooling here, the other way round from layer 1.
    net = _norm(net, 'norm2')
    net = layers.max_pool(net, 3, 2, name='pool2')
    net = layers.dense(net, 384, activation=tf.nn.relu, name='local3', **_init(0.04, 0.1))
    net = layers.dense(net, 192, activation=tf.nn.relu, name='local4', **_init(0.04, 0.1))
    return layers.dense(net, num_classes, name='softmax_linear', **_init(1 / 192.0, 0.0))


def build(input_shape, num_classes):
    """Returns model_fn(images, training) -> logits.

    Args:
        input_shape: (H, W, 3); the tutorial uses 32x32x3 or 24x24x3 crops.
        num_classes: positive int.

    Raises:
        ModelError: not a 3-channel image.
    """
    if input_shape[2] != 3:
        raise ModelError(f'cifar_convnet takes RGB images (H, W, 3), got input_shape '
                         f'{tuple(input_shape)}; use mnist_convnet or small_convnet '
                         'for other inputs')

    def model_fn(images, training):
        images = check_inputs(images, training, input_shape, 'cifar_convnet')
        return inference(images, training, num_classes)

    return model_fn
