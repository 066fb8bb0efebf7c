"""Inception v3 (Szegedy et al. 2016, "Rethinking the Inception Architecture"), as
keras.applications.InceptionV3 builds it, for 299x299 images.

Every convolution is conv (no bias) + batch norm without a scale + ReLU (Keras'
conv2d_bn). The stem: 3x3/2 (32, VALID), 3x3 (32, VALID), 3x3 (64), max-pool 3x3/2, 1x1
(80, VALID), 3x3 (192, VALID), max-pool 3x3/2. Then the modules mixed0..mixed10: three
35x35 modules (1x1, 5x5 and double-3x3 branches and an average-pool branch), a grid
reduction, four 17x17 modules with factorised 7x7 (1x7 and 7x1) branches, a second
reduction, and two 8x8 modules whose 3x3 branches split into 1x3 and 3x1. Global average
pooling and the logits: 23,817,352 trainable parameters at 1000 classes, Keras' count less
its batch norms' moving statistics. No auxiliary classifier (Keras has none either).
"""
import tensorflow as tf

from towers.models import layers
from towers.models.errors import ModelError, check_inputs

tf1 = tf.compat.v1


class _Builder:
    """conv2d_bn with numbered scopes, as Keras names its layers (conv2d_1, ...)."""

    def __init__(self, training):
        self.training, self.count = training, 0

    def conv(self, x, filters, kernel, strides=1, padding='SAME'):
        self.count += 1
        with tf1.variable_scope('conv%d' % self.count):
            x = layers.conv2d(x, filters, kernel, strides=strides, padding=padding,
                              activation=None, use_bias=False)
            return tf.nn.relu(layers.batch_norm(x, self.training, epsilon=1e-3, scale=False))


def _pool_branch(b, x, filters):
    return b.conv(layers.avg_pool(x, 3, 1, padding='SAME'), filters, 1)


def _module_35(b, x, pool_filters):
    branch1x1 = b.conv(x, 64, 1)
    branch5x5 = b.conv(b.conv(x, 48, 1), 64, 5)
    branch3x3dbl = b.conv(b.conv(b.conv(x, 64, 1), 96, 3), 96, 3)
    return layers.concat_channels([branch1x1, branch5x5, branch3x3dbl,
                                   _pool_branch(b, x, pool_filters)])


def _reduction_35(b, x):
    branch3x3 = b.conv(x, 384, 3, strides=2, padding='VALID')
    branch3x3dbl = b.conv(b.conv(b.conv(x, 64, 1), 96, 3), 96, 3, strides=2, padding='VALID')
    pool = layers.max_pool(x, 3, 2, padding='VALID')
    return layers.concat_channels([branch3x3, branch3x3dbl, pool])


def _module_17(b, x, width):
    branch1x1 = b.conv(x, 192, 1)
    branch7x7 = b.conv(b.conv(b.conv(x, width, 1), width, (1, 7)), 192, (7, 1))
    branch7x7dbl = b.conv(x, width, 1)
    for kernel, filters in (((7, 1), width), ((1, 7), width), ((7, 1), width),
                            ((1, 7), 192)):
        branch7x7dbl = b.conv(branch7x7dbl, filters, kernel)
    return layers.concat_channels([branch1x1, branch7x7, branch7x7dbl,
                                   _pool_branch(b, x, 192)])


def _reduction_17(b, x):
    branch3x3 = b.conv(b.conv(x, 192, 1), 320, 3, strides=2, padding='VALID')
    branch7x7x3 = b.conv(b.conv(b.conv(x, 192, 1), 192, (1, 7)), 192, (7, 1))
    branch7x7x3 = b.conv(branch7x7x3, 192, 3, strides=2, padding='VALID')
    pool = layers.max_pool(x, 3, 2, padding='VALID')
    return layers.concat_channels([branch3x3, branch7x7x3, pool])


def _module_8(b, x):
    branch1x1 = b.conv(x, 320, 1)
    branch3x3 = b.conv(x, 384, 1)
    branch3x3 = layers.concat_channels([b.conv(branch3x3, 384, (1, 3)),
                                        b.conv(branch3x3, 384, (3, 1))])
    branch3x3dbl = b.conv(b.conv(x, 448, 1), 384, 3)
    branch3x3dbl = layers.concat_channels([b.conv(branch3x3dbl, 384, (1, 3)),
                                           b.conv(branch3x3dbl, 384, (3, 1))])
    return layers.concat_channels([branch1x1, branch3x3, branch3x3dbl,
                                   _pool_branch(b, x, 192)])


def inference(images, training, num_classes):
    """Inception v3 on `images` [batch, H, W, 3]: logits [batch, num_classes]."""
    b = _Builder(training)
    net = b.conv(images, 32, 3, strides=2, padding='VALID')
    net = b.conv(net, 32, 3, padding='VALID')
    net = b.conv(net, 64, 3)
    net = layers.max_pool(net, 3, 2, padding='VALID')
    net = b.conv(net, 80, 1, padding='VALID')
    net = b.conv(net, 192, 3, padding='VALID')
    net = layers.max_pool(net, 3, 2, padding='VALID')
    for index, pool_filters in enumerate((32, 64, 64)):
        with tf1.variable_scope('mixed%d' % index):
            net = _module_35(b, net, pool_filters)
    with tf1.variable_scope('mixed3'):
        net = _reduction_35(b, net)
    for index, width in zip(range(4, 8), (128, 160, 160, 192)):
        with tf1.variable_scope('mixed%d' % index):
            net = _module_17(b, net, width)
    with tf1.variable_scope('mixed8'):
        net = _reduction_17(b, net)
    for index in (9, 10):
        with tf1.variable_scope('mixed%d' % index):
            net = _module_8(b, net)
    net = layers.global_average_pool(net)
    return layers.dense(net, num_classes, name='logits')


def build(input_shape, num_classes):
    """Inception v3: model_fn(images, training) -> logits; needs an image at least 75x75."""
    if min(input_shape[:2]) < 75:  # Keras' minimum: the stem and two reductions
        raise ModelError(f'inception3 needs images at least 75x75, got input_shape '
                         f'{tuple(input_shape)}')

    def model_fn(images, training):
        images = check_inputs(images, training, input_shape, 'inception3')
        return inference(images, training, num_classes)
    return model_fn
