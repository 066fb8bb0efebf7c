"""What crossed each emulated link, and the bench that holds it against the plan."""
import pytest

from towers.cli import main
from towers.cluster import emulate
from towers.errors import TowersError
from towers.tools import clusterbench, linkbench, plan

MB = 1e6


class _Hosts:
    """Two hosts whose counters move by the given bytes at each read."""

    def __init__(self, steps):
        self.steps, self.reads = steps, 0

    def counters(self):
        self.reads += 1
        return [(self.reads * sent, self.reads * received) for sent, received in self.steps]


def test_the_meter_counts_each_host_over_the_chiefs_logged_steps():
    clock = iter([10.0, 11.0, 12.0, 15.0])
    meter = emulate.LinkMeter(_Hosts([(100, 200), (300, 50)]), ['worker 0', 'ps 0'],
                              clock=lambda: next(clock))
    for line in ('[worker 0] step 1/9 loss 2.3', '[worker 1] step 1/9 loss 2.3',
                 '[worker 0] step 3/9 loss 2.1', 'towers launch: something', '[worker 0] '
                 'step 5/9 loss 2.0', '[worker 0] step 9/9 loss 1.9'):
        meter.observe(line)
    # From the chief's second logged step (3, read 2) to its last (9, read 4): 6 steps, 4 s.
    assert meter.per_step() == (3, 9, 4 / 6, [(200 / 6, 400 / 6), (600 / 6, 100 / 6)])
    assert meter.lines() == [
        "towers launch: link use per step over the chief's steps 3-9 (0.6667 s a step):",
        'towers launch:   worker 0 sent 33 bytes, received 67 bytes',
        'towers launch:   ps 0 sent 100 bytes, received 17 bytes']
    assert linkbench.link_use('\n'.join(['[worker 0] done'] + meter.lines() + ['x'])) == (
        0.6667, {'worker 0': (33, 67), 'ps 0': (100, 17)})
    short = emulate.LinkMeter(_Hosts([(1, 1)]), ['worker 0'])
    short.observe('[worker 0] step 20/20 loss 1.0')
    assert short.per_step() is None
    assert short.lines() == ['towers launch: no link use per step: the chief logged 1 step(s); '
                             'give train a --log-every that logs three or more']
    with pytest.raises(TowersError, match='^towers launch: no link use per step: the chief'):
        linkbench.link_use('\n'.join(short.lines()))


def test_each_tasks_planned_bytes_a_step():
    sizes = [3 * MB, 1 * MB]
    assert plan.task_bytes('collective', 4, sizes) == [('worker %d' % k, 6 * MB, 6 * MB)
                                                       for k in range(4)]
    # One read and one push per worker, whatever its towers; each ps its share N times.
    assert plan.task_bytes('parameter-server', 2, sizes, towers=3, ps=2) == [
        ('worker 0', 4 * MB, 4 * MB), ('worker 1', 4 * MB, 4 * MB),
        ('ps 0', 6 * MB, 6 * MB), ('ps 1', 2 * MB, 2 * MB)]
    # In-graph without ps tasks: the chief holds the variables, reads locally, and feeds
    # the other worker its slice.
    assert plan.task_bytes('in-graph', 2, sizes, towers=2, input_bytes=1000) == [
        ('worker 0', 8 * MB + 1000, 8 * MB), ('worker 1', 8 * MB, 8 * MB + 1000)]


def test_the_bench_plans_and_measures_each_worker_count_in_turns(monkeypatch):
    made = []

    def towers(command, timeout):
        made.append(command)
        return ('[worker 0] trained to step 10: 640.0 images/sec after warm-up\n'
                "towers launch: link use per step over the chief's steps 2-10 (0.2 s a step):\n"
                'towers launch:   worker 0 sent 1100 bytes, received 1000 bytes\n'
                'towers launch:   worker 1 sent 1000 bytes, received 1100 bytes\n')
    monkeypatch.setattr(clusterbench, 'run_towers', towers)
    monkeypatch.setattr(linkbench, 'unavailable', lambda: None)
    monkeypatch.setattr(plan, 'model_sizes', lambda model_fn, shape: [1000])
    monkeypatch.setattr(linkbench, 'measure_one_worker', lambda *args, **kwargs: (320.0, 1.0))
    rows = linkbench.run_link_bench('collective', [2], ['--steps', '10'], None, (28, 28, 1),
                                    10, 128, '100kB,0', rounds=2, log=lambda line: None)
    assert made == [['launch', '--workers', '2', '--ps', '0', '--emulate-link', '100kB,0',
                     '--grace', '5', '--', 'train', '--cluster-mode', 'collective', '--towers',
                     '1', '--steps', '10', '--log-every', '1']] * 2
    [row] = rows
    # One worker's 64 images at 320 images/sec: 0.2 s; the ring moves S = 1000 bytes each way
    # over 100 kB/s less its framing.
    assert row['planned']['step_s'] == pytest.approx(0.2 + 1000 * 1514 / 1448 / 1e5)
    assert row['measured_s'] == (0.2, 0.0)  # 128 images at 640 images/sec
    assert row['tasks'] == [('worker 0', 1000, 1000, 1100, 1000),
                            ('worker 1', 1000, 1000, 1000, 1100)]
    lines = linkbench.table_lines(rows)
    assert lines[1].split() == ['collective', '2', '0.2105', 's', '0.2000', '±', '0.0000', 's',
                                '0.95']
    assert lines[4].split() == ['collective', '2', 'worker', '0', '1.00', 'kB', '/', '1.10',
                                'kB', '1.00', 'kB', '/', '1.00', 'kB']


def test_a_plan_of_a_model_towers_does_not_have_reads_its_size(capsys):
    assert main(['plan', '--gradient-bytes', '102.2MB', '--step-seconds', '1.2', '--workers',
                 '1,8', '--cluster-mode', 'collective', '--all-reduce-bucket', '0',
                 '--bandwidth', '10Gbit', '--latency', '0']) == 0
    out = capsys.readouterr().out
    assert 'S = 102.20 MB of gradients in 1024 variables' in out
    assert main(['plan', '--gradient-bytes', 'lots', '--step-seconds', '1.2']) == 1
    assert capsys.readouterr().err.strip() == (
        "towers: error: --gradient-bytes is a positive size such as 102.2MB or 800kB, "
        "not 'lots'")


def test_each_emulated_host_has_cores_of_its_own_where_there_are_enough():
    assert emulate.host_cores(2, [0, 1]) == [[0], [1]]
    assert emulate.host_cores(2, {5, 1, 3, 7, 9}) == [[1, 3], [5, 7]]  # equal shares, in order
    assert emulate.host_cores(3, [0, 1]) == [None, None, None]  # too few: they share them all
