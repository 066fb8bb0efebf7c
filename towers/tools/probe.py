"""How fast a device computes in bf16 or fp16 against float32: measured, never inferred.

CPU flags do not say it. On an Intel Xeon with `avx512_fp16` TensorFlow's CPU
kernels ran mnist_convnet 0.003x as fast in float16 as in float32; on an AMD
EPYC with `avx512_bf16` bfloat16 is barely faster. So every claim towers makes
about a precision's speed (bench's header, `towers devices`, train's warning,
the tests that skip a slow run) comes from this probe: the model's own kind of
work, timed here and now in float32 and in the precision, on the towers' device.

The work is mnist_convnet's second convolution (5x5, 32 -> 64 channels on 14x14
maps, NHWC), forward and both gradients, and a matmul; as in a tower, float32
variables are cast to the precision on read. A GPU gets more of it per run: a
Session.run costs 0.1-0.2 ms whatever it runs, and the 15 GFLOP of convolution and
17 of matmul a GPU once got take 50-80 microseconds on an H100, so bf16 read ~1.0x
float32 there whatever its tensor cores did. A GPU's run is ~2 TFLOP of each kind
(4-16 ms on an H100, the overhead under 5%; a few hundred MB): the convolution at
batch 512 on 28x28 maps 16 times over, each time with its filter scaled otherwise
(no two are one computation to grappler) and after the last one's sum (one holds
memory at a time); and a chain of 16 matmuls of 4096x4096, each product the next
one's input (the right matrix's spread keeps the values', so float16 never
overflows). A small GPU runs it for longer than _SLOW_RUN: it is timed once, warm.
Each kind is run WARM_UPS times untimed first: a first run is set-up, not speed
(oneDNN creates its primitives; on a GPU cuDNN autotunes and, where TensorFlow has
no binary for the GPU's architecture, as 2.21 has none for an H100's sm_90, every
kernel is JIT-compiled from PTX on its first launch: an H100 once measured bf16 at
0.00072x float32 from its first run). Then float32 and the precision run in turns,
best of at most MAX_RUNS or until each has used BUDGET seconds, so drift hits both
alike. Each run fetches a float32 scalar that sums every result to the host, so a
run ends when the device's work does, not when its kernels are queued. A precision
whose warm run takes longer than a fifth of a second is not run again: that run is
its time (at 0.003x float32 the conv alone runs for most of a second). The result is
cached per process.
"""
import collections
import dataclasses
import functools
import math
import time

import tensorflow as tf

from towers.devices import parse_device
from towers.errors import op_error_summary
from towers.quiet import native_stderr_silenced

tf1 = tf.compat.v1

BUDGET = 0.05  # seconds of timed runs per kind and precision
MAX_RUNS = 20
# Untimed runs of each fetch before any is timed. The first autotunes and compiles; the
# second makes sure that what the first's set-up left behind (memory that allow_growth
# had to grow, caches) is not timed either. On a CPU a run takes milliseconds.
WARM_UPS = 2
_SLOW_RUN = 0.2  # a warm run longer than this is the kind's time: it is not run again
_DTYPES = {'fp32': tf.float32, 'bf16': tf.bfloat16, 'fp16': tf.float16}
# Per device kind, the work of one run: conv input [N, H, W, C], conv filter [h, w, in, out],
# the conv's repeats, matmul (m, k, n) and its links (a chain needs k == n), and whether results
# are summed in their own type (_sum). A GPU's is ~2 TFLOP of each kind, so that the kernels,
# not the Session's overhead, are timed (the docstring); a CPU's is as the tests that skip a
# slow precision's run were measured against.
_Work = collections.namedtuple('_Work', 'conv_input conv_filter repeats matmul links in_type')
_SHAPES = {'cpu': _Work([8, 14, 14, 32], [5, 5, 32, 64], 1, (256, 512, 256), 1, False),
           'gpu': _Work([512, 28, 28, 32], [5, 5, 32, 64], 16, (4096, 4096, 4096), 16, True)}


@dataclasses.dataclass(frozen=True)
class Speed:
    """A precision's speed on one device, as float32's time over its own.

    Attributes:
      name: 'bf16' or 'fp16'.
      device: where it was timed, e.g. '/cpu:0' or '/gpu:1'.
      conv, matmul: each kind of work alone (2.0: twice float32's speed).
      ratio: both together, float32's total time over the precision's.
      seconds: {(kind, name): best seconds of one run}, float32's too.
      error: why the precision could not run there (then the ratios are None).
    """
    name: str
    device: str
    conv: float = None
    matmul: float = None
    ratio: float = None
    seconds: dict = dataclasses.field(default_factory=dict)
    error: str = None

    def text(self):
        """'0.14x float32 measured (conv 0.11x, matmul 0.92x)'."""
        if self.error:
            return 'could not run on %s: %s' % (self.device, self.error)
        return '%s float32 measured (conv %s, matmul %s)' % (
            times(self.ratio), times(self.conv), times(self.matmul))


def times(ratio):
    """A speed ratio as people read it: 2.10x, 0.92x, 0.0031x."""
    return ('%.2fx' if ratio >= 0.1 else '%.2gx') % ratio


def probe_device(device):
    """The device a probe of `device` times: any virtual CPU is the one CPU, '/cpu:0'."""
    kind, index = parse_device(device)
    return '/cpu:0' if kind == 'cpu' else '/gpu:%d' % index


