"""--trace FILE: one training step, fully traced, as a Chrome trace and a short summary.

The Trace callback asks the Trainer to trace one step (towers/session.py runs
it with FULL_TRACE options) and hands its RunMetadata to the functions below.

The step runs with RunOptions(trace_level=FULL_TRACE); TensorFlow's own
timeline module (tensorflow.python.client.timeline) turns its step stats into
Chrome-trace JSON, which Perfetto (ui.perfetto.dev) or chrome://tracing open:
one row per device, where the towers are seen running side by side. The
summary says the step time, how long each device was busy (the union of its
ops' intervals) and idle, and how long the averaging and the apply took.
"""
import json
import os
import re

from tensorflow.python.client import timeline

from towers.callbacks import Callback
from towers.data.atomic import atomic_output
from towers.deviceplan import short_device
from towers.errors import SettingError, TowersError

APPLY_LABEL = re.compile(r'= (Resource)?(Sparse)?Apply\w*\(')  # in a timeline label
AVERAGE_SCOPES = ('average_gradients', 'all_reduce')  # where the towers' gradients meet


def check_trace_step(step):
    """SettingError unless step is None (the first after warm-up) or a step number >= 1."""
    if step is not None and not (isinstance(step, int) and step >= 1):
        raise SettingError('{trace_step} must be at least 1, got %s', step)


