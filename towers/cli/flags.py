"""The flags several `towers` commands share: devices, model and dataset, precision.

TensorFlow-free, as every flags module of towers/cli: `towers --help` is instant.
"""
import dataclasses

from towers.config import TrainConfig
from towers.data import DEFAULT_DATASET
from towers.names import DEFAULT_MODEL, PRECISIONS

# Each setting's default, written once: in its TrainConfig field. A flag of the setting (of
# train, and of the commands that share train's flags) takes it from here.
DEFAULT = {field.name: field.default for field in dataclasses.fields(TrainConfig)}


def device_flags(parser):
    group = parser.add_argument_group('devices')
    group.add_argument('--towers', type=int, default=DEFAULT['towers'],
                       help='number of towers (default: every visible GPU, or 1 CPU); '
                            'without GPUs, N virtual CPU devices /cpu:0..N-1; more than '
                            'the GPUs: each GPU split into logical GPUs, a tower on each')
    group.add_argument('--devices', default=DEFAULT['devices'],
                       help='explicit comma-separated tower devices, e.g. /gpu:0,/gpu:2; or a '
                            'kind, cpu or gpu: --towers towers on that kind (cpu: virtual '
                            'CPU devices even where there are GPUs)')
    group.add_argument('--no-logical-gpus', action='store_false', dest='logical_gpus',
                       default=DEFAULT['logical_gpus'],
                       help='refuse more towers than GPUs instead of splitting each GPU into '
                            'logical GPUs (an equal share of its memory each)')
    group.add_argument('--param-device', default=DEFAULT['param_device'],
                       help="where variables live: 'auto' (the towers' GPU where they are all "
                            "on one GPU, else /cpu:0), 'cpu' (/cpu:0, the classic tutorial), "
                            "'gpu' (the first tower's GPU), 'spread' (over the tower devices, "
                            "by size) or a device name (default: %(default)s)")


def model_flags(parser):
    parser.add_argument('--model', default=DEFAULT_MODEL,
                        help='model name (default: %s); see `towers models`' % DEFAULT_MODEL)
    parser.add_argument('--dataset', default=None,
                        help='dataset name (default: %s, 5,000 real MNIST digits shipped '
                             'with towers; imagenet-synthetic for the ImageNet models), '
                             'mnist, fashion_mnist, cifar10, records:DIR (shards from '
                             "`towers data convert`), imagenet:DIR (build_imagenet_data.py's "
                             'JPEG shards), tfds:DIR (a prepared TensorFlow Datasets version '
                             "folder), or imagenet-synthetic (random images of the model's "
                             'shape)' % DEFAULT_DATASET)
    parser.add_argument('--image-size', type=int, default=None, metavar='S',
                        help='with imagenet:DIR, tfds:DIR or imagenet-synthetic: the side the '
                             "images are cropped and resized to (default: the model's, e.g. "
                             '224 for resnet50)')


def precision_flags(parser, several=False):
    group = parser.add_argument_group('precision')
    if several:
        group.add_argument('--precision', default='fp32',
                           help='comma-separated precisions to time, each against the first: '
                                '%s (default: fp32)' % ', '.join(PRECISIONS))
    else:
        group.add_argument('--precision', default=DEFAULT['precision'], choices=PRECISIONS,
                           help='what the towers compute in: fp32, or bf16 / fp16 over float32 '
                                'variables (the loss, softmax, batch-norm statistics and '
                                'gradients stay float32) (default: %(default)s)')
    group.add_argument('--loss-scale', default=DEFAULT['loss_scale'], metavar='S',
                       help='fp16 only: a fixed loss scale S (a power of two), or "dynamic" '
                            '(the default for fp16: from 32768, halved and the step skipped '
                            'when a gradient overflows, doubled after 2000 finite steps)')
