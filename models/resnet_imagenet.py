"""ResNet-50, -101 and -152 for ImageNet, v1.5 (tf_cnn_benchmarks' default, and MLPerf's).

He et al. 2016, "Deep Residual Learning", with the change the v1.5 name stands for: in a
bottleneck block that halves the map, the stride is on the 3x3 convolution, not on the first
1x1 (which would skip three quarters of the input). conv 7x7/2 (64) + BN + ReLU, max-pool
3x3/2, then four stages of bottleneck blocks (64, 128, 256, 512 filters, each block's output
four times that), global average pooling and the logits. A bottleneck is 1x1 - 3x3 - 1x1
convolutions, each with a batch norm and all but the last with a ReLU; its shortcut is the
identity, or a 1x1 projection with a batch norm where the shape changes (the first block of
each stage); the sum then goes through a ReLU. Convolutions have no bias (the batch norm's
beta is one) and He-normal weights. A strided convolution is padded by its kernel alone
((k - 1) / 2 before, the rest after), as tf_cnn_benchmarks and the official model do, not
by TensorFlow's SAME (which pads less before than after on an even input and shifts the
sampling grid). ResNet-50 has 25,557,032 parameters at 1000 classes,
torchvision's and tf_cnn_benchmarks' count.
"""
import tensorflow as tf

from towers.models import layers, layout, resnet
from towers.models.errors import ModelError, check_inputs, static_channels

tf1 = tf.compat.v1

STAGE_FILTERS = (64, 128, 256, 512)
BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def _conv_bn(x, filters, kernel, strides, training, name, relu=True):
    with tf1.variable_scope(name):
        padding = 'SAME'
        if strides > 1:  # padded by the kernel alone, not the input's size (see the docstring)
            x, padding = _fixed_padding(x, kernel), 'VALID'
        x = layers.conv2d(x, filters, kernel, strides=strides, padding=padding,
                          activation=None, use_bias=False,
                          kernel_initializer=tf1.variance_scaling_initializer(2.0))
        x = layers.batch_norm(x, training)
        return tf.nn.relu(x) if relu else x


def _fixed_padding(x, kernel):
    """Pad (kernel - 1) / 2 before and the rest after, on both spatial axes."""
    before = (kernel - 1) // 2
    return layout.pad(x, spatial=(before, kernel - 1 - before))


def _bottleneck(x, filters, strides, training, name):
    with tf1.variable_scope(name):
        if strides == 1 and static_channels(x, name) == 4 * filters:
            shortcut = x
        else:
            shortcut = _conv_bn(x, 4 * filters, 1, strides, training, 'shortcut', relu=False)
        y = _conv_bn(x, filters, 1, 1, training, 'conv1')
        y = _conv_bn(y, filters, 3, strides, training, 'conv2')  # v1.5: the stride here
        y = _conv_bn(y, 4 * filters, 1, 1, training, 'conv3', relu=False)
        return tf.nn.relu(y + shortcut)


def inference(images, training, num_classes, blocks):
    """ResNet v1.5 on `images` [batch, H, W, 3]: logits [batch, num_classes]."""
    net = _conv_bn(images, 64, 7, 2, training, 'conv1')
    net = layers.max_pool(net, 3, 2, padding='SAME', name='pool1')
    net = resnet.residual_stages(net, STAGE_FILTERS, blocks, _bottleneck, training)
    return resnet.pooled_logits(net, num_classes)


def _builder(depth):
    name = 'resnet%d' % depth

    def build(input_shape, num_classes):
        if min(input_shape[:2]) < 32:
            raise ModelError(f'{name} halves the image five times: input_shape must be at '
                             f'least 32x32, got {tuple(input_shape)}')

        def model_fn(images, training):
            images = check_inputs(images, training, input_shape, name)
            return inference(images, training, num_classes, BLOCKS[depth])
        return model_fn
    build.__doc__ = 'ResNet-%d v1.5 for ImageNet: model_fn(images, training) -> logits.' % depth
    return build


build_resnet50 = _builder(50)
build_resnet101 = _builder(101)
build_resnet152 = _builder(152)
