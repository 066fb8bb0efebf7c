"""The cluster a task belongs to: TF_CONFIG or --cluster FILE, and one line for each mistake."""
import json

import pytest

from towers.cluster.spec import ClusterError, from_file, from_tf_config, resolve

TWO = {'worker': ['127.0.0.1:2222', '127.0.0.1:2223'], 'ps': ['127.0.0.1:2224']}


def _tf_config(cluster=TWO, task_type='worker', index=1):
    return json.dumps({'cluster': cluster, 'task': {'type': task_type, 'index': index}})


def test_tf_config_names_the_cluster_and_this_task():
    cluster = from_tf_config(_tf_config())
    assert (cluster.num_workers, cluster.num_ps, cluster.task_type, cluster.task_index) == (
        2, 1, 'worker', 1)
    assert cluster.address == '127.0.0.1:2223' and not cluster.is_chief
    assert cluster.as_dict() == TWO
    assert from_tf_config(cluster.tf_config('worker', 0)).is_chief
    assert json.loads(cluster.tf_config()) == json.loads(_tf_config())


def test_a_cluster_file_with_the_task_given_by_flags(tmp_path):
    path = tmp_path / 'cluster.json'
    path.write_text(json.dumps({'cluster': {'worker': ['a:1', 'b:2']}}))
    cluster = from_file(str(path), 'worker', 0)
    assert cluster.is_chief and cluster.num_ps == 0 and cluster.as_dict() == {
        'worker': ['a:1', 'b:2']}
    path.write_text(json.dumps({'worker': ['a:1']}))  # the bare cluster dict works too
    assert from_file(str(path), 'worker', 0).address == 'a:1'


@pytest.mark.parametrize('text,message', [
    ('{"cluster": ', 'TF_CONFIG is not JSON (Expecting value: line 1 column 13 (char 12)): set '
     'it to {"cluster": {...}, "task": {"type": "worker", "index": K}}'),
    ('[1]', 'TF_CONFIG must be a JSON object, got [1]'),
    (json.dumps({'cluster': TWO}),
     'TF_CONFIG has no task: add "task": {"type": "worker", "index": K}'),
    (_tf_config(index=2), 'TF_CONFIG: task index 2 is out of range: the cluster has 2 worker '
     'task(s), 0 to 1'),
    (_tf_config(index=-1), 'TF_CONFIG: task index -1 is out of range: the cluster has 2 worker '
     'task(s), 0 to 1'),
    (_tf_config(task_type='boss', index=0), "TF_CONFIG: task type 'boss' is not one of "
     'worker, ps, chief, master, evaluator'),
    (_tf_config(task_type='chief', index=0), 'TF_CONFIG: the task is a chief, but the cluster '
     'has no chief job'),
    (_tf_config(cluster=dict(TWO, chief=['c:1']), task_type='chief', index=1),
     'TF_CONFIG: task index 1 is out of range: the cluster has 1 chief task(s), 0 to 0'),
    (_tf_config(cluster=dict(TWO, chief=['c:1'], master=['m:1'])), 'TF_CONFIG names both a '
     'chief and a master job: they are the same task, the chief; keep one'),
    (_tf_config(cluster=dict(TWO, master=['m:1', 'm:2'])), 'TF_CONFIG: job master lists 2 '
     'addresses; a cluster has one chief: give it one "host:port"'),
    (_tf_config(cluster=dict(TWO, evaluator=['e:1']), task_type='evaluator', index=1),
     'TF_CONFIG: task index 1 is out of range: the cluster has 1 evaluator task(s), 0 to 0'),
    (_tf_config(task_type='evaluator', index=-1),
     'TF_CONFIG: task index -1 of the evaluator is not a number from 0'),
    (json.dumps({'sparseCluster': {'worker': {'1': 'a:1'}, 'ps': ['b:1']},
                 'task': {'type': 'worker', 'index': 1}}),
     'TF_CONFIG has a "sparseCluster" (TFJob\'s enableDynamicWorker): towers needs every task '
     'in "cluster"; set enableDynamicWorker: false'),
    (_tf_config(cluster={'worker': {'1': 'a:1'}}), 'TF_CONFIG: job worker is sparse ({index: '
     'address}); towers needs every task: "worker": ["host:port", ...]'),
    (_tf_config(cluster={'worker': ['a:1'], 'trainer': ['b:2']}),
     'TF_CONFIG names job(s) trainer; towers runs the jobs worker, ps (worker 0 is the chief), '
     'a chief or master (then worker 0) and an evaluator'),
    (_tf_config(cluster={'worker': ['a:1']}, task_type='ps', index=0),
     'TF_CONFIG: the task is a ps, but the cluster has no ps job'),
    (_tf_config(cluster={'ps': ['a:1']}, task_type='ps', index=0),
     'TF_CONFIG has no worker: its "cluster" needs "worker": ["host:port", ...]'),
    (_tf_config(cluster={'worker': ['a:1', 'a']}), "TF_CONFIG: worker 1 is 'a', not a host:port "
     'address'),
    (_tf_config(cluster={'worker': ['a:1', 'a:99999']}), "TF_CONFIG: worker 1 is 'a:99999', not "
     'a host:port address'),
    (_tf_config(cluster={'worker': ['a:1', 'a:1']}), 'TF_CONFIG: a:1 is both worker 0 and '
     'worker 1'),
    (json.dumps({'task': {'type': 'worker', 'index': 0}}),
     'TF_CONFIG has no "cluster": give {"cluster": {"worker": ["host:port", ...]}}'),
])
def test_each_bad_tf_config_is_one_line(text, message):
    with pytest.raises(ClusterError) as error:
        from_tf_config(text)
    assert str(error.value) == message


