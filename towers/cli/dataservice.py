"""`towers data-service dispatcher|worker|bench`: the tf.data service of `train --data-service`.

The servers run until SIGTERM or SIGINT, then stop with one line and status 0
(towers/cluster/dataservice.py serves them); bench times a pipeline read here against the
same pipeline through local service workers (towers/tools/servicebench.py).
"""
import os
import signal
import sys
import threading

from towers.cluster import dataservice
from towers.errors import SettingError
from towers.names import FOLDERS


class _Stop:
    """SIGTERM and SIGINT set it; called with a wait in seconds, it says which came (or None)."""

    def __init__(self):
        self.name, self._event, self._previous = None, threading.Event(), {}

    def _handle(self, signum, frame):
        self.name = signal.Signals(signum).name
        self._event.set()

    def __call__(self, seconds):
        self._event.wait(seconds)
        return self.name

    def __enter__(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def run_data_service(args, log):
    if args.action == 'bench':
        return run_service_bench(args, log)
    if not 0 <= args.port < 65536 or (args.action == 'dispatcher' and not args.port):
        raise SettingError('{port} must be a port number (1..65535), got %d', args.port)
    with _Stop() as stop:
        clean = True
        if args.action == 'dispatcher':
            dataservice.serve_dispatcher(args.port, log, stop)
        else:
            dispatcher = dataservice.parse_address(args.dispatcher, 'dispatcher')
            clean = dataservice.serve_worker(dispatcher, args.port, args.host, log, stop,
                                             args.wait)
    log('data-service %s: stopped (%s)%s' % (args.action, stop.name, '' if clean else
                                              ', its dispatcher gone'))
    if not clean:  # (see serve_worker) TensorFlow's worker would hold the process: end it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def run_service_bench(args, log):
    """towers data-service bench: one pipeline in this process and through local workers."""
    from towers.cli.datasets import image_side
    from towers.cli.train import open_split
    from towers.data import records
    from towers.tools import bench, servicebench
    from towers.tools.hardware import machine
    try:
        counts = [int(count) for count in args.workers.split(',') if count.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 0 or not args.dataset.startswith(FOLDERS):
        raise SettingError('{workers} wants worker counts like 0,1,2 (0: in this process) and '
                           '{dataset} records:DIR, imagenet:DIR or tfds:DIR; got %r, %r',
                           args.workers, args.dataset)
    bench.check_window(args.batch_size, args.warmup, args.window)
    kind, folder = args.dataset.split(':', 1)
    if kind == 'records':
        if args.image_size:
            raise SettingError('{image_size} goes with imagenet:DIR or tfds:DIR; %s has its '
                               'own size', args.dataset)
        train_set = records.RecordSet(folder, 'train')
    else:
        args.model = None
        train_set = open_split(args.dataset, 'train', image_side(args))
    shape = 'x'.join(map(str, train_set.input_shape))
    log('data-service bench: %s, %d images of %s, batch %d, %d warm-up + %d timed batches per '
        'row in %d blocks, rows in turns; on %s' % (args.dataset, train_set.num_examples, shape,
                                                   args.batch_size, args.warmup, args.window,
                                                   args.rounds, machine()))
    servicebench.run_service_bench(train_set, counts, args.batch_size, args.warmup,
                                   args.window, args.rounds, log=log)
