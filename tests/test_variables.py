"""--variable-update: parameter_server (one place or spread), replicated, independent."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

from tests.harness import fed, open_graph, run_graph, saved_variables, train_steps
from towers import data, models
from towers.callbacks import Callback
from towers.deviceplan import local_plan
from towers.errors import TowersError
from towers.graph import build_training_graph
from towers.model import ClassifierModel
from towers.spread import LeastLoaded
from towers.trainer import Trainer
from towers.variables import make_strategy

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)
THREE = ['/cpu:0', '/cpu:1', '/cpu:2']


def _model(optimizer='momentum', **options):
    return ClassifierModel(models.build_model('small_convnet', SHAPE, 10), SHAPE, 10,
                           optimizer=optimizer, **options)


def _batches(num_steps, batch=7, seed=0):
    rng = np.random.RandomState(seed)
    return [(rng.rand(batch, *SHAPE).astype(np.float32), rng.randint(0, 10, batch))
            for _ in range(num_steps)]


def _graph(variable_update, num_steps, param_device='/cpu:0', all_reduce=None, **model):
    """The three towers' TrainGraph, fed _batches(num_steps)."""
    plan = local_plan(THREE, param_device, variable_update, all_reduce=all_reduce)
    return build_training_graph(_model(**model), plan, seed=3,
                                source=fed(_batches(num_steps)), learning_rate=0.05)


@pytest.fixture(scope='module')
def graphs():
    """_graph's arguments -> its TrainGraph, each built once a module: a test that reads where
    the variables are reads the graph another test trains (a graph of three towers is ~1 CPU-s
    to build; its placement is the same whether a Session has run it or not). Op determinism
    (the `exact` mark) changes the ops a graph is built with: a graph built with it is never
    handed to a test without it, nor the other way."""
    built = {}

    def graph(*args, **kwargs):
        key = (tf_config.is_op_determinism_enabled(), args, tuple(sorted(kwargs.items())))
        if key not in built:
            built[key] = _graph(*args, **kwargs)
        return built[key]
    return graph


def _train(graph, num_steps, initial=None):
    """Train the graph num_steps steps; returns ({saved name: value}, {every variable:
    value})."""
    saved, everything, _ = run_graph(graph, num_steps, initial)
    return saved, everything


@pytest.fixture(scope='module')
def reference():
    """1 device, 4 momentum steps with weight decay and clipping, from set initial weights:
    its own graph's, read before the steps in the one Session that trains them (one graph
    and one Session, not two)."""
    batches = _batches(4)
    graph = build_training_graph(_model(weight_decay=0.01, clip_norm=5.0),
                                 local_plan(['/cpu:0'], '/cpu:0', 'parameter_server'), seed=3,
                                 source=fed(batches), learning_rate=0.05)
    with open_graph(graph) as sess:
        initial = sess.run(saved_variables(graph))
        train_steps(sess, graph, len(batches))
        final = sess.run(saved_variables(graph))
    return initial, batches, final


@pytest.mark.parametrize('variable_update,param_device,all_reduce', [
    ('parameter_server', '/cpu:0', None), ('parameter_server', '/cpu:2', None),
    ('parameter_server', 'spread', None), ('replicated', '/cpu:0', 'host'),
    ('replicated', '/cpu:0', 'ring')])
@pytest.mark.exact
def test_every_synchronous_strategy_equals_one_device(graphs, reference, variable_update,
                                                      param_device, all_reduce):
    initial, batches, expected = reference
    graph = graphs(variable_update, len(batches), param_device=param_device,
                   all_reduce=all_reduce, weight_decay=0.01, clip_norm=5.0)
    got, _ = _train(graph, len(batches), initial)
    # The checkpoint's variables are named alike in every strategy.
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize('optimizer,all_reduce', [('momentum', 'host'), ('adam', 'host'),
                                                  ('adam', 'ring')])
@pytest.mark.exact
def test_replicated_copies_stay_bit_equal(graphs, optimizer, all_reduce):
    _, everything = _train(graphs('replicated', 5, optimizer=optimizer, all_reduce=all_reduce),
                           5)
    replicas = [name for name in everything if name.startswith('replica_')]
    # Two copies of each model variable and of each optimizer slot beyond the master.
    masters = [name for name in everything if not name.startswith('replica_')]
    assert len(replicas) >= 2 * 4
    for name in replicas:
        master = name.split('/', 1)[1]
        assert master in masters, name
        np.testing.assert_array_equal(everything[name], everything[master], err_msg=name)
    if optimizer == 'adam':
        # Each copy's optimizer counts its own steps: 5 each, not 15 shared.
        powers = {n: v for n, v in everything.items() if n.endswith('beta1_power')}
        assert sorted(powers) == ['beta1_power', 'replica_1/beta1_power',
                                  'replica_2/beta1_power']
        for value in powers.values():
            assert value == pytest.approx(0.9 ** 6)


def test_independent_copies_drift_apart_and_the_master_is_saved():
    saved, everything = _train(_graph('independent', 3), 3)
    assert not any(name.startswith('replica_') for name in saved)
    assert not np.array_equal(everything['replica_1/conv1/weights'],
                              everything['conv1/weights'])


