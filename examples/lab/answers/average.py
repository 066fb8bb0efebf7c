"""An answer to step 6: the towers' gradients weighted by their shares of the batch.

Tower i's loss is the mean over its n_i examples, so its gradient is (1/n_i) times the sum of
its examples' gradients. One device's gradient of the whole batch's mean is (1/B) times the sum
over all B examples: sum_i (n_i / B) g_i, each tower weighted by its share. The tutorial's
plain mean, sum_i g_i / N, is the same only where every n_i is B / N.
"""
import tensorflow as tf


def average_gradients(tower_grads, weights):
    average = []
    for grads_and_vars in zip(*tower_grads):  # one variable: its N (grad, var) pairs
        grads = [grad * tf.cast(weight, grad.dtype)
                 for (grad, _), weight in zip(grads_and_vars, weights)]
        average.append((tf.add_n(grads), grads_and_vars[0][1]))
    return average
