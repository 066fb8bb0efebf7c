"""The data-service tests' helpers: a tiny ImageNet folder whose labels number its records,
and tf.data service servers in this process."""
import contextlib
import os
import queue
import threading
import time

import numpy as np
import tensorflow as tf

from towers.data import imagenet


def imagenet_folder(folder, sizes=(6, 6, 6, 6)):
    """Shards of JPEGs labelled 1, 2, ... in order (shard k holds sizes[k]) and a labels.txt
    of as many classes: a record's class is its number."""
    os.makedirs(folder, exist_ok=True)
    label = 0
    for index, count in enumerate(sizes):
        path = os.path.join(folder, 'train-%05d-of-%05d' % (index, len(sizes)))
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(count):
                label += 1
                rng = np.random.RandomState(label)
                small = rng.randint(0, 256, (4, 4, 3)).astype(np.float32)
                picture = tf.cast(tf.image.resize(small, [40, 48]), tf.uint8)
                writer.write(imagenet.make_example(tf.io.encode_jpeg(picture).numpy(), label,
                                                   40, 48))
    with open(os.path.join(folder, imagenet.LABELS), 'w', encoding='utf-8') as f:
        f.write(''.join('class%d\n' % i for i in range(label)))
    return folder


@contextlib.contextmanager
def local_service(workers=2):
    """(a dispatcher's HOST:PORT, its WorkerServers) of servers in this process."""
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    address = dispatcher.target.split('://', 1)[1]
    servers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
               for _ in range(workers)]
    try:
        yield address, servers
    finally:
        for server in servers + [dispatcher]:
            server._stop()


class Lines:
    """A process's stdout lines, read in a thread: wait_for(text) with a bound."""

    def __init__(self, process):
        self.lines, self._queue = [], queue.Queue()
        threading.Thread(target=self._read, args=(process.stdout,), daemon=True).start()

    @classmethod
    def of_fork(cls, run):
        """The stdout lines of a run the fork server started (tests/faults/runs.py Forked),
        which its own thread reads: their queue, taken over from it."""
        lines = cls.__new__(cls)
        lines.lines, lines._queue = [], run._lines
        return lines

    def _read(self, stream):
        for line in stream:
            self._queue.put(line.rstrip('\n'))
        self._queue.put(None)

    def wait_for(self, text, seconds=120.0):
        """The first line (read so far or to come) holding text; AssertionError after seconds
        or at the end of the output."""
        deadline = time.monotonic() + seconds
        while True:
            found = next((line for line in self.lines if text in line), None)
            if found is not None:
                return found
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError('no %r within %.0f s in %s' % (text, seconds,
                                                                     self.lines)) from None
            if line is None:
                raise AssertionError('no %r in %s' % (text, self.lines))
            self.lines.append(line)

    def rest(self, seconds=120.0):
        """Every line, once the output ends (within seconds)."""
        deadline = time.monotonic() + seconds
        while True:
            line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                return self.lines
            self.lines.append(line)
