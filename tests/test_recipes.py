"""--recipe: the published settings filled in, hand-given flags winning, sources said, and the
end-of-run line against the published figure."""
import pytest

from towers.cli.main import _subparser
from towers.cli.parsers import build_parser
from towers.errors import TowersError
from towers.recipes import RECIPES, apply_recipe, explicit_flags, published_line


def _applied(*argv):
    """(args, lines) of `towers train ARGV` with its recipe applied."""
    parser = build_parser()
    argv = ['train'] + list(argv)
    args = parser.parse_args(argv)
    return args, apply_recipe(args, explicit_flags(_subparser(parser, 'train'), argv))


def test_he_cifar_fills_in_section_4_2():
    args, lines = _applied('--recipe', 'he2016-cifar', '--model', 'resnet20')
    assert (args.batch_size, args.epochs, args.optimizer, args.momentum, args.lr) == \
        (128, 182, 'momentum', 0.9, 0.1)
    assert args.lr_schedule == 'piecewise:91=0.01,136.5=0.001'  # at 50% and 75% of 182
    assert (args.weight_decay, args.decay_on, args.augment) == (1e-4, 'weights', 'pad-crop-flip')
    assert args.label_smoothing == 0 and args.warmup_epochs == 0  # the recipe sets neither
    assert lines[0] == ('recipe he2016-cifar: He et al. 2016, Deep Residual Learning for Image '
                        'Recognition, CIFAR-10 ResNets (section 4.2)')
    assert '  --optimizer momentum (section 4.2: SGD with momentum)' in lines
    assert len(lines) == 1 + len(RECIPES['he2016-cifar'].settings)


def test_a_flag_given_by_hand_wins_and_the_rest_follow_it():
    """--epochs 30 moves the divisions to epochs 15 and 22.5; --batch-size 256 doubles the
    rate (linear scaling) unless --lr is given too."""
    args, lines = _applied('--recipe', 'he2016-cifar', '--epochs', '30', '--batch-size=256')
    assert (args.epochs, args.batch_size, args.lr) == (30, 256, 0.2)
    assert args.lr_schedule == 'piecewise:15=0.02,22.5=0.002'
    assert any(line.startswith('  --epochs 30 (given by hand; the recipe: ') for line in lines)
    args, _ = _applied('--recipe', 'he2016-cifar', '--batch-size', '256', '--lr', '0.05',
                       '--lr-schedule', 'cosine', '--augment', 'center')
    assert (args.lr, args.lr_schedule, args.augment) == (0.05, 'cosine', 'center')


def test_nvidia_resnet50_is_cosine_with_warmup_and_smoothing():
    args, _ = _applied('--recipe', 'nvidia-resnet50-v1.5', '--batch-size', '64')
    assert (args.optimizer, args.momentum, args.lr, args.lr_schedule, args.warmup_epochs) == \
        ('momentum', 0.875, 0.064, 'cosine', 8)
    assert (args.label_smoothing, args.weight_decay, args.decay_on, args.augment) == \
        (0.1, 2 ** -15, 'not-norms', 'inception')


def test_tf_cnn_benchmarks_steps_down_at_its_epochs_within_the_run():
    args, _ = _applied('--recipe', 'tf-cnn-benchmarks-resnet50')
    assert args.lr == pytest.approx(0.128)
    assert args.lr_schedule == 'piecewise:30=0.0128,60=0.00128,80=0.000128'  # 90 is the end
    assert args.warmup_epochs == 5 and args.decay_on == 'not-norms'


def test_steps_with_a_schedule_in_epochs_is_refused_in_one_line():
    with pytest.raises(TowersError) as error:
        _applied('--recipe', 'he2016-cifar', '--steps', '10')
    assert str(error.value) == ('recipe he2016-cifar counts its schedule in epochs: give '
                                'epochs, not steps (or a lr_schedule of your own)')
    args, _ = _applied('--recipe', 'he2016-cifar', '--steps', '10', '--lr-schedule', 'constant')
    assert args.lr_schedule == 'constant'


def test_an_unknown_recipe_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(['train', '--recipe', 'he2015'])
    assert "invalid choice: 'he2015'" in capsys.readouterr().err


