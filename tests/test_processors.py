"""Gradient processors and weight decay: each alone on hand-made gradients, then in a graph.

The property that matters most: weight decay is added once, to the averaged
gradient, so N towers make the same step as one device on the same batch, and
that step is var - lr * (data gradient + rate * var).
"""
import contextlib

import numpy as np
import pytest
import tensorflow as tf

from tests.harness import ancestors, open_graph
from towers import models
from towers.deviceplan import local_plan
from towers.errors import TowersError
from towers.gradients import build_train_op
from towers.graph import build_training_graph
from towers.model import ClassifierModel
from towers.processors import ClipGlobalNorm, FreezeVariables, ScaleGradient, WeightDecay
from towers.tower import Tower

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)
LR = 0.1
WEIGHTS = ('conv1/weights', 'logits/weights')


def _run(fetches):
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        return sess.run(fetches)


def _variable(name, value):
    return tf1.get_variable(name, initializer=tf.constant(value, tf.float32))


def _batch(size, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(size, *SHAPE).astype(np.float32), rng.randint(0, 10, size).astype(np.int64)


def _model(**options):
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    return ClassifierModel(model_fn, SHAPE, 10, optimizer='sgd', **options)


@contextlib.contextmanager
def _session(model, devices, initial=None, **options):
    """A built TrainGraph and an initialized Session; initial: name -> value to load."""
    train = build_training_graph(model, local_plan(devices), seed=1, learning_rate=LR, **options)
    if initial is not None:
        initial = {v.op.name: initial[v.op.name] for v in _trainable(train)}
    with open_graph(train, initial) as sess:
        yield train, sess


def _trainable(train):
    return train.graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)


def _values(train, sess):
    """name -> value of every trainable variable."""
    variables = _trainable(train)
    return dict(zip([v.op.name for v in variables], sess.run(variables)))


def _feed(train, batch):
    return {train.source.images: batch[0], train.source.labels: batch[1]}


# The processors alone, on hand-made grads_and_vars.

def test_clip_global_norm_scales_every_gradient_by_one_factor():
    with tf.Graph().as_default():
        a, b, c = _variable('a', [0.0, 0.0]), _variable('b', [[0.0]]), _variable('c', [0.0])
        grads = [(tf.constant([3.0, 4.0]), a), (tf.constant([[12.0]]), b), (None, c)]
        clipped = ClipGlobalNorm(1.0)(grads)
        assert [v for _, v in clipped] == [a, b, c] and clipped[2][0] is None
        grad_a, grad_b = _run([clipped[0][0], clipped[1][0]])
    before = np.sqrt(3.0 ** 2 + 4.0 ** 2 + 12.0 ** 2)
    assert before == 13.0
    np.testing.assert_allclose(grad_a, [3 / 13, 4 / 13], rtol=1e-6)
    np.testing.assert_allclose(grad_b, [[12 / 13]], rtol=1e-6)
    after = np.sqrt(np.sum(grad_a ** 2) + np.sum(grad_b ** 2))
    np.testing.assert_allclose(after, 1.0, rtol=1e-6)


def test_clip_global_norm_leaves_a_smaller_norm_alone():
    with tf.Graph().as_default():
        a = _variable('a', [0.0, 0.0])
        (grad, _), = ClipGlobalNorm(5.0001)([(tf.constant([3.0, 4.0]), a)])
        np.testing.assert_allclose(_run(grad), [3.0, 4.0], rtol=1e-6)


@pytest.mark.parametrize('max_norm', [0, -1.0])
def test_clip_norm_must_be_positive(max_norm):
    with pytest.raises(TowersError, match='^clip_norm must be positive'):
        ClipGlobalNorm(max_norm)


def test_scale_gradient_first_matching_rule_wins():
    with tf.Graph().as_default():
        head = _variable('head/weights', [1.0, 1.0])
        body = _variable('body/weights', [1.0, 1.0])
        bias = _variable('body/biases', [1.0])
        unused = _variable('tail/weights', [1.0])
        bias_grad = tf.constant([7.0])
        grads = [(tf.constant([2.0, 4.0]), head), (tf.constant([2.0, 4.0]), body),
                 (bias_grad, bias), (None, unused)]
        scaled = ScaleGradient([('^head/', 10.0), ('weights$', 0.5)])(grads)
        assert [v for _, v in scaled] == [head, body, bias, unused]
        assert scaled[2][0] is bias_grad, 'a variable no rule matches keeps its gradient'
        assert scaled[3][0] is None
        grad_head, grad_body = _run([scaled[0][0], scaled[1][0]])
    np.testing.assert_allclose(grad_head, [20.0, 40.0])  # 10, not 10 * 0.5
    np.testing.assert_allclose(grad_body, [1.0, 2.0])


