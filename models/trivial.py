"""trivial: tf_cnn_benchmarks' way to time the input alone.

The images flattened, a ReLU layer of one unit, one of 4096 and the logits: next to no
compute, so a step's time is what it takes to bring the batch to the towers.
"""
import tensorflow as tf

from towers.models import layers
from towers.models.errors import check_inputs


def build(input_shape, num_classes):
    """trivial: model_fn(images, training) -> logits, for any input shape."""

    def model_fn(images, training):
        images = check_inputs(images, training, input_shape, 'trivial')
        net = layers.dense(images, 1, activation=tf.nn.relu, name='fc1')
        net = layers.dense(net, 4096, activation=tf.nn.relu, name='fc2')
        return layers.dense(net, num_classes, name='logits')
    return model_fn
