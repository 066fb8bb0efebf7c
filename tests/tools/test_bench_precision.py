"""towers bench --precision: each precision timed against the first, and what the hardware has."""
import pytest
import tensorflow as tf

from towers import data, models
from towers.cli import main
from towers.cli.parsers import build_parser
from towers.errors import SettingError
from towers.tools import bench, clusterbench, compare, peers, rates
from towers.tools.bench import precisions_of, run_bench
from towers.tools.hardware import precision_support

SHAPE = (28, 28, 1)


def test_run_bench_times_each_precision_against_the_first():
    lines = []
    rows = run_bench(models.build_model('small_convnet', SHAPE, 10), SHAPE, 10, [1],
                     batch_size=8, warmup_steps=1, timed_steps=2, log=lines.append,
                     precisions=['fp32', 'bf16'], devices='cpu')
    assert [(r['towers'], r['input'], r['precision']) for r in rows] == [
        (1, 'synthetic', 'fp32'), (1, 'synthetic', 'bf16')]
    fp32, bf16 = rows
    assert fp32['mean'] > 0 and bf16['mean'] > 0
    assert fp32['vs_precision'] == 1.0
    assert bf16['vs_precision'] == bf16['mean'] / fp32['mean']
    # Each precision is its own column of ratios: bf16's synthetic row is bf16's.
    assert bf16['vs_synthetic'] == 1.0 and bf16['vs_first'] == 1.0
    # What the hardware has for bf16, then the table with a 'vs fp32' column.
    assert lines[:2] == ['variables: /cpu:0', precision_support('bf16', ['/cpu:0'])]
    assert lines[2].split()[:3] == ['input', 'towers', 'precision']
    assert lines[2].split()[-2:] == ['vs', 'fp32']
    assert lines[4].split()[2] == 'bf16'
    assert lines[4].split()[-1] == '%.3f' % bf16['vs_precision']


def test_precisions_are_checked_once_each_and_a_loss_scale_needs_fp16():
    assert [(p.name, p.scaling) for p in precisions_of(['fp32', 'fp16', 'fp32'], 128)] == [
        ('fp32', None), ('fp16', ('fixed', 128.0, None))]
    with pytest.raises(SettingError, match=r'^loss_scale scales the float16 loss: use it with '
                                           r'precision fp16 \(fp32 needs no loss scaling\)$'):
        precisions_of(['fp32', 'bf16'], 128)
    with pytest.raises(SettingError, match="unknown precision 'fp8'"):
        precisions_of(['fp32', 'fp8'])