def test_scale_gradient_keeps_indexed_slices_sparse():
    with tf.Graph().as_default():
        table = _variable('embedding/weights', np.ones([4, 2], np.float32))
        sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([0, 3]),
                                  tf.constant([4, 2]))
        (grad, var), = ScaleGradient([('embedding', 3.0)])([(sparse, table)])
        assert var is table
        assert isinstance(grad, tf.IndexedSlices)
        values, indices, dense = _run([grad.values, grad.indices, tf.convert_to_tensor(grad)])
    np.testing.assert_allclose(values, [[3.0, 6.0], [9.0, 12.0]])
    np.testing.assert_array_equal(indices, [0, 3])
    np.testing.assert_allclose(dense, [[3, 6], [0, 0], [0, 0], [9, 12]])


def test_scale_gradient_bad_regex_is_a_towers_error():
    with pytest.raises(TowersError, match=r"gradient scale pattern '\(' is not a valid"):
        ScaleGradient([('(', 2.0)])


def test_freeze_drops_the_matched_variables_only():
    with tf.Graph().as_default():
        names = ['conv1/weights', 'conv1/biases', 'logits/weights', 'logits/biases']
        variables = [_variable(name, [1.0]) for name in names]
        grads = [(tf.constant([float(i)]), v) for i, v in enumerate(variables)]
        kept = FreezeVariables('^conv1/')(grads)
    assert kept == grads[2:]


def test_freezing_everything_is_an_error():
    with tf.Graph().as_default():
        a, b = _variable('a/weights', [1.0]), _variable('b/weights', [1.0])
        grads = [(tf.constant([1.0]), a), (None, b)]
        with pytest.raises(TowersError, match=r"^freeze '\.' matches every trained variable"):
            FreezeVariables('.')(grads)
        # What is left has no gradient: nothing would train either.
        with pytest.raises(TowersError, match='nothing would train'):
            FreezeVariables('^a/')(grads)
    with pytest.raises(TowersError, match=r"^freeze '\[' is not a valid regular expression"):
        FreezeVariables('[')


def test_weight_decay_adds_rate_times_var_to_matched_variables_only():
    with tf.Graph().as_default():
        weights = _variable('dense/weights', [1.0, -2.0])
        biases = _variable('dense/biases', [3.0])
        lookalike = _variable('dense/weights_mean', [5.0])  # the default pattern ends in weights$
        unused = _variable('other/weights', [4.0])
        grads = [(tf.constant([0.5, 0.5]), weights), (tf.constant([1.0]), biases),
                 (tf.constant([1.0]), lookalike), (None, unused)]
        decay = WeightDecay(0.1)
        decayed = decay(grads)
        assert [v for _, v in decayed] == [weights, biases, lookalike, unused]
        assert decayed[1][0] is grads[1][0] and decayed[2][0] is grads[2][0]
        assert decayed[3][0] is None, 'no gradient stays no gradient'
        grad_weights, loss = _run([decayed[0][0], decay.loss([weights, biases, lookalike,
                                                              unused])])
    np.testing.assert_allclose(grad_weights, [0.5 + 0.1 * 1.0, 0.5 + 0.1 * -2.0], rtol=1e-6)
    # rate * sum(v**2) / 2 over dense/weights and other/weights.
    np.testing.assert_allclose(loss, 0.1 * (1.0 + 4.0 + 16.0) / 2, rtol=1e-6)


def test_weight_decay_pattern_and_errors():
    with tf.Graph().as_default():
        weights = _variable('dense/weights', [1.0])
        biases = _variable('dense/biases', [2.0])
        decay = WeightDecay(0.5, pattern='bias')
        assert not decay.matches(weights) and decay.matches(biases)
        assert _run(decay.loss([weights, biases])) == pytest.approx(0.5 * 4.0 / 2)
        assert _run(WeightDecay(0.5).loss([biases])) == 0.0
    with pytest.raises(TowersError, match='^weight_decay must be 0 or more, got -0.1$'):
        WeightDecay(-0.1)
    with pytest.raises(TowersError, match=r"^decay_pattern '\(' is not a valid"):
        WeightDecay(0.1, pattern='(')


