"""towers bench --cluster-mode: the runs it makes, what it reads from them, the bytes it says."""
import os
import subprocess

import pytest

from towers import models
from towers.cli import main
from towers.errors import TowersError
from towers.tools import clusterbench


def test_gradient_bytes_are_the_models_trainable_variables():
    # small_convnet on 28x28x1: what `towers explain` counts on the ps (less the step).
    model_fn = models.build_model('small_convnet', (28, 28, 1), 10)
    assert clusterbench.gradient_bytes(model_fn, (28, 28, 1)) == 217640


@pytest.mark.parametrize('mode,workers,expected,how', [
    ('collective', 1, 0, 'one task'),
    ('collective', 2, 2 * 1000, 'ring: 2(n-1)/n*S per worker'),  # each of 2 workers sends S
    ('collective', 4, 6 * 1000, 'ring: 2(n-1)/n*S per worker'),  # each sends 3/2 S
    ('parameter-server', 1, 2 * 1000, 'per worker: S read, S pushed'),
    ('parameter-server', 3, 6 * 1000, 'per worker: S read, S pushed'),
    ('in-graph', 2, 1234, 'counted by explain'),
    ('in-graph', 1, 1234, 'counted by explain'),  # with a ps: the chief reads from it
])
def test_bytes_between_tasks_per_step(mode, workers, expected, how):
    ps = int(mode == 'parameter-server')
    assert clusterbench.between_tasks(mode, workers, 1000, explained=1234, ps=ps) == (expected,
                                                                                        how)


def test_runs_in_turns_and_compares_each_cluster_with_one_process(monkeypatch):
    made, rates = [], iter([100.0, 50.0, 200.0, 60.0, 110.0, 52.0, 190.0, 66.0])

    def towers(command, timeout):
        made.append(command)
        rate = next(rates)
        if command[0] == 'train':
            return 'step 20/20 ...\ntrained to step 20: %.1f images/sec after warm-up\n' % rate
        return ('[worker 1] trained to step 20: 1.0 images/sec after warm-up\n'
                '[worker 0] trained to step 20: %.1f images/sec after warm-up\n'
                'towers launch: every training task finished\n' % rate)
    monkeypatch.setattr(clusterbench, 'run_towers', towers)
    rows = clusterbench.run_cluster_bench('collective', [1, 2], ['--steps', '20'], rounds=2,
                                          log=lambda line: None)
    assert made[:4] == [
        ['train', '--towers', '1', '--steps', '20'],
        ['launch', '--workers', '1', '--ps', '0', '--grace', '5', '--', 'train',
         '--cluster-mode', 'collective', '--towers', '1', '--steps', '20'],
        ['train', '--towers', '2', '--steps', '20'],
        ['launch', '--workers', '2', '--ps', '0', '--grace', '5', '--', 'train',
         '--cluster-mode', 'collective', '--towers', '1', '--steps', '20']]
    assert made[4:] == made[:4]  # the second round, in the same turns
    assert [(r['config'], r['mean']) for r in rows] == [
        ('one process, 1 tower(s)', 105.0), ('1 worker(s) x 1 tower(s)', 51.0),
        ('one process, 2 tower(s)', 195.0), ('2 worker(s) x 1 tower(s)', 63.0)]
    assert [r['stderr'] for r in rows] == pytest.approx([5.0, 1.0, 5.0, 3.0], rel=1e-12)
    assert [r['vs_one_process'] for r in rows] == [1.0, 51 / 105, 1.0, 63 / 195]
    lines = clusterbench.table_lines(rows, 'collective', 217640, {})
    assert lines[4].split() == ['2', 'worker(s)', 'x', '1', 'tower(s)', '63.0', '±', '3.0',
                                '0.323', '435.28', 'kB', '(ring:', '2(n-1)/n*S', 'per',
                                'worker)']


def test_a_run_without_a_rate_or_a_failing_run_is_one_error(monkeypatch):
    monkeypatch.setattr(clusterbench, 'run_towers', lambda command, timeout: 'step 3/3\n')
    with pytest.raises(TowersError, match='no images/sec from `towers train --towers`'):
        clusterbench.run_cluster_bench('collective', [1], [], rounds=2, log=print)
    with pytest.raises(TowersError, match='cluster_mode parameter-server needs ps of at least 1'):
        clusterbench.run_cluster_bench('parameter-server', [1], [], ps=0, log=print)


def test_a_launch_keeps_its_task_logs_only_where_it_failed(monkeypatch, tmp_path):
    """Without a --logs of the bench's, every launch it made left a /tmp/towers-launch-*."""
    monkeypatch.setattr('tempfile.tempdir', str(tmp_path))
    seen = []

    def run(argv, **kwargs):
        assert argv[3:5] == ['launch', '--logs'] and argv[6:] == ['--workers', '2']
        seen.append(argv[5])
        with open(os.path.join(argv[5], 'worker-0.log'), 'w') as f:
            f.write('what the task said\n')
        return subprocess.CompletedProcess(argv, len(seen) - 1, 'the output\n', 'it broke\n')

    monkeypatch.setattr(subprocess, 'run', run)
    assert clusterbench.run_towers(['launch', '--workers', '2'], 60) == 'the output\n'
    assert not os.path.exists(seen[0])
    with pytest.raises(TowersError) as failed:
        clusterbench.run_towers(['launch', '--workers', '2'], 60)
    assert str(failed.value) == ('`towers launch --workers 2` failed (status 1): it broke '
                                 '(task logs in %s)' % seen[1])
    assert os.listdir(seen[1]) == ['worker-0.log']
    assert os.path.dirname(seen[1]) == str(tmp_path)


def test_bench_flags_that_do_not_go_with_a_cluster_are_one_line(capsys):
    assert main(['bench', '--cluster-mode', 'collective', '--towers', '1,2']) == 1
    assert capsys.readouterr().err.splitlines() == [
        'towers: error: --cluster-mode times one --towers count per task and one --input, '
        'without --compare']
