"""What each `towers` command does, once cli.py has parsed its flags.

Each command is `run(args, log)`: args from the parser, log taking one line.
They import TensorFlow and the packages themselves, so that `towers --help`
stays instant.
"""
import os
import signal


def _models(args, log):
    from towers import data
    from towers import models
    log('models: %s' % ', '.join(models.model_names()))
    log('datasets: %s' % ', '.join(sorted(data.DATASETS)))


def _devices(args, log):
    from towers import devices
    tower_devices = devices.resolve_devices(args.towers, args.devices)
    param_device = devices.resolve_param_device(args.param_device, tower_devices)
    for line in devices.describe_devices(tower_devices, param_device):
        log(line)


def _bench(args, log):
    from towers import data
    from towers import models
    from towers import bench
    info = data.dataset_info(args.dataset)
    counts = _int_list(args.towers, '--towers')
    model_fn = models.build_model(args.model, info.input_shape, info.num_classes)
    modes = [m.strip() for m in args.input.split(',') if m.strip()]
    train_set = None
    if set(modes) - {'synthetic'}:
        train_set = data.load_dataset(args.dataset).train
    log('bench: model %s on %s images, global batch %d, %d warm-up + %d timed steps per row'
        % (args.model, 'x'.join(map(str, info.input_shape)), args.batch_size, args.warmup,
           args.window))
    from towers.trace import check_output
    for path, flag in ((args.trace, '--trace'), (args.plot, '--plot')):
        if path:
            check_output(path, flag)
    if args.compare:
        from towers import compare, variables
        updates = [u.strip() for u in args.variable_update.split(',') if u.strip()]
        unknown = sorted(set(updates) - set(variables.VARIABLE_UPDATES))
        if unknown or not updates:
            from towers.errors import TowersError
            raise TowersError('--variable-update wants some of %s, got %r'
                              % (','.join(variables.VARIABLE_UPDATES), args.variable_update))
        if train_set is None:
            train_set = data.load_dataset(args.dataset).train  # the textbook and Keras feed it
        compare.run_compare(args.model, model_fn, info.input_shape, info.num_classes, counts,
                            args.batch_size, train_set, modes, updates, xla=args.xla,
                            param_device=args.param_device,
                            warmup_steps=args.warmup, timed_steps=args.window, plot=args.plot,
                            trace=args.trace, log=log)
        return
    if args.plot or args.xla:
        from towers.errors import TowersError
        raise TowersError('--plot and --xla go with --compare')
    bench.run_bench(model_fn, info.input_shape, info.num_classes, counts, args.batch_size,
                    modes, train_set, args.warmup, args.window, args.param_device, log=log,
                    trace=args.trace)


def _load_records(args):
    """--dataset records:DIR: the train split stays on disk, the test split is read in."""
    from towers import data
    from towers.data import records
    folder = args.dataset.split(':', 1)[1]
    train_set = records.RecordSet(folder, 'train', num_workers=args.num_workers,
                                  worker_index=args.worker_index,
                                  skip_bad_shards=args.skip_bad_shards)
    test_set, test_skipped = _records_test_set(folder, train_set.num_classes,
                                               args.skip_bad_shards)
    empty = data.DataSet(test_set.images[:0], test_set.labels[:0],
                         num_classes=train_set.num_classes)
    datasets = data.Datasets(train_set, empty, test_set)
    skipped = train_set.skipped + test_skipped
    return train_set.input_shape, train_set.num_classes, datasets, skipped


def _records_test_set(folder, num_classes, skip_bad_shards=False):
    """The test split of a records folder, in memory: (DataSet, skipped shards)."""
    from towers import data
    from towers.data import records
    test = records.RecordSet(folder, 'test', skip_bad_shards=skip_bad_shards)
    images, labels = records.read_all(test, test.input_shape)
    return data.DataSet(images, labels, num_classes=num_classes), test.skipped


