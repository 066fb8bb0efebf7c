"""A cluster from SLURM's variables: recorded steps, each mistake in one line, and a real job.

Every environment here is a dict handed to the resolver (or to the processes a
test starts), never the test process's own: no SLURM_* variable reaches another test.
"""
import os
import pathlib
import re
import shlex
import socket

import pytest

from tests.cluster.test_runs import FLAGS, _close, _variables
from towers.cli import main
from towers.cli.parsers import build_parser
from towers.cluster.launch import free_ports
from towers.cluster.slurm import SlurmError, in_step, slurm_tasks
from towers.cluster.spec import ClusterError, resolve


def _step(procid, nodelist, per_node, num_tasks, localid=None, **more):
    """The variables srun sets for task `procid` of a step (SLURM_LOCALID when given)."""
    environ = {'SLURM_PROCID': str(procid), 'SLURM_STEP_NUM_TASKS': str(num_tasks),
               'SLURM_STEP_NODELIST': nodelist, 'SLURM_STEP_TASKS_PER_NODE': per_node}
    if localid is not None:
        environ['SLURM_LOCALID'] = str(localid)
    environ.update(more)
    return environ


@pytest.mark.parametrize('environ,ps_tasks,port_base,expected', [
    # One task per node (each task the node's GPUs as towers), 4 nodes with a hole in the range.
    (_step(2, 'node[1-3,5]', '1(x4)', 4, 0), None, None,
     ({'worker': ['node1:8888', 'node2:8888', 'node3:8888', 'node5:8888']}, 'worker', 2)),
    # One task per GPU: 4 on each of two zero-padded nodes; the ranks fill node after node.
    (_step(5, 'gpu[09-10]', '4(x2)', 8, 1), None, None,
     ({'worker': ['gpu09:8888', 'gpu09:8889', 'gpu09:8890', 'gpu09:8891', 'gpu10:8888',
                  'gpu10:8889', 'gpu10:8890', 'gpu10:8891']}, 'worker', 5)),
    # Uneven nodes (3(x2),2) in two bracket groups, a ps task first, another port base.
    (_step(0, 'a[1-2],b08', '3(x2),2', 8, 0), 1, 9000,
     ({'ps': ['a1:9000'], 'worker': ['a1:9001', 'a1:9002', 'a2:9000', 'a2:9001', 'a2:9002',
                                     'b08:9000', 'b08:9001']}, 'ps', 0)),
    (_step(7, 'a[1-2],b08', '3(x2),2', 8, 1), 2, 9000,
     ({'ps': ['a1:9000', 'a1:9001'], 'worker': ['a1:9002', 'a2:9000', 'a2:9001', 'a2:9002',
                                                 'b08:9000', 'b08:9001']}, 'worker', 5)),
    # The nodelist's order, as srun fills the nodes (SlurmClusterResolver sorts n10 first).
    (_step(0, 'n[9-10]', '1,1', 2, 0), None, None,
     ({'worker': ['n9:8888', 'n10:8888']}, 'worker', 0)),
    # SLURM_NTASKS where the step's count is missing (--cluster slurm only: srun sets the
    # step's count, so without it this is no step by itself); no SLURM_LOCALID to check.
    ({'SLURM_PROCID': '1', 'SLURM_NTASKS': '2', 'SLURM_STEP_NODELIST': 'n[001-002]',
      'SLURM_STEP_TASKS_PER_NODE': '1,1'}, None, None,
     ({'worker': ['n001:8888', 'n002:8888']}, 'worker', 1)),
])
def test_recorded_steps(environ, ps_tasks, port_base, expected):
    jobs, task_type, task_index = slurm_tasks(environ, ps_tasks, port_base)
    assert ({job: list(a) for job, a in jobs.items()}, task_type, task_index) == expected
    assert in_step(environ) == ('SLURM_STEP_NUM_TASKS' in environ)
    cluster = resolve('slurm', environ=environ, ps_tasks=ps_tasks, port_base=port_base)
    assert cluster.jobs == {job: tuple(a) for job, a in expected[0].items()}
    assert cluster.is_chief == (task_type == 'worker' and task_index == 0)


def test_only_a_step_of_more_than_one_task_is_a_cluster():
    assert not in_step({})
    assert not in_step({'SLURM_STEP_NUM_TASKS': '4'})  # sbatch's own shell has no rank
    assert not in_step(_step(0, 'n1', '1', 1))  # srun of one task: a plain run
    assert not in_step({'SLURM_PROCID': '0', 'SLURM_NTASKS': '2'})  # the batch script's shell
    assert in_step({'SLURM_PROCID': '0', 'SLURM_STEP_NUM_TASKS': 'two'})  # named below


LAUNCH = 'start towers with srun (in an sbatch script or an salloc), which sets it for each task'


