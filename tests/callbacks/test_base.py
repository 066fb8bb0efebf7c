"""What a custom Callback sees: every hook in order, its fetches, the epoch a stop ends."""
import io

import numpy as np
import pytest
import tensorflow as tf

from tests.callbacks.common import (
    HOOKS,
    NUM_VALIDATION,
    Recorder,
    easy_datasets,
    eval_lines,
    make_trainer,
    stats_lines,
    step_lines,
)
from towers.callbacks import default_callbacks, monitors
from towers.config import TrainConfig

tf1 = tf.compat.v1


def test_a_custom_callback_sees_every_hook_in_order():
    recorder = Recorder(fetch={'doubled_loss': lambda trainer: 2 * trainer.graph.loss})
    make_trainer([recorder], [], steps_per_epoch=2, steps=5, learning_rate=0.05).train()
    assert recorder.calls == [
        ('setup_graph', 0), ('fetches', 0), ('before_train', 0),
        ('after_step', 1), ('after_step', 2), ('after_epoch', 2),
        ('after_step', 3), ('after_step', 4), ('after_epoch', 4),
        ('after_step', 5), ('after_train', 5), ('close', None)]
    for values in recorder.values:
        assert {'loss', 'accuracy', 'batch', 'learning_rate', 'seconds'} <= set(values)
        assert 'train_op' not in values
        assert values['batch'] == 10 and values['seconds'] > 0
        assert values['learning_rate'] == pytest.approx(0.05)
        assert np.isfinite(values['loss']) and 0 <= values['accuracy'] <= 1
        # Its own fetch ran with the step.
        assert values['doubled_loss'] == pytest.approx(2 * values['loss'], rel=1e-6)


def test_callbacks_run_by_order_and_close_in_reverse_also_when_training_raises():
    journal = []
    late = Recorder(order=70, fail_at_step=2, journal=journal)
    early = Recorder(order=5, journal=journal)
    with pytest.raises(RuntimeError, match='failing at step 2 on purpose'):
        make_trainer([late, early], [], steps_per_epoch=10, steps=5).train()
    expected = [('setup_graph', 0), ('fetches', 0), ('before_train', 0), ('after_step', 1),
                ('after_step', 2), ('close', None)]
    assert late.calls == expected and early.calls == expected
    # Listed late first, called early first; closed in reverse, after_train never.
    assert journal == [(order, hook) for hook in HOOKS[:4] for order in (5, 70)] + [
        (5, 'after_step'), (70, 'after_step'), (70, 'close'), (5, 'close')]


def test_a_custom_callbacks_fetches_are_not_reported_as_training_metrics(tmp_path):
    logdir, lines = str(tmp_path / 'scalar'), []
    fetch = {'my_step': lambda trainer: trainer.graph.global_step}
    make_trainer([monitors.Progress(every=1, stream=io.StringIO()), monitors.StatsFile(),
              Recorder(fetch=fetch)], lines, steps_per_epoch=2, steps=2,
                 logdir=logdir).train()
    reported = [line for line in step_lines(lines) if 'my_step' in line] + [
        key for line in stats_lines(logdir) for key in line if 'my_step' in key]

    # A callback that watches a weight matrix.
    fetch = {'my_weights': lambda trainer: trainer.graph.graph.get_tensor_by_name(
        'conv1/weights:0')}
    try:
        make_trainer([monitors.StatsFile(), Recorder(fetch=fetch)], [], steps=1,
                     logdir=str(tmp_path / 'matrix')).train()
    except TypeError as e:
        reported.append('my_weights crashed the run: %s' % e)
    if reported:
        pytest.fail('reported: %s' % reported)


def test_a_stop_on_an_epochs_last_step_still_finishes_that_epoch(tmp_path):
    logdir, sets = str(tmp_path), easy_datasets(validation=NUM_VALIDATION)
    stops = iter([None, None, 'SIGTERM'])
    first = []
    result = make_trainer(default_callbacks(TrainConfig(logdir=logdir, log_every=1000)), first,
                          datasets=sets,
                          steps_per_epoch=3, steps=9, logdir=logdir,
                          stop_requested=lambda: next(stops)).train()
    assert result['stopped'] == 'SIGTERM' and result['steps'] == 3
    # Epoch 1 ended at the stop: its evaluation ran before the stop was acted on.
    assert [line.split(':')[0] for line in eval_lines(first)] == ['validation at epoch 1.00']
    second = []
    make_trainer(default_callbacks(TrainConfig(logdir=logdir, log_every=1000)), second,
                 datasets=sets,
                 steps_per_epoch=3, steps=9, logdir=logdir).train()
    assert [line['step'] for line in stats_lines(logdir)] == [3, 6, 9]
    assert [line.split(':')[0] for line in eval_lines(second)] == [
        'validation at epoch 2.00', 'validation at epoch 3.00']