def test_build_train_op_decays_the_average_once_then_processes():
    """Two towers, shares 1/4 and 3/4: grad = 2 * (average + rate * v), applied once."""
    with tf.Graph().as_default():
        var = _variable('v', [1.0, 2.0])
        global_step = tf1.train.get_or_create_global_step()
        towers = [Tower('/cpu:0', 'tower_%d/' % i, None, None, None, {}, None, weight,
                        [(tf.constant(grad), var)])
                  for i, (grad, weight) in enumerate([([1.0, 1.0], 0.25), ([5.0, 5.0], 0.75)])]
        train_op, applied = build_train_op(
            towers, tf1.train.GradientDescentOptimizer(1.0), global_step,
            weight_decay=WeightDecay(0.5, pattern='v'), processors=[ScaleGradient([('v', 2.0)])])
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            np.testing.assert_allclose(sess.run(applied[0][0]), [9.0, 10.0])
            sess.run(train_op)
            np.testing.assert_allclose(sess.run(var), [1.0 - 9.0, 2.0 - 10.0])
            assert sess.run(global_step) == 1


# Through ClassifierModel and build_training_graph.

@pytest.fixture(scope='module')
def reference():
    """One SGD step without decay on one device: initial weights, data gradients, data loss."""
    batch = _batch(7)
    with _session(_model(), ['/cpu:0']) as (train, sess):
        initial = _values(train, sess)
        (tower,) = train.towers
        names = [v.op.name for _, v in tower.grads_and_vars]
        grads = sess.run([g for g, _ in tower.grads_and_vars], _feed(train, batch))
        loss = sess.run(train.loss, _feed(train, batch))
    return batch, initial, dict(zip(names, grads)), loss


def _one_step(devices, initial, batch, **options):
    """(loss before the step, variables after one step) of an SGD ClassifierModel."""
    with _session(_model(**options), devices, initial) as (train, sess):
        loss = sess.run(train.loss, _feed(train, batch))
        sess.run(train.train_op, _feed(train, batch))
        assert sess.run(train.global_step) == 1
        return loss, _values(train, sess)


