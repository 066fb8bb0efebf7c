"""What each `towers` command does, once parsers.py has parsed its flags.

Each command is `run(args, log)`: args from the parser, log taking one line.
Each turns its flags into the arguments of a library function and prints
what it returns; the work is in the library (towers/, towers/tools/).
"""
import inspect
import json
import os

import numpy as np

from towers import data, exactness, models
from towers.cli.cluster import run_server
from towers.cli.config import check_xla_determinism, flag, int_list, loss_scale, name_list
from towers.cli.dataservice import run_data_service
from towers.cli.datasets import (
    SYNTHETIC,
    check_image_size,
    dataset_info,
    image_side,
    load_dataset,
)
from towers.cli.explain_command import run_explain
from towers.cli.launcher import run_launch
from towers.cli.saved import run_eval, run_export
from towers.cli.train import run_train
from towers.config import check as check_setting
from towers.devices import describe_devices, resolve_devices, resolve_param_device
from towers.errors import SettingError
from towers.exactness import exact
from towers.names import VARIABLE_UPDATES
from towers.tools.hardware import build_line, gpu_lines, machine, precision_support


def run_models(args, log):
    """towers models [NAME ...]: each model's design, parameters and FLOPs, counted on its graph."""
    from towers.tools.explain import inference_counts
    names = args.names or models.model_names()
    unknown = [name for name in names if name not in models.MODELS]
    if unknown:
        raise SettingError('unknown model %s; known models: %s', ', '.join(unknown),
                           ', '.join(models.model_names()))
    log('%-14s %-12s %8s %14s %12s' % ('model', 'input', 'classes', 'parameters',
                                       'MACs/image'))
    for name in names:
        shape, classes = models.DESIGNS[name]
        parameters, macs, _ = inference_counts(models.build_model(name, shape, classes), shape)
        size = '%.3f G' % (macs / 1e9) if macs >= 1e8 else '%.2f M' % (macs / 1e6)
        log('%-14s %-12s %8d %14s %12s' % (name, 'x'.join(map(str, shape)), classes,
                                          format(parameters, ','), size))
    log('MACs: multiply-accumulates of the convolutions and matmuls of one forward pass, '
        "as papers count them (TensorFlow's profiler, on the graph)")
    if not args.names:
        log('datasets: %s' % ', '.join(sorted(data.DATASETS) + [SYNTHETIC]))


def run_devices(args, log):
    tower_devices = resolve_devices(args.towers, args.devices,
                                    logical_gpus=not args.no_logical_gpus)
    param_device = resolve_param_device(args.param_device, tower_devices)
    log(build_line())
    for line in gpu_lines():
        log(line)
    for line in describe_devices(tower_devices, param_device):
        log(line)
    for name in ('bf16', 'fp16'):  # measured here, on the towers' devices
        log(precision_support(name, tower_devices))


def run_bench(args, log):
    if args.deterministic and (args.cluster_mode or args.input_only):
        raise SettingError('{deterministic} times one process\'s towers: not with '
                           '{cluster_mode} or {input_only}')
    check_xla_determinism(args)  # as train refuses them
    with exactness.exact_if(args.deterministic, log):
        return _run_bench(args, log)


