"""towers eval and towers export: a finished run, tested again and served by plain TF."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from towers import data
from towers.cli import main

CPU = ['--devices', 'cpu']  # every train and eval here on virtual CPU towers, GPU or not


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """A short 2-tower run with a logdir; returns (logdir, its final test line). Ten steps
    take its test accuracy to about 0.67, far from chance: eval and the served model match
    its line only by computing what it computed."""
    logdir = str(tmp_path_factory.mktemp('run') / 'logdir')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(['train', '--model', 'small_convnet', '--towers', '2', '--steps', '10',
                     '--logdir', logdir] + CPU) == 0
    return logdir, out.getvalue().splitlines()[-1]


def test_train_records_what_made_the_run(run):
    logdir, _ = run
    with open(os.path.join(logdir, 'run.json')) as f:
        info = json.load(f)
    assert info == {'model': 'small_convnet', 'model_options': {}, 'dataset': 'mnist_sample',
                    'data_dir': None, 'input_shape': [28, 28, 1], 'num_classes': 10,
                    'ema': False, 'precision': 'fp32', 'normalization': None,
                    'num_steps': 10, 'deterministic': False}


@pytest.mark.parametrize('towers', ['1', '3'])
def test_eval_reproduces_the_runs_test_line_on_any_number_of_towers(run, towers, capsys):
    logdir, test_line = run
    assert test_line.startswith('test: loss ')
    assert main(['eval', '--logdir', logdir, '--towers', towers] + CPU) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ['checkpoint: %s' % os.path.join(logdir, 'model.ckpt-10'), test_line]


_SERVE = textwrap.dedent('''
    import sys
    # Plain TensorFlow only: importing this project's packages must fail here.
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in ('towers', 'models', 'data'):
                raise ImportError('%s is not installed here' % name)
    sys.meta_path.insert(0, Block())
    import numpy as np
    import tensorflow as tf
    model = tf.saved_model.load(sys.argv[1])
    serve = model.signatures['serving_default']
    images, labels = np.load(sys.argv[2]), np.load(sys.argv[3])
    out = serve(images=tf.constant(images))
    probabilities, classes = out['probabilities'].numpy(), out['classes'].numpy()
    assert np.allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    assert (classes == probabilities.argmax(axis=1)).all()
    print('%.4f' % (classes == labels).mean())
''')


def test_export_serves_the_same_accuracy_without_this_package(run, tmp_path, capsys):
    logdir, test_line = run
    out_dir = str(tmp_path / 'saved')
    assert main(['export', '--logdir', logdir, '--out', out_dir]) == 0
    assert 'serving_default' in capsys.readouterr().out
    test = data.load_dataset('mnist_sample').test
    np.save(tmp_path / 'images.npy', test.images)
    np.save(tmp_path / 'labels.npy', test.labels)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
    served = subprocess.run(
        [sys.executable, '-c', _SERVE, out_dir, str(tmp_path / 'images.npy'),
         str(tmp_path / 'labels.npy')], capture_output=True, text=True, env=env,
        cwd=str(tmp_path), timeout=120)
    assert served.returncode == 0, served.stderr
    accuracy = test_line.split('accuracy ')[1].split()[0]
    assert served.stdout.strip() == accuracy
    # A second export may not overwrite the first.
    assert main(['export', '--logdir', logdir, '--out', out_dir]) == 1
    assert 'already exists; export into a new folder' in capsys.readouterr().err


def test_eval_and_export_need_a_trained_logdir(tmp_path, capsys):
    assert main(['eval', '--logdir', str(tmp_path)] + CPU) == 1
    assert 'has no run.json' in capsys.readouterr().err
    assert main(['export', '--logdir', str(tmp_path), '--out', str(tmp_path / 'x')]) == 1
    assert 'has no run.json' in capsys.readouterr().err


@pytest.fixture(scope='module')
def ema_run(tmp_path_factory):
    """A run with --ema: 10 steps, under one epoch (500 of the 4,000 held out), so validation
    runs once, at the end, and the best checkpoint on it is the last one, step 10."""
    logdir = str(tmp_path_factory.mktemp('ema') / 'logdir')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(['train', '--model', 'small_convnet', '--towers', '2', '--steps', '10',
                     '--validation-size', '500', '--ema', '0.9', '--logdir', logdir] + CPU) == 0
    return logdir, out.getvalue().splitlines()


def test_eval_of_an_ema_run_reads_the_moving_averages(ema_run, capsys):
    logdir, lines = ema_run
    with open(os.path.join(logdir, 'run.json')) as f:
        assert json.load(f)['ema'] is True
    assert main(['eval', '--logdir', logdir, '--towers', '3'] + CPU) == 0
    out = capsys.readouterr().out.splitlines()
    # The run's own test line came from its evaluation towers, which read the
    # averages; eval restores the averages into the plain variables.
    assert out == ['checkpoint: %s (moving averages of the weights)'
                   % os.path.join(logdir, 'model.ckpt-10'), lines[-1]]
    assert main(['eval', '--logdir', logdir, '--best'] + CPU) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('checkpoint: %s' % os.path.join(logdir, 'best', 'model.ckpt-10'))
    assert out[1] == lines[-1]


def test_export_of_an_ema_run_holds_the_moving_averages(ema_run, tmp_path, capsys):
    import tensorflow as tf
    logdir, _ = ema_run
    out_dir = str(tmp_path / 'saved')
    assert main(['export', '--logdir', logdir, '--best', '--out', out_dir]) == 0
    exported = os.path.join(out_dir, 'variables', 'variables')
    checkpoint = os.path.join(logdir, 'model.ckpt-10')
    for name in ('conv1/weights', 'logits/biases'):
        average = tf.train.load_variable(checkpoint, name + '/ExponentialMovingAverage')
        np.testing.assert_array_equal(tf.train.load_variable(exported, name), average)
        assert not np.array_equal(tf.train.load_variable(checkpoint, name), average)


def test_best_needs_a_best_checkpoint_and_excludes_checkpoint(run, tmp_path, capsys):
    logdir, _ = run
    assert main(['eval', '--logdir', logdir, '--best', '--checkpoint', 'x'] + CPU) == 1
    assert 'give --best or --checkpoint, not both' in capsys.readouterr().err
    # The run held nothing out for validation: it kept no best checkpoint.
    assert not os.path.exists(os.path.join(logdir, 'best'))
    assert main(['export', '--logdir', logdir, '--best', '--out', str(tmp_path / 'x')]) == 1
    assert 'has no best checkpoint' in capsys.readouterr().err


def test_a_refused_resume_leaves_the_runs_record_as_it_was(run, tmp_path, capsys):
    logdir, _ = run
    copy = str(tmp_path / 'copy')
    shutil.copytree(logdir, copy)
    assert main(['train', '--model', 'mnist_convnet', '--steps', '11', '--logdir', copy] + CPU) == 1
    assert 'does not match this model' in capsys.readouterr().err
    with open(os.path.join(copy, 'run.json')) as f:
        assert json.load(f)['model'] == 'small_convnet'
    assert main(['eval', '--logdir', copy] + CPU) == 0


def test_a_truncated_checkpoint_is_one_line_for_eval_and_for_a_resume(run, tmp_path, capsys):
    logdir, _ = run
    copy = str(tmp_path / 'copy')
    shutil.copytree(logdir, copy)
    data_file = os.path.join(copy, 'model.ckpt-10.data-00000-of-00001')
    with open(data_file, 'r+b') as f:
        f.truncate(1000)  # the model variables lie beyond this
    for argv in (['eval', '--logdir', copy],
                 ['train', '--model', 'small_convnet', '--steps', '11', '--logdir', copy]):
        assert main(argv + CPU) == 1
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(
            'towers: error: cannot read checkpoint %s/model.ckpt-10 (' % copy), err


def test_a_resume_with_another_input_order_is_refused(run, tmp_path, capsys):
    logdir, _ = run
    copy = str(tmp_path / 'copy')
    shutil.copytree(logdir, copy)
    assert main(['train', '--model', 'small_convnet', '--steps', '11', '--input', 'dataset',
                 '--logdir', copy] + CPU) == 1
    err = capsys.readouterr().err
    assert 'tf_data_order 0, this run asks for' in err and 'tf_data_order 1:' in err


def test_eval_refuses_test_images_that_do_not_fit_the_trained_model(run, tmp_path, capsys):
    logdir = str(tmp_path / 'copy')
    shutil.copytree(run[0], logdir)
    # run.json says the model takes 32x32 digits; the test split holds 28x28 ones.
    path = os.path.join(logdir, 'run.json')
    with open(path) as f:
        info = json.load(f)
    info['input_shape'] = [32, 32, 1]
    with open(path, 'w') as f:
        json.dump(info, f)
    capsys.readouterr()
    assert main(['eval', '--logdir', logdir] + CPU) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith('towers: error: ') and err[0].endswith(
        'holds 28x28x1 images, but the model in %s takes 32x32x1: use images of that shape, or '
        'a model built for 28x28x1' % path), err[0]