def check_output(path, setting):
    """Raise SettingError now, not after training, if path cannot be written.

    Args:
      setting: the parameter that names the file, e.g. 'trace'.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SettingError('{%s} %%s: folder %%s does not exist' % setting, path, folder)
    if not os.access(folder, os.W_OK):
        raise SettingError('{%s} %%s: folder %%s is not writable' % setting, path, folder)


class Trace(Callback):
    """--trace FILE: one step fully traced, written as Chrome-trace JSON, and summarised.

    Args:
      path: the .json file to write.
      step: the global step to trace; None: the first after warm-up (or the
        run's last, if it is shorter).
      plot: also draw the step as a PNG timeline there (needs matplotlib).
    """

    order = 45

    def __init__(self, path, step=None, plot=None):
        check_trace_step(step)
        check_output(path, 'trace')  # now, not after training
        if plot:
            check_output(plot, 'trace_plot')
        self.path, self.step, self.plot = path, step, plot

    def before_train(self, trainer):
        self.at = self.step or min(trainer.step + trainer.warmup_steps + 1, trainer.num_steps)
        if not trainer.step < self.at <= trainer.num_steps:
            raise SettingError('{trace_step} %d is not among the steps this run takes (%d to %d)',
                               self.at, trainer.step + 1, trainer.num_steps)

    def wants_trace(self, trainer):
        return trainer.step + 1 == self.at

    def after_step(self, trainer, values):
        # Other callbacks trace steps of their own (the placement audit the first).
        if trainer.step == self.at and 'run_metadata' in values:
            title = 'step %d on %d tower(s)' % (trainer.step, len(trainer.tower_devices))
            for line in report(values['run_metadata'], self.path, trainer.step, self.plot,
                               title):
                trainer.log(line)


def write_trace(run_metadata, path):
    """The step as Chrome-trace JSON at path (written whole or not at all)."""
    chrome = timeline.Timeline(run_metadata.step_stats).generate_chrome_trace_format()
    json.loads(chrome)  # it is JSON, or this fails before anything is written
    with atomic_output(path, suffix='.json') as out:
        out.write(chrome.encode())


def summarize(run_metadata):
    """What the step did, per device, in milliseconds.

    Returns:
      dict: step_ms, busy_ms {device: ms}, idle_ms {device: ms}, average_ms
      (the gradient averaging or all-reduce ops), apply_ms (the optimizer's
      apply ops); devices are the compute devices (not memcpy streams).
    """
    intervals, average, apply = {}, [], []
    for device in _compute_rows(run_metadata):
        name = short_device(device.device)
        for node in device.node_stats:
            start = node.all_start_micros
            end = start + max(node.all_end_rel_micros, 1)
            intervals.setdefault(name, []).append((start, end))
            if node.node_name.startswith(AVERAGE_SCOPES):
                average.append((start, end))
            elif APPLY_LABEL.search(node.timeline_label):
                apply.append((start, end))
    if not intervals:
        return {'step_ms': 0.0, 'busy_ms': {}, 'idle_ms': {}, 'average_ms': 0.0, 'apply_ms': 0.0}
    first = min(s for spans in intervals.values() for s, _ in spans)
    last = max(e for spans in intervals.values() for _, e in spans)
    busy = {device: _union(spans) / 1e3 for device, spans in sorted(intervals.items())}
    step = (last - first) / 1e3
    return {'step_ms': step, 'busy_ms': busy,
            'idle_ms': {device: step - ms for device, ms in busy.items()},
            'average_ms': _union(average) / 1e3, 'apply_ms': _union(apply) / 1e3}


def report(run_metadata, path, step, plot=None, title=None):
    """Write the step's Chrome trace (and with plot its timeline PNG); return the summary lines."""
    write_trace(run_metadata, path)
    if plot:
        plot_timeline(run_metadata, plot, title or 'step %d' % step)
    return summary_lines(summarize(run_metadata), path, step)


def summary_lines(summary, path, step):
    lines = ['trace of step %d: %s (open it in ui.perfetto.dev or chrome://tracing)'
             % (step, path),
             'step %.1f ms; averaging %.1f ms, apply %.1f ms'
             % (summary['step_ms'], summary['average_ms'], summary['apply_ms'])]
    for device, busy in summary['busy_ms'].items():
        share = busy / summary['step_ms'] if summary['step_ms'] else 0.0
        lines.append('  %-8s busy %.1f ms (%.0f%%), idle %.1f ms'
                     % (device, busy, 100 * share, summary['idle_ms'][device]))
    return lines


def _compute_rows(run_metadata):
    """The step stats rows where ops' compute time is: a device's own row, or, on a GPU,
    its 'stream:all' row (its own row then holds the kernel launches)."""
    rows = {}
    for device in run_metadata.step_stats.dev_stats:
        base = device.device.split('/stream')[0]
        if '/device:' not in base or '/memcpy' in device.device:
            continue
        if device.device.endswith('/stream:all') or base not in rows:
            rows[base] = device
    return [rows[base] for base in sorted(rows)]


def _union(spans):
    """Total length covered by [start, end) intervals."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def pyplot_for(setting):
    """matplotlib's pyplot, drawing to files; TowersError naming the setting without it."""
    try:
        import matplotlib
    except ImportError:
        raise TowersError('{%s} needs matplotlib: pip install matplotlib' % setting) from None
    matplotlib.use('Agg')
    from matplotlib import pyplot
    return pyplot


def save_png(pyplot, figure, path, dpi=100):
    """Write the figure to path whole (never half a file), and close it."""
    with atomic_output(os.path.abspath(path), suffix='.png') as out:
        figure.savefig(out, format='png', dpi=dpi)
    pyplot.close(figure)


def plot_timeline(run_metadata, path, title='one training step'):
    """A PNG of the step: one row per device, a bar per op, coloured by what it does."""
    pyplot = pyplot_for('trace_plot')
    colours = {'tower compute': '#4c72b0', 'gradient averaging': '#dd8452',
               'apply': '#55a868', 'other': '#b0b0b0'}
    rows = {}
    for device in _compute_rows(run_metadata):
        for node in device.node_stats:
            kind = ('gradient averaging' if node.node_name.startswith(AVERAGE_SCOPES) else
                    'apply' if APPLY_LABEL.search(node.timeline_label) else
                    'tower compute' if node.node_name.startswith('tower_') else 'other')
            rows.setdefault(short_device(device.device), []).append(
                (node.all_start_micros, max(node.all_end_rel_micros, 1), kind))
    start = min(s for spans in rows.values() for s, _, _ in spans)
    figure, axes = pyplot.subplots(figsize=(9, 1 + 0.7 * len(rows)))
    for y, device in enumerate(sorted(rows, reverse=True)):
        for kind, colour in colours.items():
            bars = [((s - start) / 1e3, d / 1e3) for s, d, k in rows[device] if k == kind]
            axes.broken_barh(bars, (y - 0.35, 0.7), facecolors=colour,
                             label=kind if y == 0 else None)
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels(sorted(rows, reverse=True))
    axes.set_xlabel('ms since the step began')
    axes.set_title(title)
    axes.legend(loc='upper center', bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8,
                frameon=False)
    figure.tight_layout()
    save_png(pyplot, figure, path, dpi=90)
