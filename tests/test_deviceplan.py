"""The device plan: every placement of a run decided once, from the devices and the strategy."""
import pytest
import tensorflow as tf

from towers.cli import main
from towers.cli.parsers import build_parser
from towers.cluster.placement import in_graph_plan
from towers.cluster.spec import Cluster
from towers.deviceplan import (
    DevicePlan,
    device_kind,
    local_plan,
    make_plan,
    xla_reaches,
)
from towers.errors import DeviceError
from towers.logicalgpus import logical_gpu_line, session_gpu_memory
from towers.spread import Spread
from towers.tower import variables_on

tf1 = tf.compat.v1

THREE = ['/cpu:0', '/cpu:1', '/cpu:2']
GPUS = ['/gpu:0', '/gpu:1']


def test_the_classic_plan_keeps_the_variables_and_the_host_ops_on_cpu0():
    plan = local_plan(THREE)
    assert (plan.towers, plan.variables, plan.host, plan.copies, plan.all_reduce,
            plan.default_device) == (tuple(THREE), '/cpu:0', '/cpu:0', False, None, '/cpu:0')
    assert [plan.variable_home(i) for i in range(3)] == [(None, '/cpu:0')] * 3
    assert plan.config.device_count['CPU'] == 3
    assert plan.describe() == '/cpu:0'
    assert local_plan(THREE, '/cpu:2').host == '/cpu:2'  # the step counter goes with them


def test_spread_places_by_bytes_and_alike_in_every_graph():
    plan = local_plan(THREE, 'spread')
    assert isinstance(plan.variables, Spread) and plan.host == '/cpu:0'
    assert plan.describe() == 'spread by bytes over /cpu:0,/cpu:1,/cpu:2'

    def placed():
        # As a tower places them: the Spread decides for the variable ops only.
        with tf.Graph().as_default(), tf1.device(variables_on(plan.variables, '/cpu:0')):
            sizes = {'a': [100], 'b': [10], 'c': [10], 'd': [95], 'e': [5]}
            return {n: tf1.get_variable(n, shape).device[-5:].upper()
                    for n, shape in sizes.items()}
    first = placed()
    assert first == {'a': 'CPU:0', 'b': 'CPU:1', 'c': 'CPU:2', 'd': 'CPU:1', 'e': 'CPU:2'}
    assert placed() == first  # a second graph (an evaluation's) starts its count afresh


def test_replicated_gives_each_tower_its_copy_a_shared_sum_on_cpus_and_nccl_on_gpus():
    plan = local_plan(THREE, variable_update='replicated')
    assert (plan.copies, plan.variables, plan.all_reduce) == (True, None, 'host')
    assert [plan.variable_home(i) for i in range(3)] == [
        (None, '/cpu:0'), ('replica_1', '/cpu:1'), ('replica_2', '/cpu:2')]
    assert plan.describe() == ('a copy on each tower (replicated), all-reduced by one sum per '
                               'variable that every tower reads (shared memory)')
    ring = local_plan(THREE, variable_update='replicated', all_reduce='ring')
    assert ring.describe().endswith("all-reduced by TensorFlow's collective ring")
    evaluation = plan.for_evaluation()  # one copy: the masters, on tower 0
    assert (evaluation.copies, evaluation.variables, evaluation.towers) == (
        False, '/cpu:0', plan.towers)
    # Planned on GPUs this machine need not have: NCCL.
    gpus = make_plan(GPUS, '/cpu:0', 'replicated')
    assert gpus.all_reduce == 'nccl' and gpus.variable_home(1) == ('replica_1', '/gpu:1')
    independent = local_plan(THREE, variable_update='independent')
    assert (independent.copies, independent.all_reduce) == (True, None)
    assert independent.describe() == 'a copy on each tower (independent), never combined'