def test_resolve_takes_one_source_or_none(tmp_path):
    path = tmp_path / 'c.json'
    path.write_text(json.dumps(TWO))
    assert resolve(environ={}) is None
    assert resolve(environ={'TF_CONFIG': _tf_config()}).task_index == 1
    assert resolve(str(path), 'ps', 0, environ={}).address == '127.0.0.1:2224'
    with pytest.raises(ClusterError, match='^both TF_CONFIG and cluster say which cluster'):
        resolve(str(path), 'ps', 0, environ={'TF_CONFIG': _tf_config()})
    with pytest.raises(ClusterError, match='^task_type and task_index go with cluster$'):
        resolve(None, 'worker', 0, environ={})
    with pytest.raises(ClusterError, match='^cluster needs task_type and task_index'):
        resolve(str(path), None, None, environ={})
    with pytest.raises(ClusterError, match='^cannot read cluster .*nope.json: No such file'):
        resolve(str(tmp_path / 'nope.json'), 'worker', 0, environ={})


# As Kubeflow's TFJob writes it: a chief apart from the workers, an evaluator listed too,
# and keys towers has no use for.
TFJOB = {'chief': ['j-chief-0.ns.svc:2222'], 'evaluator': ['j-evaluator-0.ns.svc:2222'],
         'ps': ['j-ps-0.ns.svc:2222'],
         'worker': ['j-worker-0.ns.svc:2222', 'j-worker-1.ns.svc:2222']}


def _tfjob_config(task_type, index, cluster=TFJOB):
    return json.dumps({'cluster': cluster, 'task': {'type': task_type, 'index': index},
                       'environment': 'cloud', 'rpc_layer': 'grpc', 'job': 'towers'})


@pytest.mark.parametrize('chief', ['chief', 'master'])
def test_a_chief_or_master_is_worker_0_and_the_workers_follow_it(chief):
    cluster = dict(TFJOB)
    cluster[chief] = cluster.pop('chief')
    workers = ('j-chief-0.ns.svc:2222', 'j-worker-0.ns.svc:2222', 'j-worker-1.ns.svc:2222')
    tasks = {(task_type, index): from_tf_config(_tfjob_config(task_type, index, cluster))
             for task_type, index in [(chief, 0), ('worker', 0), ('worker', 1), ('ps', 0)]}
    for task in tasks.values():  # every task sees the same cluster
        assert task.jobs == {'worker': workers, 'ps': ('j-ps-0.ns.svc:2222',)}
    assert [(t.task_type, t.task_index, t.is_chief) for t in tasks.values()] == [
        ('worker', 0, True), ('worker', 1, False), ('worker', 2, False), ('ps', 0, False)]
    assert [t.address for t in tasks.values()] == list(workers) + ['j-ps-0.ns.svc:2222']


@pytest.mark.parametrize('listed', [True, False])
def test_the_evaluator_is_outside_the_training_cluster(listed):
    cluster = dict(TFJOB) if listed else {k: v for k, v in TFJOB.items() if k != 'evaluator'}
    evaluator = from_tf_config(_tfjob_config('evaluator', 0, cluster))
    assert (evaluator.task_type, evaluator.task_index, evaluator.is_evaluator) == (
        'evaluator', 0, True)
    assert not evaluator.is_chief and evaluator.address is None
    assert evaluator.num_workers == 3 and evaluator.num_ps == 1 and 'evaluator' not in \
        evaluator.jobs
    assert from_tf_config(evaluator.tf_config()) == evaluator  # what towers launch hands it
    assert not from_tf_config(_tfjob_config('chief', 0, cluster)).is_evaluator


