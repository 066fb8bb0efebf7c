"""ResNet v1 for CIFAR-10 (He et al. 2016, "Deep Residual Learning", section 4.2).

A 3x3 conv of 16 filters, then three stages of n basic blocks with 16, 32 and 64
filters on 32x32, 16x16 and 8x8 maps, global average pooling and the logits:
6n + 2 weight layers, so resnet20 is n = 3 and resnet56 is n = 9. A basic
block is conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU. Where a
stage halves the map and doubles the filters the shortcut is the paper's
option A: parameter-free, subsample by 2 and zero-pad the new channels; this
is what gives the paper's 0.27M (resnet20) and 0.85M (resnet56) parameters.
Convolutions have no bias (the batch norm's beta is one) and He-normal weights.

Batch norm here is models/layers.batch_norm: its moving averages are
UPDATE_OPS, which the trainer runs from tower 0 once per step.
"""
import tensorflow as tf

from towers.models import layers, layout
from towers.models.errors import ModelError, check_inputs, static_channels

tf1 = tf.compat.v1

STAGE_FILTERS = (16, 32, 64)


def _conv(x, filters, strides, name):
    return layers.conv2d(x, filters, 3, strides=strides, activation=None, use_bias=False,
                         kernel_initializer=tf1.variance_scaling_initializer(2.0),
                         name=name)


def _shortcut(x, filters, strides):
    """Option A: identity, or subsample + zero channels when the shape changes."""
    in_filters = static_channels(x, 'shortcut')
    if strides == 1 and in_filters == filters:
        return x
    extra = filters - in_filters
    # x[:, ::2, ::2, :], as a 1x1 max pool of stride 2: the same numbers forward and back,
    # but TensorFlow's strided slice and its gradient took 6.8 ms on a 128x32x32x16 map,
    # the pool 0.5 (10% of resnet20's bf16 step on a 2-core EPYC).
    subsampled = layers.max_pool(x, 1, strides, padding='VALID')
    return layout.pad(subsampled, channels=(extra // 2, extra - extra // 2))


def _block(x, filters, strides, training, name):
    with tf1.variable_scope(name):
        y = _conv(x, filters, strides, 'conv1')
        y = tf.nn.relu(layers.batch_norm(y, training, name='bn1'))
        y = _conv(y, filters, 1, 'conv2')
        y = layers.batch_norm(y, training, name='bn2')
        return tf.nn.relu(y + _shortcut(x, filters, strides))


def inference(images, training, num_classes, blocks_per_stage):
    """Builds ResNet-(6n+2) on `images` in the current variable scope.

    Args:
        images: [batch, H, W, C] float32 (32x32x3 for CIFAR-10).
        training: Python bool: batch statistics and moving-average updates, or
            the moving averages.
        num_classes: number of logits.
        blocks_per_stage: n.
    Returns:
        [batch, num_classes] float32 logits.
    """
    net = _conv(images, STAGE_FILTERS[0], 1, 'conv1')
    net = tf.nn.relu(layers.batch_norm(net, training, name='bn1'))
    net = residual_stages(net, STAGE_FILTERS, [blocks_per_stage] * 3, _block, training)
    return pooled_logits(net, num_classes)


def residual_stages(net, stage_filters, blocks, block, training):
    """A ResNet's stages: stage s is blocks[s] calls block(net, stage_filters[s], strides,
    training, 'stage<s>/block<b>'), the first of each stage after the first with stride 2
    (it halves the map)."""
    for stage, (filters, count) in enumerate(zip(stage_filters, blocks)):
        for index in range(count):
            strides = 2 if stage > 0 and index == 0 else 1
            net = block(net, filters, strides, training,
                        'stage%d/block%d' % (stage + 1, index + 1))
    return net


def pooled_logits(net, num_classes):
    """How a ResNet ends: global average pooling, then the logits."""
    net = layers.global_average_pool(net)
    return layers.dense(net, num_classes, name='logits',
                        kernel_initializer=tf1.variance_scaling_initializer(1.0))


def _builder(depth):
    if (depth - 2) % 6:
        raise ValueError('ResNet v1 for CIFAR has 6n + 2 layers')
    blocks_per_stage = (depth - 2) // 6
    name = 'resnet%d' % depth

    def build(input_shape, num_classes):
        """Returns model_fn(images, training) -> logits; needs an image at least 8x8 wide."""
        if min(input_shape[:2]) < 8:
            raise ModelError(f'{name} halves the image twice: input_shape must be at least '
                             f'8x8, got {tuple(input_shape)}')

        def model_fn(images, training):
            images = check_inputs(images, training, input_shape, name)
            return inference(images, training, num_classes, blocks_per_stage)
        return model_fn
    build.__doc__ = 'ResNet-%d v1 (n = %d): model_fn(images, training) -> logits.' % (
        depth, blocks_per_stage)
    return build


build_resnet20 = _builder(20)
build_resnet56 = _builder(56)
