"""Parallel loading of Python data sources (tensorpack's DataFlow + MultiProcessRunner idea).

A *source* is any object with a length whose items are (images, labels) batches: images
numpy [n, H, W, C], labels [n]. `Prefetcher` runs K workers, processes or threads, that load
batches ahead of the consumer, so producing batch k+1 in Python overlaps training on batch k.

    with Prefetcher(source, num_workers=4) as batches:
        for epoch in range(num_epochs):
            for images, labels in batches:      # len(source) batches, in source order
                ...

Numpy + stdlib only: importing this module never imports TensorFlow.
"""
import multiprocessing
import pickle
import queue
import threading
import time
import traceback
import warnings

from towers.data.errors import DataError
from towers.data.prefetch_worker import IDLE, STARTING, signal_name, work

# Workers are started with 'spawn': each is a fresh interpreter that inherits nothing from the
# consumer. 'fork' copies a process that may hold TensorFlow's thread pools and locks mid-state,
# and the child can deadlock on a lock whose owner thread was not copied. 'forkserver' is no
# cure either: its server first imports the consumer's main module (its default preload), so a
# training script that imports TensorFlow at the top leaves TF in the very process every worker
# is forked from. 'spawn' is safe whatever the consumer has imported, and exists on every OS.
# Its price, a fresh interpreter per worker that re-imports the main module as __mp_main__, is
# paid once per Prefetcher: workers live across passes until close().
START_METHOD = 'spawn'

_POLL_S = 0.1    # how often a waiting consumer checks that every worker is still alive
_GRACE_S = 1.0   # how long close() lets workers stop by themselves before terminating them


class PrefetchError(DataError):
    """A prefetch worker failed or died. The message is one line.

    Attributes:
        index: int, the batch being loaded, or None when unknown.
        worker: int, the worker's number in [0, num_workers), or None.
        details: str, the worker's traceback text, or None when it left none (it died).
    """

    def __init__(self, message, index=None, worker=None, details=None):
        super().__init__(message)
        self.index = index
        self.worker = worker
        self.details = details


