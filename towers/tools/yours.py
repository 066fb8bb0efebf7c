"""Your own average_gradients and split_batch in the towers, graded by `towers check --average
MODULE:FUNCTION` and `--split MODULE:FUNCTION`.

The lab (examples/lab/) leaves the recipe's combining step (and its cutting step) for the
student to write. check builds the N towers with it, in place of towers' own, and holds the
result against one device on the whole batch, as ever. Where an average differs, the tower
gradients of the first batch say what the function did instead: each classic mistake gives a
gradient of its own, computed here from the same tower gradients and compared.

  the shares' mean       sum_i (n_i / B) g_i        one device's gradient: right
  an unweighted mean     sum_i g_i / N              right only where the towers' shares are equal
  a sum                  sum_i g_i                  N times the step
  the wrong axis         a gradient of another shape than its variable's
"""
import importlib
import importlib.util
import inspect
import os
import sys

import numpy as np
import tensorflow as tf

from towers.errors import SettingError

tf1 = tf.compat.v1

MISTAKES = {
    'mean': 'an unweighted mean: each tower counts 1/{n} however many examples it had; weight '
            'tower i by its share of the batch, count_i / batch (the weights argument)',
    'sum': 'a sum, not a mean: the step is {n} times one device\'s; weight each tower by its '
           'share of the batch (the weights argument, which sum to 1)',
    'counts': 'a sum weighted by the towers\' example counts, not by their shares: divide by '
              'the batch (the weights argument is count_i / batch)',
}


def load(spec, flag='--average'):
    """The function MODULE:FUNCTION names: MODULE a module on the path (the current folder
    first) or a .py file. SettingError, one line, where it cannot be had."""
    where, _, name = spec.rpartition(':')
    if not where or not name.isidentifier():
        raise SettingError('%s takes MODULE:FUNCTION (a module or a .py file, a colon, the '
                           'function\'s name), got %r' % (flag, spec))
    try:
        module = _module(where, flag)
    except SettingError:
        raise
    except Exception as e:  # the user's module fails as it loads: name where and why
        line = _line_in(e, where)
        raise SettingError('%s: importing %s raised %s: %s%s' % (
            flag, where, type(e).__name__, e, ' (line %d)' % line if line else '')) from None
    function = getattr(module, name, None)
    if not callable(function):
        others = _functions(module)
        raise SettingError('%s: %s has no function %s%s' % (
            flag, where, name, ' (it has %s)' % ', '.join(others) if others else ''))
    return function


