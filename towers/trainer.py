"""The Session loop: feed batches, run the train op, log, checkpoint, evaluate.

The loop is the classic one: `sess.run(train_op, feed_dict=...)` per step, a
log line every few steps, a Saver checkpoint every K steps and at the end, and
one pass over the test set when training is done.
"""
import dataclasses
import fractions
import math
import os
import time

import numpy as np
import tensorflow as tf

from towers.devices import session_config
from towers.errors import TowersError
from towers.export import check_checkpoint, write_run
from data.sampler import EpochSampler
from towers.graph import build_training_graph, make_optimizer
from towers.inputs import make_input, run_step

tf1 = tf.compat.v1


@dataclasses.dataclass
class TrainConfig:
    """What to train and how; the CLI's flags map one to one onto these fields.

    steps, when given, sets the length; otherwise epochs does, an epoch being
    ceil(N / batch_size) steps with a short last batch. batch_size is the
    *global* batch, sliced over the towers.
    """
    tower_devices: list = dataclasses.field(default_factory=lambda: ['/cpu:0'])
    param_device: str = '/cpu:0'
    batch_size: int = 100
    epochs: float = 10.0
    steps: int = None
    optimizer: str = 'adam'
    learning_rate: float = 1e-3
    momentum: float = 0.9
    logdir: str = None
    log_every: int = 50
    checkpoint_every: int = 500
    warmup_steps: int = 10
    seed: int = 0
    input: str = 'feed'
    mean: list = None  # per-channel, --input dataset only
    std: list = None

    def validate(self):
        """Raise TowersError for numbers no run can use."""
        checks = [
            (self.batch_size >= 1, '--batch-size must be at least 1, got %s' % self.batch_size),
            (self.steps is None or self.steps >= 1, '--steps must be at least 1, got %s'
             % self.steps),
            (self.epochs > 0, '--epochs must be positive, got %s' % self.epochs),
            (self.log_every >= 1, '--log-every must be at least 1, got %s' % self.log_every),
            (self.checkpoint_every >= 0, '--checkpoint-every must be 0 (off) or more, got %s'
             % self.checkpoint_every),
            (self.warmup_steps >= 0, 'warmup_steps must be 0 or more, got %s'
             % self.warmup_steps),
            ((self.mean is None) == (self.std is None), '--mean and --std go together'),
            (self.mean is None or self.input == 'dataset',
             '--mean/--std normalise in the tf.data pipeline: use them with --input dataset'),
            (self.std is None or all(s > 0 for s in self.std),
             '--std values must be positive, got %s' % self.std)]
        for ok, message in checks:
            if not ok:
                raise TowersError(message)

    def total_steps(self, steps_per_epoch):
        """Steps of the whole run; a fractional epoch count is rounded up to a step."""
        self.validate()
        if self.steps is not None:
            return self.steps
        # Fraction: 0.07 epochs of 1,100 steps is 77 steps, not 78 as float ceil says.
        return max(1, math.ceil(fractions.Fraction(repr(float(self.epochs))) * steps_per_epoch))


def evaluate(sess, graph, dataset, batch_size):
    """Mean loss and accuracy over a whole DataSet, last partial batch included.

    Args:
      sess: a Session on graph.graph with the variables initialised.
      graph: the TrainGraph (its inference-mode towers are used).
      dataset: anything with `images` [N, H, W, C] and `labels` [N] arrays.
      batch_size: global batch per run, spread over the towers.
    Returns:
      (loss, accuracy) as Python floats.
    """
    total = len(dataset.labels)
    if total == 0:
        raise TowersError('cannot evaluate on an empty dataset')
    loss_sum, correct = 0.0, 0
    for start in range(0, total, batch_size):
        images = dataset.images[start:start + batch_size]
        labels = dataset.labels[start:start + batch_size]
        loss, right = sess.run([graph.eval_loss, graph.eval_correct],
                               {graph.eval_images: images, graph.eval_labels: labels})
        # Batch means are re-weighted by batch size so the short last batch
        # counts exactly as much as its examples.
        loss_sum += float(loss) * len(labels)
        correct += int(right)
    return loss_sum / total, correct / total


def restore(sess, graph, checkpoint):
    """Restore a checkpoint into graph, or say plainly why it does not fit."""
    check_checkpoint(checkpoint, graph.graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES))
    graph.saver.restore(sess, checkpoint)


def _prepare_logdir(logdir):
    try:
        os.makedirs(logdir, exist_ok=True)
    except OSError as e:
        raise TowersError('cannot create --logdir %s: %s' % (logdir, e.strerror)) from e
    if not os.access(logdir, os.W_OK):
        raise TowersError('--logdir %s is not writable; choose another folder' % logdir)


class _Throughput:
    """images/sec over the steps since the last report.

    The first warmup_steps of this process are left out (graph optimisation and
    memory allocation happen there), also when a run resumes mid-way.
    """

    def __init__(self, warmup_steps):
        self.warmup_left = warmup_steps
        self.images = 0
        self.seconds = 0.0

    def add(self, images, seconds):
        if self.warmup_left > 0:
            self.warmup_left -= 1
        else:
            self.images += images
            self.seconds += seconds

    def take(self):
        rate = self.images / self.seconds if self.seconds else None
        self.images, self.seconds = 0, 0.0
        return rate


