"""towers train --data-service: two local service workers, one killed mid-run (the run goes
on to its last step and says so, as does the dispatcher), then the dispatcher stopped (the run
stops within its timeout, naming it; each server stops on its signal with one line); an
in-memory dataset refused."""
import re
import signal
import sys
import threading
import time

from tests.dataservice.common import Lines, imagenet_folder
from towers.cli import main
from towers.cluster.launch import free_ports

# A worker killed at step 10; the run held at step 20 until it says so. The hold, not the
# steps between, gives the service its time to notice: 30 steps show what 300 did, for a
# tenth of the batches the trainer and the service workers make.
STEPS = 30


def _towers(forks, cwd, *args):
    """`towers ARGS` in a process of its own, forked from the worker's fork server (a test's
    three processes do not start TensorFlow); (the run, its stdout Lines)."""
    run = forks.training(list(args), cwd)
    return run, Lines.of_fork(run)


def _end(run, signum):
    """Signal the run; its exit status (a guard of 60 s)."""
    run.send_signal(signum)
    return run.finish(60)


def _train_flags(folder, address, *more):
    return ['train', '--dataset', 'imagenet:' + folder, '--model', 'trivial', '--image-size',
            '32', '--batch-size', '8', '--eval-every', '0', '--quiet', '--devices', 'cpu',
            '--data-service', address] + list(more)


class _Out:
    """A stdout that keeps what is written and acts on the run's lines as they come.

    at(prefix, act): act() once, when a line starting with prefix has been written, its
    newline too, before the run goes on (the run's own thread writes its step lines): what a
    test does to the service lands after an exact step, whatever the machine's speed. (On
    the line's text, before print writes its newline, a line the service's watch writes
    meanwhile would join the step's.)
    """

    def __init__(self):
        self.text, self._acts, self._lock = '', [], threading.Lock()

    def at(self, prefix, act):
        self._acts.append((prefix, act))

    def write(self, text):
        with self._lock:  # (the service's watch writes from a thread of its own)
            self.text += text
            due = []
            if text.endswith('\n'):
                line = self.text[:-1].rsplit('\n', 1)[-1]  # the line this write ended
                due = [(p, a) for p, a in self._acts if line.startswith(p)]
            for each in due:
                self._acts.remove(each)
        for _, act in due:
            act()
        return len(text)

    def flush(self):
        pass

    def holds(self, text, seconds=60.0):
        """Wait until text has been written (by the service's watch, in its thread)."""
        deadline = time.monotonic() + seconds
        while text not in self.text:
            assert time.monotonic() < deadline, 'no %r within %.0f s' % (text, seconds)
            time.sleep(0.05)


def test_training_through_two_service_workers_survives_one_and_stops_without_the_dispatcher(
        tmp_path, capsys, monkeypatch, forks):
    folder = imagenet_folder(str(tmp_path / 'imagenet'))
    address = 'localhost:%d' % free_ports(1)[0]
    dispatcher = _towers(forks, tmp_path, 'data-service', 'dispatcher', '--port',
                         address.split(':')[1])
    workers = [_towers(forks, tmp_path, 'data-service', 'worker', '--dispatcher', address)
               for _ in range(2)]
    try:
        names = [said.wait_for('data-service worker: serving').split()[3]
                 for _, said in workers]
        for name in names:  # the dispatcher names its workers
            dispatcher[1].wait_for('data-service dispatcher: worker %s joined' % name)
        # One worker killed once the run is 10 steps in; the run goes on past step 20
        # only once its log says so.
        lost_line = ('data service: worker %s does not answer; the others go on with its '
                     'work (workers answering: 1 of 2)' % names[0])
        out = _Out()
        out.at('step 10/', workers[0][0].kill)
        out.at('step 20/', lambda: out.holds(lost_line))
        monkeypatch.setattr(sys, 'stdout', out)
        assert main(_train_flags(folder, address, '--steps', str(STEPS),
                                 '--log-every', '10')) == 0
        lines = out.text.splitlines()
        assert workers[0][0].status == -signal.SIGKILL
        lost = lines.index(lost_line)
        steps = [n for n, line in enumerate(lines) if line.startswith('step ')]
        assert steps[0] < lost < steps[-1], lines  # mid-run, then on to the last step
        assert lines[-1].startswith('trained to step %d: ' % STEPS), lines
        assert ('input: the tf.data service at grpc://%s, parallel_epochs: every service worker '
                "makes whole passes of this trainer's pipeline, each on a seed of its own"
                % address) in lines
        assert dispatcher[1].wait_for('worker %s does not answer' % names[0]) == (
            'data-service dispatcher: worker %s does not answer; the others go on with its work '
            '(workers answering: 1 of 2)' % names[0])

        # The dispatcher stopped (on its signal, with one line and status 0) once the run is
        # 10 steps in: the worker left goes on handing out batches, but the run stops once
        # the dispatcher has been silent for its --cluster-timeout, naming it.
        out = _Out()
        stopped = []
        out.at('step 10/', lambda: stopped.append(_end(dispatcher[0], signal.SIGTERM)))
        monkeypatch.setattr(sys, 'stdout', out)
        assert main(_train_flags(folder, address, '--steps', '1000000', '--log-every', '10',
                                 '--cluster-timeout', '2')) == 1
        assert stopped == [0]
        assert dispatcher[1].rest()[-1] == 'data-service dispatcher: stopped (SIGTERM)'
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1, err
        said = re.fullmatch(
            r'towers: error: lost the tf\.data service dispatcher %s: silent for (\d+) s '
            r'\(--cluster-timeout 2 s\) at step [1-9]\d+; start it and its workers again, then '
            r'resume the run' % re.escape(address), err[0])
        # (How long past its timeout it noticed is the machine's speed: at least the timeout.)
        assert said and int(said.group(1)) >= 2, err
        # The worker left stops on its signal, with one line and status 0.
        assert _end(workers[1][0], signal.SIGTERM) == 0
        assert workers[1][1].rest()[-1] == ('data-service worker: stopped (SIGTERM), its '
                                            'dispatcher gone')
    finally:
        for run, _ in workers + [dispatcher]:
            if run.status is None:
                run.kill()


def test_an_in_memory_dataset_is_refused_in_one_line(capsys):
    assert main(['train', '--dataset', 'mnist_sample', '--data-service', 'localhost:1']) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ['towers: error: --data-service sends a pipeline over shards on disk to its '
                   'workers: give --dataset records:DIR, imagenet:DIR or tfds:DIR; mnist_sample '
                   'is held in memory']
