"""How `towers bench` says its rows: where the variables are, the ratios, the table.

Each row is a dict (towers/tools/bench.py run_bench): input, towers,
precision, devices, mean and stderr of images/sec; add_ratios adds what the
table prints beside them, each ratio between rows measured in the same turns.
"""
from towers.names import XLA_CPU_FLAG


def variables_line(homes):
    """'variables: /gpu:0'; where tower counts differ, 'variables: /gpu:0 at 1 tower(s); /cpu:0
    at 2,4 tower(s)'. homes: {where (DevicePlan.describe): [tower counts]}."""
    return 'variables: ' + ('; '.join('%s at %s tower(s)' % (where, ','.join(map(str, counts)))
                                      for where, counts in homes.items())
                            if len(homes) > 1 else next(iter(homes)))


def add_ratios(rows):
    """Each row's vs_synthetic (to the synthetic row of its tower count and precision; None
    without one), vs_first (to its input and precision at the first tower count) and
    vs_precision (to its tower count and input in the first precision)."""
    synthetic = {(r['towers'], r['precision']): r['mean'] for r in rows
                 if r['input'] == 'synthetic'}
    first, first_precision = {}, {}
    for row in rows:
        first.setdefault((row['input'], row['precision']), row['mean'])
        first_precision.setdefault((row['towers'], row['input']), row['mean'])
        row['vs_first'] = row['mean'] / first[row['input'], row['precision']]
        row['vs_precision'] = row['mean'] / first_precision[row['towers'], row['input']]
        key = row['towers'], row['precision']
        row['vs_synthetic'] = row['mean'] / synthetic[key] if key in synthetic else None


def table_lines(rows, precisions):
    """The table: a header, then a line per row (with add_ratios' ratios); a column against
    the first precision where there are several."""
    several = len(precisions) > 1
    lines = [('%-10s %-7s %-10s %-28s %-20s %-13s %-15s%s' % (
        'input', 'towers', 'precision', 'devices', 'images/sec', 'vs synthetic',
        'vs %d tower(s)' % rows[0]['towers'], ' vs %s' % precisions[0] if several else ''))
        .rstrip()]
    for row in rows:
        vs_synthetic = '%.3f' % row['vs_synthetic'] if row['vs_synthetic'] else '-'
        lines.append(('%-10s %-7d %-10s %-28s %-20s %-13s %-15.3f%s' % (
            row['input'], row['towers'], row['precision'], row['devices'],
            '%.1f ± %.1f' % (row['mean'], row['stderr']), vs_synthetic, row['vs_first'],
            ' %.3f' % row['vs_precision'] if several else '')).rstrip())
    return lines


def xla_line(rows):
    """What XLA compiled in one step of each row (its xla_clusters): 'XLA: every row ran
    compiled clusters (3 a step)', or the rows that ran none."""
    bare = ['%s/%d/%s' % (r['input'], r['towers'], r['precision']) for r in rows
            if not r['xla_clusters']]
    if bare:
        return ('XLA: no cluster compiled in %s (on CPU towers TensorFlow clusters only when '
                'TF_XLA_FLAGS holds %s before it first looks at its devices, as towers bench '
                '--xla sets it)' % (', '.join(bare), XLA_CPU_FLAG))
    counts = sorted({r['xla_clusters'] for r in rows})
    return 'XLA: every row ran compiled clusters (%s a step)' % (
        counts[0] if len(counts) == 1 else '%d to %d' % (counts[0], counts[-1]))
