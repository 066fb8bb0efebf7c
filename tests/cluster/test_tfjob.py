"""examples/kubernetes/tfjob.yaml: the TF_CONFIG the operator gives each replica, read by towers.

The TF_CONFIG is built here as Kubeflow's training-operator v1 builds it
(pkg/controller.v1/tensorflow/tensorflow.go, genTFConfigJSONStr and
genClusterSpec): every replica type's lower-cased name is a job of the
cluster, the Evaluator's too; each task is <job>-<type>-<i>.<namespace>.svc
on the port of the container port named tfjob-port (2222 by default); the task
is {"type": <lower-cased type>, "index": i}, and "environment" is "cloud".

The manifest is read with the small reader below, not PyYAML: the venv has no
YAML library, a dependency for one test file is not worth it, and the reader
refuses anything beyond the plain block style the manifest is written in (so a
manifest it cannot read fails here instead of being misread).
"""
import json
import pathlib
import re
import socket

import pytest

from towers.cli.parsers import build_parser
from towers.cluster.server import wait_for_tasks
from towers.cluster.spec import ClusterError, from_tf_config, resolve

MANIFEST = pathlib.Path(__file__).resolve().parents[2] / 'examples' / 'kubernetes' / 'tfjob.yaml'
_KEY = re.compile(r'^([A-Za-z0-9_./\-]+):(?: +(.*))?$')


def _without_comment(line):
    quote = None
    for k, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in '"\'':
            quote = c
        elif c == '#' and (k == 0 or line[k - 1] == ' '):
            return line[:k].rstrip()
    return line.rstrip()


def _scalar(text):
    if text[:1] in '"\'':
        assert len(text) > 1 and text[-1] == text[0], text
        return text[1:-1]
    if text.startswith('['):
        assert text.endswith(']'), text
        return [_scalar(t.strip()) for t in text[1:-1].split(',') if t.strip()]
    assert not text.startswith(('{', '&', '*', '|', '>', '!', '%')), 'beyond this reader: ' + text
    return int(text) if re.fullmatch(r'-?\d+', text) else text


def _block(lines, i, indent):
    """(the block at lines[i], all at this indent; the index of the line after it)."""
    if lines[i][1] == '-' or lines[i][1].startswith('- '):
        items = []
        while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith('-'):
            rest = lines[i][1][1:].lstrip()
            assert rest, 'beyond this reader: an item on the lines after its dash'
            if not _KEY.match(rest):
                items.append(_scalar(rest))
                i += 1
                continue
            # An item that is a mapping: its first key sits at the column after '- '.
            lines[i] = (indent + len(lines[i][1]) - len(rest), rest)
            value, i = _block(lines, i, lines[i][0])
            items.append(value)
        return items, i
    mapping = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith('- '):
        match = _KEY.match(lines[i][1])
        assert match, 'beyond this reader: %r' % lines[i][1]
        key, value = match.groups()
        assert key not in mapping, key
        i += 1
        if value is not None:
            mapping[key] = _scalar(value)
        elif i < len(lines) and (lines[i][0] > indent or lines[i][0] == indent
                                 and lines[i][1].startswith('- ')):  # a list at its key's column
            mapping[key], i = _block(lines, i, lines[i][0])
        else:
            mapping[key] = None
    return mapping, i


def read_manifest(text):
    """The one YAML document of a Kubernetes manifest in plain block style, as dicts and lists."""
    lines = [(len(line) - len(line.lstrip(' ')), line.strip())
             for line in map(_without_comment, text.splitlines()) if line.strip()]
    assert not any('\t' in line for _, line in lines)
    document, end = _block(lines, 0, 0)
    assert end == len(lines), 'beyond this reader: %r' % (lines[end],)
    return document


def test_the_reader_reads_what_the_manifest_uses_and_refuses_the_rest():
    assert read_manifest('a: 1\nb:\n  - x  # note\n  - k: "v # w"\n    n: [p, q]\nc:\n- 2\n') \
        == {'a': 1, 'b': ['x', {'k': 'v # w', 'n': ['p', 'q']}], 'c': [2]}
    for text in ('a: &x 1\n', 'a: {b: 1}\n', 'a: 1\n  b: 2\n', 'a: |\n  text\n'):
        with pytest.raises(AssertionError):
            read_manifest(text)


def _port(spec):
    """The operator's GetPortFromTFJob: the tensorflow container's port named tfjob-port."""
    for container in spec['template']['spec']['containers']:
        if container['name'] == 'tensorflow':
            for port in container.get('ports', []):
                if port.get('name') == 'tfjob-port':
                    return port['containerPort']
    return 2222


def tf_config(job, replica_type, index):
    """The TF_CONFIG of replica (replica_type, index) of a TFJob, as the operator writes it."""
    name, namespace = job['metadata']['name'], job['metadata'].get('namespace', 'default')
    cluster = {rtype.lower(): ['%s-%s-%d.%s.svc:%d' % (name, rtype.lower(), i, namespace,
                                                        _port(spec))
                               for i in range(spec['replicas'])]
               for rtype, spec in job['spec']['tfReplicaSpecs'].items()}
    # Go's encoding/json: the struct's fields in order, a map's keys sorted, no spaces.
    return json.dumps({'cluster': dict(sorted(cluster.items())),
                       'task': {'type': replica_type.lower(), 'index': index},
                       'environment': 'cloud'}, separators=(',', ':'))


@pytest.fixture(scope='module')
def job():
    return read_manifest(MANIFEST.read_text(encoding='utf-8'))


