"""--accumulate K: towers in time. N towers x K micro-batches make the update one device makes
on the whole batch, for any cut; with --sync-bn, the update of one device accumulating the
same K micro-batches; one Session.run a step, so a resume is a resume."""
import numpy as np
import pytest
import tensorflow as tf

from tests.harness import fed, run_graph
from towers import TrainConfig
from towers.cli import main
from towers.deviceplan import local_plan
from towers.errors import SettingError
from towers.graph import build_training_graph
from towers.model import ClassifierModel
from towers.models import layers
from towers.slicing import TowerSlice, micro_slices
from towers.tools.check import check_towers, in_micro_order

tf1 = tf.compat.v1

# Equality tests: TF32 off, op determinism on (tests/conftest.py).
pytestmark = pytest.mark.exact

SHAPE = (6, 6, 2)


def _batches(sizes, seed=0):
    rng = np.random.RandomState(seed)
    # Per-example offsets make each micro-batch's moments differ from the batch's.
    return [((rng.rand(n, *SHAPE) + rng.rand(n, 1, 1, 1) * 3).astype(np.float32),
             rng.randint(0, 3, n).astype(np.int64)) for n in sizes]


def _net(images, training):
    x = layers.conv2d(images, 4, 3, name='conv')
    return layers.dense(tf.nn.relu(x), 3, name='logits')


def _bn_net(images, training):
    x = layers.conv2d(images, 4, 3, activation=None, use_bias=False, name='conv')
    x = tf.nn.relu(layers.batch_norm(x, training, decay=0.5, name='bn'))
    return layers.dense(x, 3, name='logits')


def _cut(count, size, parts):
    """(count, first example's label) of each micro-batch of a slice of `size` rows of which
    `count` are real, labels 0, 1, 2, ..."""
    with tf.Graph().as_default(), tf1.Session() as sess:
        labels = tf.range(size, dtype=tf.int64)
        piece = TowerSlice(tf.zeros([size, 1, 1, 1]), labels, tf.constant(count), None)
        return sess.run([(m.count, m.labels) for m in micro_slices(piece, parts)])


def test_a_slice_is_cut_into_contiguous_micro_batches_the_first_larger():
    cut = _cut(7, 7, 3)
    assert [int(count) for count, _ in cut] == [3, 2, 2]
    assert [list(labels) for _, labels in cut] == [[0, 1, 2], [3, 4], [5, 6]]
    # Fewer examples than micro-batches: the empty ones carry a stand-in, count 0.
    assert [(int(c), list(x)) for c, x in _cut(2, 2, 4)] == [(1, [0]), (1, [1]), (0, [1]),
                                                             (0, [1])]
    # An empty tower's share (its one stand-in row): every micro-batch empty.
    assert [(int(c), list(x)) for c, x in _cut(0, 1, 2)] == [(0, [0]), (0, [0])]


# Each micro-batch is a graph of its own, so K is what these cost: K = 2 has what any K has,
# a first micro-batch and one after it that waits for its gradients; the one device goes to
# K = 4 for micro-batches between two others too.
@pytest.mark.parametrize('towers,accumulate,sizes', [
    (3, 2, [5, 23]),     # fewer examples than 3 x 2 micro-batches (an empty one), then 8/8/7
    (1, 4, [3])])        # one device, 4 micro-batches of a batch of 3 (the last one empty)
def test_n_towers_times_k_micro_batches_equal_one_device_on_the_whole_batch(towers, accumulate,
                                                                            sizes):
    result, has_batch_norm = check_towers(_net, SHAPE, towers, _batches(sizes),
                                          learning_rate=0.5, devices='cpu',
                                          accumulate=accumulate)
    assert not has_batch_norm
    assert result.gradient_diff <= 1e-6 * max(1.0, result.gradient_scale)
    assert result.variable_diff <= 1e-6 * max(1.0, result.scale)


def _equal_shares(tower_grads, weights):
    """A broken accumulation: the towers' gradients averaged as if their shares were equal."""
    from towers.gradients import average_gradients
    return average_gradients(tower_grads)


def test_a_wrong_weighting_is_caught():
    # Shares 4/3 and 3/2: unequal, so equal ones are wrong; K = 2 is enough to go through
    # the accumulating towers (each micro-batch is a graph of its own: K adds to the cost).
    result, _ = check_towers(_net, SHAPE, 2, _batches([7, 5]), learning_rate=0.5,
                             devices='cpu', accumulate=2, average=_equal_shares)
    assert result.gradient_diff > 1e-3


