"""The worker side of data.prefetch: the loop each prefetch worker runs, and what it reports.

A Prefetcher starts `work` as a thread's or a spawned process's target. A spawned worker is a
fresh interpreter that finds `work` by importing this module, so `work` must stay at module
level here, and this module light: numpy + stdlib only, it never imports TensorFlow (nor does
data.prefetch, the consumer side, which is the module to use).
"""
import multiprocessing
import pickle
import queue
import signal
import traceback

STARTING, IDLE = -2, -1   # a worker's state entry: one of these, or the batch it is loading


def work(worker, source, tasks, results, state, stop, in_process):
    """A worker's loop: takes (pass_id, index) tasks, puts (pass_id, index, worker, ok, payload).

    payload is the batch (pickled by the worker for processes, so a batch that cannot be
    pickled is reported instead of being dropped by the queue's feeder thread) or, when
    ok is False, (exception type, message, traceback text).
    """
    if in_process:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the consumer's; it closes us
        results.cancel_join_thread()   # at exit, drop results nobody will read instead of blocking
        parent = multiprocessing.parent_process()
        try:
            source = pickle.loads(source)
        except BaseException as exc:
            results.put((None, None, worker, False, _describe(exc)))
            return
    state[worker + 1] = IDLE
    sequence = hasattr(type(source), '__getitem__')
    iterator = iterator_pass = None
    while not stop.is_set():
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            if in_process and not parent.is_alive():
                return   # the consumer was killed: do not linger as an orphan
            continue
        if task is None:
            return
        pass_id, index = task
        if pass_id != state[0]:
            continue     # left over from an abandoned pass
        state[worker + 1] = index
        try:
            if sequence:
                batch = source[index]
            else:
                if iterator_pass != pass_id:
                    iterator, iterator_pass = iter(source), pass_id
                batch = next(iterator)
            if in_process:
                batch = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
            message = (pass_id, index, worker, True, batch)
        except BaseException as exc:   # SystemExit and friends too: the consumer must hear of it
            message = (pass_id, index, worker, False, _describe(exc))
        results.put(message)
        state[worker + 1] = IDLE


def _describe(exc):
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == 'builtins' else (
        f'{kind.__module__}.{kind.__qualname__}')
    try:
        message = ' '.join(str(exc).split())
    except Exception:
        message = '<unprintable message>'
    return name, message, traceback.format_exc()


def signal_name(number):
    """Signal `number`'s name, e.g. 'SIGKILL', for a worker's negative exit code."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
