"""LearningRate: the rate at chosen steps for each schedule, warm-up, bad --lr-schedule specs."""
import numpy as np
import pytest
import tensorflow as tf

from towers.errors import TowersError
from towers.schedules import LearningRate

tf1 = tf.compat.v1


def _rates(schedule, steps, steps_per_epoch):
    """The schedule's rate (float32) at each global step in steps."""
    with tf.Graph().as_default():
        global_step = tf1.placeholder(tf.int64, [], name='global_step')
        rate = schedule.build(global_step, steps_per_epoch)
        assert rate.dtype == tf.float32 and rate.shape.rank == 0
        with tf1.Session() as sess:
            return [float(sess.run(rate, {global_step: s})) for s in steps]


def test_constant_is_the_base_rate_at_every_step():
    for schedule in (LearningRate(0.05), LearningRate.parse(0.05),
                     LearningRate.parse(0.05, 'constant'), LearningRate.parse(0.05, None)):
        assert schedule.kind == 'constant'
        np.testing.assert_allclose(_rates(schedule, [0, 1, 999, 10 ** 9], 7), [0.05] * 4,
                                   rtol=1e-7)


def test_rate_follows_a_global_step_variable():
    """Built on the real int64 step counter, the rate moves as the counter is assigned."""
    schedule = LearningRate.parse(0.1, 'exponential:0.5,1')
    with tf.Graph().as_default():
        global_step = tf1.train.get_or_create_global_step()
        rate = schedule.build(global_step, 4)
        new_step = tf1.placeholder(tf.int64, [])
        assign = global_step.assign(new_step)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            seen = []
            for s in (0, 3, 4, 8):
                sess.run(assign, {new_step: s})
                seen.append(float(sess.run(rate)))
    np.testing.assert_allclose(seen, [0.1, 0.1, 0.05, 0.025], rtol=1e-6)