def test_in_graph_puts_the_towers_on_every_worker_and_the_variables_on_the_ps():
    jobs = {'worker': ('h:1', 'h:2'), 'ps': ('h:3', 'h:4')}
    plan = in_graph_plan(Cluster(jobs, 'worker', 0), towers_per_task=2, num_gpus=0)
    assert plan.towers == tuple('/job:worker/task:%d/device:CPU:%d' % (t, i)
                                for t in range(2) for i in range(2))
    assert plan.variables.devices == ('/job:ps/task:0/device:CPU:0',
                                      '/job:ps/task:1/device:CPU:0')
    assert (plan.host, plan.default_device) == ('/cpu:0', '/job:worker/task:0/device:CPU:0')
    one_ps = in_graph_plan(Cluster({'worker': ('h:1',), 'ps': ('h:3',)}, 'worker', 0),
                           num_gpus=0)
    assert one_ps.variables == one_ps.host == '/job:ps/task:0/device:CPU:0'
    no_ps = in_graph_plan(Cluster({'worker': ('h:1',)}, 'worker', 0), num_gpus=0)
    assert no_ps.variables == '/job:worker/task:0/device:CPU:0'


def test_device_kinds():
    assert device_kind(GPUS) == 'GPU' and device_kind(THREE) == 'CPU'
    assert device_kind(['/job:worker/task:1/device:GPU:0']) == 'GPU'
    assert device_kind(['/cpu:0', '/gpu:0']) == 'mixed'


def test_with_xla_asks_the_sessions_config_for_auto_clustering_in_a_copy():
    plan = local_plan(THREE)
    assert plan.with_xla(False) is plan
    jit = plan.with_xla(True)
    assert jit.config.graph_options.optimizer_options.global_jit_level == (
        tf1.OptimizerOptions.ON_1)
    assert jit.config.device_count['CPU'] == 3 and jit.towers == plan.towers
    # The plan it came from (a cluster task's, shared) is left as it was.
    assert plan.config.graph_options.optimizer_options.global_jit_level == (
        tf1.OptimizerOptions.DEFAULT)
    assert DevicePlan(GPUS).with_xla(True).config.graph_options.optimizer_options \
        .global_jit_level == tf1.OptimizerOptions.ON_1  # a plan with no config of its own


def test_xla_reaches_cpus_only_with_the_tf_xla_flag(monkeypatch):
    monkeypatch.setenv('TF_XLA_FLAGS', '--tf_xla_min_cluster_size=2')
    assert xla_reaches(GPUS) and not xla_reaches(THREE)
    monkeypatch.setenv('TF_XLA_FLAGS', '--tf_xla_min_cluster_size=2 --tf_xla_cpu_global_jit')
    assert xla_reaches(THREE)


def test_a_plan_can_name_gpus_that_a_local_plan_would_refuse():
    with pytest.raises(DeviceError, match='/gpu:2 does not exist'):
        local_plan(['/gpu:0', '/gpu:2'], num_gpus=1)
    assert DevicePlan(GPUS).towers == tuple(GPUS)  # built, never run, as explain --plan-only


def test_the_plan_knows_which_towers_share_a_gpu_and_keeps_nccl_between_whole_ones():
    # Four towers on one GPU: four logical GPUs, NCCL can't reduce between them.
    one = local_plan(4, variable_update='replicated', num_gpus=1)
    assert (one.towers, one.gpus) == (('/gpu:0', '/gpu:1', '/gpu:2', '/gpu:3'), (0, 0, 0, 0))
    assert one.shared_gpus() == {0: [0, 1, 2, 3]}
    assert one.all_reduce == 'host'
    assert one.describe() == ('a copy on each tower (replicated), all-reduced by one sum per '
                              'variable that every tower reads (shared memory) (not NCCL: '
                              'towers 0,1,2,3 share GPU 0)')
    assert one.config.gpu_options.experimental.num_virtual_devices_per_gpu == 4
    two = local_plan(4, variable_update='replicated', num_gpus=2)
    assert two.gpus == (0, 0, 1, 1) and two.shared_gpus() == {0: [0, 1], 1: [2, 3]}
    assert two.all_reduce == 'host'
    whole = local_plan(2, variable_update='replicated', num_gpus=2)
    assert (whole.gpus, whole.shared_gpus(), whole.all_reduce) == ((0, 1), {}, 'nccl')
    assert local_plan(2, devices='cpu', variable_update='replicated', num_gpus=2).gpus == (
        None, None)
    with pytest.raises(DeviceError, match=r'^NCCL cannot all-reduce between logical GPUs of '
                                          r'one GPU \(towers 0,1 share GPU 0\)'):
        local_plan(2, variable_update='replicated', num_gpus=1, all_reduce='nccl')
    # The other all-reduces run between logical GPUs, and other strategies never all-reduce.
    assert local_plan(2, variable_update='replicated', num_gpus=1, all_reduce='ring') \
        .all_reduce == 'ring'
    assert local_plan(2, num_gpus=1).all_reduce is None


