"""The lab's step 7 in one command: small_convnet trained over a grid of towers x global batch x
learning rate, every run on the same number of examples, its test accuracy in a table (and a
plot with --plot).

    python examples/lab/sweep.py --towers 2 --batch-size 50,200 --lr 0.001,0.004 --plot sweep.png

Each run is `towers train --model small_convnet --devices cpu --eval-every 0` with the
batch, the rate and steps = --examples / batch, seed 0, on the digits shipped with towers
(4,000 to train on, 1,000 to test); they run one after another in this process, through
towers' Python API (towers.trainer.train).
"""
import argparse
import itertools
import os
import sys

from towers import data, models
from towers.cli.config import float_list, int_list
from towers.cli.main import use_onednn
from towers.config import TrainConfig
from towers.deviceplan import local_plan
from towers.errors import TowersError
from towers.tools.trace import pyplot_for, save_png

MODEL, DATASET = 'small_convnet', 'mnist_sample'


def sweep(towers, batch_sizes, rates, examples, log=print):
    """[(towers, batch, lr, steps, test accuracy)], one row per run, said as each ends."""
    from towers.trainer import train  # (TensorFlow: after the flags are read)
    datasets = data.load_dataset(DATASET, validation_size=0)
    shape, classes = datasets.train.images.shape[1:], datasets.train.num_classes
    log('%-7s %-6s %-7s %-6s %s' % ('towers', 'batch', 'lr', 'steps', 'test accuracy'))
    rows = []
    for count, batch, rate in itertools.product(towers, batch_sizes, rates):
        steps = max(1, examples // batch)
        config = TrainConfig(towers=tuple(local_plan(count, devices='cpu').towers),
                             batch_size=batch, steps=steps, learning_rate=rate, seed=0,
                             eval_every=0, quiet=True, log_every=steps)
        result = train(config, models.build_model(MODEL, shape, classes), datasets, shape,
                       classes, log=lambda line: None)
        rows.append((count, batch, rate, steps, result['test_accuracy']))
        log('%-7d %-6d %-7g %-6d %.4f' % rows[-1])
    return rows


def plot(rows, path):
    """Test accuracy against the global batch, a line for each (towers, lr)."""
    pyplot = pyplot_for('plot')
    figure, axes = pyplot.subplots(figsize=(6, 4))
    for (count, rate), group in itertools.groupby(sorted(rows, key=lambda r: (r[0], r[2], r[1])),
                                                  key=lambda r: (r[0], r[2])):
        group = list(group)
        axes.plot([r[1] for r in group], [r[4] for r in group], marker='o',
                  label='%d tower(s), lr %g' % (count, rate))
    axes.set_xscale('log', base=2)
    batches = sorted({r[1] for r in rows})
    axes.set_xticks(batches, [str(b) for b in batches])
    axes.minorticks_off()
    axes.set_xlabel('global batch (the same examples: fewer steps as it grows)')
    axes.set_ylabel('test accuracy')
    axes.set_title('%s on %s' % (MODEL, DATASET))
    axes.legend()
    figure.tight_layout()
    save_png(pyplot, figure, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--towers', default='2', help='tower counts, e.g. 1,2 (default: 2)')
    parser.add_argument('--batch-size', default='50,200', help='global batches (default: 50,200)')
    parser.add_argument('--lr', default='0.001,0.004', help='learning rates (default: '
                                                            '0.001,0.004, Adam)')
    parser.add_argument('--examples', type=int, default=10000,
                        help='examples each run trains on (default: 10000, 2.5 epochs)')
    parser.add_argument('--plot', metavar='FILE.png', help='also draw the table')
    args = parser.parse_args(argv)
    try:
        towers = int_list(args.towers, 'towers')
        batches, rates = int_list(args.batch_size, 'batch_size'), float_list(args.lr, 'lr')
        if args.plot:
            pyplot_for('plot')  # (no matplotlib: said before any run)
        rows = sweep(towers, batches, rates, args.examples)
        if args.plot:
            plot(rows, args.plot)
            print('plot: %s' % os.path.relpath(args.plot))
    except TowersError as e:
        print('sweep: error: %s' % e, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    use_onednn()
    sys.exit(main())
