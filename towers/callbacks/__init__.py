"""Callbacks: everything that happens around a training step, one concern each.

The hooks and the order they are called in are in base.py. The NaN guard
runs first (guard.py), so nothing saves a step whose numbers are not finite;
checkpoints next (checkpoint.py), so that an epoch's checkpoint is on disk
before its (possibly long) evaluation starts (evaluate.py); the monitors that
only report, the progress bar, TensorBoard and the stats file, come after
(monitors.py). default_callbacks is what a run gets unless it lists its own.
"""
from towers.callbacks.base import Callback, Throughput
from towers.callbacks.checkpoint import Checkpoint
from towers.callbacks.evaluate import Evaluate
from towers.callbacks.guard import NaNGuard, SkippedSteps
from towers.callbacks.monitors import Progress, StatsFile, TensorBoard
from towers.callbacks.placement import PlacementAudit
from towers.config import TrainConfig
from towers.evaluation import split_size

__all__ = ['Callback', 'Checkpoint', 'Evaluate', 'NaNGuard', 'PlacementAudit', 'Progress',
           'SkippedSteps', 'StatsFile', 'TensorBoard', 'Throughput', 'default_callbacks']


def default_callbacks(config=None, data=None):
    """The callbacks a run gets unless it lists its own.

    Always: the NaN guard (and with a dynamic fp16 loss scale, the line of each
    step it skips), the placement audit of the first step, progress (a tqdm
    bar on a terminal, else log lines every config.log_every steps), and
    evaluation every config.eval_every
    epochs (0: none; also none when data, if given, holds out nothing). With a
    logdir: checkpoints (every checkpoint_every steps and each epoch, the
    newest keep_checkpoints), the best one on validation by best_metric kept
    apart, TensorBoard events and the JSON-lines stats file.

    Args:
      config: a TrainConfig (None: the defaults).
      data: the run's towers.data.Datasets, or None.
    """
    config = TrainConfig() if config is None else config
    if not isinstance(config, TrainConfig):
        raise TypeError('default_callbacks takes a TrainConfig, e.g. default_callbacks('
                        'TrainConfig(logdir=...)), not %r' % (config,))
    callbacks = [NaNGuard(), PlacementAudit(config.allow_soft_placement),
                 Progress(config.log_every, quiet=config.quiet)]
    if config.precision == 'fp16' and config.loss_scale in (None, 'dynamic'):
        callbacks.append(SkippedSteps())
    held_out = data is None or split_size(data, 'validation') or split_size(data, 'test')
    if config.eval_every and held_out:
        callbacks.append(Evaluate(every_epochs=config.eval_every, best_metric=config.best_metric))
    if config.logdir:
        callbacks.append(Checkpoint(every_steps=config.checkpoint_every,
                                    keep=config.keep_checkpoints))
        if config.tensorboard:
            callbacks.append(TensorBoard(every_steps=config.log_every,
                                         histograms=config.histograms))
        callbacks.append(StatsFile())
    return callbacks