def _run_bench(args, log):
    from towers.names import PRECISIONS
    if (args.optimizer or args.data_format) and (
            args.compare or args.cluster_mode or args.input_only):
        raise SettingError('{optimizer} and {data_format} set the rows of bench itself: not with '
                           '{compare}, {cluster_mode} or {input_only}')
    from towers.tools import bench, compare
    from towers.tools.trace import check_output
    if args.input_only:
        run_input_bench(args, log)
        return
    if args.cluster_mode:
        run_cluster_bench(args, log)
        return
    info = dataset_info(args)
    counts = int_list(args.towers, 'towers')
    model_fn = models.build_model(args.model, info.input_shape, info.num_classes)
    modes = [m.strip() for m in args.input.split(',') if m.strip()]
    scale = loss_scale(args.loss_scale)
    precisions = [p.name for p in bench.precisions_of(  # each once; a scale needs fp16
        name_list(args.precision, 'precision', PRECISIONS), scale)]
    for path, setting in ((args.trace, 'trace'), (args.plot, 'plot')):
        if path:
            check_output(path, setting)
    if args.compare:
        updates = name_list(args.variable_update, 'variable_update', VARIABLE_UPDATES)
    elif args.plot:
        raise SettingError('{plot} goes with {compare}')
    train_set = None
    if set(modes) - {'synthetic'} or args.compare:  # the textbook and Keras feed it too
        train_set = load_dataset(args, info).train
    # train's optimizer, so that a row times train's step; --compare's rows step as its peers.
    optimizer = 'sgd' if args.compare else args.optimizer or bench.TRAIN_OPTIMIZER
    in_precisions = '' if precisions == ['fp32'] else '; in %s%s' % (
        ', '.join(precisions), ', each against %s' % precisions[0] if len(precisions) > 1
        else '')
    under_xla = '' if not args.xla else (
        ', the first combination again under XLA in each precision' if args.compare else
        ', every row under XLA auto-clustering (each compiled)')
    log('bench: model %s on %s images, global batch %d, %s%s%s, %d warm-up + %d timed steps '
        'per row%s; on %s' % (args.model, 'x'.join(map(str, info.input_shape)),
                              args.batch_size, optimizer,
                              ', maps %s' % args.data_format if args.data_format else '',
                              under_xla, args.warmup, args.window, in_precisions,
                              machine(resolve_devices(devices=args.devices))))
    if not args.compare:
        bench.run_bench(model_fn, info.input_shape, info.num_classes, counts, args.batch_size,
                        modes, train_set, args.warmup, args.window, args.param_device, log=log,
                        trace=args.trace, name_of=flag, precisions=precisions,
                        loss_scale=scale, devices=args.devices, optimizer=optimizer,
                        data_format=args.data_format, xla=args.xla)
        return
    compare.run_compare(args.model, model_fn, info.input_shape, info.num_classes, counts,
                        args.batch_size, train_set, modes, updates, xla=args.xla,
                        param_device=args.param_device, warmup_steps=args.warmup,
                        timed_steps=args.window, plot=args.plot, trace=args.trace, log=log,
                        precisions=precisions, loss_scale=scale, devices=args.devices)


def run_input_bench(args, log):
    """towers bench --input-only --dataset imagenet:DIR: the input alone, against bare tf.data."""
    from towers.cli.train import open_split
    from towers.tools import bench, inputbench
    if not args.dataset.startswith(('imagenet:', 'tfds:')):
        raise SettingError('{input_only} times the input of an imagenet:DIR or tfds:DIR '
                           'folder; got {dataset} %s', args.dataset)
    unused = [name for name, given in (
        ('compare', args.compare), ('cluster_mode', args.cluster_mode), ('xla', args.xla),
        ('trace', args.trace), ('plot', args.plot), ('towers', args.towers != '1,2,4'),
        ('input', args.input != 'synthetic'), ('precision', args.precision != 'fp32')) if given]
    if unused:
        raise SettingError('{input_only} times the input alone, with no model, towers or '
                           'precision: drop %s' % ', '.join('{%s}' % name for name in unused))
    bench.check_window(args.batch_size, args.warmup, args.window)
    check_image_size(args)
    folder = args.dataset.split(':', 1)[1]
    size = image_side(args)
    image_set = open_split(args.dataset, 'train', size)
    if image_set.schema.shape:
        raise SettingError('{input_only} times the crops of JPEGs of any size; %s\'s images '
                           'are all %s', args.dataset, 'x'.join(map(str, image_set.input_shape)))
    log('bench --input-only: %s, %d images in %d shards, %dx%d, batch %d, %d warm-up + %d '
        'timed batches per row; on %s' % (folder, image_set.num_examples,
                                          len(image_set.files), size, size, args.batch_size,
                                          args.warmup, args.window, machine()))
    inputbench.run_input_bench(image_set, args.batch_size, args.warmup, args.window, log=log)


