"""A disk that fills up or turns read-only, a logdir that cannot be read, a checkpoint cut short.

Each case checks the exit status, the one line said, and what is on disk
afterwards: the previous checkpoint intact (equal to an uninterrupted run's
at its step), nothing half written left, the state file naming only what is
whole. The disk is a real one: a tmpfs filled by a ballast file, a folder
bind-mounted read-only, file modes that root obeys once it has dropped
CAP_DAC_OVERRIDE. Only the moment is set by the test, by a wrapper around
checkpoints.save that fills or locks the disk just before the second save.
"""
import contextlib
import ctypes
import math
import os
import re
import subprocess

import pytest

from tests.faults.runs import (
    TINY,
    assert_same_variables,
    listed,
    towers,
    variables,
)
from tests.harness import snapshot
from towers import checkpoints
from towers.logdir import in_use_by

# Five steps between checkpoints and only the newest kept: the previous one is
# all there is to resume from when the next save fails.
FLAGS = TINY + ('--steps', '20', '--checkpoint-every', '5', '--keep-checkpoints', '1',
                '--no-tensorboard')
AFTER_FIRST_SAVE = {'.towers.lock', 'checkpoint', 'run.json', 'model.ckpt-5.index',
                    'model.ckpt-5.meta', 'model.ckpt-5.data-00000-of-00001'}


def _before_second_save(monkeypatch, fault):
    """Run fault(first checkpoint's prefix) just before the second checkpoint is written."""
    save, saved = checkpoints.save, []

    def save_after_fault(saver, sess, folder, step):
        if len(saved) == 1:
            fault(saved[0])
        saved.append(save(saver, sess, folder, step))
        return saved[-1]
    monkeypatch.setattr(checkpoints, 'save', save_after_fault)


def _leave_free(disk, free):
    """Fill disk's file system with a ballast file until exactly `free` bytes stay free."""
    stat = os.statvfs(disk)
    with open(os.path.join(disk, 'ballast'), 'ab') as f:
        f.write(b'\0' * (stat.f_bavail * stat.f_frsize - free))
    stat = os.statvfs(disk)
    assert stat.f_bavail * stat.f_frsize == free


def _blocks(path, disk):
    block = os.statvfs(disk).f_frsize
    return math.ceil(os.path.getsize(path) / block) * block


def _sizes(first, disk, *suffixes):
    return sum(_blocks(first + suffix, disk) for suffix in suffixes)


DATA = '.data-00000-of-00001'
# Which write of the second checkpoint finds the disk full: what stays free is
# what the writes before it take (the graph, then the variables, then the
# list); (bytes left free, the file that could not be written, more flags).
FULL_AT = {
    'graph': (lambda first, disk: 0, r'model\.ckpt-10\.meta\.tmp[0-9a-f]{32}', ()),
    'variables': (lambda first, disk: _sizes(first, disk, '.meta'),
                  r'model\.ckpt-10\.data-00000-of-00001\.tempstate\d+', ()),
    'list': (lambda first, disk: _sizes(first, disk, '.meta', '.index', DATA),
             r'checkpoint\.tmp[0-9a-f]{32}', ()),
    # Room for the variables and the list, not the graph too: in TensorFlow's
    # own order the list named the new checkpoint before its graph failed.
    'all-but-the-graph': (lambda first, disk: _sizes(first, disk, '.index', DATA)
                          + os.statvfs(disk).f_frsize,
                          r'model\.ckpt-10\.data-00000-of-00001\.tempstate\d+',
                          ('--keep-checkpoints', '2')),
}


