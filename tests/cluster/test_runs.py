"""Across real processes, in every mode: exact, and a lost task is named, never a hang.

Every cluster here is real: `towers launch` starts each task as a process of
this machine on free ports of 127.0.0.1, and every process a test starts is
ended by it. One tower per task and one thread each keep it to two cores. The
launcher is a fork of the worker's fork server (tests/conftest.py `forks`),
which imported TensorFlow once, and its tasks are forks of the launcher (its
--start fork): a cluster costs no start of TensorFlow.
"""
import os
import re
import signal

import numpy as np
import pytest
import tensorflow as tf

from towers.cli import main

tf1 = tf.compat.v1

# On CPUs, GPU hosts too: a one-process run and the clusters it is held against alike.
FLAGS = ['--model', 'small_convnet', '--batch-size', '20', '--eval-every', '0', '--quiet',
         '--log-every', '1', '--optimizer', 'momentum', '--lr', '0.05', '--devices', 'cpu']


def _variables(logdir):
    """{name: value} of the newest checkpoint's model variables (not the data order)."""
    prefix = tf1.train.latest_checkpoint(logdir)
    return {name: tf.train.load_variable(prefix, name) for name, _ in
            tf1.train.list_variables(prefix) if not name.startswith('data_order')}


def _launch_command(tmp_path, workers, ps, mode, grace=5):
    return ['launch', '--workers', str(workers), '--ps', str(ps), '--grace', str(grace),
            '--logs', str(tmp_path / 'logs'), '--', 'train', '--threads', '1',
            '--cluster-mode', mode]


def _launch(forks, tmp_path, *args, workers=2, ps=0, timeout=150, mode='in-graph'):
    """`towers launch` in a process; (status, output lines).

    A timeout kills the launcher, and its tasks get SIGTERM as it dies.
    """
    status, out, _ = forks.run(_launch_command(tmp_path, workers, ps, mode) + list(args),
                               tmp_path, timeout=timeout)
    return status, out


@pytest.fixture(scope='module')
def one_process(tmp_path_factory):
    """One process with 2 towers, 8 steps: what the 2-task cluster must equal."""
    logdir = str(tmp_path_factory.mktemp('one') / 'run')
    assert main(['train', '--towers', '2', '--steps', '8', '--logdir', logdir] + FLAGS) == 0
    return _variables(logdir)


def _close(a, b):
    """The largest difference, relative to the largest value (at least 1)."""
    return max(float(np.max(np.abs(a[n] - b[n]))) / max(1.0, float(np.max(np.abs(a[n]))))
               for n in a)


def test_two_tasks_with_a_ps_equal_one_process_with_two_towers(tmp_path, one_process, forks):
    logdir = str(tmp_path / 'run')
    status, lines = _launch(forks, tmp_path, '--steps', '8', '--logdir', logdir, *FLAGS, ps=1)
    assert status == 0, '\n'.join(lines)
    assert ('[worker 0] training 8 steps on 2 tower(s) /job:worker/task:0/device:CPU:0,'
            '/job:worker/task:1/device:CPU:0, global batch 20, feed input') in lines
    assert '[worker 1] in-graph mode: worker 1 serves; worker 0 trains' in lines
    cluster = _variables(logdir)
    assert sorted(cluster) == sorted(one_process)
    assert _close(one_process, cluster) <= 1e-6
    # Each task kept a log of its own.
    chief_log = (tmp_path / 'logs' / 'worker-0.log').read_text()
    assert 'checkpoint: %s/model.ckpt-8' % logdir in chief_log
    assert 'serving ps 0' in (tmp_path / 'logs' / 'ps-0.log').read_text()


def _pids(line):
    return {name: int(pid) for name, pid in re.findall(r'(\w+ \d+) is pid (\d+)', line)}


def _launch_and(forks, tmp_path, act, *args, at_step=3, mode='in-graph', grace=5):
    """Launch, do act(pid of worker 1) once the chief has logged step at_step; (status, lines).

    grace: the launcher's --grace, how long the tasks it stops have before SIGKILL.
    """
    ps = 1 if mode == 'parameter-server' else 0
    pids, status = {}, None
    with forks.training(_launch_command(tmp_path, 2, ps, mode, grace) + list(args),
                        tmp_path) as run:
        try:
            pids = _pids(run.wait_for_line('towers launch: worker 0 is pid'))
            run.wait_for_line('[worker 0] step %d/' % at_step)
            act(pids['worker 1'])
            status = run.finish(timeout=150)
        finally:
            if status is None:
                # The launcher is killed on leaving, and its tasks get SIGTERM as it dies;
                # a stopped one would not act on it: end them here.
                for pid in pids.values():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    return status, run.out + run.err