def _train(args, log):
    from towers import data
    from towers import models
    from towers import config as run_config, devices
    from towers.errors import TowersError
    from_records = args.dataset.startswith('records:')
    if from_records:
        if args.input not in (None, 'dataset'):
            raise TowersError('records:DIR streams from disk through --input dataset; '
                              '--input %s needs an in-memory dataset' % args.input)
        input_shape, num_classes, datasets, skipped = _load_records(args)
        for shard, count, problem in skipped:
            log('skipped %s (%d records): %s' % (shard, count, problem))
    else:
        info = data.dataset_info(args.dataset)
        input_shape, num_classes = info.input_shape, info.num_classes
        if args.validation_size is not None and not 0 <= args.validation_size < info.num_train:
            raise TowersError('--validation-size must be in [0, %d) for %s, got %d'
                              % (info.num_train, args.dataset, args.validation_size))
    options = {} if args.dropout is None else {'dropout_rate': args.dropout}
    model_fn = models.build_model(args.model, input_shape, num_classes, **options)
    tower_devices = devices.resolve_devices(args.towers, args.devices)
    config = run_config.TrainConfig(
        tower_devices=tower_devices,
        param_device=devices.resolve_param_device(args.param_device, tower_devices),
        variable_update=args.variable_update, sync_bn=args.sync_bn, batch_size=args.batch_size, epochs=args.epochs, steps=args.steps,
        optimizer=args.optimizer, learning_rate=args.lr, lr_schedule=args.lr_schedule,
        warmup_epochs=args.warmup_epochs, momentum=args.momentum,
        weight_decay=args.weight_decay, clip_norm=args.clip_norm, freeze=args.freeze,
        ema=args.ema, logdir=args.logdir, log_every=args.log_every,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints,
        eval_every=args.eval_every, best_metric=args.best_metric,
        tensorboard=not args.no_tensorboard, histograms=args.histograms, quiet=args.quiet,
        trace=args.trace, trace_step=args.trace_step, trace_plot=args.trace_plot,
        seed=args.seed, input=args.input or ('dataset' if from_records else 'feed'),
        mean=_float_list(args.mean, '--mean'), std=_float_list(args.std, '--std'))
    config.validate()  # before any data is read
    if not from_records:
        datasets = data.load_dataset(args.dataset, data_dir=args.data_dir,
                                     validation_size=args.validation_size, seed=args.seed)
    log('dataset %s: %d train, %d validation, %d test; model %s'
        % (args.dataset, datasets.train.num_examples, datasets.validation.num_examples,
           datasets.test.num_examples, args.model))
    with _StopOnSignal() as stop:
        result = run_config.train(config, model_fn, datasets, input_shape, num_classes, log=log,
                               run_info={'model': args.model, 'model_options': options,
                                         'dataset': args.dataset, 'data_dir': args.data_dir},
                               stop_requested=stop.requested)
    if result['stopped'] == 'SIGINT':
        raise KeyboardInterrupt  # saved and stopped; exit as an interrupted command does