@pytest.mark.parametrize('write', sorted(FULL_AT))
def test_a_full_disk_while_checkpointing(tmpfs, monkeypatch, capsys, uninterrupted, write):
    free, unwritten, more = FULL_AT[write]
    logdir = str(tmpfs / 'run')
    _before_second_save(monkeypatch, lambda first: _leave_free(tmpfs, free(first, tmpfs)))
    status, out, err = towers(capsys, 'train', *FLAGS, *more, '--logdir', logdir)
    assert status == 1
    assert len(err) == 1 and re.fullmatch(
        r'towers: error: cannot write checkpoint %s-10: %s/%s; No space left on device'
        % (re.escape(os.path.join(logdir, 'model.ckpt')), re.escape(logdir), unwritten),
        err[0]), err
    # The previous checkpoint is whole and listed alone; nothing of the failed
    # one is left; the lock is released.
    assert set(os.listdir(logdir)) == AFTER_FIRST_SAVE
    assert listed(logdir) == ['model.ckpt-5']
    assert_same_variables(uninterrupted(*TINY, '--steps', '5'),
                          variables(os.path.join(logdir, 'model.ckpt-5')))
    assert in_use_by(logdir) is None
    # With room again, the run resumes from it and ends where it would have.
    os.remove(str(tmpfs / 'ballast'))
    monkeypatch.undo()
    status, out, _ = towers(capsys, 'train', *FLAGS, '--logdir', logdir)
    assert status == 0 and 'resumed from %s' % os.path.join(logdir, 'model.ckpt-5') in out
    assert_same_variables(uninterrupted(*TINY, '--steps', '20'),
                          variables(checkpoints.newest_complete(logdir)))