def test_two_collective_workers_equal_one_process_with_two_towers(tmp_path, one_process,
                                                                  forks):
    logdir = str(tmp_path / 'run')
    status, lines = _launch(forks, tmp_path, '--steps', '8', '--logdir', logdir, *FLAGS,
                            mode='collective')
    assert status == 0, '\n'.join(lines)
    for k in (0, 1):  # each its own tower, its share of every global batch of 20
        assert ('[worker %d] training 8 steps on 1 tower(s) /job:worker/task:%d/device:CPU:0, '
                'global batch 20, feed input' % (k, k)) in lines
    # Every worker reports the whole batch's loss: the same line on both.
    steps = [[line.split('] ', 1)[1] for line in lines if line.startswith('[worker %d] step 8/'
                                                                          % k)] for k in (0, 1)]
    assert steps[0] == steps[1] and len(steps[0]) == 1
    assert _close(one_process, _variables(logdir)) <= 1e-6


# A lost peer fails a collective or in-graph step at once; a parameter-server worker
# never talks to the others, so the chief learns of it when the step's timeout ends.
# A parameter-server worker lost between its push and its take of the step's token leaves
# the token to the chief, whose next step sees it (syncreplicas._own_token).
WHY_LOST = {'in-graph': ('TensorFlow UnavailableError',),
            'collective': ('TensorFlow UnavailableError',),
            'parameter-server': ('the step did not finish within 3 s',
                                 'a step went on without its gradient and was stopped')}


@pytest.fixture(scope='module')
def one_process_dataset(tmp_path_factory):
    """One process with 2 towers reading through the tf.data pipeline, 6 steps."""
    logdir = str(tmp_path_factory.mktemp('one_dataset') / 'run')
    assert main(['train', '--towers', '2', '--steps', '6', '--input', 'dataset', '--logdir',
                 logdir] + FLAGS) == 0
    return _variables(logdir)


@pytest.mark.parametrize('mode', ['in-graph', 'collective'])
def test_with_the_dataset_input_each_task_reads_its_own_rows(tmp_path, one_process_dataset,
                                                             mode, forks):
    logdir = str(tmp_path / 'run')
    status, lines = _launch(forks, tmp_path, '--steps', '6', '--input', 'dataset', '--logdir',
                            logdir, *FLAGS, mode=mode)
    assert status == 0, '\n'.join(lines)
    assert _close(one_process_dataset, _variables(logdir)) <= 1e-6


def test_on_imagenet_shards_each_worker_decodes_its_rows_and_equals_one_process(tmp_path, forks):
    """Each worker decodes only its own rows of every global batch (the others stay zeros,
    unused), and the two train exactly as one process with two towers, past an epoch."""
    from tests.data.test_imagenet import _write_shards
    folder = str(tmp_path / 'imagenet')
    os.makedirs(folder)
    _write_shards(folder, 'train', [7, 6])
    flags = ['--dataset', 'imagenet:' + folder, '--image-size', '16', '--steps', '4'] + FLAGS
    flags[flags.index('--batch-size') + 1] = '5'  # 13 images: 5, 5, the epoch's last 3, 5
    one = str(tmp_path / 'one')
    assert main(['train', '--towers', '2', '--logdir', one] + flags) == 0
    logdir = str(tmp_path / 'run')
    status, lines = _launch(forks, tmp_path, '--logdir', logdir, *flags, mode='collective')
    assert status == 0, '\n'.join(lines)
    assert _close(_variables(one), _variables(logdir)) <= 1e-6


