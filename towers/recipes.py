"""Published training recipes as presets: `towers train --recipe NAME`.

A recipe fills in the flags a paper or a reference implementation fixed (optimizer,
schedule, batch, decay, smoothing, augmentation) and says where each value comes from; a
flag given by hand wins over the recipe. The learning rate scales linearly with the batch
(Goyal et al. 2017) from the batch the recipe was published with, and a schedule counted in
fractions of the run follows the run's own --epochs. At the end of the run, the test
accuracy is set beside the published figure for the same model and data, where there is one.

TensorFlow-free: the CLI applies a recipe before TensorFlow is imported.
"""
import argparse
import dataclasses

from towers.errors import SettingError
from towers.names import INPUT_MODES

# What the paper says about the CIFAR-10 ResNets (He et al. 2016, section 4.2 and table 6).
HE_2016 = 'He et al. 2016, Deep Residual Learning for Image Recognition'
TF_CNN_BENCHMARKS = 'tensorflow/benchmarks tf_cnn_benchmarks'
NVIDIA_RN50 = 'NVIDIA DeepLearningExamples TensorFlow/Classification/ConvNets resnet50v1.5'
MLPERF_RN50 = ('MLPerf training v1.0 ResNet-50 reference, mlcommons/training '
               'image_classification/tensorflow2')


@dataclasses.dataclass(frozen=True)
class Setting:
    """One flag's value in a recipe, and where it comes from.

    value: the flag's value, or callable(args) -> value for one that depends on the run's
      other settings (the batch, the epochs, the rate).
    """
    value: object
    source: str

    def resolve(self, args):
        return self.value(args) if callable(self.value) else self.value


@dataclasses.dataclass(frozen=True)
class Published:
    """A published test accuracy: of which model, on which data, from where."""
    model: str
    dataset: str  # 'cifar10', or 'imagenet' (1,000 classes, imagenet:DIR or tfds:DIR)
    accuracy: float
    source: str


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A published recipe: its settings by flag (in the order they resolve), its figures."""
    name: str
    title: str
    settings: dict
    published: tuple = ()


def _scaled(base, at_batch):
    """The rate `base` published for batch `at_batch`, scaled linearly to the run's batch."""
    return lambda args: base * args.batch_size / at_batch


def _he_steps(args):
    """He et al.'s two divisions by 10, at 32k and 48k of 64k iterations: 50% and 75%."""
    return 'piecewise:%g=%g,%g=%g' % (args.epochs * 0.5, args.lr / 10,
                                      args.epochs * 0.75, args.lr / 100)


def _tf_cnn_steps(args):
    """tf_cnn_benchmarks' ResNet schedule: x0.1 at epochs 30, 60, 80 and 90, those within the
    run (none: constant)."""
    points = ['%g=%g' % (epoch, args.lr * 0.1 ** (i + 1))
              for i, epoch in enumerate((30, 60, 80, 90)) if epoch < args.epochs]
    return 'piecewise:' + ','.join(points) if points else 'constant'


