"""`towers check`: N towers train exactly as one device does — measured, not claimed.

The property that makes synchronous data parallelism "the same training,
faster": with each tower's gradient weighted by its share of the batch, the
averaged gradient of N towers is the one-device gradient of the whole batch,
and so are the variables after any number of steps. This builds both graphs
with the teaching layer (split_batch, the towers, average_gradients, one
apply_gradients), gives them the same initial weights and the same batches,
and reports the largest differences.

With a --precision bf16 or fp16, the N towers compute in that type (over float32
variables, towers/precision.py) and the one device stays float32: the check
then measures what the precision costs, against a tolerance that fits its
mantissa instead of float32's.
"""
import collections
import functools

import numpy as np
import tensorflow as tf

from towers.deviceplan import local_plan
from towers.devices import process_split, resolve_devices
from towers.errors import SettingError, TowersError
from towers.gradients import average_gradients, tower_update_ops
from towers.inputs import FeedInput
from towers.precision import Precision, check_kernels
from towers.session import load_variables, open_session, run_steps
from towers.slicing import share_of
from towers.tools import stepgraph, yours
from towers.tower import build_towers_from_slices, tower_loss

tf1 = tf.compat.v1

CheckResult = collections.namedtuple(
    'CheckResult', ['gradient_diff', 'gradient_var', 'variable_diff', 'variable_var', 'scale',
                    'gradient_scale', 'graphs', 'diagnosis'], defaults=(None, None))
CheckResult.__doc__ = """Largest absolute differences between N towers and one device.

  gradient_diff, gradient_var: over the first batch's averaged gradients, and
    the variable it is the gradient of.
  variable_diff, variable_var: over the variables after all steps.
  scale: the largest absolute variable value, to read variable_diff against.
  gradient_scale: the largest absolute gradient value, to read gradient_diff against.
  graphs: (one device's, N towers') StepGraph of the first batch's gradients:
    what TensorFlow fused (a fused kernel rounds as it rounds, in both runs).
  diagnosis: with an average of the caller's own, (variable, what the average did) for the
    first variable whose gradient is off (towers/tools/yours.py), or None.
"""