def test_the_manifest_is_a_tfjob_of_one_command_on_a_shared_volume(job):
    assert (job['apiVersion'], job['kind']) == ('kubeflow.org/v1', 'TFJob')
    replicas = job['spec']['tfReplicaSpecs']
    assert {rtype: spec['replicas'] for rtype, spec in replicas.items()} == {
        'Chief': 1, 'Worker': 2, 'PS': 1, 'Evaluator': 1}
    commands, mounts = set(), set()
    for spec in replicas.values():
        pod = spec['template']['spec']
        (container,) = pod['containers']
        assert container['name'] == 'tensorflow'  # where the operator puts TF_CONFIG
        commands.add(tuple(container['command'] + container['args']))
        (mount,) = container['volumeMounts']
        (volume,) = [v for v in pod['volumes'] if v['name'] == mount['name']]
        mounts.add((mount['mountPath'], volume['persistentVolumeClaim']['claimName']))
    assert len(commands) == 1 and len(mounts) == 1  # every replica, the evaluator too
    (command,), ((mount_path, _),) = commands, mounts
    assert command[:2] == ('towers', 'train')
    args = build_parser().parse_args(list(command[1:]))
    assert args.cluster_mode == 'parameter-server'
    assert args.logdir.startswith(mount_path + '/') and args.data_dir.startswith(mount_path)
    assert (args.cluster, args.task_type, args.task_index) == (None, None, None)  # TF_CONFIG's


def test_each_replica_is_the_task_its_tf_config_says(job):
    """The chief is worker 0, worker i is worker i + 1, the ps serves, and the evaluator is
    outside the training cluster: every replica agrees on the cluster."""
    args = build_parser().parse_args(['train'])
    host = 'towers-cifar10-%s.default.svc:2222'
    training = {'worker': (host % 'chief-0', host % 'worker-0', host % 'worker-1'),
                'ps': (host % 'ps-0',)}
    expected = {('Chief', 0): ('worker', 0), ('Worker', 0): ('worker', 1),
                ('Worker', 1): ('worker', 2), ('PS', 0): ('ps', 0),
                ('Evaluator', 0): ('evaluator', 0)}
    for (rtype, index), task in expected.items():
        text = tf_config(job, rtype, index)
        assert '"evaluator":["towers-cifar10-evaluator-0.default.svc:2222"]' in text
        cluster = resolve(args.cluster, args.task_type, args.task_index,
                          environ={'TF_CONFIG': text}, ps_tasks=args.ps_tasks,
                          port_base=args.port_base)
        assert cluster == from_tf_config(text)
        assert (cluster.jobs, (cluster.task_type, cluster.task_index)) == (training, task)
        assert cluster.is_chief == (rtype == 'Chief')
        assert cluster.is_evaluator == (rtype == 'Evaluator')
        pod = '%s-%s-%d' % (job['metadata']['name'], rtype.lower(), index)
        assert cluster.address == (None if rtype == 'Evaluator' else
                                   '%s.default.svc:2222' % pod)


def test_pods_not_up_yet_are_named_by_task_and_host(monkeypatch):
    """A pod whose DNS name has not come yet, told apart from one that does not answer."""
    cluster = from_tf_config(json.dumps({'cluster': {
        'chief': ['j-chief-0.ns.svc:2222'], 'worker': ['j-worker-0.ns.svc:2222'],
        'ps': ['10.0.0.7:2222']}, 'task': {'type': 'chief', 'index': 0}}))

    def connect(address, timeout):
        if address[0].endswith('.svc'):
            raise socket.gaierror(socket.EAI_NONAME, 'Name or service not known')
        raise ConnectionRefusedError(111, 'Connection refused')

    monkeypatch.setattr(socket, 'create_connection', connect)
    with pytest.raises(ClusterError) as error:
        wait_for_tasks(cluster, timeout=0)
    assert str(error.value) == (
        'ps 0 (10.0.0.7:2222) never answered, and the host of worker 1 (j-worker-0.ns.svc:2222) '
        'never resolved within 0 s: start them (towers server, or towers train with its '
        'TF_CONFIG), or check the addresses')


def test_on_the_ps_replica_the_same_command_serves_and_on_the_evaluator_it_never_does(
        job, monkeypatch):
    import towers.cluster.modes
    from towers.cli.train import settings
    container = job['spec']['tfReplicaSpecs']['PS']['template']['spec']['containers'][0]
    args = build_parser().parse_args(container['command'][1:] + container['args'])
    served, lines = [], []
    monkeypatch.setattr(towers.cluster.modes, 'serve', lambda cluster, config, log: served.append(
        (cluster.task_type, cluster.task_index, config.device_count['CPU'])))
    ps = from_tf_config(tf_config(job, 'PS', 0))
    # (The plan: this process's devices, resolved once, whose kind the task's towers take.)
    config, _, plan = settings(args, from_records=False, cluster=ps)
    assert towers.cluster.modes.cluster_run(config, ps, plan, lines.append) is None
    assert served == [('ps', 0, 1)] and lines == [
        'parameter-server mode: ps 0 serves the variables']
    evaluator = from_tf_config(tf_config(job, 'Evaluator', 0))
    with pytest.raises(ClusterError, match='^this task is the evaluator, outside the training '
                                           'cluster: it serves nothing; run towers train there'):
        towers.cluster.modes.cluster_run(config, evaluator, plan, lines.append)
    assert len(served) == 1