class Prefetcher:
    """Yields a source's batches, loaded ahead by `num_workers` workers.

    Each pass (`for batch in prefetcher`) yields exactly len(source) batches, then stops;
    workers start on the first pass (or on entering a `with` block) and serve every later
    pass until close(), so an epoch loop pays the start-up once.

    Parallel loading needs random access. When the source has `__getitem__` (`source[i]` is
    batch i, for i in [0, len(source))), the workers load different indices at once. A source
    with only `__len__` and `__iter__` is iterated by a single worker; num_workers > 1 on one
    is a ValueError.

    With workers='process' the source is pickled into each worker, so it must be picklable:
    define its class at module level and hold no lambdas, open files or locks; each worker
    loads from its own copy, and state the source changes there does not come back. Workers
    are spawned (see START_METHOD), which re-imports the main module in each of them: a script
    must start its Prefetcher under `if __name__ == '__main__':`. Use workers='thread' for
    sources that are I/O bound or release the GIL (numpy, decoders).

    A pass raises PrefetchError when the source raises (at that batch's turn when ordered) or
    a worker dies without a word (it is polled every _POLL_S, so this never hangs); the
    Prefetcher is then closed. Use it in a `with` block or close() it: that ends every
    worker, also after a loop that stopped early.

    Args:
        source: sized iterable of (images [n, H, W, C], labels [n]) numpy batches.
        num_workers: int >= 1, how many workers load batches.
        workers: 'process' or 'thread'.
        ordered: yield batch 0, 1, 2, ... whatever finishes first: the same sequence as
            iterating the source directly (which must match source[0], source[1], ...).
            False yields batches as they finish.
        buffer: int >= 1, how many batches may be loading or loaded but not yet yielded; this
            bounds memory, reordering included. Defaults to 2 * num_workers.

    Raises:
        TypeError: source has no length, or is not picklable with workers='process'.
        ValueError: a bad argument, or num_workers > 1 on a source without __getitem__.
    """

    def __init__(self, source, num_workers=2, workers='process', ordered=True, buffer=None):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f'num_workers must be an int >= 1, got {num_workers!r}')
        if workers not in ('process', 'thread'):
            raise ValueError(f"workers must be 'process' or 'thread', got {workers!r}")
        buffer = 2 * num_workers if buffer is None else buffer
        if not isinstance(buffer, int) or buffer < 1:
            raise ValueError(f'buffer must be an int >= 1, got {buffer!r}')
        try:
            self._length = len(source)
        except TypeError:
            raise TypeError(f'source {type(source).__name__} has no len(); a Prefetcher needs '
                            'to know how many batches one pass yields') from None
        self._sequence = hasattr(type(source), '__getitem__')
        if num_workers > 1 and not self._sequence:
            raise ValueError(
                f'source {type(source).__name__} has no __getitem__, so only one worker can '
                f'iterate it, but num_workers={num_workers}; give the source a __getitem__ '
                '(source[i] returns batch i) to load in parallel, or use num_workers=1')
        if workers == 'process':
            try:
                source = pickle.dumps(source, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise TypeError(
                    f"source {type(source).__name__} cannot be pickled, which workers='process' "
                    f'needs ({type(exc).__name__}: {exc}); define its class at module level '
                    "without lambdas, open files or locks, or use workers='thread'") from exc
        self._source = source   # the pickled bytes for processes
        self._num_workers = num_workers
        self._in_process = workers == 'process'
        self._ordered = ordered
        self._buffer = buffer
        self._workers = []
        self._pass_id = 0       # state[0] holds the active pass's id, 0 for none
        self._closing = threading.Event()
        self._closed = False
        self._lock = threading.RLock()

    def __len__(self):
        return self._length

    def __enter__(self):
        with self._lock:
            self._start()
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:   # interpreter shutdown: multiprocessing ends daemon workers itself
            pass

    def __iter__(self):
        """Starts a pass: an iterator over len(source) batches. A newer pass ends older ones."""
        with self._lock:
            self._start()
            self._pass_id += 1
            self._state[0] = self._pass_id
            return self._run_pass(self._pass_id)

    def close(self):
        """Ends every worker; safe to call twice and from another thread than the consumer's.

        Workers get _GRACE_S to stop by themselves, then processes are terminated (and killed).
        A thread busy inside the source cannot be stopped: it ends when its batch does.
        """
        self._closing.set()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers, self._workers = self._workers, []
            if not workers:
                return
            self._stop.set()
            for _ in workers:
                self._tasks.put(None)
            deadline = time.monotonic() + _GRACE_S
            for worker in workers:
                worker.join(max(0.0, deadline - time.monotonic()))
            if self._in_process:
                for worker in workers:
                    if worker.is_alive():
                        worker.terminate()
                for worker in workers:
                    worker.join(_GRACE_S)
                    if worker.is_alive():
                        worker.kill()
                        worker.join()
                self._tasks.close()
                self._tasks.join_thread()
                self._results.close()
            else:
                for k, worker in enumerate(workers):
                    if worker.is_alive():
                        warnings.warn(f'prefetch worker thread {k} is still loading a batch '
                                      'after close(); it ends when that batch does',
                                      RuntimeWarning, stacklevel=2)

    def _start(self):
        if self._closing.is_set():
            raise ValueError('this Prefetcher is closed; make a new one')
        if self._workers:
            return
        k = self._num_workers
        if self._in_process:
            context = multiprocessing.get_context(START_METHOD)
            self._tasks, self._results = context.Queue(), context.Queue()
            self._state = context.Array('q', [0] + [STARTING] * k, lock=False)
            self._stop = context.Event()
            make, kind = context.Process, 'process'
        else:
            self._tasks, self._results = queue.Queue(), queue.Queue()
            self._state = [0] + [STARTING] * k
            self._stop = threading.Event()
            make, kind = threading.Thread, 'thread'
        args = (self._source, self._tasks, self._results, self._state, self._stop,
                self._in_process)
        workers = [make(target=work, args=(i,) + args, daemon=True, name=f'prefetch-{kind}-{i}')
                   for i in range(k)]
        try:
            for worker in workers:
                worker.start()
                self._workers.append(worker)   # close() ends only workers that started
        except BaseException:
            self.close()
            raise

    def _run_pass(self, pass_id):
        n = self._length
        sent = done = 0   # tasks sent to workers; batches yielded
        held = {}         # ordered: results that arrived before their turn, at most `buffer`
        try:
            while done < n:
                while sent < n and sent - done < self._buffer:
                    self._with_lock(pass_id, self._tasks.put, (pass_id, sent))
                    sent += 1
                if self._ordered:
                    while done not in held:
                        result = self._receive(pass_id)
                        held[result[0]] = result
                    result = held.pop(done)
                else:
                    result = self._receive(pass_id)
                done += 1
                yield self._unpack(result)
        finally:
            if self._pass_id == pass_id and not self._closed:
                self._state[0] = 0   # workers skip this pass's leftover tasks

    def _with_lock(self, pass_id, function, *args):
        with self._lock:
            if self._closing.is_set():
                raise PrefetchError('the Prefetcher was closed while a pass over it was running')
            if self._pass_id != pass_id:
                raise RuntimeError('a newer pass over this Prefetcher started; one pass at a time')
            return function(*args)

    def _receive(self, pass_id):
        """Waits for the next result of this pass: (index, worker, ok, payload)."""
        while True:
            try:
                message = self._with_lock(pass_id, self._results.get, True, _POLL_S)
            except queue.Empty:
                self._with_lock(pass_id, self._check_alive)
                continue
            result_pass, result = message[0], message[1:]
            if result_pass is None:   # the worker could not load the source
                self._unpack(result)
            if result_pass == pass_id:
                return result

    def _check_alive(self):
        for k, worker in enumerate(self._workers):
            if worker.is_alive():
                continue
            index = self._state[k + 1]
            doing = {STARTING: 'while starting', IDLE: 'between batches'}.get(
                index, f'while loading batch {index}')
            if not self._in_process:
                self._fail(PrefetchError(f'prefetch worker thread {k} ended {doing} without '
                                         'reporting why', index if index >= 0 else None, k))
            code = worker.exitcode
            if code is not None and code < 0:
                how = f'was killed by signal {signal_name(-code)} (exit code {code})'
            else:
                how = f'died with exit code {code}'
            if index == STARTING:
                why = ('see its traceback on stderr; with start method spawn each worker '
                       're-imports the main module, so code that starts a Prefetcher must sit '
                       "under if __name__ == '__main__':")
            else:
                why = ('the source crashed or exited it (out of memory, a segfault in an '
                       'extension, os._exit)')
            self._fail(PrefetchError(
                f'prefetch worker {k} (pid {worker.pid}) {how} {doing} without reporting an '
                f'error; {why}', index if index >= 0 else None, k))

    def _unpack(self, result):
        index, worker, ok, payload = result
        if ok:
            if not self._in_process:
                return payload
            try:
                return pickle.loads(payload)
            except Exception as exc:
                self._fail(PrefetchError(
                    f'batch {index} from prefetch worker {worker} could not be unpickled: '
                    f'{type(exc).__name__}: {exc}', index, worker, traceback.format_exc()))
        type_name, message, details = payload
        if index is None:
            text = f'prefetch worker {worker} could not load the source: {type_name}: {message}'
        elif type_name == 'StopIteration' and not self._sequence:
            text = (f'the source ran out after {index} batches but its len() is {self._length}; '
                    'make __len__ agree with what __iter__ yields')
        else:
            text = (f'batch {index} of {self._length} failed in prefetch worker {worker}: '
                    f'{type_name}: {message}')
        self._fail(PrefetchError(text, index, worker, details))

    def _fail(self, error):
        self.close()
        raise error
