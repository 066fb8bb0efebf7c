"""Shared test set-up: quiet TensorFlow's C++ logging before it is imported, a local HTTP
server for the download tests (no network but 127.0.0.1), and the `exact` and `gpu` marks.

The suite runs on two pytest-xdist workers (`-n 2`, as .ci/run does): most tests wait on
processes, timeouts or the disk as much as they compute, so two at a time fill two cores. No
test times anything (another process on the machine would move it, whatever the suite did to
keep its own tests apart): speed is measured by the benchmarks (`towers bench`, `towers plan
--verify`), never asserted here.

A test marked `exact` (the equality tests: N towers against one device, a strategy against
another) runs inside towers.exactness.exact(), TF32 off and op determinism on, as `towers
check` and `train --deterministic` do: on a GPU machine they would otherwise compare TF32
numbers or a non-deterministic cuDNN algorithm's.

A test marked `gpu` is about what only a GPU shows (logical GPUs, NCCL, cuDNN's layouts,
tensor cores); it is skipped where TensorFlow sees no GPU, and `python -m pytest -m gpu tests`
runs just them. The suite passes on both kinds of machine: a test about CPU towers names CPU
devices (`--devices cpu`, `local_plan(['/cpu:0', '/cpu:1'])`), never the machine's default.
"""
import contextlib
import functools
import http.server
import os
import threading

import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# As `towers` itself runs (towers/cli/main.py use_onednn): oneDNN's CPU kernels on every x86 CPU,
# not only where TensorFlow turns them on by itself (AVX-512 VNNI/BF16, AMX).
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')
# Several test processes (xdist workers, the `towers` runs they start) share a GPU where there is
# one: each takes the memory it uses, not the whole GPU at its first Session.
os.environ.setdefault('TF_FORCE_GPU_ALLOW_GROWTH', 'true')


def pytest_configure(config):
    # Each test's CPU, recorded where TOWERS_CPU_METER names a folder (nothing otherwise):
    # `TOWERS_CPU_METER=DIR bash .ci/run` meters the CI run itself (tests/cpu_meter.py).
    config.pluginmanager.import_plugin('tests.cpu_meter')
    config.addinivalue_line('markers', 'exact: runs with TF32 off and op determinism on '
                                       '(towers.exactness.exact)')
    config.addinivalue_line('markers', 'gpu: needs a GPU (skipped where TensorFlow sees none)')


@pytest.fixture(scope='session')
def forks():
    """This worker's fork server (tests/faults/runs.py Forks): a test that needs a `towers`
    run in a process of its own (to kill it, signal it, or start it clean) forks it from one
    process that imported TensorFlow once, instead of paying ~5 s of CPU for a new one."""
    from tests.faults.runs import Forks
    with Forks() as server:
        yield server


def pytest_runtest_setup(item):
    if item.get_closest_marker('gpu') is not None and not _has_gpu():
        pytest.skip('needs a GPU: TensorFlow sees none here')


@functools.lru_cache(maxsize=None)
def _has_gpu():
    import tensorflow as tf  # only where a gpu test is about to run
    return bool(tf.config.list_physical_devices('GPU'))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Around setup, call and teardown: a module fixture's run belongs to its first test.
    with _exactness(item):
        yield


@contextlib.contextmanager
def _exactness(item):
    if item.get_closest_marker('exact') is None:
        yield
        return
    from towers.exactness import exact  # imports TensorFlow: only for the tests that ask
    with exact():
        yield


# TensorFlow's frame around a cause, for its own developers: no error towers raises may carry it
# (towers/errors.py in_user_words). Every TowersError and DataError any test provokes in its own
# process is read for it as it is made.
_INTERNAL_TEXT = ('{{function_node', '[[{{node')
_SAID_INTERNALLY, _READ = [], []


def _in_the_users_words(cls):
    made = cls.__init__

    @functools.wraps(made)
    def __init__(self, *args, **kwargs):
        made(self, *args, **kwargs)
        if any(text in str(self) for text in _INTERNAL_TEXT):
            _SAID_INTERNALLY.append('%s: %s' % (cls.__name__, self))
    cls.__init__ = __init__


@pytest.fixture(autouse=True)
def _errors_in_the_users_words():
    """Fails a test in which towers raised an error carrying TensorFlow's internal text."""
    if not _READ:
        from towers.data.errors import DataError  # neither imports TensorFlow
        from towers.errors import TowersError
        for cls in (TowersError, DataError):
            _in_the_users_words(cls)
        _READ.append(True)
    del _SAID_INTERNALLY[:]
    yield
    assert not _SAID_INTERNALLY, 'an error in TensorFlow\'s words: %s' % _SAID_INTERNALLY


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/'www' on 127.0.0.1; yields (www folder, base URL)."""
    root = tmp_path / 'www'
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield root, 'http://127.0.0.1:%d' % httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    thread.join()
