"""`towers bench --compare`: towers against what a user would otherwise pick.

On one model, one global batch and the same devices (virtual CPUs here, GPUs
where there are some), at each tower count:

  towers <update>/<input>   each --variable-update with each --input asked for
  towers ... +xla           with --xla: the first of those again, XLA-clustered, in
                            each precision (on CPU towers that needs
                            TF_XLA_FLAGS=--tf_xla_cpu_global_jit before TensorFlow
                            looks at its devices, which `towers bench --xla` sets)
  textbook                  the classic CIFAR-10 multi-GPU tutorial's loop:
                            feed_dict, tf.split, variables on /cpu:0, the
                            expand_dims/concat/reduce_mean average, one apply
  plain graph               a careful hand-written TF1 graph of the same net
                            (plain.py: tf.data of ready batches, tf.nn layers,
                            add_n average on the variables' device, mixed
                            precision by casting), in each precision
  keras mirrored            tf.distribute.MirroredStrategy with Keras
                            model.fit on the same net (tf.data input)

With --precision, every towers row runs in each precision ('towers
parameter_server/synthetic bf16'), and each mixed precision gets its own plain
and Keras rows (Keras under the matching policy: 'keras mirrored
mixed_bfloat16'), so that towers in bf16 is held against its peers in bf16; a
row's "vs best" is to towers' best in its own precision. The textbook row
stays float32, as printed.

The peers are in peers.py and plain.py. Every row is timed in turns with the
others (bench.measure_interleaved), and given as a ratio to towers' best at
that tower count, and as training GFLOP/s: the model's FLOPs per image,
counted by TensorFlow's profiler on the real graph, times images/sec, and as
a share of the conv rate the same devices reach in the row's precision
(rates.py, measured after the rows): how close the training gets to what the
hardware gives TensorFlow. Last, what TensorFlow ran for one step of each
row: its fusions and casts (stepgraph.py), so that a broken fusion shows.
"""
import functools

import tensorflow as tf

from towers.data.sampler import EpochSampler
from towers.deviceplan import local_plan
from towers.devices import parse_device, process_split, resolve_devices, session_config
from towers.inputs import make_input
from towers.logicalgpus import session_gpu_memory
from towers.precision import DTYPES
from towers.tools import peers, plain, rates
from towers.tools.bench import check_window, measure_interleaved, precisions_of
from towers.tools.hardware import precision_support
from towers.tools.trace import pyplot_for, save_png

tf1 = tf.compat.v1


def training_flops_per_image(model_fn, input_shape, num_classes, batch=8):
    """FLOPs of one training step per image: forward, loss and the weights' gradients.

    Counted by TensorFlow's profiler on the ops a step runs (the subgraph the
    gradients need: no initializers, no gradient for the input images).
    """
    graph = tf.Graph()
    with graph.as_default():
        images = tf.zeros([batch] + list(input_shape))
        labels = tf.zeros([batch], tf.int64)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=model_fn(images, True)))
        grads = tf.gradients(loss, tf1.trainable_variables())
    step = tf1.graph_util.extract_sub_graph(graph.as_graph_def(),
                                            [g.op.name for g in grads if g is not None])
    with tf.Graph().as_default() as pruned:
        tf1.import_graph_def(step, name='')
        options = tf1.profiler.ProfileOptionBuilder.float_operation()
        options['output'] = 'none'
        profile = tf1.profiler.profile(pruned, options=options)
    return profile.total_float_ops / batch


