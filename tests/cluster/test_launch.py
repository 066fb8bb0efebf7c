"""towers launch's process handling: TF_CONFIG per task, prefixed output, logs, teardown."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from towers.cluster.launch import (
    SHARED_GPUS,
    Task,
    exit_status,
    free_ports,
    gpu_shares,
    launch,
    local_cluster,
)
from towers.cluster.spec import ClusterError

PY = sys.executable


def _script(code):
    return [PY, '-c', code]


PRINT_TASK = ('import json, os; c = json.loads(os.environ["TF_CONFIG"]); '
              'print(c["task"]["type"], c["task"]["index"], len(c["cluster"]["worker"]))')
SERVE_UNTIL_TERM = ('import signal, sys, time; '
                    'signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); '
                    'print("serving", flush=True); time.sleep(60)')


def test_free_ports_are_distinct_and_free():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as probe:
            probe.bind(('127.0.0.1', port))  # nothing holds it
    jobs = local_cluster(2, 1)
    assert [a.split(':')[0] for a in jobs['worker'] + jobs['ps']] == ['127.0.0.1'] * 3


def _after(path, code):
    """code, run once path holds a line (a guard of 60 s): a task that goes on only once
    another has said it is ready (the ps serving, a worker deaf to SIGTERM), so that the
    teardown's signal finds that one as the test means it to."""
    return ('import os, time\nfor _ in range(600):\n'
            '    if os.path.exists(%r) and open(%r).read(): break\n'
            '    time.sleep(0.1)\n%s' % (path, path, code))


def test_every_task_gets_its_tf_config_a_log_and_prefixed_lines(tmp_path):
    jobs = local_cluster(2, 1)
    lines = []
    worker = _script(_after(str(tmp_path / 'ps-0.log'), PRINT_TASK))
    status = launch([('worker', 0, worker, False),
                     ('worker', 1, worker, False),
                     ('ps', 0, _script(SERVE_UNTIL_TERM), True)],
                    jobs, logs=str(tmp_path), log=lines.append, grace=5)
    assert status == 0
    assert '[worker 0] worker 0 2' in lines and '[worker 1] worker 1 2' in lines
    assert lines[-1] == 'towers launch: every training task finished'
    assert (tmp_path / 'worker-1.log').read_text() == 'worker 1 2\n'
    assert (tmp_path / 'ps-0.log').read_text() == 'serving\n'  # stopped by SIGTERM, status 0


@pytest.fixture
def started(monkeypatch):
    """The Tasks launch() starts, in order: what became of each process is read after it."""
    tasks, start = [], Task.start

    def recording(task, *args):
        start(task, *args)
        tasks.append(task)
    monkeypatch.setattr(Task, 'start', recording)
    return tasks


def _ends(tasks):
    """{task name: its process's return code (-N: killed by signal N)}."""
    return {task.name: task.process.returncode for task in tasks}


def test_a_failing_task_tears_the_job_down_and_gives_its_status(tmp_path, started):
    lines = []
    failing = _after(str(tmp_path / 'ps-0.log'), 'import sys; print("boom"); sys.exit(3)')
    status = launch([('worker', 0, _script('import time; time.sleep(60)'), False),
                     ('worker', 1, _script(failing), False),
                     ('ps', 0, _script(SERVE_UNTIL_TERM), True)],
                    local_cluster(2, 1), logs=str(tmp_path), log=lines.append, grace=2)
    assert status == 3
    assert 'towers launch: worker 1 exited with status 3; stopping the other 2 task(s)' in lines
    # worker 0 would sleep a minute: the teardown's SIGTERM ended it (the ps, on its handler).
    assert _ends(started) == {'worker 0': -signal.SIGTERM, 'worker 1': 3, 'ps 0': 0}


def test_a_task_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path, started):
    stubborn = ('import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
                'print("up", flush=True); time.sleep(60)')
    lines = []
    # worker 1 kills itself once worker 0 says it is up (deaf to SIGTERM by then).
    killed = _after(str(tmp_path / 'worker-0.log'), 'os.kill(os.getpid(), 9)')
    status = launch([('worker', 0, _script(stubborn), False),
                     ('worker', 1, _script(killed), False)],
                    local_cluster(2), logs=str(tmp_path), log=lines.append, grace=1)
    assert status == 137  # worker 1's SIGKILL, as a shell reports it
    assert 'towers launch: worker 1 was killed by SIGKILL; stopping the other 1 task(s)' in lines
    # worker 0 would sleep a minute, deaf to SIGTERM: the SIGKILL after the grace ended it.
    assert _ends(started) == {'worker 0': -signal.SIGKILL, 'worker 1': -signal.SIGKILL}
    assert exit_status(-15) == 143 and exit_status(2) == 2


