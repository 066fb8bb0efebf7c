"""`towers launch --emulate-link RATE,DELAY`: every task on a host of its own, on one machine.

Each task runs in its own network namespace, joined to the others by a Linux
bridge through a veth pair, as hosts on one switch. Both ends of each pair
are shaped with `tc`, so that every host's link carries RATE each way (a
token bucket, tbf), after a one-way DELAY (netem, where the kernel has it):
what `towers plan --bandwidth RATE --latency DELAY` assumes. The tasks use
only the namespaces' own addresses (10.213.K.x); nothing else on the
network is touched, and everything made is removed when the job ends.

Needs root and iproute2 (`ip`, `tc`); without them `unavailable()` says why
in one line, and the launcher refuses with that line.

A host of its own has cores of its own too: where this machine has at least
as many CPUs as hosts, each host's task is pinned (taskset) to an equal,
disjoint share of them, so that one task's network work (gRPC, the ring's
sums) waits for its own compute only, as on separate machines, not for
another host's. With fewer CPUs than hosts they share them all.

What crossed each host's link is counted by its veth pair (LinkMeter): the
launcher reads the counters as the chief logs its steps and says, per task,
the bytes sent and received per step, the number to hold against the plan's.
"""
import ctypes
import os
import re
import shutil
import subprocess
import time

from towers.cluster.spec import ClusterError
from towers.errors import SettingError

PORT = 2222  # every task listens on it: each has its own namespace
_SUBNET = '10.213.%d.%d'


SCALES = {'': 1.0, 'k': 1e3, 'K': 1e3, 'M': 1e6, 'G': 1e9, 'T': 1e12}
_RATE = re.compile(r'^(\d+(?:\.\d+)?)\s*([kKMGT]?)(bit|B)(?:/s)?$')
_DELAY = re.compile(r'^(\d+(?:\.\d+)?)\s*(s|ms|us|ns)$')
_SECONDS = {'s': 1.0, 'ms': 1e-3, 'us': 1e-6, 'ns': 1e-9}


def parse_rate(text, setting='bandwidth'):
    """'25Gbit' -> bytes/s (3.125e9); '100MB' -> 1e8. One line naming the setting otherwise."""
    match = _RATE.match(str(text).strip())
    rate = SCALES[match.group(2)] * float(match.group(1)) if match else 0.0
    if not match or rate <= 0:
        raise SettingError('{%s} is a positive rate such as 25Gbit, 100Mbit or 1GB, not %%r'
                           % setting, text)
    return rate / 8 if match.group(3) == 'bit' else rate


def parse_size(text, setting, zero=False):
    """'102.2MB' -> 1.022e8 bytes, '256kB' -> 256000.0 (decimal units, as towers prints
    sizes); '0' only where zero is allowed. One line naming the setting otherwise."""
    if zero and str(text).strip() == '0':
        return 0.0
    match = re.match(r'^(\d+(?:\.\d+)?)\s*([kKMGT]?)B$', str(text).strip())
    size = SCALES[match.group(2)] * float(match.group(1)) if match else 0.0
    if size <= 0:
        raise SettingError('{%s} is a positive size such as 102.2MB or 800kB%s, not %%r'
                           % (setting, ', or 0' if zero else ''), text)
    return size


def parse_delay(text, setting='latency'):
    """'10us' -> 1e-05 seconds; '0' is no delay."""
    text = str(text).strip()
    if text == '0':
        return 0.0
    match = _DELAY.match(text)
    if not match:
        raise SettingError('{%s} is a time such as 10us, 0.5ms or 0, not %%r' % setting, text)
    return float(match.group(1)) * _SECONDS[match.group(2)]


def parse_link(text):
    """'RATE,DELAY' ('200Mbit,0', '1Gbit,1ms') -> (bytes/s, seconds)."""
    rate, _, delay = str(text).partition(',')
    return parse_rate(rate, 'emulate_link'), parse_delay(delay or '0', 'emulate_link')