def run_compare(model_name, model_fn, input_shape, num_classes, tower_counts, batch_size,
                dataset, modes=('synthetic',), variable_updates=('parameter_server', 'replicated'),
                xla=False, warmup_steps=10, timed_steps=50, plot=None, trace=None, log=print,
                param_device='auto', precisions=('fp32',), loss_scale=None, devices=None):
    """Measure towers and its peers at each tower count; print one table.

    precisions, loss_scale, devices: as bench.run_bench takes them; the plain graph
    and Keras get a row in each precision (Keras under its mixed-precision policy).
    Returns:
      list of dicts: config, towers, precision, mean, stderr, vs_best
      (images/sec over towers' best at that count in that precision, +xla rows
      aside), gflops (training GFLOP/s), conv_share (gflops over the conv rate
      of the same devices in that precision) and graph (the StepGraph of one of
      its steps; None for Keras).
    """
    check_window(batch_size, warmup_steps, timed_steps)
    chosen = precisions_of(precisions, loss_scale)
    twins = {p.name: peers.keras_twin(model_name, input_shape, num_classes,
                                      peers.KERAS_POLICIES[p.name]) for p in chosen}
    has_twin = None not in twins.values()
    plain_net = plain.plain_twin(model_name)
    if not plain_net:
        log('plain graph: skipped (%s has no hand-written twin here)' % model_name)
    kind, per_gpu = devices, process_split(tower_counts, devices)  # every row under one split
    # Before any eager call: Keras must see the devices the towers' Sessions make.
    eager_as_sessions(resolve_devices(max(tower_counts), kind, per_gpu=per_gpu), per_gpu)
    sampler = EpochSampler(dataset.num_examples, batch_size)
    rows, configs = [], []
    for count in tower_counts:
        devices = resolve_devices(count, kind, per_gpu=per_gpu)
        for update in variable_updates:
            plan = local_plan(devices, param_device, update, per_gpu=per_gpu)
            for mode in modes:
                for precision in chosen:
                    rows.append({'config': _label('towers %s/%s' % (update, mode), precision),
                                 'towers': count, 'precision': precision.name})
                    configs.append(dict(model_fn=model_fn, input_shape=input_shape, plan=plan,
                                        precision=precision,
                                        source=make_input(mode, dataset, sampler, batch_size,
                                                          num_classes)))
        first = len(configs) - len(variable_updates) * len(modes) * len(chosen)
        for i, precision in enumerate(chosen if xla else ()):  # (update, mode) loops first
            rows.append({'config': _label('towers %s/%s' % (variable_updates[0], modes[0]),
                                          precision) + ' +xla',
                         'towers': count, 'precision': precision.name})
            configs.append(dict(configs[first + i], xla=True, source=make_input(
                modes[0], dataset, sampler, batch_size, num_classes)))
        if batch_size % count == 0:
            rows.append({'config': 'textbook', 'towers': count, 'precision': 'fp32'})
            configs.append(functools.partial(peers.Textbook, model_fn, input_shape, devices,
                                             dataset, batch_size, per_gpu=per_gpu))
            for precision in chosen if plain_net else ():
                rows.append({'config': _label('plain graph', precision), 'towers': count,
                             'precision': precision.name})
                configs.append(functools.partial(plain.Plain, plain_net, num_classes, devices,
                                                 dataset, batch_size, precision.dtype,
                                                 per_gpu=per_gpu))
        else:
            log('textbook and plain graph at %d towers: skipped (tf.split needs the batch to '
                'divide evenly)' % count)
        if has_twin and not _eager_has(devices):
            log('keras mirrored at %d towers: skipped (TensorFlow started with fewer logical '
                'devices; run the bench in a fresh process)' % count)
        elif has_twin:
            for precision in chosen:
                rows.append({'config': _keras_label(precision.name), 'towers': count,
                             'precision': precision.name})
                configs.append(functools.partial(peers.Mirrored, twins[precision.name],
                                                 devices, dataset, batch_size))
    if not has_twin:
        log('keras mirrored: skipped (%s has no Keras twin here)' % model_name)
    devices = resolve_devices(max(tower_counts), kind, per_gpu=per_gpu)
    for precision in chosen:
        if precision.mixed:
            log(precision_support(precision.name, devices))
    flops = training_flops_per_image(model_fn, input_shape, num_classes)
    graphs = []
    for row, (mean, stderr), graph in zip(rows, measure_interleaved(
            configs, warmup_steps, timed_steps, trace_path=trace, log=log, graphs=graphs),
            graphs):
        row.update(mean=mean, stderr=stderr, gflops=mean * flops / 1e9, graph=graph)
    # What the devices reach on a conv and a matmul, in each precision, after the rows:
    # measured on the same devices in the same process.
    # Once per (tower count, precision) of the rows: towers' in every one asked, and the
    # textbook's float32 whatever was asked.
    yardsticks = {key: rates.kernel_rates(resolve_devices(key[0], kind, per_gpu=per_gpu),
                                          DTYPES[key[1]], per_gpu=per_gpu,
                                          data_format=local_plan(key[0], devices=kind,
                                                                 per_gpu=per_gpu).data_format)
                  for key in dict.fromkeys((r['towers'], r['precision']) for r in rows)}
    for row in rows:
        row['conv_share'] = row['gflops'] / yardsticks[row['towers'], row['precision']]['conv']
    _report(rows, flops, tower_counts, [p.name for p in chosen], yardsticks, log)
    if plot:
        plot_rows(rows, plot, '%s, global batch %d' % (model_name, batch_size))
        log('plot: %s' % plot)
    return rows


def _label(config, precision):
    """'towers parameter_server/synthetic', with ' bf16' after it in a mixed precision."""
    return config + (' ' + precision.name if precision.mixed else '')


def _keras_label(precision):
    policy = peers.KERAS_POLICIES[precision]
    return 'keras mirrored' + (' ' + policy if policy else '')


