"""`towers explain`: where each part of a training step runs.

Without --plan-only, one real step on this machine's devices (or an in-graph
cluster served here), read from its partition graphs (towers/tools/explain.py).
With it, the step's graph alone, built on the devices the plan asks for, GPUs
and clusters included, and never run (towers/tools/planonly.py).
"""
import json

from towers import models
from towers.cli.config import loss_scale
from towers.cli.datasets import dataset_info
from towers.config import check
from towers.deviceplan import local_plan
from towers.devices import parse_device, task_gpus
from towers.errors import SettingError
from towers.logicalgpus import logical_gpu_line
from towers.names import CLUSTER_MODES, DEVICE_KINDS, INPUT_MODES
from towers.precision import Precision
from towers.tools import explain, planonly


def run_explain(args, log):
    """towers explain [--plan-only]."""
    check('batch_size', args.batch_size)
    info = dataset_info(args)
    model_fn = models.build_model(args.model, info.input_shape, info.num_classes)
    precision = Precision(args.precision, loss_scale(args.loss_scale))
    if args.plan_only:
        return _plan_only(args, log, model_fn, info, precision)
    if (args.gpus_per_worker or not CLUSTER_MODES[args.cluster_mode].one_graph
            or INPUT_MODES[args.input or 'feed'].runs_ahead):
        raise SettingError('{gpus_per_worker}, {cluster_mode} and {input} staging or dataset '
                           'go with {plan_only}: explain runs one real step in-graph on this '
                           'machine')
    target = ''
    if _on_cluster(args):
        if args.variable_update != 'parameter_server':
            raise SettingError('explain on a cluster is in-graph, one copy of the variables: '
                               'leave {variable_update} at parameter_server')
        plan, target = explain.local_in_graph(
            args.workers, args.ps, args.towers or 1,
            num_gpus=task_gpus(args.devices))
    else:
        plan = local_plan(args.towers, args.param_device, args.variable_update, args.devices,
                          logical_gpus=args.logical_gpus)
    plan = plan.with_data_format(args.data_format)
    report = explain.explain(model_fn, info.input_shape, info.num_classes, plan,
                             args.batch_size, args.input or 'feed', args.optimizer,
                             args.sync_bn, target, precision=precision,
                             accumulate=args.accumulate)
    if args.json:
        log(json.dumps(report, indent=1))
        return
    where = 'variables: %s' % plan.describe()
    if target:
        where += '; in-graph over %d worker task(s) and %d ps task(s)' % (args.workers,
                                                                         args.ps)
    for line in explain.report_lines(report, _title(args, '%d tower(s)' % plan.num_towers,
                                                    where, precision)):
        log(line)


def _on_cluster(args):
    if args.workers is None and not args.ps:
        return False
    if args.workers is None or args.workers < 1 or args.ps < 0:
        raise SettingError('explain on a cluster needs {workers} of at least 1 (and {ps} '
                           'of 0 or more)')
    return True


def _plan_only(args, log, model_fn, info, precision):
    """The step's graph on the planned devices, never run."""
    if args.gpus_per_worker < 0:
        raise SettingError('{gpus_per_worker} is 0 (virtual CPUs) or more, got %d',
                           args.gpus_per_worker)
    if _on_cluster(args):
        if args.variable_update != 'parameter_server':
            raise SettingError('a cluster mode decides where the variables live: leave '
                               '{variable_update} at parameter_server')
        runs = [(run.plan.with_data_format(args.data_format), run.strategy)
                for run in planonly.cluster_runs(
            args.cluster_mode, args.workers, args.ps, args.towers, args.gpus_per_worker)]
        where = '%s over %d worker task(s) and %d ps task(s), %s' % (
            args.cluster_mode, args.workers, args.ps,
            '%d GPU(s) each' % args.gpus_per_worker if args.gpus_per_worker
            else 'virtual CPUs')
    else:
        # One process is one worker: --gpus-per-worker G plans this machine as one of G GPUs
        # (more towers than G: logical GPUs). Else the GPUs named are planned whether or not
        # this machine has them.
        named = [parse_device(d) for d in (args.devices or '').split(',')
                 if d.strip() and d.strip().lower() not in DEVICE_KINDS]
        gpus = args.gpus_per_worker or max(
            (index + 1 for kind, index in named if kind == 'gpu'), default=None)
        plan = local_plan(args.towers, args.param_device, args.variable_update, args.devices,
                          num_gpus=gpus, data_format=args.data_format,
                          logical_gpus=args.logical_gpus)
        runs, where = [(plan, None)], 'variables: %s' % plan.describe()
    report = planonly.planned_step(model_fn, info.input_shape, info.num_classes, runs,
                                   args.batch_size, args.input or 'feed', args.optimizer,
                                   args.sync_bn, precision, accumulate=args.accumulate)
    # The GPU each tower would be on: logical GPUs of one GPU share it.
    report['gpus'] = [list(run.gpus) if run.gpus else None for run, _ in runs]
    if args.json:
        log(json.dumps(report, indent=1))
        return
    towers = '%d tower(s)%s' % (len(report['towers'][0]),
                                ' per worker' if len(report['towers']) > 1 else '')
    for line in planonly.report_lines(report, _title(args, towers, where, precision)):
        log(line)
    for run, _ in runs[:1]:
        logical = logical_gpu_line(run, {})
        if logical:
            log(logical)


def _title(args, towers, where, precision):
    # A between-graph cluster mode decides how the gradients meet: it is `where`.
    update = '' if args.plan_only and _on_cluster(args) else args.variable_update + ', '
    return ('explain: %s on %s, global batch %d%s, %s input, %s%s%s'
            % (args.model, towers, args.batch_size,
               ' in %d micro-batches a tower' % args.accumulate if args.accumulate > 1 else '',
               args.input or 'feed', update, where,
               '; ' + precision.describe() if precision.mixed else ''))
