"""TrainConfig: a run as flat settings (the CLI's flags), and train() to run it.

train() is the Trainer with a ClassifierModel and the default callbacks: the
command line and the Python API run the same loop (towers/trainer.py).
"""
import dataclasses

from towers.errors import TowersError
from towers.gradients import check_pattern
from towers.model import ClassifierModel
from towers.monitors import Trace
from towers.schedules import LearningRate
from towers.trace import check_output
from towers.trainer import Trainer, default_callbacks


@dataclasses.dataclass
class TrainConfig:
    """What to train and how; the CLI's flags map one to one onto these fields.

    steps, when given, sets the length; otherwise epochs does, an epoch being
    ceil(N / batch_size) steps with a short last batch. batch_size is the
    *global* batch, sliced over the towers.
    """
    tower_devices: list = dataclasses.field(default_factory=lambda: ['/cpu:0'])
    param_device: str = '/cpu:0'
    variable_update: str = 'parameter_server'  # see towers/variables.py
    sync_bn: bool = False
    batch_size: int = 100
    epochs: float = 10.0
    steps: int = None
    optimizer: str = 'adam'
    learning_rate: float = 1e-3
    lr_schedule: str = 'constant'  # see towers/schedules.py
    warmup_epochs: float = 0.0
    momentum: float = 0.9
    weight_decay: float = 0.0
    clip_norm: float = None
    freeze: str = None  # regex of variables not to train
    ema: float = None  # decay of the weights' moving average, used to evaluate and export
    logdir: str = None
    log_every: int = 50
    checkpoint_every: int = 500
    keep_checkpoints: int = 5
    eval_every: int = 1  # epochs; 0: only the final test
    best_metric: str = 'accuracy'
    tensorboard: bool = True
    histograms: bool = False
    quiet: bool = False
    trace: str = None  # --trace FILE: one step as a Chrome trace
    trace_step: int = None
    trace_plot: str = None  # --trace-plot FILE.png: that step as a timeline picture
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
            (self.keep_checkpoints >= 1, '--keep-checkpoints must be at least 1, got %s'
             % self.keep_checkpoints),
            (self.eval_every >= 0, '--eval-every must be 0 (off) or more epochs, got %s'
             % self.eval_every),
            (self.warmup_steps >= 0, 'warmup_steps must be 0 or more, got %s'
             % self.warmup_steps),
            ((self.mean is None) == (self.std is None), '--mean and --std go together'),
            (self.mean is None or self.input == 'dataset',
             '--mean/--std normalise in the tf.data pipeline: use them with --input dataset'),
            (self.std is None or all(s > 0 for s in self.std),
             '--std values must be positive, got %s' % self.std),
            (self.weight_decay >= 0, '--weight-decay must be 0 or more, got %s'
             % self.weight_decay),
            (self.clip_norm is None or self.clip_norm > 0, '--clip-norm must be positive, got %s'
             % self.clip_norm),
            (self.ema is None or 0 < self.ema < 1, '--ema must lie between 0 and 1 (e.g. '
             '0.999), got %s' % self.ema),
            (self.trace_plot is None or self.trace, '--trace-plot goes with --trace'),
            (self.trace_step is None or self.trace_step >= 1, '--trace-step must be at least 1, '
             'got %s' % self.trace_step),
            (self.best_metric in ('accuracy', 'loss'), "--best-metric %r is not a metric of "
             "this model; choose one of: loss, accuracy" % self.best_metric)]
        for ok, message in checks:
            if not ok:
                raise TowersError(message)
        self.schedule()  # its own one-line errors
        if self.freeze is not None:
            check_pattern(self.freeze, '--freeze')
        for path, flag in ((self.trace, '--trace'), (self.trace_plot, '--trace-plot')):
            if path:
                check_output(path, flag)

    def schedule(self):
        return LearningRate.parse(self.learning_rate, self.lr_schedule, self.warmup_epochs)

    def callbacks(self, data=None):
        callbacks = default_callbacks(
            self.logdir, log_every=self.log_every, checkpoint_every=self.checkpoint_every,
            keep=self.keep_checkpoints, quiet=self.quiet, eval_every=self.eval_every,
            best_metric=self.best_metric, tensorboard=self.tensorboard,
            histograms=self.histograms, data=data)
        if self.trace:
            callbacks.append(Trace(self.trace, self.trace_step, self.trace_plot))
        return callbacks


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
        datasets.train (e.g. a towers.staging.PythonInput); it must have
        steps_per_epoch.
      run_info: dict written to logdir/run.json (what `towers eval` and
        `towers export` need to rebuild the model: its name, options, dataset).
      stop_requested: callable() -> None, or why to stop (e.g. 'SIGTERM'),
        asked after every step; a stop saves a checkpoint and skips the test.
    Returns:
      dict with steps, test (loss and metrics), test_loss, test_accuracy,
      images_per_sec (mean over the run after warm-up, None if too short),
      checkpoint (path or None), dropped (records the dataset input's
      cleaning removed from what it read, else 0) and stopped (None, or what
      stop_requested said; then the test numbers are None).
    """
    config.validate()
    model = ClassifierModel(model_fn, input_shape, num_classes, optimizer=config.optimizer,
                            momentum=config.momentum, weight_decay=config.weight_decay,
                            clip_norm=config.clip_norm, freeze=config.freeze)
    trainer = Trainer(
        model, datasets, towers=config.tower_devices, callbacks=config.callbacks(datasets),
        max_epoch=config.epochs, max_steps=config.steps, batch_size=config.batch_size,
        input=source or config.input, param_device=config.param_device,
        learning_rate=config.schedule(), ema_decay=config.ema, logdir=config.logdir,
        seed=config.seed, mean=config.mean, std=config.std, log=log,
        stop_requested=stop_requested, run_info=run_info, warmup_steps=config.warmup_steps,
        variable_update=config.variable_update, sync_bn=config.sync_bn)
    return trainer.train()
