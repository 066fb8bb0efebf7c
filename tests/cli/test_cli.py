"""The `towers` command: the end-to-end run, `devices`, one-line errors, --debug, --help."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from towers import data, models
from towers.cli import main
from towers.cli.main import _set_xla_flag
from towers.cli.parsers import build_parser

tf1 = tf.compat.v1

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
HAS_GPU = bool(tf.config.list_physical_devices('GPU'))


def _towers(*args, timeout=120, cwd=None):
    """Run `python -m towers ARGS` in a fresh process; the CompletedProcess (the timeout
    only catches a hang)."""
    return subprocess.run([sys.executable, '-m', 'towers'] + list(args), env=ENV, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_train_end_to_end_on_the_embedded_sample(tmp_path, forks):
    # The default net, mnist_convnet, one epoch: 0.933 here (0.946 and 0.958 at epochs 2 and
    # 3, which cost twice the CPU again and prove nothing more of the command; the bar leaves
    # other CPUs' kernels a point of rounding). small_convnet, at 2.4x less CPU time, tops
    # out at 0.95 on the sample. A process of its own: a fork of one that imported TensorFlow.
    logdir = tmp_path / 'run'
    with forks.training(['train', '--towers', '2', '--devices', 'cpu', '--epochs', '1',
                         '--batch-size', '50', '--logdir', str(logdir)], tmp_path) as run:
        status = run.finish(timeout=300)
    err, out = '\n'.join(run.err), '\n'.join(run.out)
    assert status == 0, err
    # How fast is for `towers bench`, not for a timed test on a shared machine
    # (this run takes ~10 s here); the timeout only catches a hang.
    assert 'Traceback' not in err and 'error' not in err
    assert 'training 80 steps on 2 tower(s) /cpu:0,/cpu:1, global batch 50' in out
    match = re.search(r'^test: loss (\d+\.\d+) accuracy (\d\.\d+) top5 (\d\.\d+) \(1000 images\)$',
                      out, re.M)
    assert match, out
    assert float(match.group(2)) >= 0.92, match.group(0)
    state = tf1.train.get_checkpoint_state(str(logdir))
    assert state is not None and state.model_checkpoint_path.endswith('model.ckpt-80')
    assert 'checkpoint: %s' % state.model_checkpoint_path in out


@pytest.mark.skipif(HAS_GPU, reason='a GPU is visible')
def test_devices_lists_virtual_cpus(capsys):
    assert main(['devices', '--towers', '3']) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == 'TensorFlow %s, CPU-only build' % tf.__version__
    lines = lines[1:]
    assert lines[:5] == ['visible GPUs: 0',
                         'tower_0: /cpu:0 (virtual CPU device)',
                         'tower_1: /cpu:1 (virtual CPU device)',
                         'tower_2: /cpu:2 (virtual CPU device)',
                         'variables: /cpu:0']
    # Then what bf16 and fp16 measured (tests/tools/test_hardware.py).
    assert [line.split(':')[0] for line in lines[5:]] == ['bf16 on CPU', 'fp16 on CPU']
    assert err == ''


def _blocked_logdir(tmp_path):
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a folder')
    return str(blocker / 'run')


BAD_INPUT = [
    (['train', '--model', 'nope'],
     "unknown model 'nope'; known models: " + ', '.join(models.model_names())),
    (['train', '--dataset', 'nope'],
     "unknown dataset 'nope'; known datasets: " + ', '.join(sorted(data.DATASETS))),
    (['bench', '--dataset', 'nope'], "unknown dataset 'nope'"),
    (['train', '--batch-size', '0'], '--batch-size must be at least 1, got 0'),
    (['train', '--steps', '0'], '--steps must be at least 1, got 0'),
    (['train', '--epochs', '0'], '--epochs must be positive'),
    (['train', '--lr', '0'], '--lr must be positive'),
    (['train', '--towers', '0'], '--towers must be at least 1, got 0'),
    (['devices', '--towers', '0'], '--towers must be at least 1, got 0'),
    (['devices', '--devices', '/cpu:0,/cpu:0'], 'names a device twice'),
    (['devices', '--devices', ','], 'names no device'),
    (['devices', '--devices', 'cpu', '--param-device', 'gpu'],
     '--param-device gpu needs GPU towers'),
    (['bench', '--towers', '0,1'], '--towers wants positive integers'),
    (['train', '--validation-size', '4000'], '--validation-size must be in [0, 4000)'),
    (['train', '--batch-size', '4001', '--steps', '1'],
     '--batch-size 4001 exceeds the 4000 training examples'),
    (['train', '--steps', '1', '--logdir', None], 'cannot create --logdir'),
    (['train', '--lr-schedule', 'linear'], "--lr-schedule wants constant, "
     "piecewise:EPOCH=LR,..., exponential:FACTOR,EPOCHS, cosine[:EPOCHS] or "
     "poly[:POWER[,END]], got 'linear'"),
    (['train', '--lr-schedule', 'piecewise:3=0.1,2=0.01'], 'epochs must increase'),
    (['train', '--warmup-epochs', '-1'], '--warmup-epochs must be 0 or more, got -1'),
    (['train', '--freeze', 'conv1/('], "--freeze 'conv1/(' is not a valid regular expression"),
    (['train', '--ema', '1'], '--ema must lie between 0 and 1'),
    (['train', '--weight-decay', '-0.1'], '--weight-decay must be 0 or more'),
    (['train', '--clip-norm', '0'], '--clip-norm must be positive, got 0'),
    (['train', '--keep-checkpoints', '0'], '--keep-checkpoints must be at least 1, got 0'),
    (['train', '--eval-every', '-1'], '--eval-every must be 0 (off) or more epochs'),
    (['train', '--steps', '1', '--best-metric', 'top3'],
     "--best-metric 'top3' is not a metric of this model; choose one of: loss, accuracy, top5"),
    (['train', '--freeze', '.', '--steps', '1'], "--freeze '.' matches every trained variable"),
    # Flags are checked before any data is read (cifar10 is not on this machine).
    (['check', '--towers', '0', '--dataset', 'cifar10'], 'check needs --towers, --batch-size, '
     '--steps and --accumulate of at least 1 and a positive --tolerance'),
    (['bench', '--compare', '--variable-update', 'ring', '--dataset', 'cifar10'],
     "--variable-update wants some of parameter_server,replicated,independent, got 'ring'"),
    (['bench', '--plot', 'p.png', '--dataset', 'cifar10'], '--plot goes with --compare'),
    (['bench', '--window', '1'], 'bench needs --batch-size >= 1, --window >= 2 and --warmup >= 0; '
     'got 128, 1 and 10'),
    (['train', '--best-metric', 'top3', '--dataset', 'cifar10'],
     "--best-metric 'top3' is not a metric of this model; choose one of: loss, accuracy, top5"),
    (['train', '--trace-step', '0'], '--trace-step must be at least 1, got 0'),
    (['train', '--loss-scale', '8'], '--loss-scale scales the float16 loss: use it with '
     '--precision fp16 (fp32 needs no loss scaling)'),
    (['check', '--precision', 'bf16', '--loss-scale', '8'], '--loss-scale scales the float16 '
     'loss: use it with --precision fp16 (bf16 needs no loss scaling)'),
    (['train', '--precision', 'fp16', '--loss-scale', '0'],
     '--loss-scale must be a positive finite number or "dynamic", got 0'),
    (['train', '--precision', 'fp16', '--loss-scale', '-4'],
     '--loss-scale must be a positive finite number or "dynamic", got -4'),
    (['train', '--precision', 'fp16', '--loss-scale', 'inf'],
     '--loss-scale must be a positive finite number or "dynamic", got inf'),
    (['explain', '--precision', 'fp16', '--loss-scale', 'nan'],
     '--loss-scale must be a positive finite number or "dynamic", got nan'),
    (['train', '--precision', 'fp16', '--loss-scale', 'big'],
     '--loss-scale must be a positive finite number or "dynamic", got \'big\''),
]
if not HAS_GPU:
    BAD_INPUT += [
        (['train', '--devices', '/gpu:0'], '/gpu:0 does not exist: this machine has 0 visible'),
        (['devices', '--param-device', '/gpu:0'], '/gpu:0 does not exist'),
    ]


@pytest.mark.parametrize('argv,message', BAD_INPUT,
                         ids=[' '.join(a for a in argv if a) for argv, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_status_1(capsys, tmp_path, argv, message):
    argv = [a if a is not None else _blocked_logdir(tmp_path) for a in argv]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith('towers: error: ') and message in lines[0], lines[0]
    assert 'training' not in out  # nothing was trained


def test_xla_sets_tf_xla_flags_for_cpu_towers_only(monkeypatch):
    parse = build_parser().parse_args
    monkeypatch.setenv('TF_XLA_FLAGS', '')  # put back as it was after the test
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    _set_xla_flag(parse(['train', '--devices', 'cpu']))
    assert os.environ['TF_XLA_FLAGS'] == ''
    # GPU towers: XLA clusters on their GPUs, and the host's ops stay as they are.
    for argv, cuda_build in ((['train', '--xla', '--devices', 'gpu'], True),
                             (['train', '--xla', '--devices', '/gpu:0,/gpu:1'], True),
                             (['train', '--xla'], True)):  # GPUs where there are any
        _set_xla_flag(parse(argv), cuda_build)
        assert os.environ['TF_XLA_FLAGS'] == '', argv
    _set_xla_flag(parse(['train', '--xla']), cuda_build=False)  # a CPU-only build's towers
    assert os.environ['TF_XLA_FLAGS'] == '--tf_xla_cpu_global_jit'
    monkeypatch.setenv('TF_XLA_FLAGS', '--tf_xla_min_cluster_size=2')  # a user's own stay
    for _ in range(2):  # added once
        _set_xla_flag(parse(['bench', '--xla', '--devices', 'cpu']), cuda_build=True)
    assert os.environ['TF_XLA_FLAGS'] == '--tf_xla_min_cluster_size=2 --tf_xla_cpu_global_jit'
    for argv in (['train', '--xla', '--devices', '/cpu:0,/cpu:1'], ['train', '--xla']):
        monkeypatch.setenv('TF_XLA_FLAGS', '')
        monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')  # every GPU hidden: CPU towers
        _set_xla_flag(parse(argv), cuda_build=True)
        assert os.environ['TF_XLA_FLAGS'] == '--tf_xla_cpu_global_jit', argv


@pytest.mark.parametrize('command', ['train', 'bench'])
def test_train_and_bench_refuse_xla_with_deterministic_in_one_line(capsys, monkeypatch, command):
    monkeypatch.setenv('TF_XLA_FLAGS', '')  # main sets it: put back as it was after the test
    assert main([command, '--xla', '--deterministic', '--devices', 'cpu']) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "towers: error: --xla and --deterministic do not go together: under op determinism "
        "TensorFlow's XLA has no max-pool gradient and the step would run uncompiled: drop one"]
    assert 'training' not in out and 'bench:' not in out


def test_debug_lets_the_exception_through(capsys):
    with pytest.raises(models.ModelError, match="unknown model 'nope'"):
        main(['--debug', 'train', '--model', 'nope'])
    assert 'towers: error' not in capsys.readouterr().err


def test_error_in_a_real_process_is_one_line_without_traceback(tmp_path, forks):
    status, out, err = forks.run(['train', '--model', 'nope'], tmp_path)
    assert status == 1
    assert err == ["towers: error: unknown model 'nope'; known models: "
                   + ', '.join(models.model_names())], err
    assert out == []


def test_debug_in_a_real_process_shows_the_traceback(tmp_path, forks):
    status, _, err = forks.run(['--debug', 'train', '--model', 'nope'], tmp_path)
    assert status == 1
    assert 'Traceback (most recent call last):' in err
    assert err[-1] == ("towers.models.errors.ModelError: unknown model 'nope'; known models: "
                       + ', '.join(models.model_names()))
    assert not any('towers: error' in line for line in err)


@pytest.mark.parametrize('argv,expected', [
    (['--help'], 'usage: towers'), (['train', '--help'], '--batch-size BATCH_SIZE')])
def test_help_exits_0_without_loading_tensorflow(argv, expected):
    process = _towers(*argv, timeout=30)
    assert process.returncode == 0, process.stderr
    assert expected in process.stdout
    check = subprocess.run(
        [sys.executable, '-c', 'import sys\nfrom towers.cli import main\n'
         'try:\n    main(%r)\nexcept SystemExit as e:\n    assert e.code == 0\n'
         'assert "tensorflow" not in sys.modules, "--help imported TensorFlow"' % argv],
        env=ENV, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr


def test_tensorflow_starts_without_keras_and_matplotlib_which_load_later_as_ever(tmp_path, forks):
    # What a `towers` process imports before its first line, and after: compare's Keras twins.
    # The fork server started as `towers` does, _import_tensorflow() first, and has imported
    # more since (this module run as a script imports more again): neither Keras nor
    # matplotlib in a fork of it means neither in TensorFlow's start, and the fork spares
    # the ~4 s of CPU a fresh process spends on importing TensorFlow.
    status, out, err = forks.run([], tmp_path, module='tests.cli.test_cli')
    assert status == 0, '\n'.join(err)[-3000:]
    assert out == ['[]', '(1, 2) matplotlib']


def _keras_and_matplotlib_after_tensorflow():
    """Print which of KEPT_OUT_OF_START this process has imported, then use both."""
    from towers.cli.main import KEPT_OUT_OF_START
    print(sorted(n for n in KEPT_OUT_OF_START if n in sys.modules))
    import keras
    import matplotlib
    print(keras.layers.Dense(2)(tf.ones([1, 3])).shape, matplotlib.__name__)


def test_console_script_help():
    script = os.path.join(os.path.dirname(sys.executable), 'towers')
    if not os.path.exists(script):
        pytest.skip('the towers console script is not installed next to %s' % sys.executable)
    process = subprocess.run([script, '--help'], env=ENV, capture_output=True, text=True,
                             timeout=30)
    assert process.returncode == 0 and 'usage: towers' in process.stdout


def _train_until_step_then(forks, sig, logdir, cwd):
    """Start a long training run, send `sig` once step 5 is logged; (status, out, err)."""
    with forks.training(['train', '--model', 'small_convnet', '--towers', '2', '--devices', 'cpu',
                         '--steps', '100000', '--log-every', '5', '--logdir', logdir],
                        cwd) as run:
        run.wait_for_line('step 5/')
        run.send_signal(sig)
        status = run.finish(timeout=60)
    return status, run.out, '\n'.join(run.err)


@pytest.mark.parametrize('sig,name,code', [(signal.SIGTERM, 'SIGTERM', 0),
                                           (signal.SIGINT, 'SIGINT', 130)])
def test_a_signal_finishes_the_step_saves_and_exits_cleanly(tmp_path, forks, sig, name, code):
    logdir = str(tmp_path / 'run')
    status, out, err = _train_until_step_then(forks, sig, logdir, str(tmp_path))
    assert status == code, err
    stop = [line for line in out if line.startswith(name + ': stopping after step ')]
    assert len(stop) == 1, out
    step = int(stop[0].rsplit(' ', 1)[1])
    assert step >= 5
    assert 'checkpoint: %s' % os.path.join(logdir, 'model.ckpt-%d' % step) in out
    assert tf.train.load_variable(logdir, 'global_step') == step
    assert not any(line.startswith('test:') for line in out)
    assert 'Traceback' not in err
    if code:
        assert err.strip().splitlines()[-1] == 'towers: interrupted'


@pytest.mark.parametrize('delay', [0.05, 0.4, 0.9])
def test_kill_9_at_any_moment_leaves_the_last_checkpoint_loadable(tmp_path, forks, delay):
    # A checkpoint every step: a SIGKILL that lands mid-save is likely.
    logdir = str(tmp_path / 'run')
    with forks.training(['train', '--model', 'small_convnet', '--devices', 'cpu', '--steps',
                         '100000', '--log-every', '1', '--checkpoint-every', '1', '--logdir',
                         logdir], tmp_path) as run:
        run.wait_for_line('step 3/')
        time.sleep(delay)
        assert run.kill() == -signal.SIGKILL
    latest = tf1.train.latest_checkpoint(logdir)
    assert latest is not None
    saved_step = tf.train.load_variable(latest, 'global_step')
    # 'step 3/' is logged before step 3's save (Progress runs before Checkpoint): step 2's
    # is whole by then, step 3's only if the save beat the kill, which load decides.
    assert latest.endswith('-%d' % saved_step) and saved_step >= 2
    # Every variable the model needs reads back, and training resumes from there.
    for name, _ in tf1.train.list_variables(latest):
        tf.train.load_variable(latest, name)
    assert main(['train', '--model', 'small_convnet', '--devices', 'cpu',
                 '--steps', str(saved_step + 2), '--logdir', logdir]) == 0
    assert tf.train.load_variable(logdir, 'global_step') == saved_step + 2


def test_models_lists_each_with_its_input_parameters_and_flops(capsys):
    assert main(['models', 'resnet20', 'small_convnet']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ['model', 'input', 'classes', 'parameters', 'MACs/image']
    # ResNet-20's 0.27M parameters and 41M multiply-accumulates (He et al. 2016 table 6).
    assert lines[1].split() == ['resnet20', '32x32x3', '10', '269,722', '40.55', 'M']
    # conv 26*26*32*9 + logits 5408*10 MACs.
    assert lines[2].split() == ['small_convnet', '28x28x1', '10', '54,410', '0.25', 'M']
    assert lines[3].startswith('MACs: multiply-accumulates') and len(lines) == 4
    assert main(['models', 'resnet51']) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith('towers: error: unknown model resnet51; known')


def test_an_epoch_of_imagenet_synthetic_is_an_imagenet_epoch():
    """Its 256 images in memory made an epoch of two steps, and a checkpoint each; now an epoch
    counts ImageNet's 1,281,167 images (as tf_cnn_benchmarks counts synthetic epochs)."""
    from towers.cli.config import config_from_args
    args = build_parser().parse_args(['train', '--dataset', 'imagenet-synthetic',
                                      '--batch-size', '256'])
    assert config_from_args(args, ['/cpu:0'], '/cpu:0', 'feed').steps_per_epoch == 5005
    args = build_parser().parse_args(['train', '--dataset', 'mnist_sample'])
    assert config_from_args(args, ['/cpu:0'], '/cpu:0', 'feed').steps_per_epoch is None


# test_tensorflow_starts_without_keras_and_matplotlib_which_load_later_as_ever's fork.
if __name__ == '__main__':
    _keras_and_matplotlib_after_tensorflow()
