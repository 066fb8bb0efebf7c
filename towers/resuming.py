"""A resume: a logdir's newest whole checkpoint restored into a new Session, and checked;
and the record of the run (logdir/run.json) that a resume, `towers eval` and `export` read.

What the Trainer runs between the variables' init and the replicas' sync
(towers/session.py open_session's `load`): the checkpoint that reads back whole (a newer one
cut short is named and passed over), the data order it was trained in (a resume that would
train on other batches is refused, towers/dataorder.py), op determinism as it was, and the
loss scale where the checkpoint has none.
"""
import os

from towers import checkpoints, exactness
from towers.names import RUN_FILE


def record_run(logdir, model, config, num_steps, run_info):
    """Write logdir/run.json: what rebuilds the model (run_info: its name, options, dataset)
    and how it was trained."""
    checkpoints.write_run(
        logdir, input_shape=list(model.input_shape),
        num_classes=getattr(model, 'num_classes', None), ema=config.ema is not None,
        precision=config.precision, normalization=getattr(model, 'normalization', None),
        num_steps=num_steps, deterministic=exactness.deterministic(), **run_info)


def resume(sess, logdir, graph, saved, unscaled, data_order, log):
    """Restore logdir's newest complete checkpoint into sess, if there is one.

    Args:
      graph: the TrainGraph (its saver, and its precision for the loss scale's start).
      saved: {name: variable} the checkpoints hold (the strategy's saved_variables).
      unscaled: a Saver of them without the loss scale (towers.checkpoints.optional_saver),
        for a checkpoint of another precision, or None.
      data_order: the run's towers.dataorder.DataOrder, checked against the checkpoint's.
      log: callable taking one line.
    Returns:
      Whether a checkpoint was restored.
    """
    latest, newest = checkpoints.to_restore(logdir) if logdir else (None, None)
    if not latest:
        return False
    fresh = checkpoints.restore(sess, graph.saver, latest, saved,
                                advice='move it away to resume from an older one, or use '
                                       'another {logdir}', optional=unscaled)
    data_order.check(sess, logdir)
    log('resumed from %s%s' % (latest, '' if latest == newest else
                                ' (%s, newer, does not read back whole)' % newest))
    before = checkpoints.read_run(logdir).get('deterministic') \
        if os.path.exists(os.path.join(logdir, RUN_FILE)) else None
    if before is not None and before != exactness.deterministic():
        # Op determinism changes the kernels themselves, the CPU's too.
        log('warning: %s was trained with op determinism %s and resumes with it %s: it '
            'continues, not bit-exactly' % (logdir, 'on' if before else 'off',
                                            'off' if before else 'on'))
    if fresh:
        log('%s holds no dynamic loss scale (trained in another precision, or with a fixed '
            'scale): the scale starts at %g' % (latest, graph.precision.scaling[1]))
    return True