class _Run:
    """One graph: towers over the devices, the average, one SGD apply."""

    def __init__(self, model_fn, input_shape, devices, learning_rate, average, sync_bn, batches,
                 precision=None, per_gpu=1, label_smoothing=0.0, accumulate=1, split=None):
        self.graph, self.plan = tf.Graph(), local_plan(devices, per_gpu=per_gpu)
        self.source = FeedInput(batches=lambda step: batches[step])
        if split is not None:  # the caller's cut (towers check --split)
            self.source.split = split
        precision = Precision.of(precision)
        with self.graph.as_default():
            tf1.set_random_seed(0)
            opt = tf1.train.GradientDescentOptimizer(learning_rate)
            loss_scale = precision.build_loss_scale()
            if loss_scale is not None:
                opt = loss_scale.optimizer(opt)
            towers = build_towers_from_slices(
                functools.partial(tower_loss, model_fn, label_smoothing=label_smoothing),
                self.source.build(input_shape, devices), self.plan, optimizer=opt,
                sync_bn=sync_bn, precision=precision, accumulate=accumulate)
            grads = average([t.grads_and_vars for t in towers], [t.weight for t in towers])
            self.grads = {v.op.name: g for g, v in grads if g is not None}
            # Each tower's own and its count, to tell what an average of the caller's did.
            self.towers = None if average is average_gradients else (
                {v.op.name: [tf.convert_to_tensor(t.grads_and_vars[k][0]) for t in towers]
                 for k, (_, v) in enumerate(towers[0].grads_and_vars)
                 if all(t.grads_and_vars[k][0] is not None for t in towers)},
                [t.count for t in towers])
            self.train_op = tf.group(opt.apply_gradients(grads), *tower_update_ops(towers[0]))
            check_kernels(self.graph, precision)
            self.variables = {v.op.name: v for v in tf1.global_variables()
                              if not v.op.name.startswith('loss_scale/')}
            self.has_batch_norm = bool(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
            self.init_op, self.sync_op = tf1.global_variables_initializer(), tf.no_op()

    def open(self, initial=None):
        """A Session with the variables initialised, then set to `initial` if given."""
        load = (lambda sess: load_variables(sess, self.variables, initial)) if initial else None
        return open_session(self, self.plan.config, load=load)


def check_towers(model_fn, input_shape, num_towers, batches, learning_rate=0.01,
                 average=average_gradients, sync_bn=False, precision=None, devices=None,
                 label_smoothing=0.0, accumulate=1, tolerance=None, split=None):
    """Train one device and num_towers virtual devices (or GPUs) on the same batches.

    Args:
      model_fn: callable(images, training) -> logits.
      input_shape: (H, W, C).
      num_towers: N; the towers are /cpu:0..N-1 without GPUs, else /gpu:0..N-1 (logical
        GPUs where there are fewer GPUs, the one device among them).
      batches: [(images [B, H, W, C] float32, labels [B] int64)], the same for both.
      average: the gradient combiner under test (tower_grads, weights) ->
        grads_and_vars; average_gradients unless a test breaks it on purpose.
      sync_bn: pool batch-norm moments over the towers (else a model with batch
        norm differs from one device by design).
      precision: what the N towers compute in (a towers.precision.Precision or
        its name); the one device computes in float32.
      devices: the towers' kind, 'cpu' or 'gpu'; None: GPUs where there are any.
      label_smoothing: both runs' loss smooths its targets so (towers/tower.py tower_loss).
      accumulate: K, each tower's slice in K micro-batches one after another (--accumulate),
        against one device on the whole batch at once; with sync_bn, against one device
        accumulating the same K micro-batches (the N towers' k-th together, in_micro_order),
        whose batch-norm statistics are the same.
      tolerance: with an average other than average_gradients, the relative gradient
        difference past which its diagnosis looks (None: float32's, TOLERANCES).
      split: the towers' cut of each batch in place of split_batch (yours.as_split).
    Returns:
      (CheckResult, has_batch_norm).
    """
    per_gpu = process_split([num_towers], devices)  # both runs in one process's split
    pooled = sync_bn and accumulate > 1
    one = _Run(model_fn, input_shape, resolve_devices(1, devices, per_gpu=per_gpu),
               learning_rate, average_gradients, False,
               [in_micro_order(b, num_towers, accumulate) for b in batches] if pooled
               else batches, per_gpu=per_gpu, label_smoothing=label_smoothing,
               accumulate=accumulate if pooled else 1)
    many = _Run(model_fn, input_shape, resolve_devices(num_towers, devices, per_gpu=per_gpu),
                learning_rate, average, sync_bn, batches, precision, per_gpu, label_smoothing,
                accumulate, split)
    with one.open() as one_sess:
        # The same starting point: the one-device graph's initial weights, copied.
        with many.open(initial=one_sess.run(one.variables)) as many_sess:
            grads, graphs = zip(*(stepgraph.of_run(sess, run.grads, run.source.step(0)[1])
                                  for run, sess in ((one, one_sess), (many, many_sess))))
            # (Only for an average of the caller's: the first batch's towers once more.)
            towers = (many_sess.run(many.towers, many.source.step(0)[1])
                      if many.towers is not None else None)
            after = []
            for run, sess in ((one, one_sess), (many, many_sess)):
                with run_steps(sess, run.source, {'train': run.train_op}, 0,
                               len(batches)) as steps:
                    for _ in steps:
                        pass
                after.append(sess.run(run.variables))
    gradient_var, gradient_diff = _largest(*grads)
    variable_var, variable_diff = _largest(*after)
    scale = max(float(np.max(np.abs(v))) for v in after[0].values())
    gradient_scale = max(float(np.max(np.abs(g))) for g in grads[0].values())
    diagnosis = None if towers is None else yours.diagnose(
        towers[0], [int(c) for c in towers[1]], grads[1], grads[0],
        tolerance or TOLERANCES['fp32'])
    return (CheckResult(gradient_diff, gradient_var, variable_diff, variable_var, scale,
                        gradient_scale, graphs, diagnosis),
            one.has_batch_norm)


def in_micro_order(batch, num_towers, accumulate):
    """(images, labels) reordered so that one device's K micro-batches are the N towers'
    k-th micro-batches together, tower by tower (--accumulate with --sync-bn).

    SettingError where they cannot be: one device cuts its batch into K as equal parts,
    which the towers' k-th micro-batches make up only where their sizes add up so.
    """
    images, labels = batch
    order, sizes = [[] for _ in range(accumulate)], []
    for i in range(num_towers):
        start, count = share_of(len(labels), num_towers, i)
        for k in range(accumulate):
            begin, size = share_of(count, accumulate, k)
            order[k].extend(range(start + begin, start + begin + size))
    sizes = [len(part) for part in order]
    if sizes != [share_of(len(labels), accumulate, k)[1] for k in range(accumulate)]:
        raise SettingError(
            'check {accumulate} %d with {sync_bn} compares with one device accumulating the same '
            'micro-batches, but the %d towers\' k-th micro-batches of a batch of %d hold %s '
            'examples where one device cuts %s: take a {batch_size} that %d divides', accumulate,
            num_towers, len(labels), '/'.join(map(str, sizes)),
            '/'.join(str(share_of(len(labels), accumulate, k)[1]) for k in range(accumulate)),
            num_towers * accumulate)
    order = [index for part in order for index in part]
    return images[order], labels[order]


def _largest(expected, actual):
    """(name, largest |expected - actual|) over same-named arrays."""
    worst = max(expected, key=lambda n: float(np.max(np.abs(expected[n] - actual[n]))))
    return worst, float(np.max(np.abs(expected[worst] - actual[worst])))


# The default tolerance per precision: float32 rounding, or 32 roundings of the
# compute type's mantissa (bfloat16 8 bits, float16 11: 2**-8 and 2**-11 each),
# since the N towers then compute in it while the one device stays float32.
TOLERANCES = {'fp32': 1e-5, 'bf16': 32 * 2.0 ** -8, 'fp16': 32 * 2.0 ** -11}
CHECK_LOSS_SCALE = 1024.0  # fp16's fixed scale here: a dynamic one would skip steps


def default_tolerance(precision):
    """check's tolerance for a precision name, and the words that say why."""
    if precision == 'fp32':
        return TOLERANCES['fp32'], 'float32 rounding'
    dtype = Precision(precision).dtype.name
    return TOLERANCES[precision], '32 %s roundings: the towers compute in %s, the device in ' \
        'float32' % (dtype, dtype)


def check_settings(num_towers, batch_size, steps, tolerance, accumulate=1):
    """SettingError unless check can run: at least one tower, batch, step and micro-batch; a
    tolerance."""
    if num_towers < 1 or batch_size < 1 or steps < 1 or accumulate < 1 or not tolerance > 0:
        raise SettingError('check needs {towers}, {batch_size}, {steps} and {accumulate} of at '
                           'least 1 and a positive {tolerance}')


def run_check(model_name, model_fn, dataset_name, train_set, num_towers, batch_size, steps,
              learning_rate, tolerance=None, sync_bn=False, dropout_off=False, log=print,
              precision='fp32', loss_scale=None, devices=None, label_smoothing=0.0,
              accumulate=1, average=None, average_name=None, split=None, split_name=None):
    """`towers check`: log the differences; TowersError beyond the tolerance.

    Args:
      train_set: the DataSet whose first steps * batch_size examples are the batches.
      tolerance: the largest difference allowed, relative to the size of what
        is compared (at least 1): float32 rounding grows with the magnitude;
        None: the precision's (TOLERANCES).
      precision, loss_scale: what the N towers compute in ('fp32', 'bf16',
        'fp16'); fp16's loss scale is fixed, CHECK_LOSS_SCALE unless given.
      devices: the towers' kind, 'cpu' or 'gpu'; None: GPUs where there are any.
      label_smoothing: the loss's (train's --label-smoothing), in both runs.
      accumulate: K micro-batches per tower, one after another (train's --accumulate).
      average: an average of the caller's own in place of average_gradients, (tower_grads,
        weights) -> [(grad, var)] (towers/tools/yours.py as_average); where it differs, the
        error names the first variable off and what the average did.
      average_name: how the lines call it (its MODULE:FUNCTION).
      split, split_name: a cut of the caller's own in place of split_batch, (images, labels,
        num_towers) -> TowerSlices, held first to what a cut must do (yours.as_split); its
        MODULE:FUNCTION.
    """
    why = 'given'
    if tolerance is None:
        tolerance, why = default_tolerance(precision)
    if precision == 'fp16' and loss_scale in (None, 'dynamic'):
        loss_scale = CHECK_LOSS_SCALE
    precision = Precision(precision, loss_scale)
    check_settings(num_towers, batch_size, steps, tolerance, accumulate)
    if batch_size * steps > train_set.num_examples:
        raise SettingError('check takes {steps} batches of {batch_size} distinct examples: '
                           '%d x %d is more than the %d of %s', steps, batch_size,
                           train_set.num_examples, dataset_name)
    batches = [(train_set.images[i:i + batch_size], train_set.labels[i:i + batch_size])
               for i in range(0, batch_size * steps, batch_size)]
    tower_devices = resolve_devices(num_towers, devices,
                                    per_gpu=process_split([num_towers], devices))
    # Python ints, cut as split_sizes cuts: an eager op here would make TensorFlow's devices
    # (a GPU unsplit, all its memory) before the Sessions' split (towers/devices.py).
    shares = [share_of(batch_size, num_towers, i)[1] for i in range(num_towers)]
    log('check: %s on %d tower(s) %s%s%s against 1 device%s%s, global batch %d (%s), '
        '%d SGD steps%s%s'
        % (model_name, num_towers, ','.join(tower_devices),
           ' in %s' % precision.name if precision.mixed else '',
           ' x %d micro-batches each' % accumulate if accumulate > 1 else '',
           ' in fp32' if precision.mixed else '',
           ' accumulating the same %d micro-batches' % accumulate
           if accumulate > 1 and sync_bn else '', batch_size, '/'.join(map(str, shares)),
           steps, ', dropout off' if dropout_off else '',
           ', label smoothing %g' % label_smoothing if label_smoothing else ''))
    if precision.scaling:
        log('fp16 loss scale: fixed %g' % precision.scaling[1])
    if split is not None:
        split = yours.as_split(split, num_towers, batch_size)
        log(yours.cut_line(split_name, num_towers))
    if average is not None:
        log(yours.average_line(average_name, batch_size, shares))
    result, has_batch_norm = check_towers(model_fn, train_set.images.shape[1:], num_towers,
                                          batches, learning_rate, sync_bn=sync_bn,
                                          precision=precision, devices=devices,
                                          label_smoothing=label_smoothing,
                                          accumulate=accumulate,
                                          average=average or average_gradients,
                                          tolerance=tolerance, split=split)
    for run, graph in zip(('1 device', '%d towers' % num_towers), result.graphs):
        log('fused by TensorFlow in the %s run: %s' % (run, graph.fusion_text() or 'nothing'))
    if any(graph.fusions for graph in result.graphs):
        log("(a fused kernel rounds as TensorFlow's own does: the differences below include it)")
    log('largest gradient difference: %.3g (%s); gradients reach %.3g'
        % (result.gradient_diff, result.gradient_var, result.gradient_scale))
    log('largest variable difference after %d steps: %.3g (%s); variables reach %.3g'
        % (steps, result.variable_diff, result.variable_var, result.scale))
    relative = max(result.gradient_diff / max(1.0, result.gradient_scale),
                   result.variable_diff / max(1.0, result.scale))
    if relative > tolerance:
        hint = ('; the model has batch norm: add {sync_bn}' if has_batch_norm and not sync_bn
                else '')
        if result.diagnosis is not None:
            hint = '; the first gradient off is %s\'s: %s is %s' % (
                result.diagnosis[0], average_name, result.diagnosis[1])
        raise TowersError('%d towers differ from one device by %.3g (relative), more than the '
                          'tolerance %.3g (%s)%s' % (num_towers, relative, tolerance, why, hint))
    log('within tolerance %.3g (%s; largest relative difference %.3g): %d towers train the '
        'same model as one device%s%s' % (tolerance, why, relative, num_towers,
                                          ' does in fp32' if precision.mixed else '',
                                          ''.join(', %s by %s' % (how, name) for how, name in
                                                  (('cut', split_name), ('averaged',
                                                                         average_name))
                                                  if name)))
    return result
