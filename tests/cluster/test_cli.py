"""The cluster's bad configurations through the command line: one line each, never a hang."""
import json
import os
import socket
import subprocess
import sys

import pytest

from towers.cli import main
from towers.cluster.launch import free_ports

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')


def _one_line(capsys):
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith('towers: error: '), err
    return err[0][len('towers: error: '):]


def _tf_config(workers, index=0, task_type='worker'):
    return json.dumps({'cluster': {'worker': workers}, 'task': {'type': task_type,
                                                                'index': index}})


@pytest.mark.parametrize('tf_config,message', [
    ('{"cluster"', 'TF_CONFIG is not JSON (Expecting'),
    (json.dumps({'cluster': {'worker': ['127.0.0.1:1']}}), 'TF_CONFIG has no task: add'),
    (_tf_config(['127.0.0.1:1', '127.0.0.1:2'], index=5), 'TF_CONFIG: task index 5 is out of '
     'range: the cluster has 2 worker task(s), 0 to 1'),
])
@pytest.mark.parametrize('command', ['train', 'server'])
def test_a_bad_tf_config_is_one_line(capsys, monkeypatch, tf_config, message, command):
    monkeypatch.setenv('TF_CONFIG', tf_config)
    assert main([command]) == 1
    assert _one_line(capsys).startswith(message)


def test_cluster_flags_without_a_cluster_are_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv('TF_CONFIG', raising=False)
    assert main(['train', '--cluster-mode', 'in-graph', '--steps', '1']) == 1
    assert _one_line(capsys) == ('--cluster-mode needs a cluster: set TF_CONFIG, give '
                                 '--cluster FILE.json --task-type and --task-index, or start the '
                                 'tasks with srun')
    assert main(['train', '--task-index', '1']) == 1
    assert _one_line(capsys) == '--task-type and --task-index go with --cluster'
    assert main(['server']) == 1
    assert _one_line(capsys).startswith('towers server needs a cluster: set TF_CONFIG')
    assert main(['launch', '--workers', '2']) == 1
    assert _one_line(capsys).startswith('towers launch needs the command every worker runs')
    path = tmp_path / 'cluster.json'
    path.write_text(json.dumps({'worker': ['127.0.0.1:1']}))
    monkeypatch.setenv('TF_CONFIG', _tf_config(['127.0.0.1:1']))
    assert main(['train', '--cluster', str(path), '--task-type', 'worker',
                 '--task-index', '0']) == 1
    assert _one_line(capsys) == ('both TF_CONFIG and --cluster say which cluster this is; give '
                                 'one')


def test_a_taken_port_is_one_line(capsys, monkeypatch):
    with socket.socket() as holder:
        holder.bind(('127.0.0.1', 0))
        holder.listen()
        address = '127.0.0.1:%d' % holder.getsockname()[1]
        monkeypatch.setenv('TF_CONFIG', _tf_config([address]))
        assert main(['server']) == 1
    assert _one_line(capsys) == ('port %s of %s is already taken on this machine: stop what '
                                 'holds it, or give this task another port'
                                 % (address.split(':')[1], address))


def test_a_worker_that_never_answers_is_named_within_the_timeout(tmp_path):
    chief, missing = ['127.0.0.1:%d' % p for p in free_ports(2)]
    process = subprocess.run(
        [sys.executable, '-m', 'towers', 'train', '--cluster-timeout', '2', '--steps', '1'],
        env=dict(ENV, TF_CONFIG=_tf_config([chief, missing])), cwd=str(tmp_path),
        capture_output=True, text=True, timeout=120)
    # The line names the timeout it waited out (a hang is what the timeout above catches).
    assert process.returncode == 1
    assert process.stderr.splitlines() == [
        'towers: error: worker 1 (%s) never answered within 2 s: start it (towers server, or '
        'towers train with its TF_CONFIG), or check the address' % missing], process.stderr


def test_collective_mode_takes_workers_only_and_one_copy_per_worker(capsys, monkeypatch):
    cluster = {'worker': ['127.0.0.1:1'], 'ps': ['127.0.0.1:2']}
    monkeypatch.setenv('TF_CONFIG', json.dumps({'cluster': cluster,
                                                'task': {'type': 'worker', 'index': 0}}))
    assert main(['train', '--cluster-mode', 'collective']) == 1
    assert _one_line(capsys) == ('--cluster-mode collective has no ps tasks: give the cluster '
                                 'workers only, or use --cluster-mode in-graph')
    monkeypatch.setenv('TF_CONFIG', _tf_config(['127.0.0.1:1']))
    assert main(['train', '--cluster-mode', 'collective', '--variable-update',
                 'replicated']) == 1
    assert _one_line(capsys) == ('--cluster-mode collective keeps one copy of the variables per '
                                 'worker: leave --variable-update at parameter_server')
    assert main(['train', '--variable-update', 'replicated']) == 1  # in-graph, the default
    assert _one_line(capsys) == ('--cluster-mode in-graph keeps one copy of the variables on the '
                                 'ps tasks (or the chief): leave --variable-update at '
                                 'parameter_server')


def test_parameter_server_mode_needs_ps_tasks_and_one_copy(capsys, monkeypatch):
    monkeypatch.setenv('TF_CONFIG', _tf_config(['127.0.0.1:1']))
    assert main(['train', '--cluster-mode', 'parameter-server']) == 1
    assert _one_line(capsys) == ('--cluster-mode parameter-server needs ps tasks: give the '
                                 'cluster a "ps" job (towers launch --ps 1)')
    cluster = {'worker': ['127.0.0.1:1'], 'ps': ['127.0.0.1:2']}
    monkeypatch.setenv('TF_CONFIG', json.dumps({'cluster': cluster,
                                                'task': {'type': 'worker', 'index': 0}}))
    for flags, message in (
            (['--variable-update', 'replicated'],
             '--cluster-mode parameter-server keeps one copy of the variables on the ps tasks: '
             'leave --variable-update at parameter_server'),
            (['--ema', '0.99'],
             "--ema is not kept in --cluster-mode parameter-server yet: the averages would "
             "follow every worker's push, not each update"),
            (['--sync-bn'],
             '--sync-bn pools batch norm over the towers of one process; --cluster-mode '
             'parameter-server does not pool it across workers')):
        assert main(['train', '--cluster-mode', 'parameter-server'] + flags) == 1
        assert _one_line(capsys) == message


def test_the_all_reduce_bucket_is_collective_modes_and_a_size(capsys, monkeypatch):
    monkeypatch.setenv('TF_CONFIG', _tf_config(['127.0.0.1:1']))
    assert main(['train', '--cluster-mode', 'collective', '--all-reduce-bucket', 'big']) == 1
    assert _one_line(capsys) == ("--all-reduce-bucket is auto, a positive size such as 256kB "
                                 "or 4MB, or 0, not 'big'")
    assert main(['train', '--all-reduce-bucket', '1MB']) == 1  # in-graph, the default
    assert _one_line(capsys) == ('--all-reduce-bucket sizes the all-reduce of --cluster-mode '
                                 'collective; in-graph mode has none')
