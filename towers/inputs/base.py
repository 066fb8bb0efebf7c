"""InputSource: how a step's global batch reaches the towers, as four calls.

Every source ends the same way, one TowerSlice per tower, so every mode trains
the same model the same way; they differ in where the copying happens. The
Session loop (towers/session.py run_steps) drives a source through:

  build(input_shape, tower_devices) -> [TowerSlice]   while the graph is built
  announce(log)                                       in the run's first log lines
  start(sess, start_step, num_steps)                  once variables exist
  step(step) -> (extra fetches, feed_dict)            for each train step
  fetched(values)                                     with the extra fetches' values
  stop(sess)                                          always, even on errors

and asks it `end_of_data()` when a step raises OutOfRangeError (step may raise
it too, for a source that knows its data ended before the step runs).
"""
from towers.errors import TowersError
from towers.slicing import share_of


def sampled_batch(dataset, sampler, step, share=None):
    """(images, labels) of a step: the sampler's indices of it into an in-memory DataSet;
    share (index, count): only share index of count of them, cut as split_batch cuts."""
    batch = sampler.indices(step)
    if share is not None:
        start, size = share_of(len(batch), share[1], share[0])
        batch = batch[start:start + size]
    return dataset.images[batch], dataset.labels[batch]


class InputSource:
    """Base class: the four calls, doing nothing.

    Attributes:
      name: what the run's log calls this input; the source of an --input mode takes its
        name and these facts from its towers.names.INPUT_MODES entry:
      tf_data: its batches come from a tf.data pipeline, in tf.data's order.
      stages: a loader fills a StagingArea per tower ahead of the step.
      has_images: it reads the dataset's images (synthetic makes random ones).
      augmentation: the towers.data.augment.Augmentation its training images get, said in
        the run's first lines; None for a source that augments nothing (or its own way).
      steps_per_epoch: (optional) steps that make one epoch of this source,
        for a source that knows it (a Python data source).
    """

    name = 'custom'  # what the Session loop's log calls this input
    tf_data, stages, has_images = False, False, True
    augmentation = None

    @classmethod
    def over(cls, dataset, sampler, batch_size, num_classes, seed=0, epochs=None, mean=None,
             std=None, share=None, augment=None):
        """The source of an --input mode over an in-memory DataSet (towers.inputs.make_input
        says the arguments): here, one fed from the DataSet in the sampler's order (feed,
        staging); a mode made otherwise says how."""
        return cls(dataset, sampler, augment=augment, seed=seed, share=share)

    def build(self, input_shape, tower_devices):
        raise NotImplementedError

    def announce(self, log):
        """Say in the run's first lines what this input promises, where it differs from the
        others (the base class: its augmentation); log (callable taking a line) also takes
        what the source says later."""
        if self.augmentation is not None:
            log(self.augmentation.line())

    def start(self, sess, start_step, num_steps):
        pass

    def step(self, step):
        return [], None

    def fetched(self, values):
        """The values of the extra fetches step() asked for, after the step ran."""

    def stop(self, sess):
        pass

    def end_of_data(self):
        """A step hit the end of the input; return to end training, or raise."""
        raise TowersError('the %s input ran out of data before the last step'
                          % type(self).__name__)

    def cleaning(self, sess):
        """(records dropped, records read) by in-graph cleaning, or None."""
        return None