def test_two_synchronous_workers_with_two_ps_equal_one_process_on_an_uneven_batch(tmp_path,
                                                                                 forks):
    """Shares of 11 and 10, clipping and weight decay on the whole batch's gradient."""
    flags = ['--steps', '6', '--batch-size', '21', '--clip-norm', '0.5', '--weight-decay',
             '0.01'] + FLAGS[:2] + FLAGS[4:]
    one = str(tmp_path / 'one')
    assert main(['train', '--towers', '2', '--logdir', one] + flags) == 0
    logdir = str(tmp_path / 'run')
    status, lines = _launch(forks, tmp_path, '--logdir', logdir, *flags, ps=2,
                            mode='parameter-server')
    assert status == 0, '\n'.join(lines)
    for k in (0, 1):
        assert ('[worker %d] training 6 steps on 1 tower(s) /job:worker/task:%d/device:CPU:0, '
                'global batch 21, feed input' % (k, k)) in lines
    # Both report the whole batch's loss and accuracy, as the one process did.
    steps = [[line.split('] ', 1)[1] for line in lines if line.startswith('[worker %d] step '
                                                                          % k)] for k in (0, 1)]
    assert steps[0] == steps[1] and len(steps[0]) == 6
    cluster, reference = _variables(logdir), _variables(one)
    assert sorted(cluster) == sorted(reference)  # nothing of the cluster's own is saved
    assert _close(reference, cluster) <= 1e-6
    # The variables were spread over both ps tasks by bytes.
    with tf.Graph().as_default() as graph:
        tf1.train.import_meta_graph(tf1.train.latest_checkpoint(logdir) + '.meta')
    tasks = {op.device.split('/task:')[1][0] for op in graph.get_operations()
             if op.type == 'VarHandleOp' and op.device.startswith('/job:ps')}
    assert tasks == {'0', '1'}


@pytest.mark.parametrize('mode', ['in-graph', 'collective', 'parameter-server'])
def test_a_killed_worker_is_named_and_a_relaunch_resumes_exactly(tmp_path, one_process, mode,
                                                                 forks):
    logdir = str(tmp_path / 'run')
    timeout = '3' if mode == 'parameter-server' else '20'
    args = ['--steps', '8', '--logdir', logdir, '--checkpoint-every', '1',
            '--cluster-timeout', timeout] + FLAGS
    status, lines = _launch_and(forks, tmp_path, lambda pid: os.kill(pid, signal.SIGKILL), *args,
                                mode=mode)
    assert status == 128 + signal.SIGKILL, '\n'.join(lines)  # the lost task's status
    lost = [line for line in lines if 'towers: error: lost worker 1 (127.0.0.1:' in line]
    assert len(lost) == 1 and lost[0].startswith('[worker 0] ') and any(lost[0].endswith(
        '(%s); stop the job and start it again to resume from the newest checkpoint' % why)
        for why in WHY_LOST[mode]), '\n'.join(lines)
    assert any(re.fullmatch(r'towers launch: worker 1 was killed by SIGKILL; stopping the other '
                            r'[012] task\(s\)', line) for line in lines), lines
    # The chief named it and ended by itself (its Session to the lost task cannot close).
    assert 'towers launch: worker 0 ended with status 1' in lines
    saved = int(tf1.train.latest_checkpoint(logdir).rsplit('-', 1)[1])
    assert 3 <= saved < 8
    # The same command again: the cluster resumes from the chief's newest checkpoint.
    status, lines = _launch(forks, tmp_path, *args, mode=mode, ps=int(mode == 'parameter-server'))
    assert status == 0, '\n'.join(lines)
    assert '[worker 0] resumed from %s/model.ckpt-%d' % (logdir, saved) in lines
    assert _close(one_process, _variables(logdir)) <= 1e-6


# (In parameter-server mode a frozen worker is a killed one: the step's timeout names it.)
# The chief ends by itself; the frozen worker cannot act on SIGTERM, so the launcher's grace
# is a wait for nothing before its SIGKILL: 1 s.
@pytest.mark.parametrize('mode', ['in-graph', 'collective'])
def test_a_frozen_worker_is_named_within_the_timeout(tmp_path, mode, forks):
    status, lines = _launch_and(forks, tmp_path, lambda pid: os.kill(pid, signal.SIGSTOP),
                                '--steps', '400', '--cluster-timeout', '3', *FLAGS, mode=mode,
                                grace=1)
    assert status == 1, '\n'.join(lines)
    lost = [line for line in lines if 'towers: error: lost worker 1 (127.0.0.1:' in line]
    assert len(lost) == 1 and '(the step did not finish within 3 s)' in lost[0], lines
    assert any(line.startswith('towers launch: worker 0 exited with status 1; stopping the '
                               'other 1 task(s)') for line in lines), lines


