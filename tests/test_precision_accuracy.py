"""Mixed precision ends where float32 ends: the default run on the CPU (`towers train --devices
cpu`: mnist_convnet on the shipped sample, seed 0) in bf16 and fp16 within half a point of fp32's
test accuracy, and a short fp16 run whose dynamic loss scale skips steps and grows back,
anywhere.

A run in a precision is made only where the probe (towers/tools/probe.py) measured that
precision fast enough on this CPU for the run to fit in a test, never from CPU flags: on an
Intel Xeon with avx512_fp16, TensorFlow's float16 convolutions ran at 0.003x float32, and the
default run in fp16 would have taken two hours.
"""
import contextlib
import functools
import io
import re
import time

import pytest
import tensorflow as tf

from towers import TrainConfig, data, precision, train, trainer
from towers.cli import main
from towers.models import layers
from towers.tools import probe

LIMIT = 40  # seconds a run in a mixed precision may take here (a test: 60 s at most)
# The default run in fp32 took 21 s on the fastest machine the suite has run on (an AVX-512
# EPYC; 45 to 85 s on a 2-core AVX2 one beside the other worker): where the probe says a
# precision would take LIMIT even from 15 s, it is skipped before fp32 is run.
FP32_AT_LEAST = 15
# Not alone: another test's load beside the fp32 run makes it slower, and the run in the
# precision as much; a run judged not to fit is skipped, saying what was measured, and no time
# is asserted.


def _fits(name, fp32_seconds, kind='ratio', about='~'):
    """Skip, saying what was measured, unless the run takes under LIMIT seconds in `name`.

    kind: what the run's work is like: 'ratio' (convs and matmuls), 'conv' or 'matmul'.
    about: how the run's seconds are known from fp32_seconds ('~', or 'at least ').
    """
    speed = probe.measure(name)
    if speed.error:
        pytest.skip('%s %s' % (name, speed.text()))
    expected = fp32_seconds / getattr(speed, kind)
    if expected > LIMIT:
        pytest.skip('%s measured %s float32 here (%s): this run would take %s%.0f s, over the '
                    '%d s a run of this test may' % (name, probe.times(getattr(speed, kind)),
                                                      speed.text(), about, expected, LIMIT))


def _timed(run, *args):
    start = time.perf_counter()
    result = run(*args)
    return result, time.perf_counter() - start


def _default_run(*flags):
    """(test images right of the 1000, the run's output) of `towers train --devices cpu` plus
    flags.

    Without the evaluation after each epoch (--eval-every 0): it changes nothing of
    the training, and the final test is the one compared.
    """
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(['train', '--quiet', '--log-every', '1000', '--eval-every', '0',
                     '--devices', 'cpu', *flags]) == 0
    match = re.search(r'^test: loss \d+\.\d+ accuracy (\d\.\d+) \(1000 images\)$',
                      out.getvalue(), re.M)
    assert match, out.getvalue()
    return round(float(match.group(1)) * 1000), out.getvalue()


@pytest.fixture(scope='module')
def fp32_default():
    """(images right, seconds) of the default run in fp32."""
    (right, _), seconds = _timed(_default_run)
    assert right >= 960  # the README's ~97%
    return right, seconds


@pytest.mark.parametrize('name', ['bf16', 'fp16'])
def test_the_default_run_ends_within_half_a_point_of_fp32(request, name):
    _fits(name, FP32_AT_LEAST, about='at least ')  # no fp32 run where a fast one would not do
    fp32_right, seconds = request.getfixturevalue('fp32_default')
    _fits(name, seconds)
    right, out = _default_run('--precision', name)
    assert abs(right - fp32_right) <= 5, (right, fp32_right)
    assert 'training 400 steps' in out


def _mlp(images, training):
    """784 -> 256 -> 10: matmuls only, so that its speed is the probe's matmul."""
    del training
    hidden = layers.dense(images, 256, activation=tf.nn.relu, name='hidden')
    return layers.dense(hidden, 10, name='logits')


def _mlp_run(name, digits):
    """(test images right of the 1000, log lines) of the MLP trained 10 epochs in `name`."""
    lines = []
    config = TrainConfig(towers=('/cpu:0',), precision=name, steps=400, batch_size=100,
                         eval_every=0, quiet=True, log_every=1000)
    result = train(config, _mlp, digits, (28, 28, 1), 10, log=lines.append)
    return round(result['test_accuracy'] * 1000), lines


def test_a_short_fp16_run_skips_grows_its_scale_back_and_ends_within_half_a_point(
        monkeypatch):
    digits = data.load_dataset('mnist_sample')
    (fp32_right, _), seconds = _timed(_mlp_run, 'fp32', digits)
    assert fp32_right >= 920
    _fits('fp16', seconds, 'matmul')
    # At 2**20 this MLP's gradients overflow float16: the first step is skipped and the
    # scale halved; after 20 finite steps it doubles, overflows again, and so on.
    monkeypatch.setattr(trainer, 'Precision', functools.partial(
        precision.Precision, initial_scale=2.0 ** 20, growth_steps=20))
    right, lines = _mlp_run('fp16', digits)
    skips = [(float(m.group(1)), float(m.group(2))) for m in map(re.compile(
        r'^step \d+ skipped: a float16 gradient overflowed at loss scale (\S+), .* the scale '
        r'is now (\S+)$').match, lines) if m]
    assert len(skips) >= 2, lines
    # After a skip the scale grew back: a later step overflowed at more than it had halved to.
    assert any(later[0] > earlier[1] for earlier, later in zip(skips, skips[1:])), skips
    assert abs(right - fp32_right) <= 5, (right, fp32_right)
