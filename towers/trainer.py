"""The Trainer: the one Session loop, with callbacks around each step.

Built from the teaching layer: build_training_graph (towers/graph.py) makes the
towers, average_gradients and the one apply_gradients; the session harness
(towers/session.py) opens the Session and runs `sess.run(train_op)` through
the InputSource; everything else that happens around a step (checkpoints,
evaluation, TensorBoard, the progress bar, the stats file, the NaN guard) is
a Callback (towers/callbacks/). The settings come whole
in a TrainConfig (towers/config.py). `train()` is what `towers train` runs:
a ClassifierModel over a registry model_fn, the default callbacks, this loop.
"""
import tensorflow as tf

from towers import checkpoints, evaluation
from towers.callbacks import Checkpoint, Throughput, default_callbacks
from towers.callbacks.origin import origin_said
from towers.config import TrainConfig
from towers.dataorder import DataOrder
from towers.distribution import Run
from towers.errors import TowersError
from towers.firstlines import first_lines
from towers.graph import build_training_graph, finalize_graph
from towers.initfrom import InitFrom
from towers.inputs import source_for
from towers.logdir import LogdirLock, prepare_logdir
from towers.memory import memory_said
from towers.model import ClassifierModel
from towers.precision import Precision
from towers.resuming import record_run, resume
from towers.schedules import total_steps
from towers.session import run_steps, step_options

tf1 = tf.compat.v1