def test_piecewise_inside_each_piece():
    """piecewise:2=0.01,4=0.001, 10 steps an epoch: 0.1 in epochs 0-1, 0.01 in 2-3, then 0.001."""
    schedule = LearningRate.parse(0.1, 'piecewise:2=0.01,4=0.001')
    assert schedule.points == [(2.0, 0.01), (4.0, 0.001)]
    steps = [0, 5, 18, 25, 38, 45, 1000]
    np.testing.assert_allclose(_rates(schedule, steps, 10),
                               [0.1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


def test_piecewise_changes_exactly_at_the_epoch_boundary():
    """Global step 20 is the first step of epoch 2 ("from each EPOCH on the rate is LR")."""
    schedule = LearningRate.parse(0.1, 'piecewise:2=0.01,4=0.001')
    np.testing.assert_allclose(_rates(schedule, [19, 20, 39, 40], 10),
                               [0.1, 0.01, 0.01, 0.001], rtol=1e-6)


def test_exponential_is_a_staircase_every_epochs_steps():
    """exponential:0.1,2 with 5 steps an epoch: x0.1 every 10 steps, as the CIFAR-10 tutorial."""
    schedule = LearningRate.parse(0.1, 'exponential:0.1,2')
    assert (schedule.factor, schedule.every) == (0.1, 2.0)
    steps = [0, 9, 10, 19, 20, 29, 30]
    expected = [0.1 * 0.1 ** (s // 10) for s in steps]
    np.testing.assert_allclose(_rates(schedule, steps, 5), expected, rtol=1e-5)
    # The same numbers as the tutorial's own call, decay_steps = 2 epochs in steps.
    with tf.Graph().as_default():
        global_step = tf1.placeholder(tf.int64, [])
        tutorial = tf1.train.exponential_decay(0.1, global_step, 10, 0.1, staircase=True)
        with tf1.Session() as sess:
            reference = [float(sess.run(tutorial, {global_step: s})) for s in steps]
    np.testing.assert_allclose(_rates(schedule, steps, 5), reference, rtol=1e-6)


def test_fractional_epochs_round_to_whole_steps():
    # 0.5 epochs of 3 steps is 1.5 steps -> round(1.5) = 2 steps a stair.
    schedule = LearningRate.parse(1.0, 'exponential:0.5,0.5')
    np.testing.assert_allclose(_rates(schedule, [0, 1, 2, 3, 4], 3),
                               [1.0, 1.0, 0.5, 0.5, 0.25], rtol=1e-6)


def test_warmup_ramps_linearly_then_hands_over_to_the_rate():
    """--warmup-epochs 2 with 4 steps an epoch: rate * (s + 1) / 8 for s < 8, then the rate."""
    schedule = LearningRate.parse(0.8, warmup_epochs=2)
    steps = [0, 1, 3, 6, 7, 8, 50]
    expected = [0.8 * (s + 1) / 8 for s in steps[:5]] + [0.8, 0.8]
    np.testing.assert_allclose(_rates(schedule, steps, 4), expected, rtol=1e-6)


def test_warmup_in_front_of_a_schedule_multiplies_the_scheduled_rate():
    # exponential:0.5,1 with 4 steps an epoch and a 2-epoch (8-step) ramp.
    schedule = LearningRate.parse(1.0, 'exponential:0.5,1', warmup_epochs=2)
    steps = [0, 3, 4, 7, 8, 12]
    expected = [1.0 * 1 / 8, 1.0 * 4 / 8, 0.5 * 5 / 8, 0.5 * 8 / 8, 0.25, 0.125]
    np.testing.assert_allclose(_rates(schedule, steps, 4), expected, rtol=1e-6)
    assert 'warm-up over 2 epochs' in schedule.describe()


def test_describe_says_the_schedule():
    assert LearningRate.parse(0.1).describe() == 'constant 0.1'
    assert LearningRate.parse(0.1, 'piecewise:2=0.01,4=0.001').describe() == \
        '0.1, then 0.01 from epoch 2, 0.001 from epoch 4'
    assert LearningRate.parse(0.1, 'exponential:0.1,2').describe() == '0.1 x 0.1 every 2 epochs'


@pytest.mark.parametrize('spec', [
    'piecewise:', 'piecewise', 'piecewise:2=0.1,1=0.2', 'piecewise:2=0.1,2=0.2',
    'piecewise:0=0.1', 'piecewise:-1=0.1', 'piecewise:2=-0.1', 'piecewise:2=0',
    'piecewise:x=1', 'piecewise:2=y', 'piecewise:2', 'piecewise:2=0.1,', 'piecewise:2=0.1=3',
    'exponential:0.1', 'exponential:', 'exponential:0.1,2,3', 'exponential:a,2',
    'exponential:-0.1,2', 'exponential:0,2', 'exponential:0.1,0', 'exponential:0.1,-2',
    'cosine:x', 'cosine:1,2', 'cosine:nan', 'linear', 'constant:1', 'Piecewise:2=0.1',
])
def test_malformed_spec_is_a_one_line_error_naming_the_option(spec):
    with pytest.raises(TowersError) as error:
        LearningRate.parse(0.1, spec)
    message = str(error.value)
    assert message.startswith('lr_schedule wants constant, piecewise:EPOCH=LR,..., '
                              'exponential:FACTOR,EPOCHS, cosine[:EPOCHS] or poly[:POWER[,END]], '
                              'got %r' % spec)
    assert '\n' not in message


@pytest.mark.parametrize('spec', ['piecewise:2=nan', 'piecewise:nan=0.1', 'piecewise:inf=0.1',
                                  'exponential:inf,2', 'exponential:0.1,inf'])
def test_non_finite_numbers_in_a_spec_are_an_error(spec):
    with pytest.raises(TowersError, match='lr_schedule'):
        _rates(LearningRate.parse(0.1, spec), [0, 100], 10)


@pytest.mark.parametrize('base,shown', [(0, '0'), (-0.1, '-0.1')])
def test_rate_must_be_positive(base, shown):
    for spec in ('constant', 'piecewise:2=0.01', 'exponential:0.1,2'):
        with pytest.raises(TowersError) as error:
            LearningRate.parse(base, spec)
        assert str(error.value) == 'learning_rate must be positive, got %s' % shown


def test_warmup_epochs_must_not_be_negative():
    with pytest.raises(TowersError, match=r'^warmup_epochs must be 0 or more, got -1$'):
        LearningRate.parse(0.1, 'piecewise:2=0.01', warmup_epochs=-1)
    # 0 is no warm-up at all.
    assert _rates(LearningRate.parse(0.1, warmup_epochs=0), [0], 10) == pytest.approx([0.1])


def test_unknown_kind_in_the_constructor_lists_the_kinds():
    with pytest.raises(TowersError, match='unknown lr_schedule .linear.; choose one of: '
                                          'constant, piecewise, exponential, cosine'):
        LearningRate(0.1, 'linear')


def _cosine(base, step, warmup, length):
    """The cosine rate by its formula (Loshchilov & Hutter), after a warm-up of warmup steps."""
    after = max(step - warmup, 0)
    rate = base * 0.5 * (1 + np.cos(np.pi * min(after, length - warmup) / (length - warmup)))
    return rate * min(1.0, (step + 1) / warmup) if warmup else rate


def test_cosine_decays_from_the_rate_to_zero_over_the_run():
    """cosine over a 100-step run: the rate at step 0, half at step 50, 0 from step 100 on."""
    schedule = LearningRate.parse(0.1, 'cosine')
    steps = [0, 25, 50, 75, 99, 100, 150]
    with tf.Graph().as_default():
        global_step = tf1.placeholder(tf.int64, [])
        rate = schedule.build(global_step, 10, total_steps=100)
        with tf1.Session() as sess:
            seen = [float(sess.run(rate, {global_step: s})) for s in steps]
    np.testing.assert_allclose(seen, [_cosine(0.1, s, 0, 100) for s in steps], rtol=1e-5,
                               atol=1e-8)  # float32's cos near 0
    assert seen[2] == pytest.approx(0.05, rel=1e-6) and seen[-2] == seen[-1] == 0


def test_cosine_of_given_epochs_starts_after_the_warmup():
    """cosine:10 with 2 warm-up epochs at 10 steps an epoch: the ramp to step 19, then half a
    cosine over the 80 steps left of the 10 epochs."""
    schedule = LearningRate.parse(0.2, 'cosine:10', warmup_epochs=2)
    steps = [0, 9, 19, 20, 60, 99, 100]
    np.testing.assert_allclose(_rates(schedule, steps, 10),
                               [_cosine(0.2, s, 20, 100) for s in steps], rtol=1e-5, atol=1e-8)
    assert schedule.describe() == 'cosine from 0.2 to 0 over 10 epochs, linear warm-up over 2 ' \
                                  'epochs'


def test_cosine_needs_a_length_longer_than_its_warmup():
    with pytest.raises(TowersError, match=r'^lr_schedule cosine decays over the run: give its '
                                          r'length \(cosine:EPOCHS\) where the run has none$'):
        _rates(LearningRate.parse(0.1, 'cosine'), [0], 10)
    with pytest.raises(TowersError, match=r"EPOCHS must pass the warm-up's 5"):
        LearningRate.parse(0.1, 'cosine:5', warmup_epochs=5)
    with pytest.raises(TowersError, match=r'^lr_schedule cosine decays after the warm-up of 20 '
                                          r'steps, but the run is only 20 steps long$'):
        with tf.Graph().as_default():
            LearningRate.parse(0.1, 'cosine', warmup_epochs=2).build(tf.constant(0), 10, 20)
