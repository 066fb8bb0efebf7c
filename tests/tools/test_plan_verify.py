"""`towers plan --verify`: what it refuses before timing anything, the runs it makes, and one
real run on emulated links, whose bytes are held against the plan's (its step is not: it
moves with the machine's load)."""
import json
import os

import pytest

from towers.cli import main
from towers.cluster import emulate
from towers.config import TrainConfig
from towers.tools import bench, clusterbench, linkbench, plan

MODEL = ['plan', '--model', 'small_convnet', '--verify']


@pytest.mark.parametrize('flags,message', [
    (['--step-seconds', '1'], "--verify runs towers' own model, timed here: not with "
                              '--device-flops, --step-seconds or --gradient-bytes'),
    (['--device-flops', '1T'], "--verify runs towers' own model, timed here: not with"),
    (['--workers', '2,3', '--latency', '0'],
     '--verify runs every worker here on cores of its own, as the plan times one: --workers '
     'of at most 2 with --threads 1 on 2 CPUs, not 3'),
    (['--workers', '1,2', '--threads', '2', '--latency', '0'],
     '--workers of at most 1 with --threads 2 on 2 CPUs, not 2'),
    (['--workers', '2'], '--verify: a --latency above 0 needs the netem qdisc, which this '
                         'kernel does not have; give --latency 0'),
    (['--workers', '2', '--latency', '0', '--rounds', '0'], '--rounds is at least 1, got 0'),
])
def test_what_cannot_be_verified_is_refused_in_one_line_before_a_step_is_timed(
        capsys, monkeypatch, flags, message):
    monkeypatch.setattr(linkbench, 'unavailable', lambda: None)
    monkeypatch.setattr(linkbench, 'has_netem', lambda: False)
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})
    monkeypatch.setattr(bench, 'measure_one_worker', _never)
    assert main(MODEL + flags) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_machine_that_cannot_emulate_links_is_refused_with_its_reason(capsys, monkeypatch):
    monkeypatch.setattr('os.geteuid', lambda: 1000)
    monkeypatch.setattr(bench, 'measure_one_worker', _never)
    assert main(MODEL + ['--workers', '2', '--latency', '0']) == 1
    assert capsys.readouterr().err == ('towers: error: --verify: emulating links needs root '
                                       '(network namespaces and tc)\n')


def test_each_mode_and_count_runs_on_its_weak_scaled_batch_with_the_plans_compute(
        monkeypatch):
    made = []

    def towers(command, timeout):
        made.append(command)
        workers, ps = int(command[2]), int(command[4])
        names = ['worker %d' % k for k in range(workers)] + ['ps %d' % p for p in range(ps)]
        return '\n'.join(['[worker 0] trained to step 14: %d.0 images/sec after warm-up'
                          % (320 * workers),
                          "towers launch: link use per step over the chief's steps 2-14 "
                          '(0.2 s a step):'] + ['towers launch:   %s sent 2000 bytes, received '
                                                '2000 bytes' % name for name in names])
    monkeypatch.setattr(clusterbench, 'run_towers', towers)
    monkeypatch.setattr(linkbench, 'unavailable', lambda: None)
    monkeypatch.setattr(linkbench, 'measure_one_worker', _never)
    monkeypatch.setattr(plan, 'model_sizes', lambda model_fn, shape: [1000, 3000])
    rows = linkbench.verify_plan(['collective', 'parameter-server'], [1, 2], ['--model', 'm'],
                                 None, (28, 28, 1), 10, 64, '100kB,0', 0.2, ps='workers',
                                 rounds=1, window=4, log=lambda line: None)
    steps = ['--steps', str(TrainConfig.warmup_steps + 4), '--eval-every', '0', '--quiet',
             '--threads', '1']
    assert made == [
        ['launch', '--workers', str(n), '--ps', str(ps), '--emulate-link', '100kB,0', '--grace',
         '5', '--', 'train', '--cluster-mode', mode, '--towers', '1', '--model', 'm'] + steps
        + ['--batch-size', str(64 * n)] + bucket + ['--log-every', '1']
        for mode, ps_of, bucket in (('collective', lambda n: 0, ['--all-reduce-bucket', 'auto']),
                                    ('parameter-server', lambda n: n, []))
        for n in (1, 2) for ps in [ps_of(n)]]
    # Each row's plan is `towers plan`'s, from the one compute it timed: 64 images a worker.
    for row in rows:
        mode, n = row['planned']['mode'], row['workers']
        assert row['planned'] == plan.predict(
            mode, [n], 0.2, 64, [1000, 3000], 1e5, 0.0, ps='workers',
            input_bytes=plan.slice_bytes((28, 28, 1), 64),
            bucket_bytes=500 if mode == 'collective' else 0)[0]
        assert row['measured_s'] == (0.2, None)  # 64n images at 320n images/sec, one round
    assert [(row['planned']['mode'], row['workers'], row['tasks']) for row in rows][1:3] == [
        ('collective', 2, [('worker 0', 4000, 4000, 2000, 2000),
                           ('worker 1', 4000, 4000, 2000, 2000)]),
        ('parameter-server', 1, [('worker 0', 4000, 4000, 2000, 2000),
                                 ('ps 0', 4000, 4000, 2000, 2000)])]
    planned = rows[1]['planned']['step_s']
    assert linkbench.table_lines(rows)[2].split() == [
        'collective', '2', '%.4f' % planned, 's', '0.2000', 's', '%.2f' % (0.2 / planned)]


@pytest.mark.skipif(emulate.unavailable() is not None, reason=emulate.unavailable() or '')
def test_a_verified_plan_moves_the_planned_bytes(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    window = 10
    assert main(['plan', '--model', 'small_convnet', '--dataset', 'imagenet-synthetic',
                 '--workers', '2', '--batch-size', '32', '--cluster-mode', 'collective',
                 '--all-reduce-bucket', '0', '--bandwidth', '20Mbit', '--latency', '0',
                 '--verify', '--rounds', '1', '--warmup', '2', '--window', str(window),
                 '--json']) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index('\n{') + 1:])
    [planned], [row] = report['plan'], report['verify']
    assert row['planned'] == planned and row['workers'] == 2
    sizes = plan.model_sizes(*_small_convnet())
    # The window's bounds, as tests/cluster/test_plan_emulated.py says why: one step of the
    # W = steps - 2 the meter counts may be half-way at either end.
    steps = TrainConfig.warmup_steps + window - 2
    for (task, sent, received), (name, sent_planned, received_planned, sent_seen,
                                 received_seen) in zip(plan.task_bytes('collective', 2, sizes),
                                                       row['tasks']):
        assert (name, sent_planned, received_planned) == (task, sent, received)
        for planned_bytes, seen in ((sent, sent_seen), (received, received_seen)):
            assert (steps - 1) / steps * planned_bytes <= seen <= 1.15 * planned_bytes, (
                task, planned_bytes, seen)


def _small_convnet():
    from towers import models
    return models.build_model('small_convnet', (28, 28, 1), 10), (28, 28, 1)


def _never(*args, **kwargs):
    raise AssertionError('a step was timed')
