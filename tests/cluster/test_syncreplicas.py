"""Parameter-server mode's guard on SyncReplicasOptimizer's shared token queue."""
import pytest
import tensorflow as tf

from towers.cluster import syncreplicas

tf1 = tf.compat.v1


def test_a_token_another_worker_left_behind_stops_the_step():
    """Tokens as the chief's queue runner hands them out: N (here 2) after each update,
    each the global step after it. A worker whose next take finds the other's token, with
    no update since its own, fails there instead of pushing a second gradient into the
    same update."""
    with tf.Graph().as_default():
        global_step = tf1.train.get_or_create_global_step()
        tokens = tf1.FIFOQueue(4, tf.int64, shapes=[])
        update = tf.group(tf1.assign_add(global_step, 1),
                          name='update')  # what the chief's update does to the step
        with tf.control_dependencies([update]):
            release = tokens.enqueue_many(tf.fill([2], tf.identity(global_step)))
        step = syncreplicas._own_token(tokens.dequeue().op, global_step, '/cpu:0')
        with tf1.Session() as sess:
            sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
            sess.run(release)  # update 1: a token for each of the two workers
            sess.run(step)  # this worker's
            sess.run(release)  # update 2
            sess.run(step)  # this worker's again: fine
            # The other worker never took its token of update 2; no update since.
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=syncreplicas.WITHOUT_A_WORKER):
                sess.run(step)
