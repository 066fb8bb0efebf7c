"""The evaluator task, in one process: each kept checkpoint once, as `towers eval` gives it.

The evaluator of a real cluster job is in tests/cluster/test_evaluator.py.
"""
import json
import os
import shutil

import pytest
import tensorflow as tf

from towers import checkpoints, data, models
from towers.cli import main
from towers.deviceplan import local_plan
from towers.errors import TowersError
from towers.evaluation import format_metrics
from towers.evaluator import EVAL_DIR, RESULTS_FILE, Evaluator, listed, wait_for_run

tf1 = tf.compat.v1

FLAGS = ['--model', 'small_convnet', '--batch-size', '20', '--eval-every', '0', '--quiet',
         '--checkpoint-every', '1', '--keep-checkpoints', '2', '--devices', 'cpu']


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A finished 4-step run keeping the checkpoints of steps 3 and 4."""
    logdir = str(tmp_path_factory.mktemp('evaluator') / 'run')
    assert main(['train', '--steps', '4', '--logdir', logdir] + FLAGS) == 0
    return logdir


def _evaluator(logdir, lines):
    run = checkpoints.read_run(logdir)
    model_fn = models.build_model(run['model'], run['input_shape'], run['num_classes'])
    test = data.load_dataset(run['dataset'], validation_size=0).test
    return Evaluator(logdir, run, model_fn, ('test', test), local_plan(['/cpu:0']), 20, 'accuracy',
                     log=lines.append)


def _copy(trained, tmp_path):
    logdir = str(tmp_path / 'run')
    shutil.copytree(trained, logdir)
    return logdir


def test_each_kept_checkpoint_once_with_the_numbers_towers_eval_gives(trained, tmp_path,
                                                                       capsys):
    logdir, lines = _copy(trained, tmp_path), []
    evaluator = _evaluator(logdir, lines)
    try:
        written = evaluator.run_until_done(wait=0, poll=0)
    finally:
        evaluator.close()
    assert [step for step, _ in listed(logdir)] == [3, 4]
    assert [line['step'] for line in written] == [3, 4]
    with open(os.path.join(logdir, EVAL_DIR, RESULTS_FILE)) as f:
        assert [json.loads(line) for line in f] == written
    assert lines[-1] == "evaluator: the last step's checkpoint (4) is evaluated; done"
    assert main(['eval', '--logdir', logdir, '--batch-size', '20', '--devices', 'cpu']) == 0
    metrics = {name: written[-1][name] for name in ('loss', 'accuracy', 'top5')}
    assert 'test: %s (%d images)' % (format_metrics(metrics), written[-1]['examples']) \
        in capsys.readouterr().out
    with open(os.path.join(logdir, EVAL_DIR, 'best', 'best.json')) as f:
        best = json.load(f)
    kept = max(written, key=lambda line: (line['accuracy'], -line['step']))
    assert best == {'metric': 'accuracy', 'value': kept['accuracy'], 'step': kept['step'],
                    'split': 'test', 'checkpoint': 'model.ckpt-%d' % kept['step']}
    assert checkpoints.newest_complete(os.path.join(logdir, EVAL_DIR, 'best')).endswith(
        'model.ckpt-%d' % kept['step'])
    events = tf1.train.summary_iterator(tf.io.gfile.glob(
        os.path.join(logdir, EVAL_DIR, 'events.*'))[0])
    scalars = {(e.step, v.tag): v.simple_value for e in events for v in e.summary.value}
    assert scalars[4, 'test/loss'] == pytest.approx(written[-1]['loss'], rel=1e-6)


def test_a_restarted_evaluator_skips_what_it_did_and_a_removed_checkpoint_is_named(
        trained, tmp_path):
    logdir, lines = _copy(trained, tmp_path), []
    for path in tf.io.gfile.glob(os.path.join(logdir, 'model.ckpt-3.data-*')):
        os.remove(path)  # as the chief's keep-only-the-newest would, before it was read
    evaluator = _evaluator(logdir, lines)
    try:
        assert [line['step'] for line in evaluator.run_until_done(wait=0, poll=0)] == [4]
    finally:
        evaluator.close()
    assert lines[0] == ('evaluator: skipped %s/model.ckpt-3: removed or cut short before it was '
                        'read (the chief keeps only its newest checkpoints)' % logdir)
    again = _evaluator(logdir, lines)
    try:
        assert again.run_until_done(wait=0, poll=0) == []
    finally:
        again.close()


def test_an_evaluator_ends_when_no_run_holds_the_logdir_and_waits_for_its_run_json(
        trained, tmp_path):
    logdir, lines = _copy(trained, tmp_path), []
    run = checkpoints.read_run(logdir)
    checkpoints.write_run(logdir, **dict(run, num_steps=100))  # a run stopped at step 4
    evaluator = _evaluator(logdir, lines)
    try:
        assert len(evaluator.run_until_done(wait=0, poll=0)) == 2
    finally:
        evaluator.close()
    assert lines[-1] == ('evaluator: no run has held %s for 0 s, and its last step (100) has no '
                         'checkpoint; done at step 4' % logdir)
    with pytest.raises(TowersError) as error:
        wait_for_run(str(tmp_path / 'empty'), timeout=0, poll=0)
    assert str(error.value) == ('no run.json in %s after 0 s: start the chief with this '
                                'logdir (the evaluator reads what it writes)'
                                % (tmp_path / 'empty'))
