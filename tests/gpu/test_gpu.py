"""What only a GPU shows: logical GPUs, NCCL and its stand-in, staging onto GPUs, NCHW, tensor
cores, exact resume, the untraced placement audit, the warm probe, Keras on logical GPUs.

Every test runs `towers` in a process of its own: TensorFlow fixes a process's logical GPUs
at its first Session, and these runs split the GPUs in different ways. Skipped where
TensorFlow sees no GPU (tests/conftest.py); `python -m pytest -m gpu tests` runs them.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from towers.devices import logical_gpu_devices

pytestmark = pytest.mark.gpu

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
SMALL = ('--model', 'small_convnet', '--batch-size', '64', '--eval-every', '0', '--quiet')


def _gpus():
    return len(tf.config.list_physical_devices('GPU'))


def _capability():
    gpu = tf.config.list_physical_devices('GPU')[0]
    return tuple(tf.config.experimental.get_device_details(gpu)['compute_capability'])


def _towers(*args, timeout=240, cwd=None):
    """`python -m towers ARGS` in a fresh process; the process, its exit status asserted 0."""
    process = subprocess.run([sys.executable, '-m', 'towers'] + list(args), env=ENV, cwd=cwd,
                             capture_output=True, text=True, timeout=timeout)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    return process


def test_more_towers_than_gpus_train_on_logical_gpus_audited_without_a_trace():
    count = _gpus() + 1
    towers = ','.join(logical_gpu_devices(count, _gpus()))
    process = _towers('train', '--towers', str(count), '--steps', '20', *SMALL)
    out = process.stdout.splitlines()
    assert any(line.startswith('training 20 steps on %d tower(s) %s,' % (count, towers))
               for line in out), out
    logical = [line for line in out if line.startswith('logical GPUs: ')]
    assert len(logical) == 1 and re.search(r'2 tower\(s\) on GPU 0 \(/gpu:0, /gpu:1\), '
                                           r'\d+\.\d GiB each', logical[0]), logical
    # The placement audit reads the partition graphs of an untraced step: no CUPTI.
    assert 'CUPTI' not in process.stderr and 'cupti' not in process.stderr


def test_no_logical_gpus_refuses_in_one_line():
    count = _gpus() + 1
    process = subprocess.run([sys.executable, '-m', 'towers', 'train', '--towers', str(count),
                              '--no-logical-gpus', '--steps', '1', *SMALL], env=ENV,
                             capture_output=True, text=True, timeout=120)
    assert process.returncode == 1
    # (TensorFlow's CUDA build may log lines of its own there first.)
    assert [line for line in process.stderr.splitlines() if line.startswith('towers')] == [
        'towers: error: asked for %d GPU towers but this machine has %d visible GPU(s), and '
        '--no-logical-gpus refuses to split a GPU into logical ones; use --towers %d or fewer, '
        'or --devices cpu for CPU towers' % (count, _gpus(), _gpus())]


def test_replicated_towers_on_one_gpu_meet_in_a_shared_sum_not_nccl():
    process = _towers('train', '--towers', str(_gpus() + 1), '--variable-update', 'replicated',
                      '--steps', '10', *SMALL)
    variables = [line for line in process.stdout.splitlines() if line.startswith('variables:')]
    assert variables and '(not NCCL: towers 0,1 share GPU 0' in variables[0], variables


@pytest.mark.skipif(_gpus() < 2 if tf.config.list_physical_devices('GPU') else True,
                    reason='NCCL needs two GPUs')
def test_replicated_towers_on_gpus_of_their_own_meet_in_nccl():
    process = _towers('train', '--towers', '2', '--variable-update', 'replicated',
                      '--steps', '10', *SMALL)
    assert any(line.startswith('variables: a copy on each tower (replicated), all-reduced by '
                               'NCCL;') for line in process.stdout.splitlines())


def test_check_four_towers_on_the_gpus_is_exact():
    # mnist_convnet, not resnet20: at its initial weights resnet20's gradients move by 7e-4 of
    # their scale when one device's batch is only permuted (ReLUs near zero flip), far past
    # float32's 1e-5, however the batch is split.
    process = _towers('check', '--towers', '4', '--devices', 'gpu', '--model',
                      'mnist_convnet')
    first = process.stdout.splitlines()[0]
    assert first.startswith('check: mnist_convnet on 4 tower(s) %s against 1 device'
                            % ','.join(logical_gpu_devices(4, _gpus()))), first


@pytest.mark.parametrize('input_mode', ['staging', 'dataset'])
def test_inputs_are_staged_onto_each_gpu(input_mode):
    # The placement audit of the first step fails the run where an op left its device.
    process = _towers('train', '--towers', '2', '--input', input_mode, '--steps', '10', *SMALL)
    assert 'trained to step 10' in process.stdout


def test_nchw_and_nhwc_resnet_give_the_same_check_under_determinism():
    for data_format in ('NCHW', 'NHWC'):
        process = _towers('train', '--model', 'resnet20', '--towers', '1', '--steps', '3',
                          '--batch-size', '32', '--eval-every', '0', '--quiet',
                          '--data-format', data_format)
        assert any(line.endswith('maps %s' % data_format)
                   for line in process.stdout.splitlines())


@pytest.mark.parametrize('precision,capability', [('bf16', (8, 0)), ('fp16', (7, 0))])
def test_mixed_precision_trains_on_tensor_cores_and_the_probe_says_how_fast(precision,
                                                                            capability):
    """The run trains and `towers devices` gives the probe's verdict with its figures. How fast
    is read, not asserted here (another process on the GPU moves it): .ci/gpu-checks.sh's lease
    stage prints the probe's ratio beside ResNet-50's in bench."""
    if _capability() < capability:
        pytest.skip('%s tensor cores come with compute capability %d.%d' % (
            (precision,) + capability))
    process = _towers('train', '--model', 'resnet20', '--towers', '1', '--steps', '5',
                      '--batch-size', '64', '--eval-every', '0', '--quiet',
                      '--precision', precision)
    assert re.search(r'^step 5/5 .*: loss \d', process.stdout, re.M), process.stdout
    devices = _towers('devices', '--towers', '1').stdout
    assert re.search(r'^%s on /gpu:0 \(.*, compute capability \d+\.\d\): (fast|no faster|slow), '
                     r'[\d.e-]+x float32 measured \(conv [\d.e-]+x, matmul [\d.e-]+x\); %s tensor '
                     r'cores from compute capability ' % (precision, precision), devices,
                     re.M), devices


def test_compare_times_keras_on_logical_gpus_at_every_tower_count():
    """Keras (eager) is given the logical GPUs the towers' first Session made, before any eager
    call: at a tower count that splits a GPU it is timed, not skipped."""
    counts = (1, _gpus() + 1)
    process = _towers('bench', '--compare', '--model', 'small_convnet', '--towers',
                      '%d,%d' % counts, '--batch-size', '8', '--warmup', '1', '--window', '2',
                      '--variable-update', 'replicated', '--devices', 'gpu', timeout=300)
    rows = [(line[:40].strip(), int(line[40:48])) for line in process.stdout.splitlines()
            if line.startswith('keras mirrored')]
    assert rows == [('keras mirrored', count) for count in counts], process.stdout
    assert 'keras mirrored at' not in process.stdout, process.stdout  # '... skipped'


def _variables(logdir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(logdir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def test_a_deterministic_gpu_run_stopped_and_resumed_equals_the_straight_run(tmp_path):
    run = ('train', '--deterministic', '--towers', '2', '--checkpoint-every', '0') + SMALL
    _towers(*run, '--steps', '12', '--logdir', str(tmp_path / 'straight'))
    _towers(*run, '--steps', '6', '--logdir', str(tmp_path / 'resumed'))
    resumed = _towers(*run, '--steps', '12', '--logdir', str(tmp_path / 'resumed'))
    assert any(line.startswith('resumed from ') for line in resumed.stdout.splitlines())
    straight, again = _variables(str(tmp_path / 'straight')), _variables(
        str(tmp_path / 'resumed'))
    assert sorted(straight) == sorted(again)
    differ = [name for name in straight if not np.array_equal(straight[name], again[name])]
    assert differ == []


@pytest.mark.parametrize('start', ['spawn', 'fork'])
def test_two_workers_on_one_gpu_share_it_and_all_reduce_through_the_ring(start):
    # fork: each worker forked from a launcher that imported TensorFlow, and starts CUDA itself.
    workers = _gpus() + 1
    process = _towers('launch', '--start', start, '--workers', str(workers), '--', 'train',
                      '--cluster-mode', 'collective', '--towers', '1', '--steps', '10', *SMALL,
                      timeout=300)
    assert '(workers share GPUs: their collectives take the ring, not NCCL)' in process.stdout
