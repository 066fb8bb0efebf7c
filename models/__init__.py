"""Image classifiers for towers, built from get_variable + tf.nn layers.

Public API:
    MODELS: model name -> builder(input_shape, num_classes, **options) -> model_fn.
    build_model(name, input_shape, num_classes, **options) -> model_fn, where
        model_fn(images, training) maps [batch, H, W, C] float32 images (batch
        may be dynamic, even 0 for inference) to [batch, num_classes] float32
        logits. It creates its variables with tf1.get_variable in the caller's
        variable scope, so calling it once per tower under reuse=True shares them.
    model_names() -> sorted list of names.
    DESIGNS: model name -> (input_shape, num_classes) it is designed for.
    ModelError: bad name, shape, class count or option (a ValueError).
    layers: the layer functions the models are made of.

Importing this package changes no global TensorFlow state.
"""
import functools
import inspect
import numbers

from towers.models import (
    alexnet,
    cifar_convnet,
    inception,
    layers,
    layout,
    mnist_convnet,
    resnet,
    resnet_imagenet,
    small_convnet,
    trivial,
    vgg,
)
from towers.models.errors import ModelError

__all__ = ['DESIGNS', 'MODELS', 'ModelError', 'build_model', 'layers', 'model_names']

MODELS = {
    'alexnet': alexnet.build,
    'cifar_convnet': cifar_convnet.build,
    'inception3': inception.build,
    'mnist_convnet': mnist_convnet.build,
    'resnet20': resnet.build_resnet20,
    'resnet50': resnet_imagenet.build_resnet50,
    'resnet56': resnet.build_resnet56,
    'resnet101': resnet_imagenet.build_resnet101,
    'resnet152': resnet_imagenet.build_resnet152,
    'small_convnet': small_convnet.build,
    'trivial': trivial.build,
    'vgg16': vgg.build,
}

# The input and class count each model is designed for: tf_cnn_benchmarks' sizes for the
# ImageNet nets (AlexNet's VALID first convolution, and trivial, take 224 + 3). Any size the
# net allows works, and any class count.
_IMAGENET, _IMAGENET_227 = ((224, 224, 3), 1000), ((227, 227, 3), 1000)
DESIGNS = {
    'alexnet': _IMAGENET_227, 'cifar_convnet': ((32, 32, 3), 10),
    'inception3': ((299, 299, 3), 1000), 'mnist_convnet': ((28, 28, 1), 10),
    'resnet20': ((32, 32, 3), 10), 'resnet50': _IMAGENET, 'resnet56': ((32, 32, 3), 10),
    'resnet101': _IMAGENET, 'resnet152': _IMAGENET, 'small_convnet': ((28, 28, 1), 10),
    'trivial': _IMAGENET_227, 'vgg16': _IMAGENET,
}


def model_names():
    """Returns the registered model names, sorted."""
    return sorted(MODELS)


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_input_shape(name, input_shape):
    try:
        dims = tuple(input_shape)
    except TypeError:
        dims = None
    if dims is None or len(dims) != 3 or not all(_is_int(d) and d > 0 for d in dims):
        raise ModelError(f'{name}: input_shape must be three positive ints (height, width, '
                         f'channels) without the batch dimension, got {input_shape!r}')
    return tuple(int(d) for d in dims)


def _check_options(name, builder, options):
    accepted = list(inspect.signature(builder).parameters)[2:]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ModelError(f'{name} does not take option(s) {", ".join(unknown)}; '
                         f'its options are: {", ".join(accepted) or "none"}')


def build_model(name, input_shape, num_classes, **options):
    """Builds a model_fn for one registered model; creates no graph ops yet.

    Args:
        name: one of `model_names()`.
        input_shape: (height, width, channels) of one image, e.g. (28, 28, 1).
        num_classes: number of logits, >= 1.
        **options: model options, e.g. dropout_rate for mnist_convnet.

    Returns:
        model_fn(images, training) -> logits: images [batch, H, W, C] float32,
        training a Python bool, logits [batch, num_classes] float32.

    Raises:
        ModelError: unknown name or option, unusable input_shape or num_classes.
    """
    if not isinstance(name, str) or name not in MODELS:
        raise ModelError(f'unknown model {name!r}; known models: {", ".join(model_names())}')
    input_shape = _check_input_shape(name, input_shape)
    if not _is_int(num_classes) or num_classes < 1:
        raise ModelError(f'{name}: num_classes must be an int >= 1, got {num_classes!r}')
    builder = MODELS[name]
    _check_options(name, builder, options)
    model_fn = builder(input_shape, int(num_classes), **options)

    @functools.wraps(model_fn)
    def in_preferred_layout(images, training):
        # Every model here is written for both layouts (layout.py).
        with layout.data_format(layout.preferred()):
            return model_fn(images, training)
    return in_preferred_layout