def eager_as_sessions(tower_devices, per_gpu):
    """Give eager TensorFlow, where Keras runs, the devices the towers' Sessions make.

    As many logical CPUs as CPU towers (a Session's device_count), on a GPU machine too; or
    each GPU split into per_gpu logical GPUs of the memory a Session gives them, read from
    the process's first Session (which fixes the split, towers/devices.py); or each GPU
    whole, its memory taken as it is used (as the probe's Session asks: other processes may
    share the GPU). To be called before any eager call: eager TensorFlow fixes its devices
    at its first (each GPU whole, all its memory).

    Args:
      tower_devices: the largest tower count's devices (resolve_devices).
      per_gpu: the process's logical GPUs per GPU (process_split).
    Returns:
      False where eager TensorFlow had started: it keeps what it has.
    """
    config, gpus = tf.config.LogicalDeviceConfiguration, tf.config.list_physical_devices('GPU')
    try:
        if parse_device(tower_devices[0])[0] == 'cpu':
            tf.config.set_logical_device_configuration(
                tf.config.list_physical_devices('CPU')[0], [config()] * len(tower_devices))
        elif per_gpu > 1:
            with tf1.Session(graph=tf.Graph(),
                             config=session_config(tower_devices, per_gpu=per_gpu)) as sess:
                memory = session_gpu_memory(sess)  # {'/gpu:j': bytes}, j on GPU j // per_gpu
            for gpu, device in enumerate(gpus):
                tf.config.set_logical_device_configuration(device, [
                    config(memory['/gpu:%d' % (gpu * per_gpu + j)] // 2 ** 20)
                    for j in range(per_gpu)])
        else:
            for device in gpus:
                tf.config.experimental.set_memory_growth(device, True)
    except RuntimeError:
        return False  # eager TensorFlow has started: it keeps what it has
    return True


def _eager_has(devices):
    """Whether eager TensorFlow (where Keras runs) has every one of the devices."""
    have = {d.name.lower().replace('/device:', '/') for d in tf.config.list_logical_devices()}
    return all(d.lower() in have for d in devices)


def _report(rows, flops, tower_counts, precisions, yardsticks, log):
    best = {}  # (towers, precision) -> towers' best images/sec, +xla rows aside
    for row in rows:
        if row['config'].startswith('towers') and not row['config'].endswith('+xla'):
            key = row['towers'], row['precision']
            best[key] = max(best.get(key, 0), row['mean'])

    def best_of(count, precision):  # the textbook's fp32 when fp32 was not asked for
        return best.get((count, precision), best[count, precisions[0]])
    log('training FLOPs per image: %.2f MFLOP (counted on the graph)' % (flops / 1e6))
    log('%-40s %-7s %-20s %-9s %-9s %s' % ('config', 'towers', 'images/sec', 'vs best',
                                            'GFLOP/s', 'of conv'))
    for row in rows:
        row['vs_best'] = row['mean'] / best_of(row['towers'], row['precision'])
        log('%-40s %-7d %-20s %-9.3f %-9.1f %.0f%%' % (
            row['config'], row['towers'], '%.1f ± %.1f' % (row['mean'], row['stderr']),
            row['vs_best'], row['gflops'], 100 * row['conv_share']))
    several = len(precisions) > 1
    for count in tower_counts:
        log('%d tower(s): conv / matmul on the same devices %s GFLOP/s; towers best %s' % (
            count, ', '.join('%.1f / %.1f%s' % (
                yardsticks[count, p]['conv'], yardsticks[count, p]['matmul'],
                ' (%s)' % p if several else '') for p in precisions),
            ', '.join('%.1f GFLOP/s%s, %.0f%% of conv' % (
                best[count, p] * flops / 1e9, ' (%s)' % p if several else '',
                100 * best[count, p] * flops / 1e9 / yardsticks[count, p]['conv'])
                for p in precisions)))
    log('what TensorFlow ran for one step of each row (fusions and casts):')
    for row in rows:
        if row['graph'] is not None:
            log('  %s, %d tower(s): %s' % (row['config'], row['towers'], row['graph'].text()))
    peer_names = ['textbook', 'plain graph', 'keras mirrored'] + [
        label for p in precisions if p != 'fp32'
        for label in ('plain graph %s' % p, _keras_label(p))]
    for peer in peer_names:
        mine = [r for r in rows if r['config'] == peer]
        if mine:
            held = mine[0]['precision'] if (mine[0]['towers'], mine[0]['precision']) in best \
                else precisions[0]
            log('towers best%s vs %s: %s' % (' %s' % held if several else '', peer,
                ', '.join('%d: %.2fx' % (r['towers'], 1 / r['vs_best']) for r in mine)))
    for precision in precisions:
        first = best[tower_counts[0], precision]
        log('towers best%s vs %d tower(s): %s' % (
            ' %s' % precision if several else '', tower_counts[0], ', '.join(
                '%d: %.3f' % (count, best[count, precision] / first) for count in tower_counts)))
    for precision in precisions[1:]:
        log('towers best %s vs %s: %s' % (precision, precisions[0], ', '.join(
            '%d: %.3f' % (count, best[count, precision] / best[count, precisions[0]])
            for count in tower_counts)))


def plot_rows(rows, path, title):
    """images/sec against tower count, one line per configuration, as a PNG."""
    pyplot = pyplot_for('plot')
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for config in dict.fromkeys(r['config'] for r in rows):
        mine = [r for r in rows if r['config'] == config]
        axes.errorbar([r['towers'] for r in mine], [r['mean'] for r in mine],
                      yerr=[r['stderr'] for r in mine], marker='o', capsize=3, label=config)
    axes.set_xlabel('towers')
    axes.set_ylabel('images/sec')
    axes.set_xticks(sorted({r['towers'] for r in rows}))
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    save_png(pyplot, figure, path)

