"""How fast a device computes in bf16 or fp16 against float32: measured, never inferred.

CPU flags do not say it. On an Intel Xeon with `avx512_fp16` TensorFlow's CPU
kernels ran mnist_convnet 0.003x as fast in float16 as in float32; on an AMD
EPYC with `avx512_bf16` bfloat16 is barely faster. So every claim towers makes
about a precision's speed (bench's header, `towers devices`, train's warning,
the tests that skip a slow run) comes from this probe: the model's own kind of
work, timed here and now in float32 and in the precision, on the towers' device.

The work is mnist_convnet's second convolution (5x5, 32 -> 64 channels on 14x14
maps, NHWC), forward and both gradients, and a matmul; as in a tower, float32
variables are cast to the precision on read. Each is run once to warm up (oneDNN
picks and compiles its kernels then), then float32 and the precision run in
turns, best of at most MAX_RUNS or until each has used BUDGET seconds, so drift
hits both alike. Where the precision's warm-up alone took longer than a fifth
of a second, that run is its time: it is not run again (at 0.003x float32 the conv alone
runs for most of a second). The result is cached per process.
"""
import dataclasses
import functools
import time

import tensorflow as tf

from towers.devices import parse_device
from towers.errors import op_error_summary
from towers.quiet import native_stderr_silenced

tf1 = tf.compat.v1

BUDGET = 0.05  # seconds of timed runs per kind and precision
MAX_RUNS = 20
_SLOW_RUN = 0.2  # a warm-up longer than this is the kind's time: it is not run again
_DTYPES = {'fp32': tf.float32, 'bf16': tf.bfloat16, 'fp16': tf.float16}
# Per device kind: (conv input [N, H, W, C], conv filter [h, w, in, out], matmul m, k, n).
# A GPU gets a larger batch so that the kernels, not the session's overhead, are timed.
_SHAPES = {'cpu': ([8, 14, 14, 32], [5, 5, 32, 64], (256, 512, 256)),
           'gpu': ([256, 14, 14, 32], [5, 5, 32, 64], (2048, 2048, 2048))}


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


def measure(name, device='/cpu:0'):
    """The Speed of precision `name` on `device`, timed once per process.

    Args:
      name: 'bf16' or 'fp16'.
      device: a tower device ('/cpu:3' times the CPU, as '/cpu:0' does).
    Returns:
      Speed; its error says why where the precision has no kernel on the device.
    """
    if name not in ('bf16', 'fp16'):
        raise ValueError('the probe times bf16 or fp16 against fp32, not %r' % name)
    return _measure(name, probe_device(device))


@functools.lru_cache(maxsize=None)
def _measure(name, device):
    graph, init, fetches = _probe_graph(name, device)
    config = tf1.ConfigProto(allow_soft_placement=False)
    # GPU options are the process's: the probe must not take every GPU's memory.
    config.gpu_options.allow_growth = True
    # TensorFlow logs an error line where oneDNN has no float16 kernel: what the probe
    # measures, and says better.
    with native_stderr_silenced(), tf1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        try:
            seconds = {(kind, precision): best
                       for kind, pair in fetches.items()
                       for precision, best in zip(('fp32', name), _time_in_turns(sess, pair))}
        except tf.errors.OpError as e:
            return Speed(name, device, error=op_error_summary(e))
    conv = seconds['conv', 'fp32'] / seconds['conv', name]
    matmul = seconds['matmul', 'fp32'] / seconds['matmul', name]
    total = {p: seconds['conv', p] + seconds['matmul', p] for p in ('fp32', name)}
    return Speed(name, device, conv, matmul, total['fp32'] / total[name], seconds)


def _probe_graph(name, device):
    """(graph, its init op, {kind: [float32's fetch, the precision's]}) on one device."""
    conv_input, conv_filter, (m, k, n) = _SHAPES[device[1:4]]
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        uniform = tf1.random_uniform_initializer(-1.0, 1.0, seed=0)
        # Variables, not constants: grappler folds constants away before they are timed.
        images, weights, left, right = (
            tf1.get_variable(v, shape, initializer=uniform) for v, shape in (
                ('images', conv_input), ('weights', conv_filter), ('left', [m, k]),
                ('right', [k, n])))
        fetches = {'conv': [], 'matmul': []}
        for precision in ('fp32', name):
            dtype = _DTYPES[precision]
            x, w = tf.cast(images, dtype), tf.cast(weights, dtype)
            maps = tf.nn.conv2d(x, w, 1, 'SAME')
            grad_x, grad_w = tf.gradients(maps, [x, w])
            # Every result read: grappler prunes an op whose value nothing fetches (the
            # backward convs need only the forward's shape).
            fetches['conv'].append(_sum(maps) + _sum(grad_x) + _sum(grad_w))
            fetches['matmul'].append(_sum(tf.matmul(tf.cast(left, dtype),
                                                    tf.cast(right, dtype))))
        init = tf1.global_variables_initializer()
    return graph, init, fetches


def _sum(tensor):
    return tf.reduce_sum(tf.cast(tensor, tf.float32))


def _time_in_turns(sess, fetches):
    """[best seconds of one run] of float32's fetch and the precision's, in turns.

    Each runs once to warm up. The precision's fetch, where its warm-up took
    longer than _SLOW_RUN, is not run again: its warm-up is its time (a second
    run would cost as much, and the few milliseconds of set-up in the first
    make a very slow kind at most a little slower). float32's is always timed.
    """
    warm_ups = [_seconds(sess, fetch) for fetch in fetches]
    runs = {i: [] for i, seconds in enumerate(warm_ups) if i == 0 or seconds <= _SLOW_RUN}
    for _ in range(MAX_RUNS):
        if min(sum(seconds) for seconds in runs.values()) >= BUDGET:
            break
        for i, seconds in runs.items():
            seconds.append(_seconds(sess, fetches[i]))
    return [min(runs[i]) if i in runs else warm for i, warm in enumerate(warm_ups)]


def _seconds(sess, fetch):
    start = time.perf_counter()
    sess.run(fetch)
    return time.perf_counter() - start