RECIPES = {recipe.name: recipe for recipe in (
    Recipe('he2016-cifar', HE_2016 + ', CIFAR-10 ResNets (section 4.2)', {
        'batch_size': Setting(128, 'section 4.2: mini-batch 128'),
        'epochs': Setting(182, 'section 4.2: 64k iterations of 128 over the 45k training '
                               'images'),
        'optimizer': Setting('momentum', 'section 4.2: SGD with momentum'),
        'momentum': Setting(0.9, 'section 4.2'),
        'lr': Setting(_scaled(0.1, 128), 'section 4.2: 0.1 at batch 128, scaled linearly'),
        'lr_schedule': Setting(_he_steps, 'section 4.2: divided by 10 at 32k and 48k of 64k '
                                          'iterations (50% and 75% of the run)'),
        'weight_decay': Setting(1e-4, 'section 4.2: 0.0001'),
        'decay_on': Setting('weights', 'the paper does not say; towers decays the kernels'),
        'augment': Setting('pad-crop-flip', 'section 4.2: 4 pixels padded on each side, a '
                                            'random 32x32 crop, a random horizontal flip'),
    }, published=tuple(
        Published('resnet%d' % depth, 'cifar10', 1 - error / 100, HE_2016 + ', table 6')
        for depth, error in ((20, 8.75), (32, 7.51), (44, 7.17), (56, 6.97), (110, 6.43)))),
    Recipe('tf-cnn-benchmarks-resnet50', TF_CNN_BENCHMARKS + ' ResNet-50 on ImageNet', {
        'batch_size': Setting(256, 'README: --batch_size=256 per GPU'),
        'epochs': Setting(90, 'README: --num_epochs=90'),
        'optimizer': Setting('momentum', 'README: --optimizer=momentum'),
        'momentum': Setting(0.9, 'benchmark_cnn.py: --momentum default 0.9'),
        'lr': Setting(_scaled(0.128, 256), 'models/resnet_model.py: 0.128 at batch 256, '
                                           'scaled linearly'),
        'lr_schedule': Setting(_tf_cnn_steps, 'models/resnet_model.py get_learning_rate: '
                                              'x0.1 at epochs 30, 60, 80, 90'),
        'warmup_epochs': Setting(5, 'models/resnet_model.py: linear over 5 epochs'),
        'weight_decay': Setting(1e-4, 'README: --weight_decay=1e-4'),
        'decay_on': Setting('not-norms', 'models/model.py filter_l2_loss_vars: all but batch '
                                         'norm'),
        'augment': Setting('inception', 'preprocessing.py train_image: area 5-100%, aspect '
                                        '0.75-1.33, flip'),
    }, published=(Published('resnet50', 'imagenet', 0.76, TF_CNN_BENCHMARKS + ' README: '
                                                          '"around 76% accuracy"'),)),
    Recipe('nvidia-resnet50-v1.5', NVIDIA_RN50 + ' (90 epochs)', {
        'batch_size': Setting(256, 'README: 256 per GPU (AMP, TF32)'),
        'epochs': Setting(90, 'training/*/DGXA100_RN50_*_90E.sh'),
        'optimizer': Setting('momentum', 'model/resnet.py: MomentumOptimizer'),
        'momentum': Setting(0.875, 'README: momentum 0.875'),
        'lr': Setting(_scaled(0.256, 256), 'README: 0.256 for batch 256, scaled linearly'),
        'lr_schedule': Setting('cosine', 'README: cosine decay'),
        'warmup_epochs': Setting(8, 'training/GENERIC.sh: --lr_warmup_epochs=8'),
        'weight_decay': Setting(3.0517578125e-05, 'README: 1/32768'),
        'decay_on': Setting('not-norms', 'model/resnet.py loss_filter_fn: all but batch norm'),
        'label_smoothing': Setting(0.1, 'README: label smoothing 0.1'),
        'augment': Setting('inception', 'README: random resized crop, horizontal flip'),
    }, published=(Published('resnet50', 'imagenet', 0.7701,
                            NVIDIA_RN50 + ' README: 90 epochs, TF32, 8x A100 (v1.5, as '
                                          "towers' resnet50)"),)),
    Recipe('mlperf-resnet50-lars', MLPERF_RN50 + ' with LARS, batch 4096 (TPU v3-64)', {
        'batch_size': Setting(4096, 'README_tensorflow2.md: --batch_size=4096'),
        'epochs': Setting(42, 'README_tensorflow2.md: --train_epochs=42'),
        'optimizer': Setting('lars', 'README_tensorflow2.md: --optimizer=LARS (eta 0.001, '
                                     'lars_optimizer.py)'),
        'momentum': Setting(0.9, 'README_tensorflow2.md: --momentum=0.9'),
        'lr': Setting(_scaled(10.0, 4096), 'lars_util.py: 10.0 below batch 16384, scaled '
                                           'linearly (the reference sets 8.5 at 2048 by hand)'),
        'lr_schedule': Setting('poly:2,0.0001', 'lars_util.py: polynomial decay, power 2, to '
                                                '0.0001'),
        'warmup_epochs': Setting(5, 'README_tensorflow2.md: --warmup_epochs=5'),
        'weight_decay': Setting(2e-4, 'README_tensorflow2.md: --weight_decay=0.0002, in LARS'),
        'decay_on': Setting('weights', "lars_optimizer.py skip_list: not batch norm or biases"),
        'label_smoothing': Setting(0.1, 'README_tensorflow2.md: --label_smoothing=0.1'),
        'augment': Setting('inception', 'imagenet_preprocessing.py: a random crop of the '
                                        'bounding box, flipped'),
    }, published=(Published('resnet50', 'imagenet', 0.759,
                            MLPERF_RN50 + ' README: the quality target it trains to'),)),
)}

# What each model trains well with where the run names no recipe: its reference's optimizer,
# rate and schedule (not its batch or length, which stay the run's), each flag given by hand
# winning; the first lines say them with their sources, as a recipe's.
_CIFAR_RESNETS = Recipe('resnet-cifar', HE_2016 + ", CIFAR-10 ResNets (section 4.2), with a "
                        "cosine over the run's epochs", {
    'optimizer': Setting('momentum', 'section 4.2: SGD with momentum'),
    'momentum': Setting(0.9, 'section 4.2'),
    'lr': Setting(_scaled(0.1, 128), 'section 4.2: 0.1 at batch 128, scaled linearly'),
    'lr_schedule': Setting('cosine', "a cosine over the run's epochs, where the paper divides "
                                     'by 10 at 50% and 75% of its 182'),
    'weight_decay': Setting(1e-4, 'section 4.2: 0.0001'),
    'decay_on': Setting('weights', 'the paper does not say; towers decays the kernels'),
})
_IMAGENET_RESNETS = Recipe('resnet-imagenet', TF_CNN_BENCHMARKS + ' ResNets on ImageNet', {
    key: RECIPES['tf-cnn-benchmarks-resnet50'].settings[key]
    for key in ('optimizer', 'momentum', 'lr', 'lr_schedule', 'warmup_epochs', 'weight_decay',
                'decay_on')})
