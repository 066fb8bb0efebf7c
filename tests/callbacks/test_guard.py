"""The NaN guard: a non-finite loss, gradient or weight stops the run before any save."""
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.callbacks.common import SHAPE, finite_variables, index_steps, make_trainer, model_fn
from towers import callbacks as cb
from towers.errors import TowersError
from towers.model import ClassifierModel

tf1 = tf.compat.v1


def test_a_nan_loss_stops_before_anything_saves_it(tmp_path):
    logdir = str(tmp_path)
    with pytest.raises(TowersError) as error:
        make_trainer([cb.NaNGuard(), cb.Checkpoint(every_steps=1, keep=3)], [], learning_rate=1e30,
                     steps=20, logdir=logdir).train()
    # (What the replay found is tests/callbacks/test_origin.py's.)
    match = re.fullmatch(
        r'(?:loss is (?:nan|inf) at step (\d+)|a gradient is NaN or Inf at step (\d+) '
        r'\(loss \S+\)) \((\S+), saved before it, is intact\); replayed, .+', str(error.value))
    assert match, str(error.value)
    bad_step = int(match.group(1) or match.group(2))
    assert bad_step >= 2  # the first step's loss comes from the initial weights
    newest = tf1.train.latest_checkpoint(logdir)
    assert newest == match.group(3) == os.path.join(logdir, 'model.ckpt-%d' % (bad_step - 1))
    assert index_steps(logdir) == list(range(1, bad_step))[-3:]
    assert 'conv1/weights' in finite_variables(newest)


class _InfiniteGradientAt:
    """A gradient processor: the first variable's gradient is Inf in step `step` only."""

    def __init__(self, step):
        self.step = step

    def __call__(self, grads_and_vars):
        (grad, var), rest = grads_and_vars[0], grads_and_vars[1:]
        global_step = tf1.train.get_global_step()  # step - 1 while step `step` runs
        poisoned = tf.where(tf.equal(global_step, self.step - 1), grad + np.inf, grad)
        return [(poisoned, var)] + rest


class _PoisonedClassifier(ClassifierModel):
    def gradient_processors(self):
        return super().gradient_processors() + [_InfiniteGradientAt(3)]


def test_an_infinite_gradient_with_a_finite_loss_stops_at_its_step(tmp_path):
    logdir = str(tmp_path)
    model = _PoisonedClassifier(model_fn(), SHAPE, 10, optimizer='sgd')
    with pytest.raises(TowersError) as error:
        make_trainer([cb.NaNGuard(), cb.Checkpoint(every_steps=1)], [], model=model, steps=6,
                     logdir=logdir).train()
    newest = os.path.join(logdir, 'model.ckpt-2')
    # The gradient processor's Inf comes after the towers' gradients: the replay finds it in
    # the update it makes.
    assert re.fullmatch(r'a gradient is NaN or Inf at step 3 \(loss \d\.\d+\) \(%s, saved '
                        r"before it, is intact\); replayed, step 3's gradients were finite and "
                        r'its update made \S+ non-finite: lower learning_rate'
                        % re.escape(newest), str(error.value)), str(error.value)
    assert tf1.train.latest_checkpoint(logdir) == newest
    finite_variables(newest)


@pytest.mark.filterwarnings('ignore:overflow encountered in cast:RuntimeWarning')
def test_no_checkpoint_with_non_finite_weights_is_called_intact(tmp_path):
    logdir = str(tmp_path)
    with pytest.raises(TowersError) as error:
        make_trainer([cb.NaNGuard(), cb.Checkpoint(every_steps=1)], [], learning_rate=1e39,
                     steps=5, logdir=logdir).train()
    # 1e39 is Inf in float32: step 1's loss and gradients are finite, its update is not.
    assert str(error.value) == ('the weights hold NaN or Inf after step 1, so no checkpoint '
                                'was written; lower learning_rate')
    newest = tf1.train.latest_checkpoint(logdir)
    assert newest is None


# --- A custom Callback --------------------------------------------------------------------
