"""What each `towers` command does, once parsers.py has parsed its flags.

Each command is `run(args, log)`: args from the parser, log taking one line.
Each turns its flags into the arguments of a library function and prints
what it returns; the work is in the library (towers/, towers/tools/).
"""
import inspect
import json
import os

import numpy as np

from towers import data, models
from towers.cli.bench_command import run_bench
from towers.cli.cluster import run_server
from towers.cli.config import int_list, loss_scale, name_list
from towers.cli.dataservice import run_data_service
from towers.cli.datasets import (
    SYNTHETIC,
    dataset_info,
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
                                    logical_gpus=args.logical_gpus)
    param_device = resolve_param_device(args.param_device, tower_devices)
    log(build_line())
    for line in gpu_lines():
        log(line)
    for line in describe_devices(tower_devices, param_device):
        log(line)
    for name in ('bf16', 'fp16'):  # measured here, on the towers' devices
        log(precision_support(name, tower_devices))


def run_plan(args, log):
    """towers plan: predicted scaling over --workers, from one step timed here."""
    from towers.cluster.collective import bucket_bytes
    from towers.cluster.emulate import parse_size
    from towers.precision import Precision
    from towers.tools import linkbench, plan
    workers, modes, bandwidth, latency, device_flops, threads = _plan_flags(args)
    towers = args.devices_per_worker
    precision = Precision(args.precision, loss_scale(args.loss_scale))
    info = dataset_info(args)
    model, slice_bytes, model_fn = args.model, plan.slice_bytes(info.input_shape,
                                                                args.batch_size), None
    if args.gradient_bytes is not None:
        # Even shares over the ps tasks: its variables' sizes are not known here.
        model, sizes = 'a model of %s' % args.gradient_bytes, plan.even_sizes(
            parse_size(args.gradient_bytes, 'gradient_bytes'))
    else:
        model_fn = models.build_model(args.model, info.input_shape, info.num_classes)
        sizes = plan.model_sizes(model_fn, info.input_shape)
    compute, source = _plan_step(args, info, model_fn, device_flops, precision, threads)
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
    if not args.json:
        for line in plan.table_lines(rows):
            log(line)
        for mode in modes:
            last = [row for row in rows if row['mode'] == mode][-1]
            log('%s network at %d workers%s: %s' % (
                mode, last['workers'], ', %d ps' % last['ps'] if last['ps'] else '',
                last['formula']))
    if args.verify:
        common = ['--model', args.model, '--dataset', args.dataset, '--precision', args.precision]
        common += ['--loss-scale', args.loss_scale] if args.loss_scale is not None else []
        common += ['--image-size', str(args.image_size)] if args.image_size else []
        verified = linkbench.verify_plan(
            modes, workers, common, model_fn, info.input_shape, info.num_classes,
            args.batch_size, '%s,%s' % (args.bandwidth, args.latency), compute, towers, ps,
            args.rounds, args.window, args.all_reduce_bucket, threads, log=log)
        if not args.json:
            for line in linkbench.table_lines(verified):
                log(line)
    if args.json:
        log(json.dumps({'plan': rows, 'verify': verified} if args.verify else rows, indent=1,
                       sort_keys=True))
    if args.plot:
        plan.plot_rows(rows, args.plot, '%s, batch %d per worker, %s links'
                       % (model, args.batch_size, args.bandwidth))
        log('plot: %s' % args.plot)