@pytest.mark.parametrize('environ,flags,message', [
    ({'SLURM_PROCID': '0', 'SLURM_STEP_NUM_TASKS': '2', 'SLURM_STEP_TASKS_PER_NODE': '2'}, {},
     'SLURM_STEP_NODELIST is not set: ' + LAUNCH),
    (_step(0, 'n1', '2', 2, SLURM_STEP_NUM_TASKS='two'), {},
     "SLURM_STEP_NUM_TASKS is 'two', not a number: " + LAUNCH),
    (_step('x', 'n1', '2', 2), {}, "SLURM_PROCID is 'x', not a number: " + LAUNCH),
    (_step(0, 'n[1-x]', '2', 2), {},
     "SLURM_STEP_NODELIST 'n[1-x]' is not a SLURM nodelist: write it as "
     'node1,node[2-4,7],gpu[01-08]'),
    (_step(0, 'n[1-2', '2', 2), {},
     "SLURM_STEP_NODELIST 'n[1-2' is not a SLURM nodelist: write it as "
     'node1,node[2-4,7],gpu[01-08]'),
    (_step(0, 'n[1-2],n1', '1(x3)', 3), {},
     "SLURM_STEP_NODELIST 'n[1-2],n1' names node(s) n1 twice: name each node once"),
    (_step(0, 'n[1-2]', '3(x2', 6), {},
     "SLURM_STEP_TASKS_PER_NODE '3(x2' is not a list of tasks per node: write it as 3(x2),2 (3 "
     'tasks on each of 2 nodes, then 2), every count 1 or more'),
    (_step(0, 'n[1-2]', '0,2', 2), {},
     "SLURM_STEP_TASKS_PER_NODE '0,2' is not a list of tasks per node: write it as 3(x2),2 (3 "
     'tasks on each of 2 nodes, then 2), every count 1 or more'),
    # A range written backwards names no node of its own: the counts then disagree.
    (_step(0, 'n[3-1],m1', '1(x2)', 2), {},
     "SLURM_STEP_NODELIST 'n[3-1],m1' names 1 node(s), but SLURM_STEP_TASKS_PER_NODE '1(x2)' "
     'counts the tasks of 2: both must be of the same srun step'),
    (_step(0, 'n[1-2]', '2(x2)', 5), {},
     "SLURM_STEP_TASKS_PER_NODE '2(x2)' places 4 task(s), but SLURM_STEP_NUM_TASKS is 5: both "
     'must be of the same srun step'),
    ({'SLURM_PROCID': '0', 'SLURM_NTASKS': '3', 'SLURM_STEP_NODELIST': 'n[1-2]',
      'SLURM_STEP_TASKS_PER_NODE': '1(x2)'}, {},
     "SLURM_STEP_TASKS_PER_NODE '1(x2)' places 2 task(s), but SLURM_NTASKS is 3: both must be "
     'of the same srun step'),
    (_step(4, 'n[1-2]', '2(x2)', 4), {},
     'SLURM_PROCID 4 is out of range: the step has 4 task(s), 0 to 3'),
    (_step(-1, 'n[1-2]', '2(x2)', 4), {},
     'SLURM_PROCID -1 is out of range: the step has 4 task(s), 0 to 3'),
    # srun --distribution=cyclic put rank 1 on the second node: not where towers' ports are.
    (_step(1, 'n[1-2]', '2(x2)', 4, 0), {},
     'SLURM_LOCALID is 0, but task 1 of a block distribution is task 1 of node n1: start srun '
     "with --distribution=block (its default), which towers' ports follow"),
    (_step(0, 'n[1-2]', '1(x2)', 2), {'ps_tasks': 2},
     '--ps-tasks 2 leaves no worker among the 2 task(s) of the SLURM step: give 0 to 1'),
    (_step(0, 'n[1-2]', '1(x2)', 2), {'ps_tasks': -1},
     '--ps-tasks -1 leaves no worker among the 2 task(s) of the SLURM step: give 0 to 1'),
    (_step(0, 'n[1-2]', '4(x2)', 8), {'port_base': 65534},
     '--port-base 65534 does not fit: the 4 task(s) of a node would take ports 65534 to 65537; '
     'give one from 1 to 65532'),
])
def test_each_mistake_is_one_line_naming_what_to_fix(environ, flags, message):
    with pytest.raises(SlurmError) as error:
        slurm_tasks(environ, **flags)
    with pytest.raises(ClusterError) as through_resolve:
        resolve('slurm', environ=environ, **flags)
    from towers.cli.config import flag
    assert through_resolve.value.named(flag) == message
    assert '\n' not in str(error.value)


@pytest.mark.parametrize('nodelist,per_node,ps_tasks', [
    ('n[1-2]', '2(x2)', 0), ('node[1-3,5]', '3(x2),2,1', 1), ('gpu[01-04]', '1(x4)', 2)])
