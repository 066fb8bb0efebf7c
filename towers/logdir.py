"""One run per logdir: the folder is made (or checked) and locked for the run's life.

Two runs writing into one logdir would leave a mix of both (checkpoints,
events, stats.jsonl). A training run holds an advisory lock (flock) on
LOGDIR/.towers.lock from before it writes anything until it ends; the
kernel drops it when the process dies, kill -9 included, so a crash never
leaves a stale lock in the way of the resume. The file says who holds it,
so the run that is refused can name that process. Holding the lock, a run
removes what a killed one left half written (remove_unfinished).
"""
import errno
import fcntl
import glob
import json
import os
import re
import socket
import sys
import time

from towers import checkpoints
from towers.errors import TowersError
from towers.names import BEST_FILE, CHECKPOINT_NAME, LOCK_FILE, RUN_FILE, STATS_FILE

_UNNAMED_WAIT_S = 1.0  # how long a lock whose holder wrote no name yet is asked again


def prepare_logdir(logdir):
    """Make logdir (and its parents) if needed; TowersError if it cannot be written."""
    try:
        os.makedirs(logdir, exist_ok=True)
    except OSError as e:
        raise TowersError('cannot create {logdir} %s: %s', logdir, e.strerror) from None
    if not os.access(logdir, os.W_OK | os.X_OK):
        raise TowersError('{logdir} %s is not writable; choose another folder', logdir)


def _holder_text(info):
    if not info:
        return 'another process'
    return 'process %s (%s) on %s since %s' % (
        info.get('pid', '?'), info.get('command', '?'), info.get('host', '?'),
        time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info.get('since', 0))))


def _read_holder(handle):
    handle.seek(0)
    try:
        return json.loads(handle.read() or '{}')
    except ValueError:
        return {}


def _command():
    """This process's command line, short: 'towers train --logdir ...'."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'python'
    if program in ('__main__.py', '-m', '-c'):
        program = 'towers' if program == '__main__.py' else 'python'
    return ' '.join([program] + sys.argv[1:])[:200]


class LogdirLock:
    """The exclusive lock of a training run on its logdir (a context manager).

    Raises TowersError on entry when another live process holds it, naming
    that process.
    """

    def __init__(self, logdir):
        self.logdir, self.path = logdir, os.path.join(logdir, LOCK_FILE)
        self._handle = None

    def __enter__(self):
        try:
            handle = open(self.path, 'a+', encoding='utf-8')
        except OSError as e:
            raise TowersError('cannot lock {logdir} %s: %s', self.logdir, e.strerror) from None
        deadline = time.monotonic() + _UNNAMED_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                holder = _read_holder(handle)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    handle.close()
                    raise TowersError('cannot lock {logdir} %s: %s', self.logdir,
                                      e.strerror) from None
                # Held by no one named: in_use_by looking (for a moment), or a run
                # that has just locked and is writing its name. Ask again, briefly.
                if holder or time.monotonic() > deadline:
                    handle.close()
                    raise TowersError('{logdir} %s is in use by %s: wait for that run to end, '
                                      'or choose another folder', self.logdir,
                                      _holder_text(holder)) from None
                time.sleep(0.01)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({'pid': os.getpid(), 'host': socket.gethostname(),
                                 'command': _command(), 'since': time.time()}))
        handle.flush()
        self._handle = handle
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            # Emptied, not removed: removing would race a run about to lock this file.
            self._handle.truncate(0)
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
        return False


def in_use_by(logdir):
    """Who holds logdir's lock (a line saying so), or None when no run holds it."""
    path = os.path.join(logdir, LOCK_FILE)
    try:
        handle = open(path, encoding='utf-8')
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _holder_text(_read_holder(handle))
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


# What a write cut short by a kill leaves: TensorFlow's temporary files (a
# checkpoint's data and index, its sharded folder, the graph, the state file)
# and atomic_output's (run.json, stats.jsonl, best.json).
_UNFINISHED = ['%s-*%s*' % (CHECKPOINT_NAME, mark) for mark in ('.tempstate', '_temp', '.tmp')]
_UNFINISHED += [checkpoints.STATE_FILE + '.tmp*']
_UNFINISHED += ['.%s.*' % name for name in (RUN_FILE, STATS_FILE, BEST_FILE)]
_STEM = re.compile(r'%s-(\d+)' % re.escape(CHECKPOINT_NAME))  # model.ckpt-STEP of its files


def remove_unfinished(folder):
    """Remove what an interrupted run left half written in folder; the names removed.

    Also the files of checkpoints the state file does not list: those newer
    than its newest (a run killed after writing them, before listing them),
    and the others that are not whole, graph included (killed while deleting
    an old one, or during a first save): nothing reads them, and the Saver
    would never delete them. A whole unlisted checkpoint older than the
    newest listed one stays. Only while holding the
    logdir (LogdirLock): another run's writes in progress look the same.
    """
    def matching(pattern):
        return glob.glob(os.path.join(glob.escape(folder), pattern))
    removed = {path for pattern in _UNFINISHED for path in matching(pattern)}
    state = checkpoints.checkpoint_state(folder)
    named = list(state.all_model_checkpoint_paths) + [state.model_checkpoint_path] if state \
        else []
    listed = sorted(step for step in {_step(path) for path in named} if step is not None)
    for path in matching(CHECKPOINT_NAME + '-*'):
        step = _step(path)
        if step is None or step in listed:
            continue
        # Newer than the newest listed: a save not yet listed. Older, or with no list:
        # a deletion (which takes the graph first) or a first save cut short, if it is
        # not whole; a whole one is the user's, or was about to go anyway: it stays.
        prefix = os.path.join(folder, '%s-%d' % (CHECKPOINT_NAME, step))
        if (listed and step > listed[-1]) or not (os.path.exists(prefix + '.meta')
                                                  and checkpoints.reads_back(prefix)):
            removed.add(path)
    for path in removed:
        checkpoints.remove_path(path)
    return sorted(os.path.basename(path) for path in removed)


def _step(path):
    """STEP of a model.ckpt-STEP file (or prefix), else None."""
    stem = _STEM.match(os.path.basename(path))
    return int(stem.group(1)) if stem else None


def take_over(folder, saver, log, shown=''):
    """What a run does with a checkpoint folder it now holds; the folder's CheckpointState.

    What a killed run left half written goes (and the log says what); the
    Saver learns of the checkpoints there, so that it goes on keeping the
    newest and deleting the oldest (a fresh Saver knows none of them, and
    would drop them from the state file and never delete them).

    Args:
      shown: the folder as the log line names it, relative to the logdir.
    """
    removed = remove_unfinished(folder)
    if removed:
        log('removed what an interrupted run left unfinished: %s'
            % ', '.join(os.path.join(shown, name) for name in removed))
    state = checkpoints.checkpoint_state(folder)
    if state and state.all_model_checkpoint_paths:
        saver.recover_last_checkpoints(state.all_model_checkpoint_paths)
    return state
