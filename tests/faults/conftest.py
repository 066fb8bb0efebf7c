"""Fixtures of the fault tests: the uninterrupted runs a fault is compared with, a tmpfs."""
import os
import subprocess

import pytest
import tensorflow as tf

from tests.faults.runs import variables
from towers.cli import main


@pytest.fixture(scope='session')
def uninterrupted(tmp_path_factory):
    """uninterrupted(*flags): the final variables of `towers train FLAGS`, run once per flags.

    The runs the faults are compared with, bit for bit: the trainer is
    deterministic with the feed input, so a run killed and resumed must end
    on exactly these numbers.
    """
    made = {}

    def final_variables(*flags):
        if flags not in made:
            logdir = str(tmp_path_factory.mktemp('uninterrupted') / 'run')
            assert main(['train', *flags, '--logdir', logdir]) == 0
            made[flags] = variables(tf.compat.v1.train.latest_checkpoint(logdir))
        return made[flags]
    return final_variables


@pytest.fixture
def tmpfs(tmp_path):
    """A file system of its own (tmpfs, 8 MiB) at tmp_path/'disk', to fill or make read-only."""
    disk = tmp_path / 'disk'
    disk.mkdir()
    mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=8m', 'tmpfs', str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip('mount -t tmpfs is refused here (%s): the full and read-only disk cases '
                    'need a file system of their own' % mounted.stderr.strip())
    try:
        yield disk
    finally:
        remount(disk, 'rw')
        done = subprocess.run(['umount', str(disk)], capture_output=True, text=True)
        if done.returncode:
            subprocess.run(['umount', '-l', str(disk)])  # not left mounted, whatever held it
            raise AssertionError('%s was still in use: %s' % (disk, done.stderr.strip()))


def remount(disk, mode):
    """Make the tmpfs at disk read-only ('ro') or writable again ('rw')."""
    subprocess.run(['mount', '-o', 'remount,' + mode, str(disk)], check=True)
    assert os.access(str(disk), os.W_OK) == (mode == 'rw')