MODEL_SETTINGS = dict(
    [('resnet%d' % depth, _CIFAR_RESNETS) for depth in (20, 32, 44, 56, 110)]
    + [('resnet%d' % depth, _IMAGENET_RESNETS) for depth in (50, 101, 152)])


def explicit_flags(parser, argv):
    """The dests of parser's options that argv gives by hand, however argparse reads them
    (`--lr 0.1`, `--lr=0.1`, or an abbreviation such as `--batch 64`): argv parsed again with
    every default suppressed, so that only what was given is set. argv may hold the command's
    name and global flags before it; parser is the command's own."""
    defaults = [(action, action.default) for action in parser._actions]
    try:
        for action, _ in defaults:
            action.default = argparse.SUPPRESS
        given, _ = parser.parse_known_args(argv)
    finally:
        for action, default in defaults:
            action.default = default
    return set(vars(given))


def apply_recipe(args, given):
    """Fill in args from args.recipe where `given` (explicit_flags) has no flag of its own;
    without a recipe, from the model's own settings (MODEL_SETTINGS), where it has some.

    Returns:
      The lines that say where each value comes from, for the run's first lines.
    Raises:
      SettingError: an unknown recipe, or --steps where its schedule counts epochs.
    """
    own = not getattr(args, 'recipe', None)
    recipe = MODEL_SETTINGS.get(args.model) if own else RECIPES.get(args.recipe)
    if recipe is None and own:
        return []
    if recipe is None:
        raise SettingError('unknown {recipe} %r; choose one of: %s', args.recipe,
                           ', '.join(RECIPES))
    schedule = recipe.settings.get('lr_schedule')
    by_steps = getattr(args, 'steps', None) is not None and 'lr_schedule' not in given \
        and callable(getattr(schedule, 'value', None))
    if by_steps and not own:
        raise SettingError('{recipe} %s counts its schedule in epochs: give {epochs}, not '
                           '{steps} (or a {lr_schedule} of your own)', recipe.name)
    lines = ['recipe %s: %s' % (recipe.name, recipe.title) if not own else
             'model %s trains with its own settings unless given (--recipe for others): %s'
             % (args.model, recipe.title)]
    for dest, setting in recipe.settings.items():
        flag = '--' + dest.replace('_', '-')
        if dest == 'lr_schedule' and by_steps:
            lines.append('  %s left out: it counts epochs, and the run --steps (%s)'
                         % (flag, setting.source))
            continue
        if dest in given:
            lines.append('  %s %s (given by hand; the %s: %s)'
                         % (flag, _shown(getattr(args, dest)), "model's" if own else 'recipe',
                            setting.source))
            continue
        if dest == 'augment' and not INPUT_MODES[getattr(args, 'input', None) or 'feed'
                                                 ].has_images:
            lines.append('  %s left out: --input synthetic has no images to vary (the recipe: '
                         '%s)' % (flag, setting.source))
            continue
        setattr(args, dest, setting.resolve(args))
        lines.append('  %s %s (%s)' % (flag, _shown(getattr(args, dest)), setting.source))
    return lines


def _shown(value):
    return '%g' % value if isinstance(value, float) else '%s' % (value,)


def published_line(recipe_name, model, dataset, num_classes, accuracy, top5=None):
    """The line that sets a run's test accuracy (top-1; its top-5 beside it where the model
    has more than 5 classes) beside the recipe's published figure."""
    recipe = RECIPES[recipe_name]
    kind = dataset.split(':', 1)[0]
    data = dataset
    if kind in ('imagenet', 'tfds'):  # a folder: ImageNet only if it holds its 1,000 classes
        data = 'imagenet' if num_classes == 1000 else dataset
    for figure in recipe.published:
        if (figure.model, figure.dataset) == (model, data):
            if accuracy is None:
                return 'recipe %s: no test accuracy to set beside the published %.4f (%s)' % (
                    recipe.name, figure.accuracy, figure.source)
            return ('recipe %s: test accuracy %.4f%s against the published %.4f for %s on %s '
                    '(%s): %+.4f' % (recipe.name, accuracy,
                                     '' if top5 is None else ' (top-5 %.4f)' % top5,
                                     figure.accuracy, model, data, figure.source,
                                     accuracy - figure.accuracy))
    known = ', '.join('%s %.4f on %s' % (f.model, f.accuracy, f.dataset)
                      for f in recipe.published)
    return 'recipe %s: no published figure for %s on %s (the recipe\'s: %s)' % (
        recipe.name, model, dataset, known or 'none')