def test_logs_go_to_a_new_folder_when_none_is_given():
    lines = []
    assert launch([('worker', 0, _script('print("hi")'), False)], local_cluster(1),
                  log=lines.append) == 0
    folder = lines[0].rsplit('logs in ', 1)[1]
    try:
        assert os.path.basename(folder).startswith('towers-launch-')
        with open(os.path.join(folder, 'worker-0.log')) as f:
            assert f.read() == 'hi\n'
    finally:
        shutil.rmtree(folder)


def test_the_tasks_end_when_the_launcher_is_killed(tmp_path):
    code = ('import sys; from towers.cluster.launch import launch, local_cluster; '
            'launch([("worker", 0, [sys.executable, "-c", "import time; time.sleep(60)"], '
            'False)], local_cluster(1), logs=sys.argv[1], grace=1)')
    launcher = subprocess.Popen([sys.executable, '-c', code, str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)
    try:
        line = ''
        while 'is pid' not in line:
            line = launcher.stdout.readline()
            assert line, 'the launcher said nothing'
        pid = int(line.rsplit(' ', 1)[1])
        launcher.kill()  # SIGKILL: no teardown runs
        launcher.wait()
        deadline = time.monotonic() + 60  # (a guard: it goes as soon as the launcher dies)
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError('the task outlived its launcher')
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_spawned_tasks_import_tensorflow_and_the_launcher_never_does(tmp_path):
    # --start spawn: each task is a new Python process that loads TensorFlow itself.
    code = ('import sys; from towers.cli import main; '
            'status = main(["launch", "--start", "spawn", "--workers", "1", "--logs", "logs", '
            '"--", "data", "convert", "--shards", "1", "--out", "records"]); '
            'print("launcher:", status, "tensorflow" in sys.modules)')
    run = subprocess.run([PY, '-c', code], cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=120)
    lines = run.stdout.splitlines()
    assert lines[-1] == 'launcher: 0 False', run.stdout + run.stderr
    assert '[worker 0] test: 1000 records in 1 shard(s)' in lines  # (a command on TensorFlow)


# A forked task runs `fork` (the CLI's main where towers launch forks) on its ARGS; here a
# stand-in that says where it runs, so that no TensorFlow is needed to see how it starts.
FORKED = textwrap.dedent('''
    import atexit, json, os, sys, time
    from towers.cluster.launch import launch, local_cluster, towers_command

    def main(args):
        print(json.dumps([sys.argv[1:], os.getpid(), os.getsid(0), os.environ['TF_CONFIG']]))
        sys.stdout.flush()
        if args == ['0']:
            time.sleep(60)  # until the teardown's SIGTERM
        raise SystemExit(int(args[0]))

    lines = []
    atexit.register(print, 'the launcher ends')  # in the launcher, not in its tasks
    status = launch([('worker', k, towers_command(str(3 * k)), False) for k in (0, 1)],
                    local_cluster(2), logs=sys.argv[1], log=lines.append, grace=2, fork=main)
    print(json.dumps([status, os.getpid(), os.getsid(0), lines]))
''')


def test_forked_tasks_are_processes_of_their_own_with_their_own_environment(tmp_path):
    run = subprocess.run([PY, '-c', FORKED, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    status, pid, sid, lines = json.loads(run.stdout.splitlines()[-2])
    assert status == 3, run.stdout + run.stderr  # worker 1's SystemExit(3), as its status
    said = {k: json.loads(next(line for line in lines if line.startswith('[worker %d] [' % k))
                          .split('] ', 1)[1]) for k in (0, 1)}
    for k, (argv, task_pid, task_sid, tf_config) in said.items():
        assert argv == [str(3 * k)]  # its command line, `towers 0`
        assert task_pid != pid and task_sid == task_pid != sid  # a session of its own
        assert json.loads(tf_config)['task'] == {'type': 'worker', 'index': k}
    assert 'towers launch: worker 1 exited with status 3; stopping the other 1 task(s)' in lines
    assert not any(line.endswith('the launcher ends') for line in lines)
    assert run.stdout.splitlines()[-1] == 'the launcher ends'


def test_the_host_gpus_come_from_cuda_visible_devices_or_nvidia_smi(monkeypatch):
    from towers.cluster import launch as launching
    assert launching.host_gpus({'CUDA_VISIBLE_DEVICES': '2, 3,5'}) == ['2', '3', '5']
    assert launching.host_gpus({'CUDA_VISIBLE_DEVICES': ''}) == []  # a scheduler hid them all

    class Listed:
        returncode = 0
        stdout = ('GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n'
                  '  MIG 1g.5gb Device 0: (UUID: MIG-1)\n'
                  'GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\n')
    monkeypatch.setattr(launching.subprocess, 'run', lambda *a, **k: Listed)
    assert launching.host_gpus({}) == ['0', '1']

    def missing(*args, **kwargs):
        raise FileNotFoundError('nvidia-smi')
    monkeypatch.setattr(launching.subprocess, 'run', missing)
    assert launching.host_gpus({}) == []


def test_each_worker_gets_its_share_of_the_gpus_a_ps_none_and_an_evaluator_the_rest():
    gpus = ['0', '1', '2', '3']
    assert gpu_shares(gpus, 2, 1) == {('worker', 0): '0,1', ('worker', 1): '2,3', ('ps', 0): '',
                                      ('evaluator', 0): ''}
    assert gpu_shares(gpus, 3, 0) == {('worker', 0): '0', ('worker', 1): '1', ('worker', 2): '2',
                                      ('evaluator', 0): '3'}
    assert gpu_shares(gpus, 2, 0, gpus_per_worker=1) == {('worker', 0): '0', ('worker', 1): '1',
                                                         ('evaluator', 0): '2,3'}
    assert gpu_shares([], 2, 1) == {}  # a CPU host: the environment is left alone
    for workers, per in ((5, 1), (2, 3)):
        with pytest.raises(ClusterError, match=r'do not fit in the 4 GPU\(s\) of this host'):
            gpu_shares(gpus, workers, 0, per)


def test_more_workers_than_gpus_share_them_dealt_out_evenly():
    assert gpu_shares(['0'], 2, 1) == {('worker', 0): '0', ('worker', 1): '0', ('ps', 0): '',
                                       ('evaluator', 0): ''}
    assert gpu_shares(['0', '1'], 3, 0) == {('worker', 0): '0', ('worker', 1): '0',
                                            ('worker', 2): '1', ('evaluator', 0): ''}
    assert [gpu_shares(list('0123'), 5, 0)['worker', k] for k in range(5)] == [
        '0', '0', '1', '2', '3']


def test_workers_that_share_a_gpu_are_told_so_and_the_others_are_not(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_GPUS, '1')  # never inherited from the launcher's own environment
    show = _script('import os; print(repr(os.environ.get("CUDA_VISIBLE_DEVICES")), '
                   'os.environ.get("%s"))' % SHARED_GPUS)
    for gpus, told in ((['0'], '1'), (['0', '1'], None)):
        lines = []
        status = launch([('worker', 0, show, False), ('worker', 1, show, False),
                         ('ps', 0, show, False)], local_cluster(2, 1), logs=str(tmp_path),
                        log=lines.append, gpus=gpus)
        assert status == 0, lines
        assert "[worker 0] '0' %s" % told in lines and "[ps 0] '' None" in lines
        shared = [line for line in lines if line.startswith('towers launch: GPUs')]
        assert shared[0].endswith('(workers share GPUs: their collectives take the ring, not '
                                  'NCCL)') == (told == '1'), shared


def test_launch_hands_each_task_its_cuda_environment(tmp_path, monkeypatch):
    monkeypatch.delenv('TF_FORCE_GPU_ALLOW_GROWTH', raising=False)  # tests/conftest.py sets it
    show = _script('import os; print(repr(os.environ.get("CUDA_VISIBLE_DEVICES")), '
                   'os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"))')
    lines = []
    status = launch([('worker', 0, show, False), ('worker', 1, show, False),
                     ('ps', 0, show, False)], local_cluster(2, 1), logs=str(tmp_path),
                    log=lines.append, gpus=['4', '5', '6', '7'])
    assert status == 0, lines
    assert "[worker 0] '4,5' true" in lines and "[worker 1] '6,7' true" in lines
    assert "[ps 0] '' true" in lines
    assert 'towers launch: GPUs worker 0: 4,5; worker 1: 6,7; ps 0: none' in lines


def test_auto_forks_the_tasks_on_a_host_without_gpus_and_spawns_them_on_one_with():
    from towers.cli.launcher import forks_tasks
    assert forks_tasks('auto', gpus=[]) and not forks_tasks('auto', gpus=['0', '1'])
    assert forks_tasks('fork', gpus=['0']) and not forks_tasks('spawn', gpus=[])
