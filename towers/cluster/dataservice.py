"""The tf.data service: its dispatcher and workers served, and watched from a trainer.

`towers data-service dispatcher` and `towers data-service worker` run TensorFlow's own
tf.data.experimental.service servers (serve_dispatcher, serve_worker) until they are asked
to stop; `towers train --data-service` sends its input pipeline to them
(towers/inputs/dataservice.py).

What TensorFlow 2.21 does not tell, Watch finds out. Its dispatcher lists every worker that
ever registered and never drops a lost one (`worker_timeout_ms` serves only snapshots there),
and a trainer's reads go on from the workers it knows after the dispatcher is gone. So a
Watch asks the dispatcher for its workers (its GetWorkers call) and each worker whether it
answers (GetWorkerTasks), over their own gRPC services, once a second in a thread of its own,
and says what changed: a worker come or lost, the dispatcher silent since when.

TensorFlow-free at import: grpc and TensorFlow are imported where they are used.
"""
import socket
import threading
import time

from towers.cluster.launch import bind_error
from towers.config import parse_address as parse_address  # the CLI's --dispatcher's too
from towers.errors import TowersError
from towers.names import DATA_SERVICE_MODES

MODES = DATA_SERVICE_MODES  # --data-service-mode, named once in towers/names.py
DEFAULT_TIMEOUT_S = 60.0  # without --cluster-timeout: how long the dispatcher may be silent
POLL_S = 1.0  # between a Watch's looks
ASK_S = 2.0  # how long one question to the dispatcher or a worker may take
_DISPATCHER = '/tensorflow.data.DispatcherService/'
_LEFT = []  # workers not stopped, see serve_worker
_WORKER = '/tensorflow.data.WorkerService/'


def _ask(address, method, timeout=ASK_S):
    """The serialized answer of one gRPC call with an empty request; None if none came."""
    import grpc
    channel = grpc.insecure_channel(address)
    try:
        call = channel.unary_unary(method, request_serializer=bytes,
                                   response_deserializer=bytes)
        return call(b'', timeout=timeout)
    except grpc.RpcError as e:
        # An answer that is an error is an answer: the server is there.
        return None if e.code() in (grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.DEADLINE_EXCEEDED) else b''
    finally:
        channel.close()


def dispatcher_workers(address, timeout=ASK_S):
    """The workers the dispatcher at address lists (every one that ever registered), or
    None when it does not answer."""
    answer = _ask(address, _DISPATCHER + 'GetWorkers', timeout)
    return None if answer is None else _worker_addresses(answer)


def worker_answers(address, timeout=ASK_S):
    """Whether the tf.data service worker at address answers."""
    return _ask(address, _WORKER + 'GetWorkerTasks', timeout) is not None


def _worker_addresses(payload):
    """The addresses of a GetWorkersResponse (repeated WorkerInfo workers = 1, each with
    string address = 1), read off the protobuf wire format."""
    return [_fields(info).get(1, b'').decode() for number, info in _items(payload)
            if number == 1]


def _fields(payload):
    return dict(_items(payload))


def _items(payload):
    """(field number, bytes) of a message's length-delimited fields; the others skipped."""
    position = 0
    while position < len(payload):
        key, position = _varint(payload, position)
        number, kind = key >> 3, key & 7
        if kind == 0:
            _, position = _varint(payload, position)
        elif kind == 1:
            position += 8
        elif kind == 5:
            position += 4
        elif kind == 2:
            size, position = _varint(payload, position)
            yield number, payload[position:position + size]
            position += size
        else:
            return