class Trainer:
    """tensorpack's interface on the tower core: a ModelDesc, data, a TrainConfig, callbacks.

    Args:
      model: a towers.model.ModelDesc.
      data: a towers.data.Datasets; train feeds the towers (through the
        config's input), validation and test are what Evaluate and the final
        test line read.
      config: a TrainConfig; or give its settings as keywords instead
        (`Trainer(model, data, towers=2, epochs=3)`).
      callbacks: Callbacks; None means default_callbacks(config, data).
      source: an InputSource to train from instead of config.input over
        data.train (e.g. a towers.inputs.PythonInput; it must have
        steps_per_epoch unless the config says it).
      log: callable taking one line of text.
      stop_requested: callable() -> None, or why to stop (e.g. 'SIGTERM'),
        asked after every step; a stop saves a checkpoint and skips evaluation.
      run_info: dict written to logdir/run.json (what `towers eval` and
        `towers export` need to rebuild the model).
      run: the run's shape (towers/distribution.py): its plan, strategy, Session...;
        a cluster mode's (towers/cluster/modes.py), or None: Run.local(config), this
        process's.
    """

    def __init__(self, model, data, config=None, *, callbacks=None, source=None, log=print,
                 stop_requested=None, run_info=None, run=None, **settings):
        if config is None:
            config = TrainConfig.from_keywords(**settings)
        elif settings:
            raise TypeError('give a TrainConfig or its settings, not both: %s' % sorted(settings))
        model.check_settings(config)
        self.model, self.data, self.config = model, data, config
        self.run = run if run is not None else Run.local(config)
        self.plan = self.run.plan
        self.tower_devices = list(self.plan.towers)
        self.logdir, self.batch_size = config.logdir, config.batch_size
        self.warmup_steps = config.warmup_steps
        self.log, self.stop_requested, self.run_info = log, stop_requested, run_info
        self.callbacks = sorted(default_callbacks(config, data) if callbacks is None
                                else callbacks, key=lambda c: c.order)
        self.given_source = source  # a source of the caller's own: a replay cannot remake it
        self.source, self.sampler = source_for(config, data, model, source,
                                               share=self.run.share)
        self.steps_per_epoch = config.steps_per_epoch or (
            self.sampler.steps_per_epoch if self.sampler else self.source.steps_per_epoch)
        self.num_steps = total_steps(config.epochs, config.steps, self.steps_per_epoch)
        # Set while train() runs; what callbacks read. epoch_stats: split ->
        # {'loss': ..., metric: ...} of the evaluations made at this step.
        self.graph = self.sess = None
        self.step, self.stopped, self.epoch_stats = 0, None, {}
        self._evaluated = {}

    @property
    def epoch(self):
        """Epochs done so far, fractional mid-epoch."""
        return self.step / self.steps_per_epoch

    def evaluate(self, split):
        """{'loss': ..., metrics...} over data.<split> at this step (computed once per step)."""
        key = (split, self.step)
        if key not in self._evaluated:
            self._evaluated[key] = evaluation.evaluate(
                self.sess, self.graph, getattr(self.data, split), self.batch_size)
        return self._evaluated[key]

    def _build(self):
        config = self.config
        graph = build_training_graph(
            self.model, self.plan, seed=config.seed, source=self.source,
            learning_rate=config.schedule(), steps_per_epoch=self.steps_per_epoch,
            total_steps=self.num_steps, ema_decay=config.ema, finalize=False,
            strategy=self.run.strategy, sync_bn=config.sync_bn,
            precision=Precision(config.precision, config.loss_scale),
            accumulate=config.accumulate)
        # In a cluster the chief's task completes every device here too: its Savers
        # write the checkpoints, its host runs the evaluation's slicing.
        with graph.graph.as_default(), tf1.device(self.plan.default_device):
            self.run.build_ops(self.plan.host)
            self.data_order = DataOrder(self._data_order())
            self.data_order.build(self.plan.host)
            self.graph = graph
            for callback in self.callbacks:
                callback.setup_graph(self)
            self.run.agree(self)
            self.saved = graph.strategy.saved_variables()
            self.init_from = InitFrom(config.init_from, config.init_map, self.saved) \
                if config.init_from else None
            # A checkpoint of another precision has no loss scale: restore the rest.
            self.unscaled = checkpoints.optional_saver(self.saved, graph.loss_scale)
            init_op, saver = finalize_graph(graph.graph, graph.strategy,
                                            freeze=self.run.finalizes_graph)
        self.graph = graph._replace(init_op=init_op, saver=saver)

    def _data_order(self):
        examples = self.sampler.num_examples if self.sampler else -1
        # feed and staging follow the sampler; a tf.data pipeline shuffles: another order.
        pipeline = 1 if self.source.tf_data else 0
        return {'seed': self.config.seed, 'batch_size': self.batch_size,
                'num_examples': examples, 'tf_data_order': pipeline,
                'steps_per_epoch': self.steps_per_epoch}

    def _resume(self, sess):
        resumed = resume(sess, self.logdir, self.graph, self.saved, self.unscaled,
                         self.data_order, self.log)
        if self.init_from is not None and resumed:
            self.log('init from %s left out: the run resumes from its own checkpoint'
                     % self.init_from.checkpoint)
        elif self.init_from is not None:
            self.init_from.restore(sess, self.log)

    def train(self):
        """Run the loop to num_steps (or a stop); returns a dict (see `train`)."""
        with memory_said(self.plan, self.batch_size, self.config.accumulate), \
                origin_said(self):
            if not self.logdir:
                return self._train()
            prepare_logdir(self.logdir)
            with LogdirLock(self.logdir):  # before anything is written there
                return self._train()

    def _train(self):
        self._build()
        overall = Throughput(self.warmup_steps)
        fetches = self._fetches()
        try:
            with self.run.session(self.graph, self._resume, lambda: self.step) as self.sess:
                if self.logdir and self.run_info is not None:
                    # Only once the checkpoint there (if any) fits this run: a refused
                    # resume leaves the logdir's record of its model as it was.
                    record_run(self.logdir, self.model, self.config, self.num_steps,
                               self.run_info)
                self.step = int(self.sess.run(self.graph.global_step))
                for line in first_lines(self):
                    self.log(line)
                # (The log as it is when said: the progress bar writes around itself.)
                self.source.announce(lambda line: self.log(line))
                for callback in self.callbacks:
                    callback.before_train(self)
                self._loop(fetches, overall)
                for callback in self.callbacks:
                    callback.after_train(self)
                return self._result(overall)
        finally:
            for callback in reversed(self.callbacks):
                callback.close()
            self.sess = None

    def _fetches(self):
        """What each step runs: the train op, loss, metrics, ... and the callbacks' fetches."""
        fetches = {'train_op': self.graph.train_op, 'loss': self.graph.loss,
                   'batch': self.graph.batch, 'learning_rate': self.graph.learning_rate}
        if self.run.votes is not None:
            fetches['stop_votes'] = self.run.votes
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

    def _run_options(self, step):
        """Trace the coming step when a callback wants it (--trace); the run's own options
        (on a cluster, a timeout; longer after an epoch's end or a checkpoint)."""
        options = step_options(c.wants_trace(self) for c in self.callbacks)
        every = self.config.checkpoint_every
        after_chief_work = step > 0 and (step % self.steps_per_epoch == 0
                                         or bool(every and step % every == 0))
        return self.run.run_options(options, after_chief_work)

    def _loop(self, fetches, overall):
        asked = None  # a stop asked of this process; in a collective run, voted on
        feed = (lambda step: self.run.vote_feed(asked)) if 'stop_votes' in fetches else None
        with run_steps(self.sess, self.source, fetches, self.step, self.num_steps,
                       run_options=self._run_options, feed=feed) as steps:
            for values in steps:
                del values['train_op']
                self.step = steps.step  # the train op increments global_step by exactly one
                overall.add(values['batch'], values['seconds'])
                self.run.observe(values['seconds'])
                self.epoch_stats = {}  # what evaluations at this step found
                for callback in self.callbacks:
                    callback.after_step(self, values)
                # An epoch that ends here is finished (saved, evaluated, recorded)
                # even when a stop was asked for meanwhile: a resume starts after it.
                if self.step % self.steps_per_epoch == 0:
                    for callback in self.callbacks:
                        callback.after_epoch(self)
                asked = asked or (self.stop_requested() if self.stop_requested else None)
                if 'stop_votes' not in values:
                    self.stopped = asked
                elif values['stop_votes'] > 0:  # every worker stops after this same step
                    self.stopped = asked or 'a stop asked of another worker'
                if self.stopped:
                    self.log('%s: stopping after step %d' % (self.stopped, self.step))
                    break

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
        scale = self.graph.loss_scale
        skipped = scale.skipped(self.sess, self.log) if scale is not None else 0
        checkpoint = next((c.last_saved for c in self.callbacks
                           if isinstance(c, Checkpoint)), None)
        return {'steps': self.step, 'test': test,
                'test_loss': test and test['loss'], 'test_accuracy': test and test.get('accuracy'),
                'test_top5': test and test.get('top5'),
                'images_per_sec': rate, 'checkpoint': checkpoint, 'dropped': dropped,
                'stopped': self.stopped, 'skipped_steps': skipped}