def measure(name, device='/cpu:0', per_gpu=1):
    """The Speed of precision `name` on `device`, timed once per process.

    Args:
      name: 'bf16' or 'fp16'.
      device: a tower device ('/cpu:3' times the CPU, as '/cpu:0' does).
      per_gpu: the logical GPUs per GPU of the run the probe is for
        (towers/devices.py gpu_split): TensorFlow fixes a process's logical GPUs
        at its first Session, which may be the probe's.
    Returns:
      Speed; its error says why where the precision has no kernel on the device.
    """
    if name not in ('bf16', 'fp16'):
        raise ValueError('the probe times bf16 or fp16 against fp32, not %r' % name)
    return _measure(name, probe_device(device), per_gpu)


@functools.lru_cache(maxsize=None)
def _measure(name, device, per_gpu=1):
    graph, init, fetches = _probe_graph(name, device)
    config = tf1.ConfigProto(allow_soft_placement=False)
    # GPU options are the process's: the probe must not take every GPU's memory.
    config.gpu_options.allow_growth = True
    if per_gpu > 1:
        config.gpu_options.experimental.num_virtual_devices_per_gpu = per_gpu
    # TensorFlow logs an error line where oneDNN has no float16 kernel: what the probe
    # measures, and says better.
    with native_stderr_silenced(), tf1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        try:
            # One callable per fetch, used for its warm-ups and its timed runs alike: the
            # same Session and the same fetch, so every kernel and algorithm the timed runs
            # use was chosen and compiled before them.
            seconds = {(kind, precision): best
                       for kind, pair in fetches.items()
                       for precision, best in zip(
                           ('fp32', name),
                           _time_in_turns([functools.partial(sess.run, f) for f in pair]))}
        except tf.errors.OpError as e:
            return Speed(name, device, error=op_error_summary(e))
    conv = seconds['conv', 'fp32'] / seconds['conv', name]
    matmul = seconds['matmul', 'fp32'] / seconds['matmul', name]
    total = {p: seconds['conv', p] + seconds['matmul', p] for p in ('fp32', name)}
    return Speed(name, device, conv, matmul, total['fp32'] / total[name], seconds)


def _probe_graph(name, device):
    """(graph, its init op, {kind: [float32's fetch, the precision's]}) on one device.

    Each fetch is a float32 scalar, the sum of every result of its kind's work:
    small to copy, and a Session.run that returns it has waited for all of it.
    """
    work = _SHAPES[device[1:4]]
    m, k, n = work.matmul
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        uniform = tf1.random_uniform_initializer(-1.0, 1.0, seed=0)
        # Variables, not constants: grappler folds constants away before they are timed.
        images, weights, left = (
            tf1.get_variable(v, shape, initializer=uniform) for v, shape in (
                ('images', work.conv_input), ('weights', work.conv_filter), ('left', [m, k])))
        # A chain's right matrix has spread sqrt(3 / k): each product keeps the left's spread.
        spread = math.sqrt(3.0 / k) if work.links > 1 else 1.0
        right = tf1.get_variable('right', [k, n], initializer=tf1.random_uniform_initializer(
            -spread, spread, seed=1))
        fetches = {'conv': [], 'matmul': []}
        for precision in ('fp32', name):
            dtype = _DTYPES[precision]
            fetches['conv'].append(_conv_work(tf.cast(images, dtype), tf.cast(weights, dtype),
                                              work.repeats, work.in_type))
            product, factor = tf.cast(left, dtype), tf.cast(right, dtype)  # cast once a run
            for _ in range(work.links):
                product = tf.matmul(product, factor)
            fetches['matmul'].append(_sum(product, work.in_type))
        init = tf1.global_variables_initializer()
    return graph, init, fetches


def _conv_work(x, w, repeats, in_type=False):
    """The float32 sum of a conv's maps and both its gradients, `repeats` times over.

    Every result read: grappler prunes an op whose value nothing fetches (the backward
    convs need only the forward's shape). Repeat r's filter is w / (1 + r), a computation
    of its own, and starts after repeat r - 1's sum: one repeat's maps in memory at a time.
    """
    total = None
    for r in range(repeats):
        with tf.control_dependencies([total] if r else []):
            filters = w / (1.0 + r) if r else w
        maps = tf.nn.conv2d(x, filters, 1, 'SAME')
        grad_x, grad_w = tf.gradients(maps, [x, filters])
        part = _sum(maps, in_type) + _sum(grad_x, in_type) + _sum(grad_w, in_type)
        total = part if total is None else total + part
    return total


def _sum(tensor, in_type=False):
    """A result's sum as a float32 scalar. in_type: summed in the result's own type, a half
    precision's map read at half the bytes as the next layer reads it (its value, inf where
    float16 overflows, is unused); else cast to float32 first, which on a GPU would time a pass
    over a float32 copy of every half-precision map (~20% of a repeat's time in bf16)."""
    return tf.cast(tf.reduce_sum(tensor), tf.float32) if in_type else tf.reduce_sum(
        tf.cast(tensor, tf.float32))


def _time_in_turns(runs):
    """[best seconds of one run] of each of `runs` (float32's, the precision's), in turns.

    Args:
      runs: callables of no arguments, each one run of one fetch to the host.

    Each is first run WARM_UPS times, untimed, so that no first run's set-up
    (autotuning, JIT compiles) is ever a precision's time. The best of the
    timed runs is the time, not their median: the result is fetched, so no run
    ends before the work does, and what else differs between runs (another
    process on the cores, the clock ramping up) only adds time. A callable
    whose timed run took longer than _SLOW_RUN is not run again: that run is
    its time (a second would cost as much, to say the same).
    """
    for run in runs:
        for _ in range(WARM_UPS):
            run()
    timed = [[] for _ in runs]
    for _ in range(MAX_RUNS):
        if all(sum(seconds) >= BUDGET for seconds in timed):
            break
        for run, seconds in zip(runs, timed):
            if not seconds or seconds[-1] <= _SLOW_RUN:
                seconds.append(_seconds(run))
    return [min(seconds) for seconds in timed]


def _seconds(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start