def test_towers_reads_tf_config_as_tensorflows_own_resolver_does(monkeypatch):
    """TFConfigClusterResolver (which spec.py may not import) keeps the chief and evaluator as
    jobs of their own; towers' worker 0 is its chief, and each task serves where it says."""
    import tensorflow as tf
    for task_type, count in (('chief', 1), ('worker', 2), ('ps', 1), ('evaluator', 1)):
        for index in range(count):
            monkeypatch.setenv('TF_CONFIG', _tfjob_config(task_type, index))
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            theirs, ours = resolver.cluster_spec().as_dict(), from_tf_config(
                _tfjob_config(task_type, index))
            assert (resolver.task_type, resolver.task_id) == (task_type, index)
            assert list(ours.jobs['worker']) == theirs['chief'] + theirs['worker']
            assert list(ours.jobs['ps']) == theirs['ps']
            assert ours.address == (None if task_type == 'evaluator' else
                                    resolver.cluster_spec().task_address(task_type, index))
            assert ours.is_chief == (task_type == 'chief')


def test_a_cluster_file_takes_chief_and_evaluator_tasks(tmp_path):
    path = tmp_path / 'cluster.json'
    path.write_text(json.dumps(TFJOB))
    assert from_file(str(path), 'chief', None).is_chief  # there is one: index 0
    assert from_file(str(path), 'worker', 1).address == 'j-worker-1.ns.svc:2222'
    evaluator = from_file(str(path), 'evaluator', None)
    assert evaluator.is_evaluator and evaluator.num_workers == 3
    with pytest.raises(ClusterError, match='^cluster needs task_type and task_index'):
        from_file(str(path), 'worker', None)


SLURM = {'SLURM_PROCID': '1', 'SLURM_STEP_NUM_TASKS': '2', 'SLURM_STEP_NODELIST': 'n[1-2]',
         'SLURM_STEP_TASKS_PER_NODE': '1(x2)', 'SLURM_LOCALID': '0'}


def test_resolve_reads_a_slurm_step_without_tf_config(tmp_path):
    cluster = resolve(environ=SLURM)  # srun of more than one task: automatic
    assert (cluster.jobs, cluster.task_type, cluster.task_index) == (
        {'worker': ('n1:8888', 'n2:8888')}, 'worker', 1)
    assert resolve('slurm', environ=SLURM, ps_tasks=1, port_base=9000).jobs == {
        'worker': ('n2:9000',), 'ps': ('n1:9000',)}
    one_task = dict(SLURM, SLURM_STEP_NUM_TASKS='1', SLURM_PROCID='0',
                    SLURM_STEP_TASKS_PER_NODE='1', SLURM_STEP_NODELIST='n1')
    assert resolve(environ=one_task) is None  # a plain run of one process
    assert resolve('slurm', environ=one_task).jobs == {'worker': ('n1:8888',)}
    # TF_CONFIG says which cluster this is, even inside srun (towers launch in an allocation).
    assert resolve(environ=dict(SLURM, TF_CONFIG=_tf_config())).jobs['ps'] == ('127.0.0.1:2224',)
    path = tmp_path / 'c.json'
    path.write_text(json.dumps(TWO))
    assert resolve(str(path), 'ps', 0, environ=SLURM).task_type == 'ps'
    for args, kwargs, message in (
            (('slurm',), {'environ': dict(SLURM, TF_CONFIG=_tf_config())},
             'both TF_CONFIG and cluster say which cluster this is; give one'),
            (('slurm', 'worker', 0), {'environ': SLURM}, 'task_type and task_index go with '
             'cluster FILE.json; in a SLURM step each task is told which it is (SLURM_PROCID)'),
            ((), {'environ': {}, 'ps_tasks': 1}, 'ps_tasks and port_base go with a SLURM step '
             '(srun, or cluster slurm)'),
            ((), {'environ': {'TF_CONFIG': _tf_config()}, 'port_base': 9000},
             'ps_tasks and port_base go with a SLURM step (srun, or cluster slurm)'),
            (('slurm',), {'environ': {}}, 'SLURM_PROCID is not set: start towers with srun (in an '
             'sbatch script or an salloc), which sets it for each task')):
        with pytest.raises(ClusterError) as error:
            resolve(*args, **kwargs)
        assert str(error.value) == message