def host_cores(count, cpus=None):
    """The CPUs each of count hosts runs on: a disjoint, equal share of cpus (this
    process's, by default) each, in order; None each when there are fewer CPUs than hosts."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    share = len(cpus) // count
    if not share:
        return [None] * count
    return [cpus[i * share:(i + 1) * share] for i in range(count)]


def unavailable():
    """Why links cannot be emulated here (one line), or None when they can."""
    if os.geteuid() != 0:
        return 'emulating links needs root (network namespaces and tc)'
    missing = [tool for tool in ('ip', 'tc') if shutil.which(tool) is None]
    if missing:
        return 'emulating links needs iproute2: %s not found' % ' and '.join(missing)
    probe = 'towers-probe-%d' % os.getpid()
    made = _run(['ip', 'netns', 'add', probe], check=False)
    if made.returncode:
        return 'cannot make a network namespace here: %s' % _said(made)
    _run(['ip', 'netns', 'del', probe], check=False)
    return None


def has_netem():
    """Whether this kernel has the netem qdisc (a link's delay needs it)."""
    probe = 'towers-netem-%d' % os.getpid()
    try:
        _run(['ip', 'netns', 'add', probe])
        made = _run(['ip', '-n', probe, 'link', 'add', 'probe0', 'type', 'dummy'], check=False)
        return not made.returncode and not _run(
            ['tc', '-n', probe, 'qdisc', 'add', 'dev', 'probe0', 'root', 'netem', 'delay', '1ms'],
            check=False).returncode
    finally:
        _run(['ip', 'netns', 'del', probe], check=False)


_CLONE_NEWNET = 0x40000000


class Host:
    """One emulated host: command(argv) spawns argv on it; enter() moves this process there
    (a task forked by the launcher, before it starts TensorFlow's servers): into the host's
    network namespace (setns, as `ip netns exec` does) and onto its cores."""

    def __init__(self, hosts, index):
        self._hosts, self._index = hosts, index

    def command(self, argv):
        return self._hosts.command(self._index, argv)

    def enter(self):
        fd = os.open('/run/netns/%s' % self._hosts.namespaces[self._index], os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET):
                raise OSError(ctypes.get_errno(), 'setns into %s'
                              % self._hosts.namespaces[self._index])
        finally:
            os.close(fd)
        cores = self._hosts.cores[self._index]
        if cores:
            os.sched_setaffinity(0, cores)


class EmulatedHosts:
    """count namespaces on one bridge, each link shaped to rate bytes/s after delay seconds.

    A context manager: entering makes them (removing what it made if any step
    fails), leaving removes them.
    """

    def __init__(self, count, rate, delay=0.0):
        reason = unavailable()
        if reason:
            raise ClusterError('{emulate_link}: %s' % reason)
        if delay and not has_netem():
            raise ClusterError('{emulate_link}: a DELAY needs the netem qdisc, which this '
                               'kernel does not have; give a DELAY of 0')
        self.count, self.rate, self.delay = count, rate, delay
        tag = os.getpid() % 100000
        self.bridge = 'twb%d' % tag
        self.namespaces = ['towers-%d-%d' % (tag, i) for i in range(count)]
        self._veths = ['tw%dv%d' % (tag, i) for i in range(count)]
        self.subnet = tag % 250
        self.addresses = [_SUBNET % (self.subnet, i + 1) for i in range(count)]
        self.cores = host_cores(count) if shutil.which('taskset') else [None] * count
        self._made = []

    def __enter__(self):
        try:
            self._make()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc):
        self._remove()
        return False

    def command(self, index, argv):
        """argv run inside host index's namespace, on its cores."""
        cores = self.cores[index]
        pinned = ['taskset', '-c', ','.join(map(str, cores))] if cores else []
        return ['ip', 'netns', 'exec', self.namespaces[index]] + pinned + list(argv)

    def host(self, index):
        """Host index, as a task of the launcher is placed on it (launch.Task's host)."""
        return Host(self, index)

    def cores_text(self):
        """What cores the hosts run on, for the launcher's log."""
        if self.cores[0] is None:
            return "sharing this machine's %d cores" % len(os.sched_getaffinity(0))
        return 'each on %d core(s) of its own' % len(self.cores[0])

    def counters(self):
        """[(bytes sent, bytes received)] by each host so far: its veth pair's bridge end
        receives what the host sends, and sends what it receives."""
        def read(veth, name):
            with open('/sys/class/net/%s/statistics/%s' % (veth, name)) as counter:
                return int(counter.read())
        return [(read(veth, 'rx_bytes'), read(veth, 'tx_bytes')) for veth in self._veths]

    def _make(self):
        self._do(['ip', 'link', 'add', self.bridge, 'type', 'bridge'], ('link', self.bridge))
        self._do(['ip', 'link', 'set', self.bridge, 'up'])
        for namespace, veth, address in zip(self.namespaces, self._veths, self.addresses):
            self._do(['ip', 'netns', 'add', namespace], ('netns', namespace))
            self._do(['ip', 'link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0',
                      'netns', namespace], ('link', veth))
            self._do(['ip', 'link', 'set', veth, 'master', self.bridge, 'up'])
            self._do(['ip', '-n', namespace, 'addr', 'add', address + '/24', 'dev', 'eth0'])
            self._do(['ip', '-n', namespace, 'link', 'set', 'eth0', 'up'])
            self._do(['ip', '-n', namespace, 'link', 'set', 'lo', 'up'])
            # The host's sending side, inside its namespace; its receiving side, the
            # bridge's end of its pair.
            self._do(['tc', '-n', namespace, 'qdisc', 'add', 'dev', 'eth0', 'root']
                     + self._shaping())
            self._do(['tc', 'qdisc', 'add', 'dev', veth, 'root'] + self._shaping())

    def _shaping(self):
        bits = '%dbit' % int(self.rate * 8)
        if self.delay:
            return ['netem', 'delay', '%dus' % int(self.delay * 1e6), 'rate', bits,
                    'limit', '100000']
        # A queue of half a second: TCP sees the rate without drops. A bucket of 1 ms of
        # the rate, and no less than 16 kB: a real link has no burst at all, and a bucket
        # of 1/50 s let 250 kB a step through at once on 100 Mbit, half of a small model's
        # push (a step of small_convnet in parameter-server mode measured twice as fast as
        # its bytes).
        burst = max(16384, int(self.rate / 1000))
        return ['tbf', 'rate', bits, 'burst', str(burst), 'limit', str(max(burst, int(
            self.rate / 2)))]

    def _do(self, argv, made=None):
        _run(argv)
        if made:
            self._made.append(made)

    def _remove(self):
        # Deleting a namespace removes the veth end inside it, and so the pair.
        for kind, name in reversed(self._made):
            if kind == 'netns':
                _run(['ip', 'netns', 'del', name], check=False)
        for kind, name in reversed(self._made):
            if kind == 'link':
                _run(['ip', 'link', 'del', name], check=False)
        self._made = []


