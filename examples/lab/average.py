"""Step 5 of the lab: write the recipe's combining step yourself.

Each of N towers computed the gradients of its own slice of the global batch. Combine them into
the one gradient per variable that the single apply_gradients will take, so that N towers make
exactly one device's update on the whole batch. Then let `towers check` grade it:

    towers check --average examples/lab/average.py:average_gradients --towers 3 \
        --model small_convnet --batch-size 10 --steps 2 --devices cpu

(10 examples over 3 towers is 4/3/3: the towers' shares are not equal.)
"""
import tensorflow as tf  # noqa: F401 (yours to use)


def average_gradients(tower_grads, weights):
    """One gradient per variable from the towers' gradients.

    Args:
      tower_grads: num_towers x num_vars x (grad, var), what each tower's
        `optimizer.compute_gradients(loss)` returned; every tower lists the same variables in
        the same order. A tower's loss is the mean over its own slice.
      weights: num_towers scalar tensors, each tower's share of the global batch
        (count_i / batch); they sum to 1.
    Returns:
      num_vars x (grad, var): for each variable, its gradient for the whole batch's mean loss,
      paired with tower 0's variable.
    """
    # Your code here: for each variable (zip(*tower_grads) walks them), combine the N
    # gradients. tf.add_n, tf.stack and tf.reduce_sum / tf.reduce_mean may help.
    raise NotImplementedError('combine the towers\' gradients in examples/lab/average.py')
