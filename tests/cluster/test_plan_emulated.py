"""The plan's bytes against an emulated cluster: each task a host of its own, on links shaped
with tc.

`towers launch --emulate-link` runs each task in its own network namespace; its LinkMeter
counts what crossed each host's link over the chief's logged steps. What each task sends and
receives a step is the model's and the mode's, whatever the machine's load, and is held
against `towers plan`'s bytes: collective with its all-reduce in buckets (`auto`) and
parameter-server at two workers, and the ring after the backward pass (`--all-reduce-bucket 0`)
at three, where its 2(N-1)/N is not 1. (At two workers, bucket 0 is what `towers plan --verify`
runs and holds to the same bounds: tests/tools/test_plan_verify.py.) The step's time is not
asserted here: it moves with whatever else this machine runs; `towers plan --verify` measures
it against the plan.
Each namespace and bridge a test makes is removed by the launcher's teardown.
"""
import re
import subprocess

import pytest

from towers import models
from towers.cluster import emulate
from towers.tools import linkbench, plan

REASON = emulate.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or '')

MODEL, BATCH = 'small_convnet', 32  # S = 218 kB; its batch per worker
# A step of a few tenths of a second, most of it on the link (the bytes do not depend on it):
# long beside how late the launcher may read the counters.
LINK = '20Mbit,0'
# The meter counts over the chief's logged steps 2 to STEPS: W = STEPS - 2 steps. It reads the
# counters when the chief's line reaches the launcher, and at either end of the window a step's
# traffic may be half-way: the next step's may have begun by the read (a parameter-server
# worker pulls as soon as its run returns, with the chief's: mnist_convnet's worker 1 once
# received 725 bytes a step less than its 13 MB plan, a window of 6 steps), the tail of the
# chief's last all-gather may still be on its way to the other worker, and nothing follows the
# last step. So one step's bytes at most, of the W, fall outside the window or in it from
# outside: each task moves at least (W - 1) / W of its plan in it, and above it 1/W more, with
# the TCP/IP headers, the acks of what flows the other way and the step's few scalars (7 to 9%
# at this link, whose shaping cuts TCP's segments to 1514-byte frames): at most 15% above.
STEPS = 22
LOW, HIGH = (STEPS - 3) / (STEPS - 2), 1.15
CASES = [('collective', 'auto', 2), ('parameter-server', None, 2), ('collective', '0', 3)]


@pytest.mark.parametrize('mode,bucket,workers', CASES)
def test_each_task_moves_the_planned_bytes(tmp_path, mode, bucket, workers, forks):
    ps = int(mode == 'parameter-server')
    flags = ['--all-reduce-bucket', bucket] if bucket else []
    # imagenet-synthetic: no data to read, and no final test whose reads of the variables
    # would follow the last step. The launcher forks from the worker's fork server, and its
    # tasks from it into their hosts (tests/conftest.py).
    status, out, _ = forks.run(
        ['launch', '--workers', str(workers), '--ps', str(ps), '--emulate-link', LINK,
         '--grace', '5', '--logs', str(tmp_path / 'logs'), '--', 'train', '--cluster-mode',
         mode, '--model', MODEL, '--dataset', 'imagenet-synthetic', '--threads', '1',
         '--batch-size', str(workers * BATCH), '--steps', str(STEPS), '--eval-every', '0',
         '--quiet', '--log-every', '1', '--devices', 'cpu'] + flags, tmp_path, timeout=300)
    stdout = '\n'.join(out) + '\n'
    assert status == 0, stdout[-2000:]
    assert _left_behind(stdout) == []
    _, use = linkbench.link_use(stdout)
    sizes = plan.model_sizes(models.build_model(MODEL, (28, 28, 1), 10), (28, 28, 1))
    where = '%s %s, %d workers' % (MODEL, mode + (' bucket %s' % bucket if bucket else ''),
                                   workers)
    planned = plan.task_bytes(mode, workers, sizes, ps=ps)
    assert sorted(use) == sorted(task for task, _, _ in planned)
    for task, sent, received in planned:
        for what, bytes_planned, seen in (('sent', sent, use[task][0]),
                                          ('received', received, use[task][1])):
            assert LOW * bytes_planned <= seen <= HIGH * bytes_planned, (
                '%s: %s %s %d bytes a step, planned %d' % (where, task, what, seen,
                                                          bytes_planned))


def _left_behind(output):
    """The namespaces and bridge of this launch still there: tests beside this one may
    make their own, so only this launch's, named after its bridge, are looked for."""
    tag = re.search(r' on bridge twb(\d+),', output).group(1)
    listed = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    left = [line.split()[0] for line in listed.splitlines()
            if line.startswith('towers-%s-' % tag)]
    bridge = subprocess.run(['ip', 'link', 'show', 'twb' + tag], capture_output=True)
    return left + (['twb' + tag] if bridge.returncode == 0 else [])
