"""A task's server: it starts on its port, refuses a taken one in a line, and SIGTERM ends it."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from towers.cluster.launch import free_ports
from towers.cluster.server import check_port_free, server_config, task_device_indices, task_towers
from towers.cluster.spec import Cluster, ClusterError

SERVE = '''
import os
import sys
from towers.cluster.server import serve, server_config
from towers.cluster.spec import from_tf_config
cluster = from_tf_config(os.environ['TF_CONFIG'])
sys.exit(serve(cluster, server_config(cluster, devices_per_task=2, threads=1, num_gpus=0)))
'''


def test_a_taken_port_is_refused_in_one_line():
    with socket.socket() as holder:
        holder.bind(('127.0.0.1', 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ClusterError) as error:
            check_port_free('127.0.0.1:%d' % port)
    assert str(error.value) == ('port %d of 127.0.0.1:%d is already taken on this machine: stop '
                                'what holds it, or give this task another port' % (port, port))
    check_port_free('127.0.0.1:%d' % free_ports(1)[0])  # a free one passes


def test_a_server_serves_until_sigterm_and_exits_cleanly(tmp_path):
    [port] = free_ports(1)
    cluster = Cluster({'worker': ('127.0.0.1:%d' % port,)}, 'worker', 0)
    env = dict(os.environ, TF_CONFIG=cluster.tf_config(), TF_CPP_MIN_LOG_LEVEL='2')
    process = subprocess.Popen([sys.executable, '-c', SERVE], env=env, cwd=str(tmp_path),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = process.stdout.readline()
        assert first == 'serving worker 0 on 127.0.0.1:%d (2 device(s)); SIGTERM stops it\n' % port
        with socket.create_connection(('127.0.0.1', port), timeout=5):
            pass  # it listens
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert out == 'SIGTERM: the server of worker 0 stops\n'


def test_a_task_on_a_gpu_host_has_its_gpus_beside_one_cpu_and_grows_their_memory():
    cluster = Cluster({'worker': ('h:1', 'h:2')}, 'worker', 1)
    gpus = server_config(cluster, 4, num_gpus=4)
    assert (gpus.device_count['CPU'], gpus.gpu_options.allow_growth) == (1, True)
    cpus = server_config(cluster, 3, num_gpus=0)
    assert (cpus.device_count['CPU'], cpus.gpu_options.allow_growth) == (3, False)
    # A CPU host's idle threads sleep, leaving its cores to the RPCs; a GPU host's spin.
    assert (cpus.experimental.disable_thread_spinning,
            gpus.experimental.disable_thread_spinning) == (True, False)
    # Towers: every GPU a task sees by default, or some of them; else virtual CPUs.
    assert task_towers(None, num_gpus=4) == (4, 'GPU')
    assert task_towers(2, num_gpus=4) == (2, 'GPU')
    assert task_towers(None, num_gpus=0) == (1, 'CPU')
    assert task_towers(3, num_gpus=0) == (3, 'CPU')
    # More towers than its GPUs: logical GPUs, dealt out as in one process.
    assert task_towers(5, num_gpus=4) == (5, 'GPU')
    assert task_device_indices(5, 'GPU', 4) == [0, 1, 2, 4, 6]
    assert task_device_indices(2, 'GPU', 1) == [0, 1]
    assert task_device_indices(3, 'CPU', 0) == [0, 1, 2]
    split = server_config(cluster, 5, num_gpus=4).gpu_options.experimental
    assert (split.num_virtual_devices_per_gpu, gpus.gpu_options.experimental
            .num_virtual_devices_per_gpu) == (2, 0)
