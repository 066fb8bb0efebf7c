"""towers data-service dispatcher|worker: what cannot be served is one line and status 1 (their
stop on a signal is in test_train.py, with the workers a run trains from)."""
import socket
import time

from towers.cli import main
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
    silent = free_ports(1)[0]
    start = time.monotonic()
    assert main(['data-service', 'worker', '--dispatcher', 'localhost:%d' % silent,
                 '--wait', '1']) == 1
    assert time.monotonic() - start < 10
    assert _one_line(capsys) == ('the dispatcher localhost:%d did not answer within 1 s; start '
                                 '`towers data-service dispatcher` there, or fix --dispatcher'
                                 % silent)