def test_the_keras_twin_is_built_under_its_policy_and_leaves_the_global_one_alone():
    import keras
    before = keras.mixed_precision.global_policy().name
    twin = peers.keras_twin('small_convnet', SHAPE, 10, 'mixed_bfloat16')()
    assert keras.mixed_precision.global_policy().name == before
    conv, logits = twin.layers[0], twin.layers[-1]
    assert (conv.compute_dtype, conv.variable_dtype) == ('bfloat16', 'float32')
    assert logits.compute_dtype == 'float32'  # softmax and the loss in float32
    half = peers.keras_twin('small_convnet', SHAPE, 10, 'mixed_float16')()
    half.compile(optimizer=keras.optimizers.SGD(0.01),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert isinstance(half.optimizer, keras.optimizers.LossScaleOptimizer)
    assert peers.keras_twin('small_convnet', SHAPE, 10)().layers[0].compute_dtype == 'float32'


def test_compare_gives_keras_a_row_in_each_precision(monkeypatch):
    monkeypatch.setattr(rates, 'kernel_rates',  # test_rates' part
                        lambda devices, dtype, data_format, per_gpu=None: {'conv': 1.0,
                                                                           'matmul': 1.0})
    train = data.load_dataset('mnist_sample').train
    tf.config.list_logical_devices()  # eager on one CPU device, as in test_compare
    lines = []
    rows = compare.run_compare(
        'small_convnet', models.build_model('small_convnet', SHAPE, 10), SHAPE, 10, [1],
        batch_size=8, dataset=train, variable_updates=('parameter_server',), warmup_steps=1,
        timed_steps=2, log=lines.append, precisions=['fp32', 'bf16'], devices='cpu', xla=True)
    assert [(r['config'], r['precision']) for r in rows] == [
        ('towers parameter_server/synthetic', 'fp32'),
        ('towers parameter_server/synthetic bf16', 'bf16'),
        # --xla times the first combination again in each precision, not the first only.
        ('towers parameter_server/synthetic +xla', 'fp32'),
        ('towers parameter_server/synthetic bf16 +xla', 'bf16'), ('textbook', 'fp32'),
        ('plain graph', 'fp32'), ('plain graph bf16', 'bf16'),
        ('keras mirrored', 'fp32'), ('keras mirrored mixed_bfloat16', 'bf16')]
    best = {r['precision']: r['mean'] for r in rows[:2]}
    for row in rows:  # each against towers in its own precision
        assert row['vs_best'] == pytest.approx(row['mean'] / best[row['precision']])
    assert precision_support('bf16', ['/cpu:0']) in lines
    assert any(line.startswith('towers best bf16 vs keras mirrored mixed_bfloat16: 1: ')
               for line in lines)
    assert any(line.startswith('towers best bf16 vs fp32: 1: ') for line in lines)
    assert any(line.startswith('towers best bf16 vs plain graph bf16: 1: ') for line in lines)


@pytest.mark.parametrize('argv,message', [
    (['bench', '--precision', 'fp32,fp8'],
     "--precision wants some of fp32,bf16,fp16, got 'fp32,fp8'"),
    (['bench', '--precision', 'fp32,bf16', '--loss-scale', '128'],
     '--loss-scale scales the float16 loss: use it with --precision fp16 (fp32 needs no loss '
     'scaling)'),
    (['bench', '--cluster-mode', 'collective', '--towers', '1', '--precision', 'fp32,bf16'],
     "--cluster-mode times one --precision per run, got 'fp32,bf16'"),
])
def test_bad_precisions_are_one_line(capsys, argv, message):
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == ['towers: error: ' + message]


def test_the_cluster_bench_passes_its_precision_to_every_run(monkeypatch, capsys):
    commands = []

    def towers(command, timeout):
        commands.append(command)
        return 'trained to step 4: 100.0 images/sec after warm-up\n'
    monkeypatch.setattr(clusterbench, 'run_towers', towers)
    assert main(['bench', '--cluster-mode', 'collective', '--towers', '1', '--workers', '1',
                 '--rounds', '2', '--warmup', '1', '--window', '3', '--model', 'small_convnet',
                 '--precision', 'fp16', '--loss-scale', '256']) == 0
    assert len(commands) == 4  # one process and one cluster, twice
    for command in commands:
        at = command.index('--precision')
        assert command[at:at + 4] == ['--precision', 'fp16', '--loss-scale', '256']
    assert ', fp16, 1 warm-up' in capsys.readouterr().out.splitlines()[0]
    # --xla: every run under XLA, the one process and the cluster alike.
    commands.clear()
    monkeypatch.setenv('TF_XLA_FLAGS', '')  # main sets it for CPU towers: put back after
    assert main(['bench', '--cluster-mode', 'collective', '--towers', '1', '--workers', '1',
                 '--rounds', '2', '--warmup', '1', '--window', '3', '--model', 'small_convnet',
                 '--xla', '--devices', 'cpu']) == 0
    assert len(commands) == 4 and all('--xla' in command for command in commands)
    assert ', fp32 under XLA, 1 warm-up' in capsys.readouterr().out.splitlines()[0]


def test_the_bench_title_names_the_precisions(monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(bench, 'run_bench', lambda *args, **kwargs: seen.update(kwargs))
    assert main(['bench', '--precision', 'fp32,bf16,fp32', '--towers', '1', '--devices',
                 'cpu']) == 0
    from towers.tools.hardware import machine
    assert capsys.readouterr().out.splitlines()[0].endswith(
        'timed steps per row; in fp32, bf16, each against fp32; on %s' % machine())
    assert (seen['precisions'], seen['loss_scale']) == (['fp32', 'bf16'], None)



def test_bench_times_the_step_with_the_optimizer_and_layout_asked(monkeypatch, capsys):
    built = []

    def measured(configs, *args, **kwargs):
        built.extend(configs)
        return [(100.0, 1.0)] * len(configs)
    monkeypatch.setattr(bench, 'measure_interleaved', measured)
    assert main(['bench', '--towers', '1,2', '--devices', 'cpu', '--model', 'small_convnet',
                 '--optimizer', 'sgd', '--data-format', 'NCHW', '--batch-size', '16']) == 0
    assert ', global batch 16, sgd, maps NCHW, 10 warm-up' in capsys.readouterr().out
    assert [(c['optimizer'], c['plan'].data_format) for c in built] == [('sgd', 'NCHW')] * 2
    # Without --optimizer a row steps with train's optimizer: it times train's step.
    built.clear()
    assert main(['bench', '--towers', '1', '--devices', 'cpu', '--model', 'small_convnet',
                 '--batch-size', '16']) == 0
    train = build_parser().parse_args(['train']).optimizer
    assert train == bench.TRAIN_OPTIMIZER == 'adam'
    assert ', global batch 16, adam, 10 warm-up' in capsys.readouterr().out
    assert [c['optimizer'] for c in built] == [train]
    assert main(['bench', '--compare', '--optimizer', 'adam']) == 1
    assert capsys.readouterr().err.strip() == (
        'towers: error: --optimizer and --data-format set the rows of bench itself: not with '
        '--compare, --cluster-mode or --input-only')