def test_with_sync_bn_n_towers_times_k_equal_one_device_accumulating_the_same_micro_batches():
    # 2 towers x 2 micro-batches of 2, then of 4: one device's micro-batches are the towers'
    # k-th together (examples 0, 1, 4, 5 first), not its batch's first half.
    batches = _batches([8, 16])
    synced, has_batch_norm = check_towers(_bn_net, SHAPE, 2, batches, learning_rate=0.5,
                                          devices='cpu', sync_bn=True, accumulate=2)
    assert has_batch_norm
    assert synced.gradient_diff <= 1e-5 * max(1.0, synced.gradient_scale)
    assert synced.variable_diff <= 1e-5 * max(1.0, synced.scale)


def test_one_device_accumulates_the_towers_k_th_micro_batches_together():
    images = np.arange(12, dtype=np.float32).reshape(12, 1, 1, 1)
    labels = np.arange(12, dtype=np.int64)
    _, order = in_micro_order((images, labels), 2, 3)
    # Towers 0-5 and 6-11, micro-batches of 2: one device's k-th is both towers' k-th.
    assert list(order) == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]
    with pytest.raises(SettingError, match=r"the 3 towers' k-th micro-batches of a batch of 10 "
                                           r"hold 6/4 examples where one device cuts 5/5: take "
                                           r"a batch_size that 6 divides"):
        in_micro_order((images[:10], labels[:10]), 3, 2)  # 4/3/3 towers: 2/2, 2/1, 2/1


def _trained(accumulate, steps=3, sync_bn=False, net=_net, towers=2):
    model = ClassifierModel(net, SHAPE, 3, optimizer='momentum', weight_decay=0.01)
    batches = _batches([10] * steps, seed=1)
    plan = local_plan(['/cpu:%d' % i for i in range(towers)])
    graph = build_training_graph(model, plan, seed=1, source=fed(batches), learning_rate=0.1,
                                 accumulate=accumulate, sync_bn=sync_bn)
    saved, _, per_step = run_graph(graph, steps, fetches={'loss': graph.loss,
                                                          'batch': graph.batch,
                                                          'accuracy': graph.metrics['accuracy']})
    return saved, per_step


def test_the_training_graph_reports_whole_batches_and_trains_as_without_accumulation():
    plain, plain_steps = _trained(1)
    accumulated, steps = _trained(2)  # each tower's 5 as 3 and 2
    assert [s['batch'] for s in steps] == [10, 10, 10]  # whole batches, not micro-batches
    for name in plain:
        np.testing.assert_allclose(accumulated[name], plain[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_allclose([s['loss'] for s in steps], [s['loss'] for s in plain_steps],
                               rtol=1e-5)
    # Accuracy is a count over the batch: the same fraction, to the last float64 digit.
    assert [s['accuracy'] for s in steps] == [s['accuracy'] for s in plain_steps]


def test_train_says_it_accumulates_and_a_resume_is_exact(tmp_path, capsys):
    flags = ['train', '--model', 'small_convnet', '--towers', '2', '--devices', 'cpu',
             '--batch-size', '12', '--accumulate', '2', '--eval-every', '0', '--quiet',
             '--seed', '3']
    # Three runs (straight, cut, resumed), each its own graph of 2 x 2 micro-batches: the
    # fewest steps and micro-batches that still cut a run and resume it.
    whole = str(tmp_path / 'whole')
    assert main(flags + ['--steps', '2', '--logdir', whole]) == 0
    out = capsys.readouterr().out.splitlines()
    assert ('accumulating: each tower runs its slice as 2 micro-batches one after another, '
            'and the step applies their summed gradients once') in out
    cut = str(tmp_path / 'cut')
    assert main(flags + ['--steps', '1', '--logdir', cut]) == 0
    assert main(flags + ['--steps', '2', '--logdir', cut]) == 0
    assert any(line.startswith('resumed from ') for line in capsys.readouterr().out.splitlines())
    for name, _ in tf1.train.list_variables(whole):
        a = tf.train.load_variable(whole, name)
        b = tf.train.load_variable(cut, name)
        assert np.array_equal(a, b), name


def test_a_config_refuses_no_micro_batch():
    with pytest.raises(SettingError, match=r'^accumulate must be at least 1, got 0$'):
        TrainConfig(accumulate=0)


def _dense(images, training):
    return layers.dense(images, 4, name='logits')


def test_a_tower_away_from_its_variables_reads_them_once_a_step_not_once_a_micro_batch():
    from towers.tools.explain import explain
    # K = 2: a read per micro-batch would be two.
    report = explain(_dense, (2, 2, 2), 4, local_plan(['/cpu:0', '/cpu:1']), batch_size=12,
                     accumulate=2)
    to_tower_1 = next(t for t in report['transfers'] if t['to'] == '/cpu:1')
    # logits/weights 8*4 float32 = 128 B and biases 16 B, once (tests/tools/test_explain.py
    # counts the same at K = 1).
    assert to_tower_1['kinds']['variables'] == 144