class LinkMeter:
    """Each host's bytes per step, over the steps the chief logs: observe() every line of
    the job's output, lines() at its end (while the hosts are still there).

    The window runs from the chief's second logged step to its last (the first is the
    placement audit's traced step, after the set-up's own traffic), so give train a
    --log-every that logs several.

    Args:
      hosts: the EmulatedHosts.
      names: each host's task, 'worker 0', 'ps 0', in host order.
    """

    CHIEF_STEP = re.compile(r'^\[worker 0\] step (\d+)/')

    def __init__(self, hosts, names, clock=time.monotonic):
        self.hosts, self.names, self.clock, self.marks = hosts, list(names), clock, []

    def observe(self, line):
        match = self.CHIEF_STEP.match(line)
        if match:
            self.marks.append((int(match.group(1)), self.clock(), self.hosts.counters()))

    def per_step(self):
        """(first step, last step, seconds a step, [(sent, received) a step per host]), or
        None when the chief logged fewer than three steps."""
        if len(self.marks) < 3:
            return None
        (first, start, before), (last, end, after) = self.marks[1], self.marks[-1]
        steps = last - first
        return first, last, (end - start) / steps, [
            ((s1 - s0) / steps, (r1 - r0) / steps)
            for (s0, r0), (s1, r1) in zip(before, after)]

    def lines(self):
        """The launcher's report: one line for the window, one per task."""
        window = self.per_step()
        if window is None:
            return ['towers launch: no link use per step: the chief logged %d step(s); give '
                    'train a --log-every that logs three or more' % len(self.marks)]
        first, last, seconds, hosts = window
        lines = ['towers launch: link use per step over the chief\'s steps %d-%d '
                 '(%.4f s a step):' % (first, last, seconds)]
        for name, (sent, received) in zip(self.names, hosts):
            lines.append('towers launch:   %s sent %d bytes, received %d bytes' % (
                name, round(sent), round(received)))
        return lines


def _run(argv, check=True):
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode:
        raise ClusterError('{emulate_link}: `%s` failed: %s' % (' '.join(argv), _said(result)))
    return result


def _said(result):
    return (result.stderr.strip() or result.stdout.strip() or 'status %d'
            % result.returncode).splitlines()[0]
