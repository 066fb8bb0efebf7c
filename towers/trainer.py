"""The Trainer: the one Session loop, with callbacks around each step.

Built from the teaching layer: build_training_graph (towers/graph.py) makes the
towers, average_gradients and the one apply_gradients; the loop below runs
`sess.run(train_op)` through the InputSource's run_step, and everything else
that happens around a step (checkpoints, evaluation, TensorBoard, the progress
bar, the stats file, the NaN guard) is a Callback (towers/callbacks.py). The
CLI's `towers train` is `train(TrainConfig, ...)`, which makes a
ClassifierModel and the default callbacks and runs this same loop.
"""
import fractions
import math
import os
import time

import tensorflow as tf

from towers.data.sampler import EpochSampler
from towers import callbacks as cb
from towers import evaluation
from towers import monitors
from towers.devices import resolve_devices, resolve_param_device, session_config
from towers.errors import TowersError
from towers.export import restore, write_run
from towers.graph import build_training_graph
from towers.inputs import InputSource, make_input, run_step
from towers.schedules import LearningRate
from towers.trace import trace_options
from towers.variables import host_device

tf1 = tf.compat.v1


def total_steps(max_epoch, max_steps, steps_per_epoch):
    """Steps of a whole run; a fractional epoch count is rounded up to a step."""
    if max_steps is not None:
        return max_steps
    # Fraction: 0.07 epochs of 1,100 steps is 77 steps, not 78 as float ceil says.
    return max(1, math.ceil(fractions.Fraction(repr(float(max_epoch))) * steps_per_epoch))


def prepare_logdir(logdir):
    try:
        os.makedirs(logdir, exist_ok=True)
    except OSError as e:
        raise TowersError('cannot create --logdir %s: %s' % (logdir, e.strerror)) from e
    if not os.access(logdir, os.W_OK):
        raise TowersError('--logdir %s is not writable; choose another folder' % logdir)


