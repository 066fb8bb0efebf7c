"""`towers bench --cluster-mode M --emulate-link RATE,DELAY` and `towers plan --verify`: the plan
against a cluster on links.

For each worker count n, `towers launch --workers n --emulate-link RATE,DELAY` trains on
this machine with every task on a host of its own (towers/cluster/emulate.py), and
`towers plan` predicts the same run: one worker's step (its towers, its share of the
global batch) timed here in this process, plus the mode's network time at RATE.

Per worker count it prints the planned and the measured step (the chief's images/sec
after warm-up, as a step of the global batch), and per task the bytes the plan says it
sends and receives a step against what crossed its link (the launcher's LinkMeter, over
the chief's logged steps): where a mode moves more than its formula, the table says so.
The runs go round after round, so that the means and their errors come from runs made
side by side on a shared machine.

`towers plan --verify` runs the same, for each mode and worker count it plans, on links of
its --bandwidth and --latency, with the one worker's step it timed for the plan: weak
scaling, each worker its --batch-size.
"""
import os
import re

from towers.cluster.collective import bucket_bytes
from towers.cluster.emulate import has_netem, parse_link, unavailable
from towers.config import TrainConfig
from towers.errors import SettingError, TowersError
from towers.names import CLUSTER_MODES
from towers.tools import clusterbench, plan
from towers.tools.bench import mean_stderr, measure_one_worker
from towers.tools.explain import bytes_text

_WINDOW = re.compile(r"^towers launch: link use per step over the chief's steps \d+-\d+ "
                     r'\(([\d.]+) s a step\):$')
_TASK = re.compile(r'^towers launch:   (\w+ \d+) sent (\d+) bytes, received (\d+) bytes$')


def link_use(output):
    """(seconds a step, {task: (bytes sent, bytes received) a step}), from the launcher's
    LinkMeter lines."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if _WINDOW.match(line)), None)
    if start is None:
        said = [line for line in lines if line.startswith('towers launch: no link use')]
        raise TowersError(said[0] if said else 'the launcher measured no link use')
    seconds, use = float(_WINDOW.match(lines[start]).group(1)), {}
    for line in lines[start + 1:]:
        match = _TASK.match(line)
        if not match:
            break
        use[match.group(1)] = (int(match.group(2)), int(match.group(3)))
    return seconds, use


def run_link_bench(mode, worker_counts, train_flags, model_fn, input_shape, num_classes,
                   batch_size, link, towers=1, ps=0, rounds=2, warmup=5, window=10,
                   log=print, timeout=600, bucket='0', threads=None, compute=None):
    """Plan and measure every worker count; returns one row per count.

    Args:
      train_flags: the train flags every run shares (model, batch, steps...); the chief
        logs every step, for the meter.
      batch_size: the global batch, split over the workers.
      link: 'RATE,DELAY', as --emulate-link takes it.
      bucket: collective mode's --all-reduce-bucket, as train_flags give it to the runs.
      threads: each task's --threads (in train_flags too), for the step timed here.
      compute: seconds of one worker's step, timed by the caller (`towers plan`); None:
        timed here for each count (warmup and window steps).
    Returns:
      list of dicts: workers, planned (the plan's row), measured_s (mean, stderr: None
      from one round) of the step, and tasks: [(task, planned sent, planned received,
      measured sent, measured received)].
    """
    facts = CLUSTER_MODES[mode]
    if facts.needs_ps and ps < 1:
        raise TowersError('{cluster_mode} %s needs {ps} of at least 1' % mode)
    if facts.copy_per_worker:  # no ps tasks
        ps = 0
    if rounds < 1:
        raise TowersError('{rounds} must be at least 1')
    bandwidth, latency = parse_link(link)
    reason = unavailable()
    if reason:
        raise TowersError('{emulate_link}: %s' % reason)
    sizes = plan.model_sizes(model_fn, input_shape)
    overlap = bucket_bytes(bucket, sizes) if facts.copy_per_worker else 0
    planned = {}
    for n in worker_counts:
        per_worker = batch_size // n
        step = compute
        if step is None:
            step = per_worker / measure_one_worker(model_fn, input_shape, num_classes, towers,
                                                   per_worker, warmup, window,
                                                   threads=threads)[0]
        planned[n] = plan.predict(mode, [n], step, per_worker, sizes, bandwidth, latency,
                                  towers, ps,
                                  plan.slice_bytes(input_shape, per_worker), overlap)[0]
        log('%s, %d worker(s): one worker\'s step (%d tower(s), batch %d) %.4f s here; planned '
            'step %.4f s' % (mode, n, towers, per_worker, step, planned[n]['step_s']))
    runs = {n: [] for n in worker_counts}
    for round_index in range(rounds):
        for n in worker_counts:
            command = ['launch', '--workers', str(n), '--ps', str(ps),
                       '--emulate-link', link, '--grace', '5', '--', 'train',
                       '--cluster-mode', mode, '--towers', str(towers)] + list(train_flags) + [
                '--log-every', '1']
            output = clusterbench.run_towers(command, timeout)
            seconds = batch_size / clusterbench.rate_in(output, command)
            runs[n].append((seconds, link_use(output)[1]))
            log('round %d/%d: %s, %d worker(s): %.4f s a step' % (
                round_index + 1, rounds, mode, n, seconds))
    rows = []
    for n in worker_counts:
        row = planned[n]
        tasks = []
        for name, sent, received in plan.task_bytes(mode, n, sizes, towers, row['ps'],
                                                    plan.slice_bytes(input_shape,
                                                                     batch_size // n)):
            measured = [use.get(name, (0, 0)) for _, use in runs[n]]
            tasks.append((name, sent, received, sum(m[0] for m in measured) / len(measured),
                          sum(m[1] for m in measured) / len(measured)))
        mean, stderr = mean_stderr([seconds for seconds, _ in runs[n]])
        rows.append({'workers': n, 'planned': row, 'tasks': tasks,
                     'measured_s': (mean, stderr if rounds > 1 else None)})
    return rows


def table_lines(rows):
    """The step planned and measured per mode and worker count, then each task's bytes."""
    lines = ['%-17s %-8s %-14s %-20s %s' % ('mode', 'workers', 'planned step', 'measured step',
                                            'measured / planned')]
    for row in rows:
        mean, stderr = row['measured_s']
        planned = row['planned']['step_s']
        measured = '%.4f s' % mean if stderr is None else '%.4f ± %.4f s' % (mean, stderr)
        lines.append('%-17s %-8d %-14s %-20s %.2f' % (row['planned']['mode'], row['workers'],
                                                      '%.4f s' % planned, measured,
                                                      mean / planned))
    lines.append('bytes a step, planned / measured:')
    lines.append('  %-17s %-8s %-9s %-21s %s' % ('mode', 'workers', 'task', 'sent', 'received'))
    for row in rows:
        for name, sent, received, sent_seen, received_seen in row['tasks']:
            lines.append('  %-17s %-8d %-9s %-21s %s' % (
                row['planned']['mode'], row['workers'], name,
                '%s / %s' % (bytes_text(sent), bytes_text(sent_seen)),
                '%s / %s' % (bytes_text(received), bytes_text(received_seen))))
    return lines