@pytest.mark.exact  # as the test whose graph it reads
def test_replicated_variables_live_on_their_towers(graphs):
    # The graph test_replicated_copies_stay_bit_equal[momentum-host] trains.
    graph = graphs('replicated', 5, optimizer='momentum', all_reduce='host')
    with graph.graph.as_default():
        devices = {v.op.name: v.device.upper()[-5:] for v in tf1.global_variables()}
    assert devices['conv1/weights'] == 'CPU:0'
    assert devices['replica_1/conv1/weights'] == 'CPU:1'
    assert devices['replica_2/logits/biases'] == 'CPU:2'
    # Each copy's optimizer slots sit with it.
    assert devices['replica_2/logits/biases/Momentum'] == 'CPU:2'


@pytest.mark.exact  # as the test whose graph it reads
def test_spread_places_each_variable_on_the_least_loaded_device(graphs):
    chooser = LeastLoaded(['/cpu:0', '/cpu:1'])
    assert [chooser.place(size) for size in (100, 10, 10, 95, 5)] == \
        ['/cpu:0', '/cpu:1', '/cpu:1', '/cpu:1', '/cpu:0']
    # test_every_synchronous_strategy_equals_one_device[parameter_server-spread-None]'s graph:
    # weight decay and clipping add no variable.
    graph = graphs('parameter_server', 4, param_device='spread', all_reduce=None,
                   weight_decay=0.01, clip_norm=5.0)
    with graph.graph.as_default():
        devices = {v.op.name: v.device.upper()[-5:] for v in tf1.trainable_variables()}
    # small_convnet's biggest variable (logits/weights, 5408x10) comes after conv1's two.
    assert devices == {'conv1/weights': 'CPU:0', 'conv1/biases': 'CPU:1',
                       'logits/weights': 'CPU:2', 'logits/biases': 'CPU:1'}


def test_a_checkpoint_moves_between_strategies(tmp_path):
    rng = np.random.RandomState(0)
    sets = data.Datasets(data.DataSet(rng.rand(40, *SHAPE).astype(np.float32),
                                      rng.randint(0, 10, 40)), None,
                         data.DataSet(rng.rand(9, *SHAPE).astype(np.float32),
                                      rng.randint(0, 10, 9)))
    logdir = str(tmp_path)

    def run(variable_update, steps, towers):
        return Trainer(_model(), sets, towers=towers, steps=steps, batch_size=8,
                       logdir=logdir, callbacks=None, log=lambda line: None, warmup_steps=0,
                       variable_update=variable_update, learning_rate=0.05).train()

    run('replicated', 3, THREE)
    names = {name for name, _ in tf1.train.list_variables(tf1.train.latest_checkpoint(logdir))}
    assert not any(name.startswith('replica_') for name in names)
    assert run('parameter_server', 5, ['/cpu:0'])['steps'] == 5
    assert run('replicated', 7, ['/cpu:0', '/cpu:1'])['steps'] == 7


def test_an_unknown_variable_update_is_named():
    with pytest.raises(TowersError, match="unknown variable_update 'ring'; choose one of"):
        make_strategy(local_plan(THREE, variable_update='ring'))


class _ReplicasEqualMaster(Callback):
    """After the Trainer's set-up, every replica variable equals its master."""

    order = 99

    def setup_graph(self, trainer):
        with trainer.graph.graph.as_default():
            variables = {v.op.name: v for v in tf1.global_variables()}
        self.pairs = [(v, variables[name.split('/', 1)[1]]) for name, v in variables.items()
                      if name.startswith('replica_')]

    def before_train(self, trainer):
        self.unequal = [r.op.name for r, m in self.pairs
                        if not np.array_equal(*trainer.sess.run([r, m]))]


def test_the_trainer_starts_replicas_from_the_masters_values():
    rng = np.random.RandomState(0)
    sets = data.Datasets(data.DataSet(rng.rand(16, *SHAPE).astype(np.float32),
                                      rng.randint(0, 10, 16)), None, None)
    probe = _ReplicasEqualMaster()
    Trainer(_model(), sets, towers=THREE, steps=1, batch_size=8, callbacks=[probe],
            log=lambda line: None, variable_update='replicated').train()
    assert probe.pairs and probe.unequal == []


def test_spread_variables_train_and_evaluate_through_the_command_line(tmp_path, capsys):
    from towers.cli import main
    logdir = str(tmp_path / 'run')
    assert main(['train', '--model', 'small_convnet', '--towers', '2', '--devices', 'cpu',
                 '--param-device', 'spread', '--steps', '3', '--logdir', logdir,
                 '--quiet']) == 0
    test_line = capsys.readouterr().out.splitlines()[-1]
    assert main(['eval', '--logdir', logdir, '--towers', '2', '--devices', 'cpu',
                 '--param-device', 'spread']) == 0
    assert capsys.readouterr().out.splitlines()[-1] == test_line


def test_every_strategy_implements_the_one_documented_interface():
    from towers.names import VARIABLE_UPDATES
    from towers.variables import STRATEGIES, VariableStrategy
    with pytest.raises(TypeError, match='abstract'):
        VariableStrategy(local_plan(THREE))
    assert tuple(STRATEGIES) == VARIABLE_UPDATES
    # Where the variables are is the plan's (towers/deviceplan.py), not a strategy's.
    hooks = ('build_train_op', 'saved_variables', 'sync_op')
    for name, strategy in STRATEGIES.items():
        assert strategy.name == name
        # Each is its own implementation of the interface, none a variation of a neighbour.
        assert strategy.__bases__ == (VariableStrategy,)
        assert all(hook in vars(strategy) for hook in hooks), name
    for hook in hooks:
        assert getattr(VariableStrategy, hook).__doc__, hook