def _plan_flags(args):
    """towers plan's flags, checked before a step is timed: (worker counts, modes, bandwidth,
    latency, device FLOP/s or None, threads)."""
    from towers.cluster.emulate import parse_delay, parse_rate
    from towers.names import CLUSTER_MODES
    from towers.tools import linkbench, plan
    from towers.tools.trace import check_output
    workers = int_list(args.workers, 'workers')
    modes = name_list(args.cluster_mode, 'cluster_mode', CLUSTER_MODES)
    bandwidth, latency = parse_rate(args.bandwidth), parse_delay(args.latency)
    towers = args.devices_per_worker
    if towers < 1:
        raise SettingError('{devices_per_worker} is at least 1, got %d', towers)
    if args.ps != 'workers' and not (args.ps.isdigit() and int(args.ps) >= 0):
        raise SettingError('{ps} is a count of 0 or more, or "workers", not %r', args.ps)
    needs_ps = [mode for mode in modes if CLUSTER_MODES[mode].needs_ps]
    if needs_ps and args.ps == '0':
        raise SettingError('{cluster_mode} %s needs {ps} of at least 1', needs_ps[0])
    device_flops = plan.parse_flops(args.device_flops) if args.device_flops is not None else None
    if args.plot:
        check_output(args.plot, 'plot')
    if args.gradient_bytes is not None and args.step_seconds is None:
        raise SettingError('{gradient_bytes} goes with {step_seconds}: a model towers does not '
                           'have cannot be timed here')
    if args.step_seconds is not None and (device_flops is not None or args.step_seconds <= 0):
        raise SettingError('{step_seconds} is a positive number of seconds, instead of '
                           '{device_flops}, got %r', args.step_seconds)
    threads = args.threads
    if args.verify:  # refused now, before a step is timed
        if device_flops is not None or args.step_seconds is not None or args.gradient_bytes:
            raise SettingError("{verify} runs towers' own model, timed here: not with "
                               '{device_flops}, {step_seconds} or {gradient_bytes}')
        threads = threads or 1  # each task's and the one timed here: a host's cores are its own
        linkbench.check_verify(workers, threads, latency, args.rounds)
    return workers, modes, bandwidth, latency, device_flops, threads


def _plan_step(args, info, model_fn, device_flops, precision, threads):
    """(seconds of one worker's step, where the figure comes from): --step-seconds as given,
    FLOPs over --device-flops, or one worker's step timed here."""
    from towers.tools import bench, plan
    from towers.tools.explain import flops_text
    towers = args.devices_per_worker
    if args.step_seconds is not None:
        return args.step_seconds, 'one worker measured elsewhere: --step-seconds'
    # One worker's towers split its batch; each tower's share, as train splits it.
    per_tower = -(-args.batch_size // towers)
    if device_flops is not None:
        flops = plan.tower_flops(model_fn, info.input_shape, info.num_classes, per_tower)
        return flops / device_flops, ('%s per tower step (%d images) / %s FLOP/s'
                                      % (flops_text(flops), per_tower, args.device_flops))
    bench.check_window(args.batch_size, args.warmup, args.window)
    mean, stderr = bench.measure_one_worker(model_fn, info.input_shape, info.num_classes,
                                            towers, args.batch_size, args.warmup,
                                            args.window, precision, threads)
    return args.batch_size / mean, (
        'one worker timed here: %d tower(s), batch %d, %s%s: %.1f ± %.1f images/sec over %d '
        'steps after %d; on %s' % (towers, args.batch_size, precision.name,
                                   ', %d thread(s)' % threads if threads else '', mean, stderr,
                                   args.window, args.warmup, machine()))


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
    from towers.tools import yours
    average = yours.as_average(yours.load(args.average)) if args.average else None
    split = yours.load(args.split, '--split') if args.split else None
    tolerance = (args.tolerance if args.tolerance is not None
                 else checking.default_tolerance(args.precision)[0])
    checking.check_settings(args.towers, args.batch_size, args.steps, tolerance,
                            args.accumulate)
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
                           label_smoothing=check_setting('label_smoothing', args.label_smoothing),
                           accumulate=args.accumulate, average=average,
                           average_name=args.average, split=split, split_name=args.split)


COMMANDS = {'train': run_train, 'devices': run_devices, 'bench': run_bench,
            'models': run_models, 'data': run_convert, 'eval': run_eval, 'export': run_export,
            'check': run_check, 'explain': run_explain, 'server': run_server,
            'launch': run_launch, 'plan': run_plan, 'data-service': run_data_service}
