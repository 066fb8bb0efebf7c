"""A task of `towers launch` forked from the launcher (launch.py's docstring): what Task needs
of a Popen, for a child that runs the CLI's main on its arguments instead of exec'ing Python.
"""
import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import traceback


def die_with_parent():
    """In the child, before exec or main: SIGTERM it when the launcher dies (Linux's
    PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the teardown still ends the tasks, unless the launcher is killed


class Forked:
    """main(ARGS) in a fork of this process: what Task needs of a Popen (pid, stdout,
    returncode, poll, wait), for a child this process forked and reaps itself."""

    def __init__(self, main, args, env, inherited=(), enter=None):
        self.args, self.returncode = args, None
        read, write = os.pipe()
        ready, started = os.pipe()  # closed by the fork once it is a task of its own
        sys.stdout.flush()
        sys.stderr.flush()
        # The stopping signals wait until the fork has its own session and handlers: one sent
        # before would reach the launcher's handler in it, or a process group not yet made.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)
        try:
            self.pid = os.fork()
            if self.pid == 0:  # the task: never returns
                os.close(read)
                os.close(ready)
                _run_forked(main, args, env, write, inherited, enter, started, blocked)
        except BaseException:
            for fd in (read, write, ready, started):
                os.close(fd)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(write)
        os.close(started)
        while os.read(ready, 64):  # as Popen returns after the exec: the task is set up
            pass
        os.close(ready)
        self.stdout = os.fdopen(read, 'rb')

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode


_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _run_forked(main, args, env, output, inherited, enter, started, blocked):
    """In the fork: become the task (as Popen with start_new_session and die_with_parent
    would start it), say so (close `started`), enter its host where it has one, run main(ARGS)
    as `towers ARGS`, end as a Python process ends, and exit with its status.

    The stopping signals arrive blocked; they are let through (`blocked`: the mask before)
    once this process has its own session and a new Python process's handlers.
    """
    status = 1
    try:
        launcher = os.getppid()
        os.setsid()
        die_with_parent()
        if os.getppid() != launcher:
            os._exit(128 + signal.SIGTERM)  # the launcher died before the line above: as its
            # SIGTERM would have ended this task
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        # The launcher's exit handlers are not this task's (multiprocessing's fork start
        # clears them too); the task's own run at its end.
        atexit._clear()
        sys.argv = sys.argv[:1] + list(args)  # its command line (a logdir lock names it)
        os.close(started)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for f in inherited:
            f.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(devnull)
        os.close(output)
        os.environ.clear()
        os.environ.update(env)
        if enter is not None:
            enter()
        status = main(args)
    except SystemExit as e:
        status = e.code
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            if isinstance(status, str):
                print(status, file=sys.stderr)
                status = 1
            # What Python does at exit: wait for the non-daemon threads, run the atexit
            # handlers, flush what is left.
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status if isinstance(status, int) else 0 if status is None else 1)