def run_cluster_bench(args, log):
    """towers bench --cluster-mode M --workers 1,2: local clusters against one process."""
    from towers.names import PRECISIONS
    from towers.tools import bench, clusterbench
    precisions = name_list(args.precision, 'precision', PRECISIONS)
    if len(precisions) > 1:
        raise SettingError('{cluster_mode} times one {precision} per run, got %r',
                           args.precision)
    bench.precisions_of(precisions, loss_scale(args.loss_scale))
    info = dataset_info(args)
    model_fn = models.build_model(args.model, info.input_shape, info.num_classes)
    workers = int_list(args.workers, 'workers')
    towers = int(args.towers) if args.towers.isdigit() else None
    if not towers or args.compare or ',' in args.input:
        raise SettingError('{cluster_mode} times one {towers} count per task and one {input}, '
                           'without {compare}')
    bench.check_window(args.batch_size, args.warmup, args.window)
    ps = args.ps if args.ps is not None else int(args.cluster_mode == 'parameter-server')
    common = ['--model', args.model, '--dataset', args.dataset, '--precision', precisions[0]]
    common += ['--loss-scale', args.loss_scale] if args.loss_scale is not None else []
    common += ['--image-size', str(args.image_size)] if args.image_size else []
    flags = common + ['--batch-size', str(args.batch_size), '--input', args.input,
                      '--steps', str(args.warmup + args.window), '--eval-every', '0',
                      '--quiet', '--log-every', str(args.warmup + args.window)]
    flags += ['--threads', str(args.threads)] if args.threads else []
    flags += ['--xla'] if args.xla else []  # every run, the one process and the clusters
    if args.cluster_mode == 'collective':
        flags += ['--all-reduce-bucket', args.all_reduce_bucket]
    log('bench: %s, global batch %d, %s input, %s, %d warm-up + %d timed steps per run, '
        '%d rounds; %s mode, %d tower(s) per task%s; on %s'
        % (args.model, args.batch_size, args.input,
           precisions[0] + (' under XLA' if args.xla else ''), args.warmup, args.window,
           args.rounds, args.cluster_mode, towers, ', every task on a host of its own on '
           'links of %s' % args.emulate_link if args.emulate_link else '', machine()))
    if args.emulate_link:
        from towers.tools import linkbench
        rows = linkbench.run_link_bench(
            args.cluster_mode, workers, flags, model_fn, info.input_shape, info.num_classes,
            args.batch_size, args.emulate_link, towers, ps, args.rounds, args.warmup,
            args.window, log=log, bucket=args.all_reduce_bucket, threads=args.threads)
        for line in linkbench.table_lines(rows):
            log(line)
        return
    rows = clusterbench.run_cluster_bench(args.cluster_mode, workers, flags, towers, ps,
                                          args.rounds, log=log)
    explained = (clusterbench.explained_bytes(workers, ps, towers, common + [
        '--batch-size', str(args.batch_size)]) if args.cluster_mode == 'in-graph' else {})
    size = clusterbench.gradient_bytes(model_fn, info.input_shape)
    log('S = %d bytes of gradients (the model\'s trainable variables)' % size)
    for line in clusterbench.table_lines(rows, args.cluster_mode, size, explained,
                                              towers, ps):
        log(line)