def test_auto_is_the_command_lines_default_and_a_plan_on_one_gpu_keeps_everything_there():
    parser = build_parser()
    for command in ('train', 'bench', 'explain', 'devices', 'eval'):
        args = [command] + (['--logdir', 'x'] if command == 'eval' else [])
        assert parser.parse_args(args).param_device == 'auto', command
    one = local_plan(1, 'auto', num_gpus=1)
    assert (one.towers, one.variables, one.host) == (('/gpu:0',), '/gpu:0', '/gpu:0')
    assert local_plan(2, 'auto', num_gpus=1).variables == '/gpu:0'  # logical GPUs of GPU 0
    assert local_plan(2, 'auto', num_gpus=2).variables == '/cpu:0'
    replicated = local_plan(2, 'auto', 'replicated', num_gpus=2)
    assert (replicated.variables, replicated.host, replicated.all_reduce) == (
        None, '/cpu:0', 'nccl')
    # Every CPU run is as it was: the variables and the host ops on /cpu:0.
    cpus = local_plan(3, 'auto', devices='cpu', num_gpus=1)
    assert (cpus.variables, cpus.host) == ('/cpu:0', '/cpu:0')


def test_a_run_says_in_its_first_lines_where_the_variables_are_and_how_copies_meet(capsys):
    assert main(['train', '--towers', '2', '--devices', 'cpu', '--variable-update',
                 'replicated', '--steps', '1', '--model', 'small_convnet', '--quiet',
                 '--eval-every', '0']) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith('training 1 steps'))
    assert lines[at + 1:at + 3] == [
        'exact: a resume continues bit-exactly (CPU kernels; op determinism off)',
        'variables: a copy on each tower (replicated), all-reduced by one sum per variable that '
        'every tower reads (shared memory); maps NHWC']


def test_a_run_on_logical_gpus_says_which_towers_share_which_gpu_and_their_memory():
    plan = local_plan(3, num_gpus=2)  # /gpu:0 and /gpu:1 on GPU 0, /gpu:2 on GPU 1
    memory = {'/gpu:%d' % i: 40 * 2 ** 30 for i in range(4)}
    assert logical_gpu_line(plan, memory) == (
        'logical GPUs: 2 tower(s) on GPU 0 (/gpu:0, /gpu:1), 40.0 GiB each; '
        '1 tower(s) on GPU 1 (/gpu:2), 40.0 GiB each')
    assert logical_gpu_line(plan, {}).endswith('(/gpu:2), an equal share of its memory each')
    assert logical_gpu_line(local_plan(2, num_gpus=2), memory) is None
    assert logical_gpu_line(local_plan(2, devices='cpu', num_gpus=1), memory) is None


def test_a_sessions_gpu_memory_is_read_off_its_devices():
    with tf.Graph().as_default() as graph, tf1.Session(graph=graph) as sess:
        assert session_gpu_memory(sess) == {
            '/gpu:%d' % i: d.memory_limit_bytes for i, d in enumerate(
                d for d in sess.list_devices() if d.device_type == 'GPU')}
