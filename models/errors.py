"""The exception the models package raises for bad user input, and its checks."""
import tensorflow as tf

from towers.context import is_training_flag
from towers.models import layout


class ModelError(ValueError):
    """A model name, input shape, class count, option or images the models cannot take.

    The message is one line that says what to change, so the CLI can print it as is.
    """


# What a model computes in: float32, or a mixed-precision run's type (towers/precision.py).
COMPUTE_DTYPES = (tf.float32, tf.bfloat16, tf.float16)


def check_inputs(images, training, input_shape, model):
    """Checks the arguments of a model_fn against the shape it was built for.

    Args:
        images: [batch, H, W, C] float32 tensor (or something convertible to one).
        training: a Python bool, or the tower's towers.context.TowerContext
            (truthy when training): graphs are built separately for training
            and eval, and a tensor here would always count as True.
        input_shape: (H, W, C) the model was built for.
        model: model name, for the message.

    Returns:
        `images` as a tensor, transposed to NCHW inside a data_format('NCHW') scope.

    Raises:
        ModelError: wrong dtype, rank or image shape.
        TypeError: `training` is not a Python bool.
    """
    check_training(training, model)
    images = tf.convert_to_tensor(images)
    if images.dtype not in COMPUTE_DTYPES:
        raise ModelError(f'{model}: images must be float32 (or the bfloat16 or float16 of '
                         f'mixed precision), got {images.dtype.name}; cast them in the input '
                         'pipeline')
    expected = tf.TensorShape([None, *input_shape])
    if not expected.is_compatible_with(images.shape):
        raise ModelError(f'{model} was built for images [batch, {", ".join(map(str, input_shape))}]'
                         f' but got shape {images.shape}; build it with the matching input_shape')
    if layout.current() == 'NCHW':  # the layers build channels first (towers/models/layout.py)
        images = layout.to_nchw(images)
    return images


def static_channels(x, layer):
    """The static size of x's channel axis, which a layer sizes its variables by."""
    channels = x.shape[layout.channel_axis(x)]
    if channels is None:
        raise ValueError(f'{layer}: the channel dimension of {x.name} must be known '
                         f'statically to size the variables, got shape {x.shape}')
    return int(channels)


def check_training(training, layer):
    """TypeError unless training is a Python bool or a TowerContext."""
    # A tensor here would silently be truthy and turn eval into training.
    if not is_training_flag(training):
        raise TypeError(f'{layer}: training must be a Python bool, got {training!r}')
