"""towers: graph-mode multi-tower (data-parallel) training on tf.compat.v1.

The public API, in the order the classic recipe uses it:

    resolve_devices, session_config    which devices; a ConfigProto that has them
    local_plan, DevicePlan             where towers, variables and host ops go, decided once
    split_batch                        slice the global batch, one piece per tower
    build_towers, Tower                one tower per device, shared variables
    average_gradients                  combine the towers' gradients
    build_train_op                     average_gradients -> one apply_gradients
    make_optimizer                     sgd / momentum / adam by name
    build_training_graph, TrainGraph   all of the above in a fresh tf.Graph
    TowerContext                       what a tower's layers are told (mode, index, share)
    open_session, run_steps            the session harness: init, restore, sync; the steps

The Trainer, built from those:

    ModelDesc, ClassifierModel         what a model gives the Trainer
    Trainer, default_callbacks         the one Session loop, callbacks around it
    Callback, Checkpoint, Evaluate,    callbacks: checkpoints, evaluation and the
    NaNGuard, Progress, TensorBoard,   best checkpoint, the NaN guard, progress,
    StatsFile                          events, stats.jsonl
    LearningRate                       learning-rate schedules in epochs
    WeightDecay, ClipGlobalNorm,       what happens to the averaged gradients
    ScaleGradient, FreezeVariables
    Trace                              one step as a Chrome trace (--trace)
    TrainConfig                        every setting of a run, checked once
    train, evaluate                    a CLI run in one call; exact evaluation
    make_strategy                      --variable-update: parameter_server, replicated,
                                       independent
    check_towers                       N towers against one device (towers check)
    TowersError, SettingError          what bad input raises

Names are imported on first use, so `import towers` (and `towers --help`) does
not load TensorFlow.
"""
import importlib

_API = {
    'resolve_devices': 'towers.devices',
    'session_config': 'towers.devices',
    'DevicePlan': 'towers.deviceplan',
    'local_plan': 'towers.deviceplan',
    'build_towers': 'towers.tower',
    'split_batch': 'towers.tower',
    'Tower': 'towers.tower',
    'average_gradients': 'towers.gradients',
    'build_train_op': 'towers.gradients',
    'build_training_graph': 'towers.graph',
    'make_optimizer': 'towers.model',
    'TrainGraph': 'towers.graph',
    'ModelDesc': 'towers.model',
    'ClassifierModel': 'towers.model',
    'Trainer': 'towers.trainer',
    'default_callbacks': 'towers.callbacks',
    'Callback': 'towers.callbacks',
    'Checkpoint': 'towers.callbacks',
    'Evaluate': 'towers.callbacks',
    'NaNGuard': 'towers.callbacks',
    'Progress': 'towers.callbacks',
    'TensorBoard': 'towers.callbacks',
    'StatsFile': 'towers.callbacks',
    'Trace': 'towers.tools.trace',
    'make_strategy': 'towers.variables',
    'check_towers': 'towers.tools.check',
    'LearningRate': 'towers.schedules',
    'WeightDecay': 'towers.processors',
    'ClipGlobalNorm': 'towers.processors',
    'ScaleGradient': 'towers.processors',
    'FreezeVariables': 'towers.processors',
    'train': 'towers.trainer',
    'TrainConfig': 'towers.config',
    'evaluate': 'towers.evaluation',
    'TowersError': 'towers.errors',
    'SettingError': 'towers.errors',
    'TowerContext': 'towers.context',
    'open_session': 'towers.session',
    'run_steps': 'towers.session',
}

__all__ = sorted(_API)


def __getattr__(name):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
