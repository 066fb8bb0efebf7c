"""Steps 4 and 5 of the lab: three ways to combine the towers' gradients that look right, and a
cut that looks right.

Each runs, trains and lowers the loss; `towers check` says which of them one device would
have made, and what the others did instead:

    towers check --average examples/lab/mistakes.py:unweighted_mean --towers 3 \
        --model small_convnet --batch-size 10 --steps 2 --devices cpu
    towers check --split examples/lab/mistakes.py:drops_the_remainder --towers 3 \
        --model small_convnet --batch-size 10 --steps 1 --devices cpu
"""
import tensorflow as tf

from towers.slicing import TowerSlice


def unweighted_mean(tower_grads):
    """The CIFAR-10 tutorial's average_gradients: every tower counts 1/N."""
    average = []
    for grads_and_vars in zip(*tower_grads):
        grads = tf.stack([grad for grad, _ in grads_and_vars], axis=0)
        average.append((tf.reduce_mean(grads, axis=0), grads_and_vars[0][1]))
    return average


def summed(tower_grads):
    """The towers' gradients added up, as if each had held the whole batch."""
    return [(tf.add_n([grad for grad, _ in grads_and_vars]), grads_and_vars[0][1])
            for grads_and_vars in zip(*tower_grads)]


def wrong_axis(tower_grads, weights):
    """The shares' weights, but the stack reduced over the variable's first axis instead of
    the towers'."""
    average = []
    for grads_and_vars in zip(*tower_grads):
        grads = tf.stack([grad * tf.cast(weight, grad.dtype)
                          for (grad, _), weight in zip(grads_and_vars, weights)], axis=0)
        average.append((tf.reduce_sum(grads, axis=1), grads_and_vars[0][1]))
    return average


def drops_the_remainder(images, labels, num_towers):
    """A cut of batch // N examples to each tower: the remainder of the batch goes nowhere."""
    batch = tf.shape(labels)[0]
    size = batch // num_towers
    return [TowerSlice(images[i * size:(i + 1) * size], labels[i * size:(i + 1) * size], size,
                       batch) for i in range(num_towers)]