def _varint(payload, position):
    value, shift = 0, 0
    while True:
        byte = payload[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if byte < 0x80:
            return value, position


class Watch:
    """The dispatcher and its workers, looked at every `every` seconds in a thread.

    Args:
      dispatcher: its HOST:PORT.
      log: takes one line for each change: a worker that comes, one that stops answering
        (or answers again), the dispatcher silent or back.
      every: seconds between looks.
    Attributes:
      workers: {address: whether it answered at the last look}.
    """

    def __init__(self, dispatcher, log, every=POLL_S, who='data service'):
        self.dispatcher, self.log, self.every, self.who = dispatcher, log, every, who
        self.workers, self._heard = {}, time.monotonic()
        self._silent = False
        self._stop = threading.Event()
        self._thread = None

    def look(self):
        """One look: the dispatcher's workers, and which of them answer; logs what changed.
        Returns whether the dispatcher answered."""
        listed = dispatcher_workers(self.dispatcher)
        if listed is None:
            if not self._silent:
                self.log('%s: the dispatcher %s does not answer' % (self.who, self.dispatcher))
            self._silent = True
            return False
        if self._silent:
            self.log('%s: the dispatcher %s answers again' % (self.who, self.dispatcher))
        self._silent, self._heard = False, time.monotonic()
        for address in listed:
            answers = worker_answers(address)
            before = self.workers.get(address)
            self.workers[address] = answers
            if before is None:
                self.log('%s: worker %s %s (%s)' % (self.who, address, 'joined' if answers
                                                    else 'is listed but does not answer',
                                                    self.count()))
            elif before and not answers:
                self.log('%s: worker %s does not answer; %s (%s)' % (
                    self.who, address, 'the others go on with its work' if any(
                        self.workers.values()) else 'no worker is left', self.count()))
            elif before is False and answers:
                self.log('%s: worker %s answers again (%s)' % (self.who, address, self.count()))
        return True

    def count(self):
        """'workers answering: 2 of 3'."""
        return 'workers answering: %d of %d' % (sum(self.workers.values()), len(self.workers))

    def silent_for(self):
        """Seconds since the dispatcher last answered (0 while it answers)."""
        return time.monotonic() - self._heard if self._silent else 0.0

    def start(self):
        self._thread = threading.Thread(target=self._run, daemon=True, name='towers-watch')
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.every):
            self.look()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * ASK_S + self.every)


def _check_port(port):
    """TowersError unless port can be bound on every interface now (as gRPC binds it)."""
    error = bind_error(port)
    if error is not None:
        raise TowersError('cannot serve on port %d: %s; choose another {port}'
                          % (port, error.strerror or error))


def serve_dispatcher(port, log, stopped, every=POLL_S):
    """Run a tf.data service dispatcher on port until stopped(seconds) (which waits up to
    seconds) says why; logs its workers as they come and go."""
    import tensorflow as tf
    service = tf.data.experimental.service
    _check_port(port)
    try:
        server = service.DispatchServer(service.DispatcherConfig(port=port))
    except RuntimeError as e:  # what TensorFlow says when it cannot bind
        raise TowersError('cannot serve on port %d (%s); choose another {port}'
                          % (port, e)) from None
    log('data-service dispatcher: serving grpc://%s:%d; start workers with `towers '
        'data-service worker --dispatcher %s:%d`' % (socket.gethostname(), port,
                                                      socket.gethostname(), port))
    watch = Watch('localhost:%d' % port, log, every, who='data-service dispatcher')
    try:
        while not stopped(every):
            watch.look()
    finally:
        server._stop()


def serve_worker(dispatcher, port, host, log, stopped, wait_s=DEFAULT_TIMEOUT_S):
    """Run a tf.data service worker for the dispatcher at HOST:PORT until stopped() says
    why, trainers reaching it as host:its port. Waits up to wait_s for the dispatcher first
    (TensorFlow's worker would wait for it forever, deaf to signals).

    Returns:
      whether the server was stopped: not when its dispatcher is gone, for then a task that
      asks it for a split retries for an hour, and TensorFlow's stop waits for that, holding
      Python's lock (the process should just end).
    """
    import tensorflow as tf
    service = tf.data.experimental.service
    if port:
        _check_port(port)
    start, said = time.monotonic(), False
    while dispatcher_workers(dispatcher) is None:
        if time.monotonic() - start > wait_s:
            raise TowersError('the dispatcher %s did not answer within %.0f s; start `towers '
                              'data-service dispatcher` there, or fix {dispatcher}'
                              % (dispatcher, wait_s))
        if not said:
            log('data-service worker: waiting for the dispatcher %s' % dispatcher)
            said = True
        if stopped(POLL_S):
            return True
    try:
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=dispatcher, worker_address=host + ':%port%', port=port or 0,
            dispatcher_timeout_ms=int(1000 * wait_s)))
    except RuntimeError as e:
        raise TowersError('cannot serve on port %d (%s); choose another {port}'
                          % (port, e)) from None
    log('data-service worker: serving %s for the dispatcher %s' % (
        server._address.replace('localhost', host, 1), dispatcher))
    while not stopped(POLL_S):
        pass
    if dispatcher_workers(dispatcher) is None:
        _LEFT.append(server)  # not even collected: its __del__ would stop it
        return False
    server._stop()
    return True