def test_the_cluster_is_the_one_tensorflows_resolver_makes(monkeypatch, nodelist, per_node,
                                                          ps_tasks):
    """Where its order of the nodes (by name) is the nodelist's, SlurmClusterResolver (told the
    GPUs, and never to set CUDA_VISIBLE_DEVICES) places every task where towers does."""
    import tensorflow as tf
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_tasks_per_node,
    )
    counts = expand_tasks_per_node(per_node)
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '3')  # as srun --gpus-per-task=1 binds it
    for rank in range(sum(counts)):
        environ = _step(rank, nodelist, per_node, sum(counts))
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        jobs = {'worker': sum(counts) - ps_tasks, **({'ps': ps_tasks} if ps_tasks else {})}
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=jobs, port_base=7000, gpus_per_node=max(counts), gpus_per_task=1,
            auto_set_gpu=False)
        theirs = resolver.cluster_spec().as_dict()
        ours, task_type, task_index = slurm_tasks(environ, ps_tasks, 7000)
        assert theirs == {job: list(a) for job, a in ours.items()}
        assert resolver.get_task_info() == (task_type, task_index)
    assert os.environ['CUDA_VISIBLE_DEVICES'] == '3'  # srun's binding, kept


def _consecutive_free_ports():
    """A port base P of this machine where P and P + 1 are both free (two tasks, one node)."""
    for port in free_ports(20):
        probes = [socket.socket() for _ in range(2)]
        try:
            for offset, probe in enumerate(probes):
                probe.bind(('127.0.0.1', port + offset))
            return port
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    pytest.skip('no two consecutive free ports on 127.0.0.1')


def test_a_two_task_srun_step_equals_one_process_with_two_towers(tmp_path, monkeypatch, forks):
    """Two `towers train` processes told only what srun tells its tasks (one node, 127.0.0.1,
    two tasks) train as one collective cluster, exactly as one process with two towers.
    (Forked from the worker's fork server: two processes, no start of TensorFlow.)"""
    # Each task's environment is srun's alone: the test's own SLURM_ and TF_CONFIG unset.
    unset = dict.fromkeys([n for n in os.environ if n.startswith('SLURM_')] + ['TF_CONFIG'])
    for name in unset:
        monkeypatch.delenv(name, raising=False)  # the reference run is a plain one
    flags = ['--steps', '4'] + FLAGS
    one = str(tmp_path / 'one')
    assert main(['train', '--towers', '2', '--logdir', one] + flags) == 0
    port_base, logdir = _consecutive_free_ports(), str(tmp_path / 'run')
    runs = []
    try:
        for rank in (0, 1):
            runs.append(forks.training(
                ['train', '--cluster-mode', 'collective', '--threads', '1', '--port-base',
                 str(port_base), '--cluster-timeout', '60', '--logdir', logdir] + flags,
                tmp_path, env=dict(unset, **_step(rank, '127.0.0.1', '2', 2, rank))))
        statuses = [run.finish(timeout=150) for run in runs]
    finally:
        for run in runs:
            if run.status is None:
                run.kill()
    for rank, (status, run) in enumerate(zip(statuses, runs)):
        assert status == 0, run.out + run.err
        assert ('training 4 steps on 1 tower(s) /job:worker/task:%d/device:CPU:0, global batch '
                '20, feed input' % rank) in run.out, run.out
    assert _close(_variables(one), _variables(logdir)) <= 1e-6


SBATCH = pathlib.Path(__file__).resolve().parents[2] / 'examples' / 'slurm' / 'train.sbatch'


def test_the_batch_script_runs_towers_train_on_two_nodes_in_one_step():
    text = SBATCH.read_text(encoding='utf-8')
    assert text.startswith('#!/bin/bash\n')
    options = re.findall(r'^#SBATCH (--[\w-]+)=(\S+)$', text, re.M)
    assert ('--nodes', '2') in options and dict(options)['--ntasks-per-node'] == '1'
    (srun,) = [line for line in text.replace('\\\n', ' ').splitlines()
               if line.startswith('srun ')]
    words = shlex.split(srun)
    command = words[words.index('towers') + 1:]
    # The shell's expansions: ${VAR:-default} to its default, any other variable to 'x'.
    command = [re.sub(r'\$\{?\w+\}?', 'x', re.sub(r'\$\{\w+:-([^}]*)\}', r'\1', word))
               for word in command]
    args = build_parser().parse_args(command)
    assert (args.command, args.cluster_mode, args.cluster) == ('train', 'collective', None)
    assert '$shared/runs/' in srun and 'CUDA_VISIBLE_DEVICES' not in srun


def test_slurm_flags_without_a_slurm_step_are_one_line(capsys, monkeypatch):
    for name in [n for n in os.environ if n.startswith('SLURM_')] + ['TF_CONFIG']:
        monkeypatch.delenv(name, raising=False)
    for argv, message in (
            (['train', '--ps-tasks', '1'], '--ps-tasks and --port-base go with a SLURM step '
             '(srun, or --cluster slurm)'),
            (['server', '--port-base', '9000'], '--ps-tasks and --port-base go with a SLURM '
             'step (srun, or --cluster slurm)'),
            (['train', '--cluster', 'slurm'], 'SLURM_PROCID is not set: ' + LAUNCH)):
        assert main(argv) == 1
        err = capsys.readouterr().err.splitlines()
        assert err == ['towers: error: ' + message]
