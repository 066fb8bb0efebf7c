"""towers data-service dispatcher|worker: what cannot be served is one line and status 1 (their
stop on a signal is in test_train.py, with the workers a run trains from)."""
import socket

from towers.cli import main
from towers.cli.dataservice import _Stop
from towers.cluster import dataservice
from towers.cluster.launch import free_ports


def _one_line(capsys):
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith('towers: error: '), err
    return err[0][len('towers: error: '):]


def test_what_cannot_be_served_is_one_line(capsys):
    with socket.socket() as holder:
        holder.bind(('', 0))
        holder.listen()
        taken = holder.getsockname()[1]
        assert main(['data-service', 'dispatcher', '--port', str(taken)]) == 1
        assert _one_line(capsys) == ('cannot serve on port %d: Address already in use; choose '
                                     'another --port' % taken)
        assert main(['data-service', 'worker', '--dispatcher', 'localhost:1', '--port',
                     str(taken)]) == 1
        assert _one_line(capsys).startswith('cannot serve on port %d' % taken)
    for address in ('localhost', 'localhost:http', 'http://localhost:80', 'localhost:70000'):
        assert main(['data-service', 'worker', '--dispatcher', address]) == 1
        assert _one_line(capsys) == ('--dispatcher wants HOST:PORT or grpc://HOST:PORT (the '
                                     'dispatcher of `towers data-service dispatcher`), got %r'
                                     % address)


class _Clock:
    """The worker's clock (towers.cluster.dataservice's time) moved on by its waits alone."""

    def __init__(self):
        self.now, self.waits = 1000.0, []

    def monotonic(self):
        return self.now

    def wait(self, seconds):  # as a _Stop's call: no signal came within seconds
        self.waits.append(seconds)
        self.now += seconds
        return None


def test_a_silent_dispatcher_is_asked_until_the_wait_is_over(capsys, monkeypatch):
    silent = 'localhost:%d' % free_ports(1)[0]
    clock, asked, ask = _Clock(), [], dataservice.dispatcher_workers
    monkeypatch.setattr(dataservice, 'time', clock)
    monkeypatch.setattr(_Stop, '__call__', lambda stop, seconds: clock.wait(seconds))
    monkeypatch.setattr(dataservice, 'dispatcher_workers',
                        lambda address, *rest: asked.append(address) or ask(address, *rest))
    assert main(['data-service', 'worker', '--dispatcher', silent, '--wait', '1']) == 1
    # Asked at 0, 1 and 2 s on its clock (its waits between looks, POLL_S, are 1 s): the
    # third answer missing was past the 1 s it waits.
    assert (asked, clock.waits) == ([silent] * 3, [dataservice.POLL_S] * 2)
    assert _one_line(capsys) == ('the dispatcher %s did not answer within 1 s; start '
                                 '`towers data-service dispatcher` there, or fix --dispatcher'
                                 % silent)
