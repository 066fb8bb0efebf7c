"""--dataset and --image-size as every command reads them.

A named dataset (data.DATASETS) has its own shape; imagenet-synthetic takes the model's
(models.DESIGNS: 224x224x3 and 1000 classes for resnet50), its side set by --image-size.
The folders (records:DIR, imagenet:DIR) are streamed by `towers train` (cli/train.py).
"""
from towers import data, models
from towers.data.registry import DatasetInfo
from towers.data.synthetic import NAME as SYNTHETIC
from towers.errors import SettingError

# imagenet-synthetic's images: at least this many, and two global batches.
SYNTHETIC_IMAGES = 256


def default_dataset(model):
    """imagenet-synthetic for a model designed for ImageNet (1000 classes), else the
    shipped MNIST sample."""
    design = models.DESIGNS.get(model)
    return SYNTHETIC if design and design[1] == 1000 else data.DEFAULT_DATASET


def image_side(args):
    """The side JPEGs of any size are cut to: --image-size, else an ImageNet model's own
    (299 for inception3), else ImageNet's 224."""
    design = models.DESIGNS.get(args.model)
    return args.image_size or (design[0][0] if design and design[1] == 1000 else 224)


def check_image_size(args):
    """--image-size: None, or a positive side for a dataset that has no size of its own."""
    size = args.image_size
    if size is not None and size < 1:
        raise SettingError('{image_size} must be at least 1, got %d', size)
    if size is not None and args.dataset != SYNTHETIC and not args.dataset.startswith(
            ('imagenet:', 'tfds:')):
        raise SettingError('{image_size} goes with imagenet:DIR, tfds:DIR or %s; %s has its '
                           'own size', SYNTHETIC, args.dataset)
    return size


def dataset_info(args):
    """The DatasetInfo of --dataset (a name, or imagenet-synthetic for --model)."""
    size = check_image_size(args)
    if args.dataset != SYNTHETIC:
        return data.dataset_info(args.dataset)
    (height, width, channels), classes = models.DESIGNS.get(args.model, ((224, 224, 3), 1000))
    shape = (size, size, channels) if size else (height, width, channels)
    return DatasetInfo(
        name=SYNTHETIC, input_shape=shape, num_classes=classes,
        num_train=synthetic_count(args), num_test=0, default_validation_size=0,
        description='random images of the model\'s shape, for benchmarks',
        class_names=tuple(str(i) for i in range(classes)))


def synthetic_count(args):
    """Two global batches, or as many as `towers check` takes distinct batches of, at least
    SYNTHETIC_IMAGES."""
    batch = getattr(args, 'batch_size', 0)
    steps = getattr(args, 'steps', 0) if args.command == 'check' else 0
    return max(SYNTHETIC_IMAGES, 2 * batch, steps * batch)


def load_dataset(args, info, **options):
    """Datasets of --dataset: data.load_dataset's, or imagenet-synthetic's of info's shape."""
    if args.dataset == SYNTHETIC:
        return data.synthetic_datasets(info.input_shape, info.num_classes, info.num_train,
                                       seed=getattr(args, 'seed', None) or 0)
    return data.load_dataset(args.dataset, **options)
