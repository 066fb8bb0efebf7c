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
    (_tf_config(task_type='chief', index=0), "TF_CONFIG: task type 'chief' is not one of "
     'worker, ps'),
    (_tf_config(cluster={'worker': ['a:1']}, task_type='ps', index=0),
     'TF_CONFIG: the task is a ps, but the cluster has no ps job'),
    (_tf_config(cluster={'worker': ['a:1'], 'evaluator': ['b:2']}),
     'TF_CONFIG names job(s) evaluator; towers runs the jobs worker, ps (worker 0 is the chief)'),
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