def train(config, model_fn, datasets, input_shape, num_classes=10, log=print, source=None,
          run_info=None, stop_requested=None, callbacks=(), run=None):
    """Train model_fn on datasets.train as config says; test at the end.

    What `towers train` runs: a ClassifierModel (mean softmax cross-entropy,
    accuracy; the config's optimizer, weight decay, clipping and freezing),
    the default callbacks plus `callbacks`, and the Trainer's loop.

    Args:
      config: a TrainConfig.
      model_fn: callable(images, training) -> logits [batch, num_classes].
      datasets: a towers.data.Datasets; train and test need images
        [N, H, W, C] float32 and labels [N] int64.
      input_shape: (H, W, C).
      num_classes: labels lie in [0, num_classes).
      callbacks: more Callbacks besides the default ones (e.g. a
        towers.tools.trace.Trace).
      log, source, run_info, stop_requested, run: as for Trainer.
    Returns:
      dict with steps, test (loss and metrics), test_loss, test_accuracy,
      images_per_sec (mean over the run after warm-up, None if too short),
      checkpoint (path or None), dropped (records the dataset input's
      cleaning removed from what it read, else 0), stopped (None, or what
      stop_requested said; then the test numbers are None) and skipped_steps
      (steps a dynamic fp16 loss scale skipped, 0 otherwise).
    """
    model = ClassifierModel.from_config(model_fn, input_shape, num_classes, config)
    trainer = Trainer(model, datasets, config,
                      callbacks=default_callbacks(config, datasets) + list(callbacks),
                      source=source, log=log, stop_requested=stop_requested,
                      run_info=run_info, run=run)
    return trainer.train()
