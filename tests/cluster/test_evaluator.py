"""An evaluator task beside a real job: every kept checkpoint, `towers eval`'s numbers.

One worker: the evaluator reads only what the chief saves, however many workers train; a
second worker would add a process's TensorFlow start, not a thing the evaluator sees.
"""
import json
import os

from towers.cli import main
from towers.evaluation import format_metrics
from towers.evaluator import EVAL_DIR, RESULTS_FILE, listed

FLAGS = ['--model', 'small_convnet', '--batch-size', '20', '--eval-every', '0', '--quiet',
         '--log-every', '1', '--checkpoint-every', '2', '--devices', 'cpu']


def test_launch_evaluator_evaluates_every_kept_checkpoint_as_towers_eval_does(tmp_path,
                                                                               capsys, forks):
    logdir = str(tmp_path / 'run')
    # The launcher forked from the worker's fork server, its tasks from it (tests/conftest.py).
    status, lines, _ = forks.run(
        ['launch', '--workers', '1', '--evaluator', '--grace', '5', '--logs',
         str(tmp_path / 'logs'), '--', 'train', '--threads', '1', '--cluster-mode', 'collective',
         '--steps', '6', '--logdir', logdir] + FLAGS, tmp_path, timeout=150)
    assert status == 0, lines[-40:]
    assert "[evaluator 0] evaluator: the last step's checkpoint (6) is evaluated; done" in lines
    with open(os.path.join(logdir, EVAL_DIR, RESULTS_FILE)) as f:
        results = [json.loads(line) for line in f]
    evaluated = [line['step'] for line in results]
    kept = [step for step, _ in listed(logdir)]
    assert kept == [2, 4, 6] and evaluated == sorted(set(evaluated)) and set(kept) <= set(
        evaluated)
    assert main(['eval', '--logdir', logdir, '--batch-size', '20', '--devices', 'cpu']) == 0
    final = {name: results[-1][name] for name in ('loss', 'accuracy', 'top5')}
    assert 'test: %s (1000 images)' % format_metrics(final) in capsys.readouterr().out