class Trainer:
    """tensorpack's interface on the tower core: a ModelDesc, data, callbacks.

    Args:
      model: a towers.model.ModelDesc.
      data: a data.Datasets; train feeds the towers (through `input`),
        validation and test are what Evaluate and the final test line read.
      towers: a tower count (virtual CPUs, or that many GPUs) or device names.
      callbacks: Callbacks; None means default_callbacks(logdir).
      steps_per_epoch: steps that make an epoch; None means one pass over
        data.train (ceil(N / batch_size), the last batch short).
      max_epoch: epochs to train (may be fractional); max_steps overrides it.
      batch_size: the global batch, sliced over the towers.
      input: an --input mode ('feed', 'staging', 'dataset', 'synthetic') or
        an InputSource (e.g. towers.staging.PythonInput; it must have
        steps_per_epoch unless that is given).
      param_device: where the variables live; None is the tutorial's /cpu:0,
        'spread' spreads them over the tower devices.
      variable_update: 'parameter_server', 'replicated' or 'independent'
        (towers/variables.py).
      sync_bn: batch norms use the whole global batch's moments (--sync-bn).
      learning_rate: a float or a towers.schedules.LearningRate.
      ema_decay: evaluate (and export) a moving average of the weights, or None.
      logdir: where checkpoints, run.json, events and stats go; a logdir that
        holds a checkpoint is resumed.
      seed: graph seed and data order; the order is saved with each checkpoint.
      mean, std: per-channel normalisation of the dataset input.
      log: callable taking one line of text.
      stop_requested: callable() -> None, or why to stop (e.g. 'SIGTERM'),
        asked after every step; a stop saves a checkpoint and skips evaluation.
      run_info: dict written to logdir/run.json (what `towers eval` and
        `towers export` need to rebuild the model).
      warmup_steps: steps left out of images/sec.
    """

    def __init__(self, model, data, towers=None, callbacks=None, steps_per_epoch=None,
                 max_epoch=10, max_steps=None, batch_size=100, input='feed', param_device=None,
                 learning_rate=1e-3, ema_decay=None, logdir=None, seed=0, mean=None, std=None,
                 log=print, stop_requested=None, run_info=None, warmup_steps=10,
                 variable_update='parameter_server', sync_bn=False):
        self.model, self.data = model, data
        self.tower_devices = (list(towers) if isinstance(towers, (list, tuple))
                              else resolve_devices(towers))
        self.param_device = resolve_param_device(param_device, self.tower_devices)
        if batch_size < 1:
            raise TowersError('--batch-size must be at least 1, got %s' % batch_size)
        if max_steps is not None and max_steps < 1:
            raise TowersError('--steps must be at least 1, got %s' % max_steps)
        if max_steps is None and not max_epoch > 0:
            raise TowersError('--epochs must be positive, got %s' % max_epoch)
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise TowersError('steps_per_epoch must be at least 1, got %s' % steps_per_epoch)
        self.batch_size, self.seed, self.logdir = batch_size, seed, logdir
        self.learning_rate = learning_rate if isinstance(learning_rate, LearningRate) \
            else LearningRate(learning_rate)
        self.ema_decay, self.log, self.stop_requested = ema_decay, log, stop_requested
        self.run_info, self.warmup_steps = run_info, warmup_steps
        self.variable_update, self.sync_bn = variable_update, sync_bn
        self.callbacks = sorted(default_callbacks(logdir, data=data) if callbacks is None
                                else callbacks, key=lambda c: c.order)
        self.source, self.sampler = self._make_source(input, steps_per_epoch, max_epoch,
                                                      max_steps, mean, std)
        self.steps_per_epoch = steps_per_epoch or (
            self.sampler.steps_per_epoch if self.sampler else self.source.steps_per_epoch)
        self.num_steps = total_steps(max_epoch, max_steps, self.steps_per_epoch)
        # Set while train() runs; what callbacks read. epoch_stats: split ->
        # {'loss': ..., metric: ...} of the evaluations made at this step.
        self.graph = self.sess = None
        self.step, self.stopped, self.epoch_stats = 0, None, {}
        self._evaluated = {}

    @property
    def epoch(self):
        """Epochs done so far, fractional mid-epoch."""
        return self.step / self.steps_per_epoch

    def _make_source(self, input, steps_per_epoch, max_epoch, max_steps, mean, std):
        if isinstance(input, InputSource):
            if steps_per_epoch is None and not hasattr(input, 'steps_per_epoch'):
                raise TowersError('give steps_per_epoch for an input source without one')
            return input, None
        train_set = self.data.train
        if self.batch_size > train_set.num_examples:
            raise TowersError('--batch-size %d exceeds the %d training examples; use a smaller '
                              'batch' % (self.batch_size, train_set.num_examples))
        sampler = EpochSampler(train_set.num_examples, self.batch_size, seed=self.seed)
        # A dataset pipeline ends after the epochs asked for: when cleaning drops
        # records, its epochs are shorter than the sampler's.
        epochs = None if (max_steps or steps_per_epoch) else math.ceil(max_epoch)
        num_classes = getattr(self.model, 'num_classes', None) or train_set.num_classes
        # (DataSet and RecordSet know their class count; a ModelDesc may say it too.)
        return make_input(input, train_set, sampler, self.batch_size, num_classes,
                          seed=self.seed, epochs=epochs, mean=mean, std=std), sampler

    def evaluate(self, split):
        """{'loss': ..., metrics...} over data.<split> at this step (computed once per step)."""
        key = (split, self.step)
        if key not in self._evaluated:
            self._evaluated[key] = evaluation.evaluate(self.sess, self.graph, getattr(self.data, split),
                                            self.batch_size)
        return self._evaluated[key]

    def _build(self):
        graph = build_training_graph(
            self.model, self.tower_devices, self.param_device, seed=self.seed,
            source=self.source, learning_rate=self.learning_rate,
            steps_per_epoch=self.steps_per_epoch, ema_decay=self.ema_decay, finalize=False,
            variable_update=self.variable_update, sync_bn=self.sync_bn)
        with graph.graph.as_default():
            with tf.device(host_device(self.param_device)), tf1.variable_scope('data_order'):
                # The data order's inputs, saved with every checkpoint so that a
                # resume which would see other batches is refused.
                order = [tf1.get_variable(name, initializer=tf.constant(value, tf.int64),
                                          trainable=False)
                         for name, value in self._data_order().items()]
            self.graph = graph
            for callback in self.callbacks:
                callback.setup_graph(self)
            init_op = tf.group(tf1.global_variables_initializer(),
                               tf1.local_variables_initializer(), name='init_all')
            self.saved = graph.strategy.saved_variables()
            saver = tf1.train.Saver(self.saved, max_to_keep=None)
        graph.graph.finalize()
        self.graph = graph._replace(init_op=init_op, saver=saver)
        return order

    def _data_order(self):
        examples = self.sampler.num_examples if self.sampler else -1
        # feed and staging follow the sampler; dataset shuffles in tf.data: another order.
        pipeline = 1 if self.source.name == 'dataset' else 0
        return {'seed': self.seed, 'batch_size': self.batch_size, 'num_examples': examples,
                'tf_data_order': pipeline, 'steps_per_epoch': self.steps_per_epoch}

    def _resume(self, order):
        latest = tf1.train.latest_checkpoint(self.logdir) if self.logdir else None
        if not latest:
            return
        restore(self.sess, self.graph.saver, latest, self.saved)
        saved = dict(zip(self._data_order(), self.sess.run(order)))
        if saved != self._data_order():
            raise TowersError(
                'the checkpoint in %s was trained with data order %s, this run asks for %s: '
                'resuming would train on other batches; use the same --seed, --batch-size, '
                'dataset and --input, or a new --logdir' % (self.logdir, _pairs(saved),
                                                       _pairs(self._data_order())))
        self.log('resumed from %s' % latest)

    def train(self):
        """Run the loop to num_steps (or a stop); returns a dict (see `train`)."""
        if self.logdir:
            prepare_logdir(self.logdir)
        order = self._build()
        overall = cb.Throughput(self.warmup_steps)
        config = session_config(self.tower_devices, self.param_device)
        fetches = self._fetches()
        names = sorted(fetches)
        try:
            with tf1.Session(graph=self.graph.graph, config=config) as self.sess:
                self.sess.run(self.graph.init_op)  # also what a checkpoint does not hold
                self._resume(order)
                self.sess.run(self.graph.sync_op)  # replicas take the master's values
                if self.logdir and self.run_info is not None:
                    # Only once the checkpoint there (if any) fits this run: a refused
                    # resume leaves the logdir's record of its model as it was.
                    write_run(self.logdir, input_shape=list(self.model.input_shape),
                              num_classes=getattr(self.model, 'num_classes', None),
                              ema=self.ema_decay is not None, **self.run_info)
                self.step = int(self.sess.run(self.graph.global_step))
                self.log('training %d steps on %d tower(s) %s, global batch %d, %s input'
                         % (self.num_steps, len(self.tower_devices),
                            ','.join(self.tower_devices), self.batch_size, self.source.name))
                for callback in self.callbacks:
                    callback.before_train(self)
                self._loop(names, [fetches[n] for n in names], overall)
                for callback in self.callbacks:
                    callback.after_train(self)
                result = self._result(overall)
        finally:
            for callback in reversed(self.callbacks):
                callback.close()
            self.sess = None
        return result

    def _fetches(self):
        """What each step runs: the train op, loss, metrics, ... and the callbacks' fetches."""
        fetches = {'train_op': self.graph.train_op, 'loss': self.graph.loss,
                   'batch': self.graph.batch, 'learning_rate': self.graph.learning_rate}
        for name, tensor in self.graph.metrics.items():
            if name in fetches or name == 'seconds':
                raise TowersError('the model names a metric %r, which the trainer uses itself; '
                                  'rename it' % name)
            fetches[name] = tensor
        for callback in self.callbacks:
            for name, tensor in callback.fetches(self).items():
                if name in fetches and fetches[name] is not tensor:
                    raise TowersError('%s fetches %r, a name already taken; rename it'
                                      % (type(callback).__name__, name))
                fetches[name] = tensor
        return fetches

    def _loop(self, names, fetches, overall):
        try:
            self.source.start(self.sess, self.step, self.num_steps)
            while self.step < self.num_steps:
                options = metadata = None
                if any(c.wants_trace(self) for c in self.callbacks):
                    options, metadata = trace_options()
                start = time.perf_counter()
                values = run_step(self.sess, self.source, self.step, fetches, options, metadata)
                if values is None:
                    break  # a finite dataset input ended
                values = dict(zip(names, values), seconds=time.perf_counter() - start)
                if metadata is not None:
                    values['run_metadata'] = metadata
                del values['train_op']
                self.step += 1  # the train op increments global_step by exactly one
                overall.add(values['batch'], values['seconds'])
                self.epoch_stats = {}  # what evaluations at this step found
                for callback in self.callbacks:
                    callback.after_step(self, values)
                # An epoch that ends here is finished (saved, evaluated, recorded)
                # even when a stop was asked for meanwhile: a resume starts after it.
                if self.step % self.steps_per_epoch == 0:
                    for callback in self.callbacks:
                        callback.after_epoch(self)
                self.stopped = self.stop_requested() if self.stop_requested else None
                if self.stopped:
                    self.log('%s: stopping after step %d' % (self.stopped, self.step))
                    break
        except BaseException:
            try:
                self.source.stop(self.sess)
            except Exception:  # noqa: BLE001 - the error in flight is the one to report
                pass
            raise
        self.source.stop(self.sess)

    def _result(self, overall):
        dropped = 0
        cleaning = self.source.cleaning(self.sess)
        if cleaning and cleaning[0]:
            dropped = cleaning[0]
            self.log('cleaning dropped %d of the %d records read (every pass reads and cleans '
                     'again)' % cleaning)
        test = None
        if not self.stopped and evaluation.split_size(self.data, 'test'):
            test = self.evaluate('test')
        rate = overall.take()
        if rate:
            self.log('trained to step %d: %.1f images/sec after warm-up' % (self.step, rate))
        if test is not None:
            self.log('test: %s (%d images)' % (evaluation.format_metrics(test),
                                               evaluation.split_size(self.data, 'test')))
        checkpoint = next((c.last_saved for c in self.callbacks
                           if isinstance(c, cb.Checkpoint)), None)
        return {'steps': self.step, 'test': test,
                'test_loss': test and test['loss'], 'test_accuracy': test and test.get('accuracy'),
                'images_per_sec': rate, 'checkpoint': checkpoint, 'dropped': dropped,
                'stopped': self.stopped}


