"""`towers bench`: its flags turned into timed rows (towers/tools/bench.py), the input alone
(--input-only), or one step against clusters of processes (--cluster-mode).

Part of the commands of towers/cli/commands.py, apart so that each stays small.
"""
from towers import models
from towers.cli.config import check_xla_determinism, flag, int_list, loss_scale, name_list
from towers.cli.datasets import (
    check_image_size,
    dataset_info,
    image_side,
    load_dataset,
)
from towers.devices import resolve_devices
from towers.errors import SettingError
from towers.names import CLUSTER_MODES, INPUT_MODES, VARIABLE_UPDATES
from towers.tools.hardware import machine


def run_bench(args, log):
    if args.deterministic and (args.cluster_mode or args.input_only):
        raise SettingError('{deterministic} times one process\'s towers: not with '
                           '{cluster_mode} or {input_only}')
    check_xla_determinism(args)  # as train refuses them
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
    modes = name_list(args.input, 'input', INPUT_MODES)
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
    if any(INPUT_MODES[m].has_images for m in modes) or args.compare:  # Keras reads it too
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
    mode = CLUSTER_MODES[args.cluster_mode]
    ps = args.ps if args.ps is not None else int(mode.needs_ps)
    common = ['--model', args.model, '--dataset', args.dataset, '--precision', precisions[0]]
    common += ['--loss-scale', args.loss_scale] if args.loss_scale is not None else []
    common += ['--image-size', str(args.image_size)] if args.image_size else []
    flags = common + ['--batch-size', str(args.batch_size), '--input', args.input,
                      '--steps', str(args.warmup + args.window), '--eval-every', '0',
                      '--quiet', '--log-every', str(args.warmup + args.window)]
    flags += ['--threads', str(args.threads)] if args.threads else []
    flags += ['--xla'] if args.xla else []  # every run, the one process and the clusters
    if mode.copy_per_worker:
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
        '--batch-size', str(args.batch_size)]) if mode.one_graph else {})
    size = clusterbench.gradient_bytes(model_fn, info.input_shape)
    log('S = %d bytes of gradients (the model\'s trainable variables)' % size)
    for line in clusterbench.table_lines(rows, args.cluster_mode, size, explained,
                                              towers, ps):
        log(line)