def check_verify(worker_counts, threads, latency, rounds, cpus=None):
    """SettingError unless `towers plan --verify` can run each count on this machine.

    The plan's compute is one worker's step timed alone, so each worker needs its threads on
    cores of its own (cpus: this process's, by default); the ps tasks mostly wait on the
    network and share them.
    """
    if rounds < 1:
        raise SettingError('{rounds} is at least 1, got %d', rounds)
    reason = unavailable()
    if reason:
        raise SettingError('{verify}: %s', reason)
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    most = max(1, cpus // threads)
    if max(worker_counts) > most:
        raise SettingError('{verify} runs every worker here on cores of its own, as the plan '
                           'times one: {workers} of at most %d with {threads} %d on %d CPUs, '
                           'not %d', most, threads, cpus, max(worker_counts))
    if latency and not has_netem():
        raise SettingError('{verify}: a {latency} above 0 needs the netem qdisc, which this '
                           'kernel does not have; give {latency} 0')


def verify_plan(modes, worker_counts, common, model_fn, input_shape, num_classes, batch, link,
                compute, towers=1, ps=1, rounds=2, window=20, bucket='auto', threads=1,
                log=print):
    """`towers plan --verify`: run_link_bench for each mode and worker count, n workers on a
    global batch of n * batch (weak scaling, as the plan), each run training train's
    warm-up and `window` steps, its step timed over the window.

    Args:
      common: the train flags of the model (--model, --dataset, --precision...).
      compute: seconds of one worker's step, as the plan has it.
      ps: ps tasks of the modes that have them, or 'workers' for one per worker.
    Returns:
      run_link_bench's rows, mode by mode.
    """
    flags = list(common) + ['--steps', str(TrainConfig.warmup_steps + window), '--eval-every',
                            '0', '--quiet', '--threads', str(threads)]
    rows = []
    for mode in modes:
        for n in worker_counts:
            all_reduce = CLUSTER_MODES[mode].copy_per_worker
            tasks = 0 if all_reduce else n if ps == 'workers' else ps
            rows += run_link_bench(
                mode, [n], flags + ['--batch-size', str(n * batch)] + (
                    ['--all-reduce-bucket', bucket] if all_reduce else []),
                model_fn, input_shape, num_classes, n * batch, link, towers, tasks, rounds,
                log=log, bucket=bucket, threads=threads, compute=compute)
    return rows
