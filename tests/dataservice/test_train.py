"""towers train --data-service: two local service workers, one killed mid-run (the run goes
on to its last step and says so, as does the dispatcher), then the dispatcher stopped (the run
stops within its timeout, naming it; each server stops on its signal with one line); an
in-memory dataset refused."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

from tests.dataservice.common import Lines, imagenet_folder
from towers.cli import main
from towers.cluster import dataservice
from towers.cluster.launch import free_ports

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
STEPS = 900  # some 3 s here after the kill at step 100: the run's watch looks every second


def _towers(*args):
    process = subprocess.Popen([sys.executable, '-m', 'towers'] + list(args),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=ENV)
    return process, Lines(process)


def _end(process, signum):
    """Signal process; its exit status (within 30 s)."""
    process.send_signal(signum)
    return process.wait(30)


def _tasks(worker):
    """How many tasks the service worker at worker holds (its GetWorkerTasks answer)."""
    answer = dataservice._ask(worker, dataservice._WORKER + 'GetWorkerTasks')
    return sum(1 for number, _ in dataservice._items(answer or b'') if number == 1)


def _train_flags(folder, address, *more):
    return ['train', '--dataset', 'imagenet:' + folder, '--model', 'trivial', '--image-size',
            '32', '--batch-size', '8', '--eval-every', '0', '--quiet', '--devices', 'cpu',
            '--data-service', address] + list(more)


def _in_a_thread(act):
    """Run act() in a thread; a list that gets the time it returned."""
    done = []
    thread = threading.Thread(target=lambda: done.append((act(), time.monotonic())),
                              daemon=True)
    thread.start()
    return done


class _Out:
    """A stdout that keeps what is written, for a thread to watch."""

    def __init__(self):
        self.text = ''

    def write(self, text):
        self.text += text
        return len(text)

    def flush(self):
        pass


def _wait(condition, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_training_through_two_service_workers_survives_one_and_stops_without_the_dispatcher(
        tmp_path, capsys, monkeypatch):
    folder = imagenet_folder(str(tmp_path / 'imagenet'))
    address = 'localhost:%d' % free_ports(1)[0]
    dispatcher = _towers('data-service', 'dispatcher', '--port', address.split(':')[1])
    workers = [_towers('data-service', 'worker', '--dispatcher', address) for _ in range(2)]
    try:
        names = [said.wait_for('data-service worker: serving').split()[3]
                 for _, said in workers]
        for name in names:  # the dispatcher names its workers
            dispatcher[1].wait_for('data-service dispatcher: worker %s joined' % name)
        # One worker killed once the run is 100 steps in (its log says so).
        out = _Out()
        monkeypatch.setattr(sys, 'stdout', out)
        killed = _in_a_thread(lambda: (_wait(lambda: 'step 100/' in out.text),
                                       workers[0][0].kill()))
        assert main(_train_flags(folder, address, '--steps', str(STEPS),
                                 '--log-every', '100')) == 0
        lines = out.text.splitlines()
        assert killed and workers[0][0].poll() is not None
        lost = lines.index('data service: worker %s does not answer; the others go on with its '
                           'work (workers answering: 1 of 2)' % names[0])
        steps = [n for n, line in enumerate(lines) if line.startswith('step ')]
        assert steps[0] < lost < steps[-1], lines  # mid-run, then on to the last step
        assert lines[-1].startswith('trained to step %d: ' % STEPS), lines
        assert ('input: the tf.data service at grpc://%s, parallel_epochs: every service worker '
                "makes whole passes of this trainer's pipeline, each on a seed of its own"
                % address) in lines
        assert dispatcher[1].wait_for('worker %s does not answer' % names[0], 10) == (
            'data-service dispatcher: worker %s does not answer; the others go on with its work '
            '(workers answering: 1 of 2)' % names[0])

        # The dispatcher stopped: the worker left goes on handing out batches, but the run
        # stops within its --cluster-timeout, naming the dispatcher.
        held = _tasks(names[1])

        def stop_the_dispatcher():  # once the run's job is on the worker, a few steps in
            _wait(lambda: _tasks(names[1]) > held)
            time.sleep(0.5)
            signalled.append(time.monotonic())
            return _end(dispatcher[0], signal.SIGTERM)
        signalled, stopped = [], _in_a_thread(stop_the_dispatcher)
        assert main(_train_flags(folder, address, '--steps', '1000000', '--log-every',
                                 '1000000', '--cluster-timeout', '2')) == 1
        assert signalled and time.monotonic() - signalled[0] < 2 + 4
        _wait(lambda: stopped, 30)
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and re.fullmatch(
            r'towers: error: lost the tf\.data service dispatcher %s: silent for [23] s '
            r'\(--cluster-timeout 2 s\) at step [1-9]\d*; start it and its workers again, then '
            r'resume the run' % re.escape(address), err[0]), err
        # Each server stopped on its signal, with one line and status 0.
        assert stopped[0][0] == 0
        assert dispatcher[1].rest()[-1] == 'data-service dispatcher: stopped (SIGTERM)'
        assert _end(workers[1][0], signal.SIGTERM) == 0
        assert workers[1][1].rest()[-1] == ('data-service worker: stopped (SIGTERM), its '
                                            'dispatcher gone')
    finally:
        for process, _ in workers + [dispatcher]:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_an_in_memory_dataset_is_refused_in_one_line(capsys):
    assert main(['train', '--dataset', 'mnist_sample', '--data-service', 'localhost:1']) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ['towers: error: --data-service sends a pipeline over shards on disk to its '
                   'workers: give --dataset records:DIR, imagenet:DIR or tfds:DIR; mnist_sample '
                   'is held in memory']