@pytest.fixture
def read_only(tmp_path):
    """read_only(folder): bind-mount folder read-only over itself; unmounted afterwards."""
    mounted = []

    def lock(folder):
        done = subprocess.run(['mount', '--bind', folder, folder], capture_output=True,
                              text=True)
        if done.returncode:
            pytest.skip('mount --bind is refused here (%s)' % done.stderr.strip())
        mounted.append(folder)
        done = subprocess.run(['mount', '-o', 'remount,bind,ro', folder, folder],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip('a read-only bind mount is refused here (%s)' % done.stderr.strip())
        assert not os.access(folder, os.W_OK)
    yield lock
    for folder in mounted:
        subprocess.run(['umount', folder], check=True)


def test_a_logdir_made_read_only_while_checkpointing(tmp_path, monkeypatch, capsys,
                                                     uninterrupted, read_only):
    logdir = str(tmp_path / 'run')
    _before_second_save(monkeypatch, lambda first: read_only(logdir))
    status, _, err = towers(capsys, 'train', *FLAGS, '--logdir', logdir)
    assert status == 1
    assert len(err) == 1 and re.fullmatch(
        r'towers: error: cannot write checkpoint %s-10: %s/model\.ckpt-10\.meta\.tmp[0-9a-f]{32}'
        r'; Read-only file system' % (re.escape(os.path.join(logdir, 'model.ckpt')),
                                      re.escape(logdir)), err[0]), err
    assert set(os.listdir(logdir)) == AFTER_FIRST_SAVE
    assert listed(logdir) == ['model.ckpt-5']
    assert_same_variables(uninterrupted(*TINY, '--steps', '5'),
                          variables(os.path.join(logdir, 'model.ckpt-5')))


def test_a_read_only_logdir_is_refused_for_training_and_read_for_eval(tmp_path, capsys,
                                                                     read_only):
    logdir = str(tmp_path / 'run')
    assert towers(capsys, 'train', *FLAGS, '--logdir', logdir)[0] == 0
    read_only(logdir)
    before = snapshot(logdir)
    assert towers(capsys, 'train', *FLAGS, '--steps', '25', '--logdir', logdir)[::2] == (
        1, ['towers: error: --logdir %s is not writable; choose another folder' % logdir])
    status, out, err = towers(capsys, 'eval', '--devices', 'cpu', '--logdir', logdir)
    assert (status, err) == (0, [])
    assert out[0] == 'checkpoint: %s' % os.path.join(logdir, 'model.ckpt-20')
    assert re.fullmatch(r'test: loss \d\.\d{4} accuracy 0\.\d{4} top5 \d\.\d{4} \(1000 images\)',
                        out[1]), out
    assert snapshot(logdir) == before


class _CapHeader(ctypes.Structure):
    _fields_ = [('version', ctypes.c_uint32), ('pid', ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [('effective', ctypes.c_uint32), ('permitted', ctypes.c_uint32),
                ('inheritable', ctypes.c_uint32)]


_CAPABILITY_VERSION_3 = 0x20080522
_DAC = 1 << 1 | 1 << 2  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


@contextlib.contextmanager
def _without_dac_override():
    """This thread, root, without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH in effect inside:
    it obeys file modes. Capabilities are a thread's own, and the reads the runs below are
    refused are Python's, on this thread: a run in this process, not one of ~5 s of CPU
    starting TensorFlow, sees what a process without them would. Only the effective set
    changes (they stay permitted), so they come back on the way out."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()

    def capset():
        if libc.capset(ctypes.byref(header), data):
            raise OSError(ctypes.get_errno(), 'capset failed')
    if libc.capget(ctypes.byref(header), data):
        raise OSError(ctypes.get_errno(), 'capget failed')
    effective = data[0].effective
    data[0].effective &= ~_DAC
    capset()
    try:
        yield
    finally:
        data[0].effective = effective
        capset()


@pytest.fixture
def unreadable(tmp_path):
    """unreadable(path): chmod 000, so that it cannot be read inside _without_dac_override
    (skips where dropping the capabilities does not make root obey modes)."""
    probe = tmp_path / 'probe'
    probe.write_text('secret')
    probe.chmod(0)
    if os.geteuid() != 0:
        pytest.skip('not root: file modes already apply, and chmod 000 is the test itself')
    try:
        with _without_dac_override():
            probe.read_text()
    except PermissionError:
        pass
    except OSError as e:
        pytest.skip('cannot drop CAP_DAC_OVERRIDE here (%s)' % e)
    else:
        pytest.skip('root still reads a mode-000 file without CAP_DAC_OVERRIDE here')
    changed = []

    def make_unreadable(path):
        changed.append((path, os.stat(path).st_mode))
        os.chmod(path, 0)
    yield make_unreadable
    for path, mode in reversed(changed):
        os.chmod(path, mode)


def _run_unprivileged(capsys, *argv):
    with _without_dac_override():
        return towers(capsys, *argv)


def test_an_unreadable_state_file_stops_the_run_instead_of_starting_it_over(tmp_path, capsys,
                                                                            unreadable):
    # TensorFlow reads a state file it cannot open as "no checkpoints": the run
    # would start again from step 0 and list only its own new checkpoints.
    logdir = str(tmp_path / 'run')
    assert towers(capsys, 'train', *FLAGS, '--logdir', logdir)[0] == 0
    unreadable(os.path.join(logdir, 'checkpoint'))
    before = snapshot(logdir)
    status, out, err = _run_unprivileged(capsys, 'train', *FLAGS, '--steps', '25',
                                         '--logdir', logdir)
    assert status == 1
    assert err == ['towers: error: cannot read %s: Permission denied; make it readable (it lists '
                   'the checkpoints there), or use another --logdir'
                   % os.path.join(logdir, 'checkpoint')]
    assert not any(line.startswith('training') for line in out)
    after = snapshot(logdir)
    del before['.towers.lock'], after['.towers.lock']  # taken and emptied again
    assert after == before


def test_an_unreadable_logdir_is_one_line_for_eval(tmp_path, capsys, unreadable):
    logdir = str(tmp_path / 'run')
    assert towers(capsys, 'train', *FLAGS, '--logdir', logdir)[0] == 0
    unreadable(logdir)
    status, out, err = _run_unprivileged(capsys, 'eval', '--logdir', logdir)
    assert (status, out) == (1, [])
    assert err == ['towers: error: cannot read %s: Permission denied'
                   % os.path.join(logdir, 'run.json')]


def test_a_checkpoint_cut_short_is_passed_over(tmp_path, capsys, uninterrupted):
    # A disk error or a copy that stopped: the newest data file is short. 15 steps, then
    # resumed to 20: the uninterrupted run it ends equal to is the other tests' (one run less).
    logdir = str(tmp_path / 'run')
    flags = TINY + ('--checkpoint-every', '5')
    assert towers(capsys, 'train', *flags, '--steps', '15', '--logdir', logdir)[0] == 0
    newest = os.path.join(logdir, 'model.ckpt-15')
    with open(newest + '.data-00000-of-00001', 'r+b') as f:
        f.truncate(1000)
    status, out, _ = towers(capsys, 'eval', '--devices', 'cpu', '--logdir', logdir)
    assert (status, out[0]) == (0, 'checkpoint: %s' % os.path.join(logdir, 'model.ckpt-10'))
    status, out, _ = towers(capsys, 'train', *flags, '--steps', '20', '--logdir', logdir)
    assert status == 0
    assert 'resumed from %s (%s, newer, does not read back whole)' % (
        os.path.join(logdir, 'model.ckpt-10'), newest) in out
    assert_same_variables(uninterrupted(*TINY, '--steps', '20'),
                          variables(checkpoints.newest_complete(logdir)))