class _StopOnSignal:
    """SIGINT and SIGTERM ask training to stop after the current step and save.

    A second SIGINT interrupts at once. SIGTERM (a scheduler's polite stop)
    then ends the command with status 0; SIGINT with 130, as Ctrl-C does.
    """

    def __init__(self):
        self.signal_name, self._previous = None, {}

    def requested(self):
        return self.signal_name

    def _handle(self, signum, frame):
        if self.signal_name == 'SIGINT' and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def __enter__(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _saved_run(args):
    """(run.json, model_fn, checkpoint) of --logdir, for eval and export."""
    from towers import models
    from towers import export
    from towers.errors import TowersError
    run = export.read_run(args.logdir)
    model_fn = models.build_model(run['model'], run['input_shape'], run['num_classes'],
                                  **run.get('model_options', {}))
    if args.best and args.checkpoint:
        raise TowersError('give --best or --checkpoint, not both')
    if args.best:
        folder = os.path.join(args.logdir, 'best')
        if not os.path.isdir(folder):
            raise TowersError('%s has no best checkpoint: it is kept when training evaluates '
                              'on validation or test data with --logdir' % args.logdir)
        return run, model_fn, export.find_checkpoint(folder)
    return run, model_fn, export.find_checkpoint(args.logdir, args.checkpoint)


def _eval(args, log):
    """towers eval: a checkpoint's loss and accuracy over the whole test set."""
    import tensorflow as tf
    from towers import data
    from towers import devices, export, graph
    from towers.evaluation import evaluate, format_metrics
    from towers.model import ClassifierModel
    if args.batch_size < 1:
        from towers.errors import TowersError
        raise TowersError('--batch-size must be at least 1, got %d' % args.batch_size)
    run, model_fn, checkpoint = _saved_run(args)
    if run['dataset'].startswith('records:'):
        test_set, _ = _records_test_set(run['dataset'].split(':', 1)[1], run['num_classes'])
    else:
        test_set = data.load_dataset(run['dataset'], data_dir=args.data_dir or run['data_dir'],
                                     validation_size=0).test
    tower_devices = devices.resolve_devices(args.towers, args.devices)
    param_device = devices.resolve_param_device(args.param_device, tower_devices)
    model = ClassifierModel(model_fn, run['input_shape'], run['num_classes'])
    ema = run.get('ema', False)
    built = graph.build_eval_graph(model, tower_devices, param_device, ema=ema)
    with tf.compat.v1.Session(graph=built.graph,
                              config=devices.session_config(tower_devices, param_device)) as sess:
        export.restore(sess, built.saver, checkpoint, built.variables)
        values = evaluate(sess, built, test_set, args.batch_size)
    log('checkpoint: %s%s' % (checkpoint, ' (moving averages of the weights)' if ema else ''))
    log('test: %s (%d images)' % (format_metrics(values), len(test_set.labels)))


def _export(args, log):
    """towers export: a SavedModel of one tower that plain TensorFlow can serve."""
    from towers import export
    run, model_fn, checkpoint = _saved_run(args)
    export.export_saved_model(model_fn, run['input_shape'], checkpoint, args.out,
                              ema=run.get('ema', False))
    log('exported %s as a SavedModel (signature %r: images -> probabilities, classes) to %s'
        % (checkpoint, export.SIGNATURE, args.out))


def _convert(args, log):
    """towers data convert: a dataset -> TFRecord shards and a manifest."""
    import numpy as np
    from towers import data
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


def _check(args, log):
    """towers check: N towers against one device on the same batches."""
    import inspect
    from towers import data
    from towers import models
    from towers import check, devices, tower
    from towers.errors import TowersError
    if args.towers < 1 or args.batch_size < 1 or args.steps < 1 or args.tolerance <= 0:
        raise TowersError('check needs --towers, --batch-size and --steps of at least 1 and a '
                          'positive --tolerance')
    info = data.dataset_info(args.dataset)
    # Dropout masks are drawn per tower: off here, so that only the towers can differ.
    options = ({'dropout_rate': 0.0} if 'dropout_rate' in inspect.signature(
        models.MODELS[args.model]).parameters else {}) if args.model in models.MODELS else {}
    model_fn = models.build_model(args.model, info.input_shape, info.num_classes, **options)
    train = data.load_dataset(args.dataset).train
    if args.batch_size * args.steps > train.num_examples:
        raise TowersError('check takes --steps batches of --batch-size distinct examples: %d x %d '
                          'is more than the %d of %s' % (args.steps, args.batch_size,
                                                         train.num_examples, args.dataset))
    batches = [(train.images[i:i + args.batch_size], train.labels[i:i + args.batch_size])
               for i in range(0, args.batch_size * args.steps, args.batch_size)]
    tower_devices = devices.resolve_devices(args.towers)
    shares = tower.split_sizes(args.batch_size, args.towers).numpy()  # eager: as it cuts
    log('check: %s on %d tower(s) %s against 1 device, global batch %d (%s), %d SGD steps%s'
        % (args.model, args.towers, ','.join(tower_devices), args.batch_size,
           '/'.join(map(str, shares)), args.steps, ', dropout off' if options else ''))
    result, has_batch_norm = check.check_towers(model_fn, info.input_shape, args.towers,
                                                batches, args.lr, sync_bn=args.sync_bn)
    log('largest gradient difference: %.3g (%s); gradients reach %.3g'
        % (result.gradient_diff, result.gradient_var, result.gradient_scale))
    log('largest variable difference after %d steps: %.3g (%s); variables reach %.3g'
        % (args.steps, result.variable_diff, result.variable_var, result.scale))
    # Relative to the size of what is compared (at least 1): float32 rounding
    # grows with the magnitude of the numbers.
    relative = max(result.gradient_diff / max(1.0, result.gradient_scale),
                   result.variable_diff / max(1.0, result.scale))
    if relative > args.tolerance:
        hint = ('; the model has batch norm: add --sync-bn' if has_batch_norm
                and not args.sync_bn else '')
        raise TowersError('%d towers differ from one device by %.3g (relative), more than the '
                          'tolerance %.3g%s' % (args.towers, relative, args.tolerance, hint))
    log('within tolerance %.3g (largest relative difference %.3g): %d towers train the same '
        'model as one device' % (args.tolerance, relative, args.towers))


def _explain(args, log):
    """towers explain: where each part of a training step runs, from the real graph."""
    import json
    from towers import data
    from towers import models
    from towers import devices, explain
    from towers.errors import TowersError
    if args.batch_size < 1:
        raise TowersError('--batch-size must be at least 1, got %d' % args.batch_size)
    info = data.dataset_info(args.dataset)
    model_fn = models.build_model(args.model, info.input_shape, info.num_classes)
    tower_devices = devices.resolve_devices(args.towers, args.devices)
    param_device = devices.resolve_param_device(args.param_device, tower_devices)
    report = explain.explain(model_fn, info.input_shape, info.num_classes, tower_devices,
                             param_device, args.batch_size, args.variable_update,
                             args.input or 'feed', args.optimizer, args.sync_bn)
    if args.json:
        log(json.dumps(report, indent=1))
        return
    where = ('variables on %s' % param_device if args.variable_update == 'parameter_server'
             else 'a copy of the variables per tower')
    title = ('explain: %s on %d tower(s), global batch %d, %s input, %s, %s'
             % (args.model, len(tower_devices), args.batch_size, args.input or 'feed',
                args.variable_update, where))
    for line in explain.report_lines(report, title):
        log(line)


COMMANDS = {'train': _train, 'devices': _devices, 'bench': _bench, 'models': _models,
            'data': _convert, 'eval': _eval, 'export': _export, 'check': _check,
            'explain': _explain}


def _float_list(text, flag):
    if text is None:
        return None
    try:
        return [float(v) for v in text.split(',')]
    except ValueError:
        from towers.errors import TowersError
        raise TowersError('%s wants comma-separated numbers like 0.5,0.5,0.5, got %r'
                          % (flag, text)) from None


def _int_list(text, flag):
    try:
        values = [int(v) for v in text.split(',') if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        from towers.errors import TowersError
        raise TowersError('%s wants positive integers like 1,2,4, got %r' % (flag, text))
    return values