def _module(where, flag):
    if where.endswith('.py'):
        if not os.path.isfile(where):
            raise SettingError('%s: there is no file %s' % (flag, where))
        spec = importlib.util.spec_from_file_location(
            '_towers_yours_' + os.path.splitext(os.path.basename(where))[0], where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        if e.name and where.startswith(e.name):
            raise SettingError('%s: no module %s here or on the path (a file: give its path, '
                               'ending .py)' % (flag, where)) from None
        raise
    finally:
        sys.path.remove(os.getcwd())


def _line_in(error, where):
    """The line of `where` (a .py file) that the error came from, or None."""
    traceback = error.__traceback__
    line = getattr(error, 'lineno', None) if isinstance(error, SyntaxError) else None
    while traceback is not None:
        if os.path.abspath(traceback.tb_frame.f_code.co_filename) == os.path.abspath(where):
            line = traceback.tb_lineno
        traceback = traceback.tb_next
    return line


def _functions(module):
    return sorted(n for n, v in vars(module).items()
                  if inspect.isfunction(v) and not n.startswith('_'))


def as_average(function):
    """function as check calls an average: (tower_grads, weights) -> [(grad, var)].

    A function of one argument is the CIFAR-10 tutorial's average_gradients(tower_grads),
    which has no weights to take."""
    positional = [p for p in inspect.signature(function).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    takes_weights = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional)
    name = getattr(function, '__name__', 'your function')

    def average(tower_grads, weights):
        result = _called(function, name, *((tower_grads, weights) if takes_weights
                                           else (tower_grads,)))
        return checked(result, tower_grads, name)
    return average


def average_line(name, batch_size, shares):
    """The line that says an average of the caller's is in use; where the towers' shares are
    equal, that an unweighted mean is right on them, and which tower count cuts unevenly."""
    equal = len(shares) > 1 and len(set(shares)) == 1
    return 'averaging with %s in place of towers\' average_gradients%s' % (
        name, ' (the towers\' shares are equal here, %s: an unweighted mean is right on them; '
        '%d towers cut it unevenly)' % ('/'.join(map(str, shares)),
                                       _uneven_towers(batch_size, len(shares))) if equal else '')


def _uneven_towers(batch_size, num_towers):
    """The next tower count past num_towers that does not divide the batch."""
    count = num_towers + 1
    while batch_size % count == 0 and count < batch_size:
        count += 1
    return count


def cut_line(name, num_towers):
    """The line that says a cut of the caller's is in use, and what it was held to."""
    return ("cutting with %s in place of towers' split_batch: every example to one tower, "
            'counted once, the batch whole%s' % (name, ' (and on %d examples over %d towers '
                                                 'too)' % (num_towers - 1, num_towers)
                                                 if num_towers > 1 else ''))


def _called(function, name, *args):
    """function(*args), its failure one line: not written yet, or what it raised and where."""
    try:
        return function(*args)
    except NotImplementedError as e:
        raise SettingError('your %s is not written yet (NotImplementedError%s)'
                           % (name, ': %s' % e if str(e) else '')) from None
    except Exception as e:  # the student's code fails as the towers are built
        where = inspect.getsourcefile(function) or ''
        line = _line_in(e, where) if where else None
        raise SettingError('your %s raised %s%s: %s' % (
            name, type(e).__name__, ' at %s line %d' % (os.path.relpath(where), line)
            if line else '', str(e).strip().splitlines()[0] if str(e).strip() else '')) from None


def checked(result, tower_grads, name='average_gradients'):
    """The function's [(grad, var)], SettingError where it cannot be applied: not one pair a
    variable, a variable not the towers', or a gradient of another shape than its
    variable's (the mean taken over the wrong axis)."""
    variables = [v for _, v in tower_grads[0]]
    try:
        pairs = [(g, v) for g, v in result]
    except (TypeError, ValueError):
        raise SettingError('your %s returned %s: it returns a list of (gradient, variable), '
                           'one per variable' % (name, type(result).__name__)) from None
    if len(pairs) != len(variables) or {id(v) for _, v in pairs} != {id(v) for v in variables}:
        raise SettingError('your %s returned %d (gradient, variable) pairs for the towers\' %d '
                           'variables: one per variable, each the variable of tower 0\'s pair'
                           % (name, len(pairs), len(variables)))
    for grad, var in pairs:
        if grad is not None and not grad.shape.is_compatible_with(var.shape):
            raise SettingError(
                'your %s averaged over the wrong axis: it gives %s a gradient of shape %s, its '
                'shape is %s; stack the towers\' gradients on a new axis 0 and reduce over that '
                'axis' % (name, var.op.name, grad.shape.as_list(), var.shape.as_list()))
    return pairs


def diagnose(tower_grads, counts, got, expected, tolerance):
    """What the function did, from one batch's values: (variable, words) for the first
    variable whose gradient is off, or None where none is.

    Args:
      tower_grads: {variable name: [N arrays]}, each tower's gradient, in variable order.
      counts: N ints, the examples each tower had.
      got: {variable name: array}, the function's gradient.
      expected: {variable name: array}, one device's.
      tolerance: the largest difference allowed, relative to the largest gradient (at least 1).
    """
    scale = max(1.0, max(float(np.max(np.abs(g))) for g in expected.values()))
    n = len(counts)
    for name, grads in tower_grads.items():
        off = float(np.max(np.abs(got[name] - expected[name])))
        if off <= tolerance * scale:
            continue
        candidates = {'mean': sum(grads) / n, 'sum': sum(grads),
                      'counts': sum(c * g for c, g in zip(counts, grads))}
        local = max(1.0, float(np.max(np.abs(got[name]))))
        for mistake, gradient in candidates.items():
            if float(np.max(np.abs(got[name] - gradient))) <= 1e-5 * local:
                return name, MISTAKES[mistake].format(n=n)
        return name, ('none of the classic mistakes (an unweighted mean, a sum, the wrong '
                      'axis): off by %.3g where the gradient reaches %.3g'
                      % (off, float(np.max(np.abs(expected[name])))))
    return None


def as_split(function, num_towers, batch_size):
    """function as check cuts the batch: (images, labels, num_towers) -> num_towers
    TowerSlices; first held to what a cut must do, on this batch and on one smaller than the
    towers: SettingError naming the first thing it does not."""
    name = getattr(function, '__name__', 'your function')
    for batch in [batch_size] + ([num_towers - 1] if num_towers > 1 else []):
        _check_cut(_cut_of(function, name, batch, num_towers), name, batch, num_towers)

    def split(images, labels, count):
        return _called(function, name, images, labels, count)
    return split


def _cut_of(function, name, batch, num_towers):
    """[(count, batch, [the examples it holds, by number], rows)] of each slice the function
    cuts from a batch whose example i is the number i."""
    graph = tf.Graph()
    with graph.as_default():
        numbers = tf.range(batch)
        images = tf.reshape(tf.cast(numbers, tf.float32), [batch, 1, 1, 1])
        returned = _called(function, name, images, tf.cast(numbers, tf.int64), num_towers)
        try:
            slices = list(returned)
            fetches = [(tf.convert_to_tensor(s.count), tf.convert_to_tensor(s.batch),
                        tf.shape(s.labels)[0], tf.cast(s.labels, tf.int64)) for s in slices]
        except (TypeError, AttributeError, ValueError):
            raise SettingError('your %s returned %s: it returns one TowerSlice(images, labels, '
                               'count, batch) per tower (towers.slicing.TowerSlice)'
                               % (name, type(returned).__name__)) from None
        with tf1.Session(graph=graph) as sess:
            cut = sess.run(fetches)
    if len(cut) != num_towers:
        raise SettingError('your %s cut %d slices for %d towers: one per tower'
                           % (name, len(cut), num_towers))
    return [(int(count), int(whole), int(rows), [int(n) for n in held[:count]])
            for count, whole, rows, held in cut]


def _check_cut(cut, name, batch, num_towers):
    counts = [count for count, _, _, _ in cut]
    over = '%d examples over %d towers' % (batch, num_towers)
    if sum(counts) < batch:
        raise SettingError('your %s gives the towers %s of %s: %d left out; the remainder goes '
                           'to the first towers, one more each'
                           % (name, '+'.join(map(str, counts)), over, batch - sum(counts)))
    if sum(counts) > batch:
        raise SettingError('your %s gives the towers %s of %s: %d counted twice; each example '
                           'to exactly one tower' % (name, '+'.join(map(str, counts)), over,
                                                     sum(counts) - batch))
    short = [(i, count, rows) for i, (count, _, rows, _) in enumerate(cut) if rows < count]
    if short:
        raise SettingError('your %s says tower %d has %d examples and hands it %d images, with '
                           '%s: count is how many of its rows are real' % ((name,) + short[0]
                                                                          + (over,)))
    held = sorted(n for _, _, _, numbers in cut for n in numbers)
    if held != list(range(batch)):
        twice = sorted({n for n in held if held.count(n) > 1})
        raise SettingError('your %s gives example %d to two towers and example %d to none, with '
                           '%s: each example to exactly one' % (
                               name, twice[0], min(set(range(batch)) - set(held)), over))
    wrong = [(i, whole) for i, (_, whole, _, _) in enumerate(cut) if whole != batch]
    if wrong:
        raise SettingError('your %s says tower %d\'s batch is %d, with %s: a tower counts '
                           'count / batch of the update, so batch is the whole batch\'s size'
                           % (name, wrong[0][0], wrong[0][1], over))
    empty = [i for i, (count, _, rows, _) in enumerate(cut) if rows == 0]
    if empty:
        raise SettingError('your %s hands tower %d no image at all, with %s: give a tower '
                           'without examples a stand-in (the batch\'s last) with count 0, as '
                           'some kernels cannot take an empty batch' % (name, empty[0], over))
