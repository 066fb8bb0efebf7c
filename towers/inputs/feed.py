"""feed: placeholders fed from Python each step, the classic loop and the reference.

The Python gather and the host-to-device copy sit on every step's critical path.
The placeholders are the core's FedBatch (towers/placeholders.py), what a graph
built without an input source reads too.
"""
import functools

from towers.inputs.base import InputSource, sampled_batch
from towers.placeholders import FedBatch


class FeedInput(FedBatch, InputSource):
    """Placeholders fed from an in-memory DataSet, in the sampler's order.

    Args:
      dataset: has images [N, H, W, C] float32 and labels [N] int64.
      sampler: a towers.data.sampler.EpochSampler over it.
      batches: instead of those two, callable(step) -> (images [n, H, W, C]
        float32, labels [n] int64), the step's batch.
      (All may be None for a graph that is only built, or fed by hand through
      the `images` and `labels` placeholders.)
    """

    name = 'feed'

    def __init__(self, dataset=None, sampler=None, batches=None):
        super().__init__()
        self.dataset, self.sampler = dataset, sampler
        self._make_batch = batches or functools.partial(sampled_batch, dataset, sampler)

    def step(self, step):
        images, labels = self._make_batch(step)
        return [], {self.images: images, self.labels: labels}
