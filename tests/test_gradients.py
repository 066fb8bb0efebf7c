"""average_gradients: weights, None gradients, IndexedSlices, mismatched towers."""
import numpy as np
import pytest
import tensorflow as tf

from towers.errors import GradientError
from towers.gradients import average_gradients, check_same_variables

tf1 = tf.compat.v1


def _run(fetches):
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        return sess.run(fetches)


def test_equal_weights_is_the_plain_mean():
    with tf.Graph().as_default():
        var = tf1.get_variable('v', [2], initializer=tf1.zeros_initializer())
        grads = [[(tf.constant([1.0, 2.0]), var)], [(tf.constant([3.0, 6.0]), var)]]
        (grad, out_var), = average_gradients(grads)
        assert out_var is var
        np.testing.assert_array_equal(_run(grad), [2.0, 4.0])


def test_weights_follow_each_towers_share():
    with tf.Graph().as_default():
        var = tf1.get_variable('v', [1], initializer=tf1.zeros_initializer())
        grads = [[(tf.constant([1.0]), var)], [(tf.constant([4.0]), var)]]
        (grad, _), = average_gradients(grads, weights=[0.75, tf.constant(0.25)])
        np.testing.assert_allclose(_run(grad), [0.75 * 1.0 + 0.25 * 4.0])


def test_none_gradient_counts_as_zero_and_all_none_stays_none():
    with tf.Graph().as_default():
        a = tf1.get_variable('a', [2], initializer=tf1.zeros_initializer())
        b = tf1.get_variable('b', [2], initializer=tf1.zeros_initializer())
        grads = [[(tf.constant([2.0, 4.0]), a), (None, b)],
                 [(None, a), (None, b)]]
        (grad_a, _), (grad_b, var_b) = average_gradients(grads)
        assert grad_b is None and var_b is b
        # Tower 1 did not use `a`: its contribution is zero, not left out.
        np.testing.assert_array_equal(_run(grad_a), [1.0, 2.0])


def test_indexed_slices_stay_sparse_and_sum_correctly():
    with tf.Graph().as_default():
        table = tf1.get_variable('table', [5, 3], initializer=tf1.ones_initializer())
        tower_grads = []
        for ids in ([0, 2], [2, 4]):
            loss = tf.reduce_sum(tf.gather(table, ids) * 2.0)
            (grad, var), = tf1.train.GradientDescentOptimizer(1.0).compute_gradients(loss, [table])
            assert isinstance(grad, tf.IndexedSlices)
            tower_grads.append([(grad, var)])
        (grad, _), = average_gradients(tower_grads)
        assert isinstance(grad, tf.IndexedSlices), 'sparse gradients were densified'
        dense = _run(tf.convert_to_tensor(grad))
        expected = np.zeros([5, 3], np.float32)
        expected[[0, 4]] = 1.0  # 2.0 from one tower, halved
        expected[2] = 2.0       # both towers
        np.testing.assert_allclose(dense, expected)


def test_mixed_dense_and_sparse_densifies_to_the_right_sum():
    with tf.Graph().as_default():
        table = tf1.get_variable('table', [3, 2], initializer=tf1.ones_initializer())
        sparse = tf.IndexedSlices(tf.constant([[2.0, 2.0]]), tf.constant([1]),
                                  tf.constant([3, 2]))
        dense = tf.fill([3, 2], 4.0)
        (grad, _), = average_gradients([[(sparse, table)], [(dense, table)]])
        np.testing.assert_allclose(_run(grad), [[2, 2], [3, 3], [2, 2]])


def test_average_is_placed_with_its_variable():
    with tf.Graph().as_default():
        with tf.device('/cpu:1'):
            var = tf1.get_variable('v', [1])
        with tf.device('/cpu:0'):
            g0, g1 = tf.constant([1.0]), tf.constant([2.0])
        (grad, _), = average_gradients([[(g0, var)], [(g1, var)]])
        assert grad.device == var.device == '/device:CPU:1'


def test_towers_with_different_variables_are_a_readable_error():
    with tf.Graph().as_default():
        a = tf1.get_variable('a', [1])
        b = tf1.get_variable('b', [1])
        g = tf.constant([1.0])
        with pytest.raises(GradientError, match=r"only in tower 0: \['b'\]"):
            average_gradients([[(g, a), (g, b)], [(g, a)]])
        with pytest.raises(GradientError, match='different order'):
            average_gradients([[(g, a), (g, b)], [(g, b), (g, a)]])
        with pytest.raises(GradientError, match='2 weights for 1 towers'):
            average_gradients([[(g, a)]], weights=[0.5, 0.5])


def test_replicas_of_other_variables_are_the_same_readable_error():
    """Towers with copies of their own agree by name: replica_1/a is tower 0's a."""
    from towers.variables import variable_name
    with tf.Graph().as_default():
        a, b = tf1.get_variable('a', [1]), tf1.get_variable('b', [1])
        with tf1.variable_scope('replica_1'):
            a1, c1 = tf1.get_variable('a', [1]), tf1.get_variable('c', [1])
        check_same_variables([[a], [a1]], name=variable_name)  # copies of the same
        with pytest.raises(GradientError, match=r"only in tower 0: \['b'\]; only in tower 1: "
                                                r"\['c'\]"):
            check_same_variables([[a, b], [a1, c1]], name=variable_name)


def test_a_tower_that_holds_the_whole_batch_is_not_weighted_by_one():
    """One tower of one process: its weight is the number 1, and its gradients and loss reach
    the apply as they are (multiplying by 1 would copy each gradient, 161 for ResNet-50)."""
    from towers import models
    from towers.deviceplan import local_plan
    from towers.graph import build_training_graph
    from towers.model import ClassifierModel
    model = ClassifierModel(models.build_model('small_convnet', (28, 28, 1), 10), (28, 28, 1),
                            10, optimizer='sgd')
    one = build_training_graph(model, local_plan(['/cpu:0']), seed=0, learning_rate=0.1)
    assert one.towers[0].weight == 1.0 and not isinstance(one.towers[0].weight, tf.Tensor)
    averaged = [op for op in one.graph.get_operations()
                if op.name.startswith('average_gradients/')]
    assert averaged == []
    two = build_training_graph(model, local_plan(['/cpu:0', '/cpu:1']), seed=0,
                               learning_rate=0.1)
    assert all(isinstance(t.weight, tf.Tensor) for t in two.towers)
    assert sum(op.type == 'Mul' for op in two.graph.get_operations()
               if op.name.startswith('average_gradients/')) == 2 * 4  # 4 variables
    with tf.Graph().as_default():
        g = tf.constant([1.0, 2.0])
        v = tf.Variable([0.0, 0.0])
        [(summed, _)] = average_gradients([[(g, v)]], weights=[1.0])
        assert summed is g