@pytest.mark.parametrize('mode', ['collective', 'parameter-server'])
def test_a_stop_asked_of_one_worker_stops_all_after_the_same_step(tmp_path, mode, forks):
    logdir = str(tmp_path / 'run')
    status, lines = _launch_and(forks, tmp_path, lambda pid: os.kill(pid, signal.SIGTERM),
                                '--steps', '400', '--logdir', logdir, *FLAGS, mode=mode)
    assert status == 0, '\n'.join(lines)  # a polite stop: saved, and no error anywhere
    stopped = {k: [line for line in lines if line.startswith('[worker %d] ' % k)
                   and 'stopping after step' in line] for k in (0, 1)}
    assert len(stopped[0]) == len(stopped[1]) == 1, lines
    step = int(stopped[1][0].rsplit(' ', 1)[1])
    assert stopped[1][0] == '[worker 1] SIGTERM: stopping after step %d' % step
    assert stopped[0][0] == ('[worker 0] a stop asked of another worker: stopping after step %d'
                             % step)
    assert tf1.train.latest_checkpoint(logdir).endswith('model.ckpt-%d' % step)


@pytest.mark.parametrize('mode', ['collective', 'parameter-server'])
def test_workers_started_with_other_settings_are_refused(tmp_path, mode, forks):
    from towers.cluster.launch import local_cluster
    from towers.cluster.spec import Cluster
    ps = int(mode == 'parameter-server')
    jobs = local_cluster(2, ps)
    commands = [(Cluster(jobs, 'worker', k), ['train', '--cluster-mode', mode, '--threads', '1',
                                               '--steps', '4', '--cluster-timeout', '5']
                 + FLAGS[:2] + ['--batch-size', batch] + FLAGS[4:])
                for k, batch in ((0, '20'), (1, '10'))]
    commands += [(Cluster(jobs, 'ps', 0), ['server', '--threads', '1'])] * ps
    runs = [forks.training(command, tmp_path, env={'TF_CONFIG': cluster.tf_config()})
            for cluster, command in commands]
    try:
        statuses = [run.finish(timeout=120) for run in runs[:2]]
    finally:
        for run in runs:
            if run.status is None:
                run.kill()
    refused = ['towers: error: the workers were started with different batch_size, '
               'steps_per_epoch: start every worker with the same flags']
    # Every collective worker compares; in parameter-server mode each worker compares
    # with the chief, which then names the worker it waits for in vain.
    errors = [run.err for run in runs[:2]]
    assert statuses == [1, 1]
    assert errors[1] == refused, errors
    if mode == 'collective':
        assert errors[0] == refused, errors
    else:
        assert len(errors[0]) == 1 and errors[0][0].startswith(
            'towers: error: lost worker 1 (%s) after step 0' % jobs['worker'][1]), errors


@pytest.mark.parametrize('mode,precision,ps', [('parameter-server', 'fp16', 1),
                                               ('collective', 'bf16', 0)])
def test_mixed_precision_workers_equal_one_process(tmp_path, mode, precision, ps, forks):
    """fp16: the chief's update applies or skips the whole batch's step, one loss scale on
    the ps; bf16: the workers all-reduce the float32 gradients of their bf16 towers."""
    flags = ['--steps', '6', '--precision', precision] + FLAGS
    one = str(tmp_path / 'one')
    assert main(['train', '--towers', '2', '--logdir', one] + flags) == 0
    logdir = str(tmp_path / 'run')
    status, lines = _launch(forks, tmp_path, '--logdir', logdir, *flags, ps=ps, mode=mode)
    assert status == 0, '\n'.join(lines)
    assert any(line.startswith('[worker 1] training 6 steps') and line.endswith(precision)
               for line in lines), '\n'.join(lines)
    cluster, reference = _variables(logdir), _variables(one)
    assert sorted(cluster) == sorted(reference)
    if precision == 'fp16':
        for name in ('loss_scale/scale', 'loss_scale/good_steps', 'loss_scale/skipped_steps'):
            assert cluster[name] == reference[name], name
        assert cluster['loss_scale/good_steps'] + cluster['loss_scale/skipped_steps'] == 6
    # Towers in a 16-bit type: a float32 sum in another order may round a weight the
    # other way.
    assert _close(reference, cluster) <= 1e-3