def run_plan(args, log):
    """towers plan: predicted scaling over --workers, from one step timed here."""
    from towers.cluster.collective import bucket_bytes
    from towers.cluster.emulate import parse_delay, parse_rate, parse_size
    from towers.names import CLUSTER_MODES
    from towers.precision import Precision
    from towers.tools import bench, plan
    from towers.tools.explain import flops_text
    from towers.tools.trace import check_output
    workers = int_list(args.workers, 'workers')
    modes = name_list(args.cluster_mode, 'cluster_mode', CLUSTER_MODES)
    bandwidth, latency = parse_rate(args.bandwidth), parse_delay(args.latency)
    towers = args.devices_per_worker
    if towers < 1:
        raise SettingError('{devices_per_worker} is at least 1, got %d', towers)
    if args.ps != 'workers' and not (args.ps.isdigit() and int(args.ps) >= 0):
        raise SettingError('{ps} is a count of 0 or more, or "workers", not %r', args.ps)
    if 'parameter-server' in modes and args.ps == '0':
        raise SettingError('{cluster_mode} parameter-server needs {ps} of at least 1')
    device_flops = plan.parse_flops(args.device_flops) if args.device_flops is not None else None
    if args.plot:
        check_output(args.plot, 'plot')
    if args.gradient_bytes is not None and args.step_seconds is None:
        raise SettingError('{gradient_bytes} goes with {step_seconds}: a model towers does not '
                           'have cannot be timed here')
    if args.step_seconds is not None and (device_flops is not None or args.step_seconds <= 0):
        raise SettingError('{step_seconds} is a positive number of seconds, instead of '
                           '{device_flops}, got %r', args.step_seconds)
    precision = Precision(args.precision, loss_scale(args.loss_scale))
    info = dataset_info(args)
    model, slice_bytes = args.model, plan.slice_bytes(info.input_shape, args.batch_size)
    if args.gradient_bytes is not None:
        # Even shares over the ps tasks: its variables' sizes are not known here.
        model, sizes = 'a model of %s' % args.gradient_bytes, plan.even_sizes(
            parse_size(args.gradient_bytes, 'gradient_bytes'))
    else:
        model_fn = models.build_model(args.model, info.input_shape, info.num_classes)
        sizes = plan.model_sizes(model_fn, info.input_shape)
    # One worker's towers split its batch; each tower's share, as train splits it.
    per_tower = -(-args.batch_size // towers)
    if args.step_seconds is not None:
        compute, source = args.step_seconds, 'one worker measured elsewhere: --step-seconds'
    elif device_flops is not None:
        flops = plan.tower_flops(model_fn, info.input_shape, info.num_classes, per_tower)
        compute = flops / device_flops
        source = ('%s per tower step (%d images) / %s FLOP/s'
                  % (flops_text(flops), per_tower, args.device_flops))
    else:
        bench.check_window(args.batch_size, args.warmup, args.window)
        mean, stderr = bench.measure_one_worker(model_fn, info.input_shape, info.num_classes,
                                                towers, args.batch_size, args.warmup,
                                                args.window, precision, args.threads)
        compute = args.batch_size / mean
        source = ('one worker timed here: %d tower(s), batch %d, %s%s: %.1f ± %.1f images/sec '
                  'over %d steps after %d; on %s' % (
                      towers, args.batch_size, precision.name,
                      ', %d thread(s)' % args.threads if args.threads else '', mean, stderr,
                      args.window, args.warmup, machine()))
    log('plan: %s, batch %d per worker of %d device(s); links %s each way (B = %s/s), '
        'latency a = %s' % (model, args.batch_size, towers, args.bandwidth,
                            plan.bytes_text(bandwidth), args.latency))
    log('compute: %.4f s per step (%s)' % (compute, source))
    log('S = %s of gradients in %d variables; I = %s of input per worker'
        % (plan.bytes_text(sum(sizes)), len(sizes), plan.bytes_text(slice_bytes)))
    ps = args.ps if args.ps == 'workers' else int(args.ps)
    bucket = bucket_bytes(args.all_reduce_bucket, sizes)
    rows = [row for mode in modes
            for row in plan.predict(mode, workers, compute, args.batch_size, sizes, bandwidth,
                                    latency, towers, ps, slice_bytes, bucket)]
    if args.json:
        log(json.dumps(rows, indent=1, sort_keys=True))
    else:
        for line in plan.table_lines(rows):
            log(line)
        for mode in modes:
            last = [row for row in rows if row['mode'] == mode][-1]
            log('%s network at %d workers%s: %s' % (
                mode, last['workers'], ', %d ps' % last['ps'] if last['ps'] else '',
                last['formula']))
    if args.plot:
        plan.plot_rows(rows, args.plot, '%s, batch %d per worker, %s links'
                       % (model, args.batch_size, args.bandwidth))
        log('plot: %s' % args.plot)


def run_convert(args, log):
    """towers data convert: a dataset -> TFRecord shards and a manifest."""
    if args.from_folder:
        return _convert_folder(args, log)
    if args.validation_folder or args.skip_bad_images or args.workers:
        raise SettingError('{validation_folder}, {skip_bad_images} and {workers} go with '
                           '{from_folder}')
    from towers.data import records
    datasets = data.load_dataset(args.dataset, data_dir=args.data_dir, validation_size=0)
    # DataSet holds images as float32 x/255; rint recovers the bytes exactly.
    splits = {name: (np.rint(split.images * 255).astype(np.uint8), split.labels)
              for name, split in (('train', datasets.train), ('test', datasets.test))}
    manifest = records.write_records(splits, args.out, args.shards, args.dataset,
                                     data.dataset_info(args.dataset).num_classes)
    for name, split in manifest['splits'].items():
        log('%s: %d records in %d shard(s)' % (name, split['records'], len(split['shards'])))
    log('wrote %s' % os.path.join(args.out, records.MANIFEST))


def _convert_folder(args, log):
    """towers data convert --from-folder: class subfolders -> ImageNet-format shards."""
    import tqdm

    from towers.data import from_folder
    total = sum(len(from_folder.list_images(folder)[1])
                for folder in (args.from_folder, args.validation_folder) if folder)
    with tqdm.tqdm(total=total, unit='image', desc='converting', leave=False,
                   disable=None) as bar:
        manifest = from_folder.convert_folder(
            args.from_folder, args.out, args.shards, args.validation_folder, args.workers,
            args.skip_bad_images, progress=bar.update)
    for path, reason in manifest['skipped']:
        log('skipped %s: %s' % (path, reason))
    for name, split in manifest['splits'].items():
        log('%s: %d images in %d shard(s)' % (name, split['records'], len(split['shards'])))
    log('%d classes; wrote %s: train with --dataset imagenet:%s'
        % (len(manifest['classes']), os.path.join(args.out, from_folder.MANIFEST), args.out))


def run_check(args, log):
    """towers check: N towers against one device on the same batches."""
    from towers.tools import check as checking
    tolerance = (args.tolerance if args.tolerance is not None
                 else checking.default_tolerance(args.precision)[0])
    checking.check_settings(args.towers, args.batch_size, args.steps, tolerance)
    info = dataset_info(args)
    # Dropout masks are drawn per tower: off here, so that only the towers can differ.
    has_dropout = args.model in models.MODELS and 'dropout_rate' in inspect.signature(
        models.MODELS[args.model]).parameters
    options = {'dropout_rate': 0.0} if has_dropout else {}
    model_fn = models.build_model(args.model, info.input_shape, info.num_classes, **options)
    train_set = load_dataset(args, info).train
    # A GPU's TF32 or a non-deterministic cuDNN algorithm would be measured too.
    with exact():
        checking.run_check(args.model, model_fn, args.dataset, train_set, args.towers,
                           args.batch_size, args.steps, args.lr, args.tolerance,
                           sync_bn=args.sync_bn, dropout_off=has_dropout, log=log,
                           precision=args.precision, loss_scale=loss_scale(args.loss_scale),
                           devices=args.devices,
                           label_smoothing=check_setting('label_smoothing', args.label_smoothing))


COMMANDS = {'train': run_train, 'devices': run_devices, 'bench': run_bench,
            'models': run_models, 'data': run_convert, 'eval': run_eval, 'export': run_export,
            'check': run_check, 'explain': run_explain, 'server': run_server,
            'launch': run_launch, 'plan': run_plan, 'data-service': run_data_service}