def test_weight_decay_counts_once_whatever_the_number_of_towers(reference):
    batch, initial, data_grads, _ = reference
    rate = 0.01
    _, one = _one_step(['/cpu:0'], initial, batch, weight_decay=rate)
    _, three = _one_step(['/cpu:0', '/cpu:1', '/cpu:2'], initial, batch, weight_decay=rate)
    for name, before in initial.items():
        decay = rate * before if name in WEIGHTS else 0.0
        expected = before - LR * (data_grads[name] + decay)
        np.testing.assert_allclose(one[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(three[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(three[name], one[name], rtol=1e-5, atol=1e-7, err_msg=name)
    for name in WEIGHTS:
        # What the decay alone moved: rate * var once, to 1% of its size (3 towers each
        # adding it would make it 3 times as large).
        without_decay = initial[name] - LR * data_grads[name]
        for after in (one[name], three[name]):
            shift = after.astype(np.float64) - without_decay
            np.testing.assert_allclose(shift, -LR * rate * initial[name],
                                       atol=0.01 * LR * rate * np.abs(initial[name]).max(),
                                       err_msg=name)


def test_reported_loss_is_data_loss_plus_the_decay_term(reference):
    batch, initial, _, data_loss = reference
    rate = 0.01
    loss, _ = _one_step(['/cpu:0', '/cpu:1', '/cpu:2'], initial, batch, weight_decay=rate)
    l2 = sum(np.sum(initial[name].astype(np.float64) ** 2) / 2 for name in WEIGHTS)
    assert rate * l2 > 1e-3 * data_loss
    np.testing.assert_allclose(loss, data_loss + rate * l2, rtol=1e-5)


def test_a_step_reports_the_decay_of_the_weights_it_ran_on_not_of_their_update(reference):
    """Fetched with the update, the loss is the data loss plus the decay term of the weights
    before it: every apply waits for the term's reads. (Without that wait the two raced, and
    a step now and then reported the decay of its updated weights.)"""
    batch, initial, _, data_loss = reference
    rate = 0.01
    with _session(_model(weight_decay=rate), ['/cpu:0', '/cpu:1'], initial) as (train, sess):
        loss, _ = sess.run([train.loss, train.train_op], _feed(train, batch))
        term = train.graph.get_tensor_by_name('total_loss:0').op.inputs[1].op
        applies = [op for op in train.graph.get_operations()
                   if op.type.startswith('ResourceApply')]
        assert len(applies) == len(initial)
        assert all(term in ancestors(op) for op in applies)
    l2 = sum(np.sum(initial[name].astype(np.float64) ** 2) / 2 for name in WEIGHTS)
    np.testing.assert_allclose(loss, data_loss + rate * l2, rtol=1e-5)


def test_clip_norm_limits_the_sgd_update_to_lr_times_clip_norm(reference):
    batch, initial, data_grads, _ = reference
    clip_norm = 1e-2
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in data_grads.values()))
    assert norm > 10 * clip_norm, 'the clip must bite for this test to mean anything'
    _, after = _one_step(['/cpu:0', '/cpu:1'], initial, batch, clip_norm=clip_norm)
    update = np.sqrt(sum(np.sum((after[n].astype(np.float64) - initial[n]) ** 2)
                         for n in initial))
    np.testing.assert_allclose(update, LR * clip_norm, rtol=1e-3)
    # The same direction as the unclipped gradient: every variable scaled by one factor.
    for name, before in initial.items():
        expected = before - LR * data_grads[name] * (clip_norm / norm)
        np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)


def test_frozen_variables_stay_put_and_do_not_decay(reference):
    batch, initial, _, _ = reference
    model = _model(freeze='^conv1/', weight_decay=0.01)
    with _session(model, ['/cpu:0', '/cpu:1'], initial) as (train, sess):
        for seed in (1, 2):
            sess.run(train.train_op, _feed(train, _batch(4, seed)))
        assert sess.run(train.global_step) == 2
        after = _values(train, sess)
    for name in ('conv1/weights', 'conv1/biases'):
        np.testing.assert_array_equal(after[name], initial[name])
    for name in ('logits/weights', 'logits/biases'):
        assert np.abs(after[name] - initial[name]).max() > 1e-4, name


def test_freezing_every_variable_fails_when_the_graph_is_built():
    with pytest.raises(TowersError, match='matches every trained variable'):
        build_training_graph(_model(freeze='/'), local_plan(['/cpu:0']))


def test_ema_follows_tensorflows_formula_and_feeds_the_eval_towers():
    devices = ['/cpu:0', '/cpu:1']
    decay = 0.5
    eval_batch = _batch(5, seed=9)
    with _session(_model(), devices, ema_decay=decay) as (train, sess):
        variables = _trainable(train)
        averages = [train.ema.average(v) for v in variables]
        assert all(a is not None for a in averages)
        current = sess.run(variables)
        average = sess.run(averages)
        for value, mean in zip(current, average):
            np.testing.assert_array_equal(mean, value)  # the average starts at the variable
        # Steps 1 and 2, then a jump to step 10 where the cap `decay` takes over.
        for start, seed in ((None, 1), (None, 2), (10, 3)):
            if start is not None:
                train.global_step.load(start, sess)
            sess.run(train.train_op, _feed(train, _batch(4, seed)))
            step = sess.run(train.global_step)
            factor = min(decay, (1.0 + step) / (10.0 + step))
            new = sess.run(variables)
            average = [factor * mean + (1 - factor) * value
                       for mean, value in zip(average, new)]
            for got, want in zip(sess.run(averages), average):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
            current = new
        assert factor == decay and step == 11
        feed = {train.eval_images: eval_batch[0], train.eval_labels: eval_batch[1]}
        eval_loss = sess.run(train.eval_loss, feed)
        names = [v.op.name for v in variables]
        raw, averaged = dict(zip(names, current)), dict(zip(names, average))

    def loss_with(weights):
        with _session(_model(), devices, weights) as (plain, plain_sess):
            return plain_sess.run(plain.eval_loss, {plain.eval_images: eval_batch[0],
                                                    plain.eval_labels: eval_batch[1]})

    np.testing.assert_allclose(eval_loss, loss_with(averaged), rtol=1e-5)
    assert abs(eval_loss - loss_with(raw)) > 1e-4


@pytest.mark.parametrize('decay_on,decayed', [
    ('weights', ['conv1/weights', 'logits/weights']),
    ('not-norms', ['conv1/weights', 'conv1/biases', 'logits/weights', 'logits/biases']),
    ('all', ['conv1/weights', 'conv1/biases', 'bn1/beta', 'bn1/gamma', 'logits/weights',
             'logits/biases']),
])
def test_decay_on_picks_the_variables_by_name(decay_on, decayed):
    """--decay-on: the kernels alone; all but batch norm's beta and gamma; everything."""
    from towers.model import DECAY_PATTERNS
    names = ['conv1/weights', 'conv1/biases', 'bn1/beta', 'bn1/gamma', 'logits/weights',
             'logits/biases']
    with tf.Graph().as_default():
        variables = [tf1.get_variable(n, [2]) for n in names]
        decay = WeightDecay(0.1, DECAY_PATTERNS[decay_on])
        assert [v.op.name for v in variables if decay.matches(v)] == decayed
