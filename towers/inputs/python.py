"""python: batches from a Python data source, loaded in parallel, then staged.

tensorpack's DataFlow idea: data only Python can produce comes in as a
sequence of batches, K worker processes or threads (towers/data/prefetch.py)
load it, and a StagingInput moves it onto the towers' devices.
"""
import numpy as np

from towers.data.prefetch import Prefetcher
from towers.errors import TowersError
from towers.inputs.staging import StagingInput


class PythonInput(StagingInput):
    """Batches from a Python data source, loaded in parallel, then staged.

    For data only Python can produce (tensorpack's DataFlow idea): `source` is
    any sequence (len + getitem) or iterable with a length whose items are
    (images [n, H, W, C] float32, labels [n] int) batches; one pass is one
    epoch. A towers.data.prefetch.Prefetcher runs its K workers; one loader thread
    moves their batches into the staging queue, in order when ordered=True. A
    worker's error stops training with that error, never a hang.

    Args:
      source: the data source; len(source) batches per epoch.
      num_workers, workers, ordered: see towers.data.prefetch.Prefetcher.
      capacity: host queue capacity, in batches.
    """

    name = 'python'

    def __init__(self, source, num_workers=2, workers='thread', ordered=True, capacity=4):
        super().__init__(capacity=capacity, batches=self._next_batch)
        self.prefetcher = Prefetcher(source, num_workers=num_workers, workers=workers,
                                     ordered=ordered)
        self.ordered = ordered
        self.steps_per_epoch = len(source)
        self._batches = None

    def start(self, sess, start_step, num_steps):
        if start_step % self.steps_per_epoch and not self.ordered:
            raise TowersError('cannot resume mid-epoch (step %d) from an unordered Python '
                              'source: which batches were trained is unknown; use ordered=True'
                              % start_step)
        self._batches = self._from_step(start_step)
        super().start(sess, start_step, num_steps)

    def _from_step(self, start_step):
        """Batches from global step start_step on, epoch after epoch."""
        skip = start_step % self.steps_per_epoch
        while True:
            for batch in self.prefetcher:
                if skip:
                    skip -= 1  # a resumed run: this epoch's first batches are done
                    continue
                yield batch

    def _next_batch(self, step):
        images, labels = next(self._batches)
        return np.asarray(images, np.float32), np.asarray(labels, np.int64)

    def stop(self, sess):
        # Close the workers first: it wakes a loader waiting on a slow batch, so
        # stopping never waits for one to finish.
        self._stopping = True
        try:
            self.prefetcher.close()
        finally:
            super().stop(sess)
