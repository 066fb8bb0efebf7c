"""towers explain: its numbers against a tiny model counted by hand."""
import json
import re

import pytest

from towers.cli import main
from towers.deviceplan import local_plan
from towers.models import layers
from towers.tools import plan
from towers.tools.explain import explain, report_lines

SHAPE = (2, 2, 2)


def _dense(images, training):
    return layers.dense(images, 4, name='logits')


@pytest.fixture(scope='module')
def report():
    # One dense layer 8 -> 4 on 2 towers, a global batch of 4 (2 + 2), SGD, the
    # variables on /cpu:0.
    return explain(_dense, SHAPE, 4, local_plan(['/cpu:0', '/cpu:1']), batch_size=4)


def test_each_device_holds_its_tower_and_variables(report):
    cpu0, cpu1 = report['devices']['/cpu:0'], report['devices']['/cpu:1']
    assert (cpu0['tower'], cpu0['examples'], cpu1['tower'], cpu1['examples']) == \
        ('tower_0', 2, 'tower_1', 2)
    # logits/weights 8*4 float32 = 128 B, logits/biases 16 B, global_step int64 8 B.
    assert (cpu0['variables'], cpu0['variable_bytes']) == (3, 152)
    assert (cpu1['variables'], cpu1['variable_bytes']) == (0, 0)
    assert report['averaging'] == ['/cpu:0'] and report['apply'] == ['/cpu:0']


def test_bytes_between_devices_per_step(report):
    to_tower_1, back = report['transfers']
    assert (to_tower_1['from'], to_tower_1['to'], back['from'], back['to']) == \
        ('/cpu:0', '/cpu:1', '/cpu:1', '/cpu:0')
    # To tower 1: the weights and biases it reads, 128 + 16 B; its slice of the batch,
    # images 2*2*2*2 float32 = 64 B and labels 2 int64 = 16 B, with its two int32
    # sizes (its count and the global batch), 8 B.
    assert to_tower_1['kinds'] == {'variables': 144, 'input': 88}
    # Back: its gradients, 128 + 16 B, and its float32 share of the batch, 4 B.
    assert back['kinds'] == {'gradients': 144, 'other': 4}
    assert report['bytes_per_step'] == 144 + 88 + 144 + 4


def test_flops_per_device_cover_the_towers_matmuls(report):
    # Each tower: forward MatMul 2*2*8*4 = 128 and weight-gradient MatMul 128, at least.
    cpu1 = report['devices']['/cpu:1']['flops']
    assert cpu1 >= 256
    # Tower 0 does the same and the average and apply besides.
    assert report['devices']['/cpu:0']['flops'] > cpu1


def test_report_lines_and_json(report, capsys):
    lines = report_lines(report, 'title')
    assert lines[1].startswith('/cpu:0   tower_0, 2 of 4 examples; ')
    # The step's peak depends on the order the executor's threads ran the ops in: its
    # figure is tested where it must move, with the batch (tests/test_memory.py).
    assert re.search(r'; 3 variables, 152 B; step peak \d+ B; gradient averaging, apply$',
                     lines[1])
    assert lines[3] == 'between devices per step: 380 B'
    assert main(['explain', '--model', 'small_convnet', '--towers', '2', '--devices', 'cpu',
                 '--batch-size', '8', '--json']) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert sorted(parsed['devices']) == ['/cpu:0', '/cpu:1']
    # small_convnet's 54,410 float32 parameters (217,640 B) cross to tower 1 and back.
    kinds = {(t['from'], t['to']): t['kinds'] for t in parsed['transfers']}
    assert kinds[('/cpu:0', '/cpu:1')]['variables'] == 217_640
    assert kinds[('/cpu:1', '/cpu:0')]['gradients'] == 217_640


def test_on_a_cluster_each_part_is_named_by_task_and_the_network_bytes_counted(tmp_path, forks):
    """In-graph over 2 workers and a ps, in a process of its own (its servers end with it)."""
    import json
    status, out, err = forks.run(
        ['explain', '--model', 'small_convnet', '--workers', '2', '--ps', '1', '--devices',
         'cpu', '--batch-size', '20', '--json'], tmp_path)
    assert status == 0, err
    report = json.loads('\n'.join(out))
    ps, chief, worker = ('/job:ps/task:0/cpu:0', '/job:worker/task:0/cpu:0',
                         '/job:worker/task:1/cpu:0')
    assert sorted(report['devices']) == [ps, chief, worker]
    assert report['devices'][chief]['tower'] == 'tower_0'
    assert report['devices'][worker]['tower'] == 'tower_1'
    assert report['devices'][worker]['examples'] == 10
    assert report['averaging'] == [ps] and report['apply'] == [ps]
    held = report['devices'][ps]['variable_bytes'] - 8  # all variables, less the int64 step
    pairs = {(t['from'], t['to']): t['kinds'] for t in report['transfers']}
    for task in (chief, worker):  # each task reads every weight and sends every gradient
        assert pairs[(ps, task)]['variables'] == held
        assert pairs[(task, ps)]['gradients'] == held
    # The fed batch goes from the chief to the other task: 10 images of 28x28 floats, their
    # int64 labels, the slice's count and the batch size (int32).
    assert pairs[(chief, worker)]['input'] == 10 * 28 * 28 * 4 + 10 * 8 + 2 * 4
    between = sum(t['bytes'] for t in report['transfers']
                  if t['from'].rsplit('/', 1)[0] != t['to'].rsplit('/', 1)[0])
    assert report['bytes_between_tasks'] == between >= 4 * held
    # What `towers plan` counts for in-graph: every tower's read and gradient, the slice fed.
    counted = sum(t['kinds'].get(kind, 0) for t in report['transfers'] for kind in
                  ('variables', 'gradients', 'input')
                  if t['from'].rsplit('/', 1)[0] != t['to'].rsplit('/', 1)[0])
    assert plan.bytes_between_tasks('in-graph', 2, [held], towers=1, ps=1, input_bytes=(
        plan.slice_bytes((28, 28, 1), 10))) == counted