def _pairs(values):
    return ', '.join('%s %s' % (k, v) for k, v in sorted(values.items()))


def default_callbacks(logdir=None, log_every=50, checkpoint_every=500, keep=5, quiet=False,
                      eval_every=1, best_metric='auto', tensorboard=True, histograms=False,
                      data=None):
    """The callbacks a run gets unless it lists its own.

    Always: the NaN guard, progress (a tqdm bar on a terminal, else log lines
    every log_every steps), and evaluation every eval_every epochs (0: none;
    also none when data, if given, holds out nothing). With a logdir:
    checkpoints (every checkpoint_every steps and each epoch, the newest
    `keep`), the best one on validation by best_metric kept apart,
    TensorBoard events and the JSON-lines stats file.
    """
    callbacks = [cb.NaNGuard(), monitors.Progress(log_every, quiet=quiet)]
    held_out = data is None or evaluation.split_size(data, 'validation') or evaluation.split_size(data, 'test')
    if eval_every and held_out:
        callbacks.append(cb.Evaluate(every_epochs=eval_every, best_metric=best_metric))
    if logdir:
        callbacks.append(cb.Checkpoint(every_steps=checkpoint_every, keep=keep))
        if tensorboard:
            callbacks.append(monitors.TensorBoard(every_steps=log_every, histograms=histograms))
        callbacks.append(monitors.StatsFile())
    return callbacks