def test_the_end_of_run_line_sets_the_accuracy_beside_the_published_one():
    assert published_line('he2016-cifar', 'resnet20', 'cifar10', 10, 0.9151) == (
        'recipe he2016-cifar: test accuracy 0.9151 against the published 0.9125 for resnet20 on '
        'cifar10 (He et al. 2016, Deep Residual Learning for Image Recognition, table 6): '
        '+0.0026')
    assert published_line('nvidia-resnet50-v1.5', 'resnet50', 'imagenet:/data/in', 1000,
                          0.75).endswith(': -0.0201')
    line = published_line('he2016-cifar', 'resnet20', 'fashion_mnist', 10, 0.94)
    assert line.startswith('recipe he2016-cifar: no published figure for resnet20 on '
                           "fashion_mnist (the recipe's: resnet20 0.9125 on cifar10, ")
    # A folder of 10 classes is not ImageNet, whatever its kind.
    assert 'no published figure' in published_line('nvidia-resnet50-v1.5', 'resnet50',
                                                   'imagenet:/data/fm', 10, 0.9)


def test_a_run_says_its_recipe_first_and_the_published_figure_last(capsys):
    from towers.cli import main
    code = main(['train', '--recipe', 'he2016-cifar', '--model', 'small_convnet', '--steps', '2',
                 '--lr-schedule', 'constant', '--batch-size', '50', '--eval-every', '0',
                 '--devices', 'cpu', '--quiet'])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0].startswith('recipe he2016-cifar: He et al. 2016')
    assert '  --lr 0.0390625 (section 4.2: 0.1 at batch 128, scaled linearly)' in lines
    assert '  --lr-schedule constant (given by hand; the recipe: section 4.2: divided by 10 at ' \
           '32k and 48k of 64k iterations (50% and 75% of the run))' in lines
    assert lines[-1].startswith('recipe he2016-cifar: no published figure for small_convnet on '
                                'mnist_sample')


def test_an_abbreviated_flag_is_a_flag_given_by_hand():
    """argparse takes `--batch 64` for --batch-size: the recipe must not overwrite it."""
    args, lines = _applied('--recipe', 'he2016-cifar', '--batch', '64', '--weight-dec', '0')
    assert (args.batch_size, args.weight_decay, args.lr) == (64, 0, 0.05)
    assert any(line.startswith('  --weight-decay 0 (given by hand') for line in lines)


def test_a_run_shorter_than_the_first_step_down_keeps_its_rate():
    args, _ = _applied('--recipe', 'tf-cnn-benchmarks-resnet50', '--epochs', '20')
    assert args.lr_schedule == 'constant'


def test_synthetic_input_takes_the_recipe_without_its_augmentation():
    args, lines = _applied('--recipe', 'nvidia-resnet50-v1.5', '--input', 'synthetic')
    assert args.augment is None
    assert '  --augment left out: --input synthetic has no images to vary (the recipe: README: ' \
           'random resized crop, horizontal flip)' in lines


def test_a_model_trains_with_its_own_settings_where_the_run_names_none():
    args, lines = _applied('--model', 'resnet20', '--epochs', '12', '--batch-size', '64')
    assert (args.optimizer, args.momentum, args.lr, args.lr_schedule) == \
        ('momentum', 0.9, 0.05, 'cosine')  # 0.1 at 128, linearly
    assert (args.weight_decay, args.decay_on, args.epochs, args.batch_size) == \
        (1e-4, 'weights', 12, 64)  # the run's length and batch stay the run's
    assert lines[0].startswith('model resnet20 trains with its own settings unless given '
                               '(--recipe for others): He et al. 2016')
    # A flag by hand wins; a schedule in epochs is left out of a run counted in steps.
    args, lines = _applied('--model', 'resnet50', '--optimizer', 'adam', '--steps', '3')
    assert (args.optimizer, args.lr_schedule) == ('adam', 'constant')
    assert '  --optimizer adam (given by hand; the model\'s: README: --optimizer=momentum)' \
        in lines
    assert any(line.startswith('  --lr-schedule left out: it counts epochs') for line in lines)
    # A model without settings of its own keeps train's defaults; --recipe wins over them.
    args, lines = _applied('--model', 'mnist_convnet')
    assert (lines, args.optimizer, args.lr) == ([], 'adam', 0.001)
    args, lines = _applied('--model', 'resnet20', '--recipe', 'he2016-cifar')
    assert lines[0].startswith('recipe he2016-cifar: ') and args.epochs == 182
