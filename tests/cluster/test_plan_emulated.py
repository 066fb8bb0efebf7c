"""`towers plan` against an emulated cluster: hosts of their own, on links of 100 Mbit/s.

`towers launch --emulate-link` runs each task in its own network namespace,
every host's link shaped with tc; at 100 Mbit/s small_convnet's 218 kB of
gradients take far longer on the wire than its step takes to compute, so the
prediction's network term is what is checked. Each namespace, bridge and
process a test makes is removed by it (the launcher's teardown).
"""
import io
import json
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout

import pytest

from towers.cli import main
from towers.cluster import emulate

REASON = emulate.unavailable()
# Alone: a step timed beside another test's load would not be the step the plan predicts.
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ''), pytest.mark.alone]

LINK = '100Mbit'
BATCH = 32  # per worker: the global batch is workers * BATCH
FLAGS = ['--model', 'small_convnet', '--threads', '1']
RATE = re.compile(r'^\[worker 0\] trained to step \d+: ([\d.]+) images/sec after warm-up$')


@pytest.fixture(scope='module')
def predicted():
    """{(mode, workers): predicted step seconds}, from one `towers plan`."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(['plan', '--model', 'small_convnet', '--workers', '2,3', '--batch-size',
                     str(BATCH), '--bandwidth', LINK, '--latency', '0', '--cluster-mode',
                     'collective,parameter-server', '--warmup', '5', '--window', '50',
                     '--json']) == 0
    text = out.getvalue()
    rows = json.loads(text[text.index('\n[') + 1:])
    return {(row['mode'], row['workers']): row['step_s'] for row in rows}


@pytest.mark.parametrize('mode,workers', [('collective', 2), ('collective', 3),
                                          ('parameter-server', 2), ('parameter-server', 3)])
def test_a_measured_step_is_within_25_percent_of_the_plan(tmp_path, predicted, mode, workers):
    ps, before = int(mode == 'parameter-server'), _namespaces()
    process = subprocess.run(
        [sys.executable, '-m', 'towers', 'launch', '--workers', str(workers), '--ps', str(ps),
         '--emulate-link', LINK + ',0', '--grace', '5', '--logs', str(tmp_path / 'logs'), '--',
         'train', '--cluster-mode', mode, '--batch-size', str(workers * BATCH), '--steps', '15',
         '--eval-every', '0', '--quiet', '--log-every', '15'] + FLAGS,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'), cwd=str(tmp_path),
        capture_output=True, text=True, timeout=180)
    assert process.returncode == 0, process.stdout[-2000:]
    rates = [float(m.group(1)) for m in map(RATE.match, process.stdout.splitlines()) if m]
    assert len(rates) == 1, process.stdout[-2000:]
    measured = workers * BATCH / rates[0]
    expected = predicted[(mode, workers)]
    assert abs(measured - expected) <= 0.25 * expected, (
        '%s, %d workers: measured %.4f s per step, planned %.4f s' % (mode, workers, measured,
                                                                      expected))
    assert _namespaces() == before  # the launcher removed the hosts it made


def _namespaces():
    listed = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    return sorted(line.split()[0] for line in listed.splitlines() if line.strip())
