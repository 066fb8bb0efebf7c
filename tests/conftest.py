"""Shared test set-up: quiet TensorFlow's C++ logging before it is imported, a local HTTP
server for the download tests (no network but 127.0.0.1), and the `alone` and `exact` marks.

The suite runs on two pytest-xdist workers (`-n 2`, as .ci/run does): most tests wait on
processes, timeouts or the disk as much as they compute, so two at a time fill two cores. A
test marked `alone` runs with no other test beside it, because it times something (a step
against the plan, a run against its budget) that another test's load on the same cores would
skew. Without xdist every test is alone anyway.

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
import fcntl
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
    config.addinivalue_line('markers', 'alone: no other test runs beside this one (it times '
                                       'something that another test would slow down)')
    config.addinivalue_line('markers', 'exact: runs with TF32 off and op determinism on '
                                       '(towers.exactness.exact)')
    config.addinivalue_line('markers', 'gpu: needs a GPU (skipped where TensorFlow sees none)')


def pytest_runtest_setup(item):
    if item.get_closest_marker('gpu') is not None and not _has_gpu():
        pytest.skip('needs a GPU: TensorFlow sees none here')


@functools.lru_cache(maxsize=None)
def _has_gpu():
    import tensorflow as tf  # only where a gpu test is about to run
    return bool(tf.config.list_physical_devices('GPU'))



@contextlib.contextmanager
def _turn(alone):
    """A test's turn among the xdist workers of this run: shared, or the only one.

    A readers-writer lock of two files: every test passes the gate, and one to run alone
    holds it until its run ends, so no new test starts while it waits for the running ones
    to end, and none starts beside it.
    """
    if 'PYTEST_XDIST_WORKER' not in os.environ:
        yield
        return
    # Locks on two files every worker has and nobody writes (this folder and this file):
    # a lock leaves nothing on disk.
    gate, lock = (os.open(path, os.O_RDONLY) for path in (os.path.dirname(__file__), __file__))
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(lock)  # closing a file releases its lock
        os.close(gate)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Around setup, call and teardown: a module fixture's run belongs to its first test.
    with _turn(item.get_closest_marker('alone') is not None), _exactness(item):
        yield


@contextlib.contextmanager
def _exactness(item):
    if item.get_closest_marker('exact') is None:
        yield
        return
    from towers.exactness import exact  # imports TensorFlow: only for the tests that ask
    with exact():
        yield


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
