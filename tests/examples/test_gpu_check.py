"""examples/gpu_check.sh: valid bash, and on a machine without GPUs one line saying why."""
import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf

from towers.devices import no_gpu_reason

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / 'examples' / 'gpu_check.sh'


def test_the_script_parses():
    assert subprocess.run(['bash', '-n', str(SCRIPT)]).returncode == 0


@pytest.mark.skipif(bool(tf.config.list_physical_devices('GPU')), reason='a GPU is visible')
def test_without_a_gpu_it_says_why_in_one_line(tmp_path):
    # `towers` and `python` as this interpreter's environment has them.
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ['PATH'])
    run = subprocess.run(['bash', str(SCRIPT)], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stdout.splitlines() == [
        'gpu_check: /gpu:0 does not exist: this machine has 0 visible GPU(s); %s (or use '
        '/cpu:N, virtual devices)' % no_gpu_reason()], run.stdout + run.stderr
