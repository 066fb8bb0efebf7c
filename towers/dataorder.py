"""The data order: which batch each step trains on, kept in every checkpoint.

A resume is exact only when it sees the batches an uninterrupted run would
have seen; these settings decide them, so they are saved as variables with
the weights, and a resume that would see others is refused.
"""
import tensorflow as tf

from towers.errors import TowersError

tf1 = tf.compat.v1


class DataOrder:
    """The settings that decide which batch each step trains on, kept in every checkpoint.

    Saved as int64 variables in the 'data_order' scope, so a resume that would
    train on other batches (another seed, batch size, dataset or input order)
    is refused instead of silently continuing on a different sequence.

    Args:
      settings: {name: int}, e.g. seed, batch_size, num_examples.
    """

    def __init__(self, settings):
        self.settings = dict(settings)
        self.variables = None

    def build(self, device):
        """Create the variables in the default graph, on device."""
        with tf.device(device), tf1.variable_scope('data_order'):
            self.variables = [tf1.get_variable(name, initializer=tf.constant(value, tf.int64),
                                               trainable=False)
                              for name, value in self.settings.items()]

    def check(self, sess, logdir):
        """After a restore from logdir: raise TowersError if the checkpoint's order is another."""
        saved = dict(zip(self.settings, (int(v) for v in sess.run(self.variables))))
        if saved != self.settings:
            raise TowersError(
                'the checkpoint in %s was trained with data order %s, this run asks for %s: '
                'resuming would train on other batches; use the same {seed}, {batch_size}, '
                'dataset and {input}, or a new {logdir}'
                % (logdir, _pairs(saved), _pairs(self.settings)))


def _pairs(values):
    return ', '.join('%s %s' % (k, v) for k, v in sorted(values.items()))