def train(config, model_fn, datasets, input_shape, num_classes=10, log=print, source=None,
          run_info=None, stop_requested=None):
    """Train model_fn on datasets.train over config.tower_devices; test at the end.

    Args:
      config: a TrainConfig.
      model_fn: callable(images, training) -> logits [batch, num_classes].
      datasets: a data.Datasets; train and test need images [N, H, W, C]
        float32 and labels [N] int64.
      input_shape: (H, W, C).
      num_classes: labels lie in [0, num_classes).
      log: callable taking one line of text.
      source: an InputSource to train from instead of config.input over
        datasets.train (e.g. a towers.inputs.PythonInput); it must have
        steps_per_epoch.
      run_info: dict written to logdir/run.json (what `towers eval` and
        `towers export` need to rebuild the model: its name, options, dataset).
      stop_requested: callable() -> None, or why to stop (e.g. 'SIGTERM'),
        asked after every step; a stop saves a checkpoint and skips the test.
    Returns:
      dict with steps, test_loss, test_accuracy, images_per_sec (mean over the
      run after warm-up, None if too short), checkpoint (path or None) and
      dropped (records the dataset input's cleaning removed from what it read,
      else 0) and stopped (None, or what stop_requested said; then the test
      numbers are None).
    """
    config.validate()
    train_set = datasets.train
    if source is None:
        if config.batch_size > train_set.num_examples:
            raise TowersError('--batch-size %d exceeds the %d training examples; use a smaller '
                              'batch' % (config.batch_size, train_set.num_examples))
        sampler = EpochSampler(train_set.num_examples, config.batch_size, seed=config.seed)
        steps_per_epoch = sampler.steps_per_epoch
        # A dataset pipeline ends after the epochs asked for: when cleaning drops
        # records, its epochs are shorter than the sampler's.
        epochs = None if config.steps is not None else math.ceil(config.epochs)
        source = make_input(config.input, train_set, sampler, config.batch_size, num_classes,
                            seed=config.seed, epochs=epochs, mean=config.mean, std=config.std)
    else:
        steps_per_epoch = source.steps_per_epoch
    num_steps = config.total_steps(steps_per_epoch)
    if config.logdir:
        _prepare_logdir(config.logdir)
        if run_info is not None:
            write_run(config.logdir, input_shape=list(input_shape), num_classes=num_classes,
                      **run_info)
    graph = build_training_graph(
        model_fn, input_shape, config.tower_devices,
        lambda: make_optimizer(config.optimizer, config.learning_rate, config.momentum),
        param_device=config.param_device, seed=config.seed, source=source)
    sess_config = session_config(config.tower_devices, config.param_device)
    checkpoint, dropped, stopped = None, 0, None
    with tf1.Session(graph=graph.graph, config=sess_config) as sess:
        latest = tf1.train.latest_checkpoint(config.logdir) if config.logdir else None
        sess.run(graph.init_op)  # also the local variables a checkpoint does not hold
        if latest:
            restore(sess, graph, latest)
            # A fresh Saver knows none of the earlier checkpoints: without this it
            # would drop them from the state file and never delete them (max_to_keep).
            graph.saver.recover_last_checkpoints(
                tf1.train.get_checkpoint_state(config.logdir).all_model_checkpoint_paths)
            log('resumed from %s' % latest)
        step = int(sess.run(graph.global_step))
        window, overall = _Throughput(config.warmup_steps), _Throughput(config.warmup_steps)
        log('training %d steps on %d tower(s) %s, global batch %d, %s input'
            % (num_steps, len(config.tower_devices), ','.join(config.tower_devices),
               config.batch_size, source.name))
        try:
            source.start(sess, step, num_steps)
            while step < num_steps:
                start = time.perf_counter()
                values = run_step(sess, source, step,
                                  [graph.train_op, graph.loss, graph.correct, graph.batch])
                if values is None:
                    break  # a finite dataset input ended
                _, loss, correct, batch = values
                elapsed = time.perf_counter() - start
                step += 1  # the train op increments global_step by exactly one
                window.add(batch, elapsed)
                overall.add(batch, elapsed)
                if not np.isfinite(loss):
                    raise TowersError('loss is %s at step %d; lower --lr' % (loss, step))
                if step % config.log_every == 0 or step == num_steps:
                    rate = window.take()
                    log('step %d/%d epoch %.2f: loss %.4f accuracy %.4f%s'
                        % (step, num_steps, step / steps_per_epoch, loss, correct / batch,
                           ' | %.1f images/sec' % rate if rate else ''))
                stopped = stop_requested() if stop_requested else None
                if stopped:
                    log('%s: stopping after step %d' % (stopped, step))
                    break
                if (config.logdir and config.checkpoint_every
                        and step % config.checkpoint_every == 0):
                    checkpoint = graph.saver.save(
                        sess, os.path.join(config.logdir, 'model.ckpt'), global_step=step)
        except BaseException:
            try:
                source.stop(sess)
            except Exception:  # noqa: BLE001 - the error in flight is the one to report
                pass
            raise
        source.stop(sess)
        if config.logdir and (checkpoint is None or not checkpoint.endswith('-%d' % step)):
            checkpoint = graph.saver.save(sess, os.path.join(config.logdir, 'model.ckpt'),
                                          global_step=step)
        if checkpoint:
            log('checkpoint: %s' % checkpoint)
        cleaning = source.cleaning(sess)
        if cleaning and cleaning[0]:
            dropped = cleaning[0]
            log('cleaning dropped %d of the %d records read (every pass reads and cleans '
                'again)' % cleaning)
        test_loss = test_accuracy = None
        if not stopped:
            test_loss, test_accuracy = evaluate(sess, graph, datasets.test, config.batch_size)
    rate = overall.take()
    if rate:
        log('trained to step %d: %.1f images/sec after warm-up' % (step, rate))
    if not stopped:
        log('test: loss %.4f accuracy %.4f (%d images)'
            % (test_loss, test_accuracy, len(datasets.test.labels)))
    return {'steps': step, 'test_loss': test_loss, 'test_accuracy': test_accuracy,
            'images_per_sec': rate, 'checkpoint': checkpoint, 'dropped': dropped,
            'stopped': stopped}
