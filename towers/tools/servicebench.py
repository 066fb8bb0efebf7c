"""`towers data-service bench`: one input pipeline read in this process, and through 1, 2, ...
local tf.data service workers.

Each row pulls the batches a trainer would take (the pipeline of `train --data-service`,
normalised here), with no model: the input alone. Row 0 runs the pipeline in this process;
row n sends it to a dispatcher of its own with n workers, each a `towers data-service worker`
process of this machine. Timed as `bench --input-only` times (towers/tools/inputbench.py):
the rows take turns block by block, each block starting its pipeline afresh (a new job on the
service) after untimed warm-up batches; a row's images/sec is the mean over its blocks, with
its standard error. On one machine the workers share its cores with the reader: the numbers
say what the service costs here, not what workers on machines of their own would add.
"""
import subprocess
import time

import tensorflow as tf

from towers.cluster.dataservice import dispatcher_workers, worker_answers
from towers.cluster.launch import towers_command
from towers.data import pipeline
from towers.errors import TowersError
from towers.inputs.dataservice import distributed, service_pipeline
from towers.tools.inputbench import Reader, cores, time_in_turns

START_S = 120.0  # for a row's workers to start and register


def _pipeline(train_set, batch_size):
    """(the pipeline a service worker runs, its finish on the trainer) of a split on disk."""
    shape = train_set.input_shape
    dataset = service_pipeline(train_set, shape, train_set.num_classes, batch_size,
                               'parallel_epochs')
    finish = pipeline.finisher(shape, 255.0)
    return dataset, lambda pixels, labels: (finish(pixels), labels)


class ServiceRow:
    """A dispatcher in this process and `workers` worker processes, for one row."""

    def __init__(self, workers, log):
        service = tf.data.experimental.service
        # Jobs of finished blocks go at once: their tasks stop taking the workers' cores.
        self.server = service.DispatchServer(service.DispatcherConfig(
            port=0, job_gc_check_interval_ms=500, job_gc_timeout_ms=500))
        self.address = self.server.target.split('://', 1)[1]
        self.processes = [subprocess.Popen(
            towers_command('data-service', 'worker', '--dispatcher', self.address),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(workers)]
        deadline = time.monotonic() + START_S
        while sum(worker_answers(a) for a in dispatcher_workers(self.address) or []) < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.close()
                raise TowersError('%d local data-service worker(s) did not start within %.0f s'
                                  % (workers, START_S))
            time.sleep(0.2)
        log('%d data-service worker(s) for the dispatcher %s' % (workers, self.address))

    def close(self):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.server._stop()


def run_service_bench(train_set, counts, batch_size, warmup=10, window=50, rounds=5,
                      log=print, clock=time.perf_counter):
    """Time the pipeline of `train --data-service` over train_set in this process (count 0)
    and through each count of local service workers; print one table.

    Returns:
      list of dicts: workers, mean, stderr (images/sec), per_core, vs_local (the first row).
    """
    rows = []
    try:
        for count in counts:
            row = {'workers': count, 'service': ServiceRow(count, log) if count else None}

            def make(service=row['service']):
                dataset, finish = _pipeline(train_set, batch_size)
                if service is not None:
                    dataset = distributed(dataset, 'grpc://' + service.address,
                                          'parallel_epochs')
                return dataset.map(pipeline.as_written(finish))
            row['reader'] = Reader(make)
            rows.append(row)
        rates = time_in_turns([row['reader'] for row in rows], warmup, window, rounds, clock)
    finally:
        for row in rows:
            row.pop('reader').close()
            if row['service'] is not None:
                row['service'].close()
    n = cores()
    for row, (mean, stderr) in zip(rows, rates):
        row.update(mean=mean, stderr=stderr, per_core=mean / n)
        row.pop('service')
    for row in rows:
        row['vs_local'] = row['mean'] / rows[0]['mean']
    log('%-22s %-20s %-16s %s' % ('input', 'images/sec', 'per core (%d)' % n,
                                  'vs %s' % _name(rows[0]['workers'])))
    for row in rows:
        log('%-22s %-20s %-16.1f %.3f' % (_name(row['workers']), '%.1f ± %.1f' % (
            row['mean'], row['stderr']), row['per_core'], row['vs_local']))
    return rows


def _name(workers):
    return 'in this process' if not workers else '%d service worker%s' % (
        workers, '' if workers == 1 else 's')
