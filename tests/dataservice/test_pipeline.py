"""The pipeline a tf.data service runs, read through two workers of this process: each example
once a pass (distributed_epoch), no batch handed out twice (parallel_epochs), a resume at its
epoch's start."""
import collections

import numpy as np
import tensorflow as tf

from tests.dataservice.common import imagenet_folder, local_service
from towers.data import image_records
from towers.inputs.dataservice import DataServiceInput, distributed, service_pipeline

tf1 = tf.compat.v1
SIDE = 16


def _read(address, mode, image_set, job='', epochs=1, batch_size=4):
    """Every batch of the service's pipeline over image_set: [(labels, pixels)]."""
    with tf.Graph().as_default() as graph:
        tf1.set_random_seed(3)  # a graph seed, as the Trainer sets: the workers must not share it
        dataset = service_pipeline(image_set, image_set.input_shape, image_set.num_classes,
                                   batch_size, mode, seed=5, epochs=epochs)
        iterator = tf1.data.make_initializable_iterator(
            distributed(dataset, 'grpc://' + address, mode, tf.constant(job)))
        batch = iterator.get_next()
    batches = []
    with tf1.Session(graph=graph) as sess:
        sess.run(iterator.initializer)
        while True:
            try:
                pixels, labels = sess.run(batch, options=tf1.RunOptions(timeout_in_ms=60000))
            except tf.errors.OutOfRangeError:
                return batches
            batches.append((tuple(labels), pixels))


def test_distributed_epoch_hands_out_every_example_once_a_pass_across_two_workers(tmp_path):
    image_set = image_records.ImageNetSet(imagenet_folder(str(tmp_path)), 'train', SIDE)
    with local_service(2) as (address, workers):
        once = _read(address, 'distributed_epoch', image_set, job='once')
        assert [worker._num_tasks() for worker in workers] == [1, 1]  # both had the job
        twice = _read(address, 'distributed_epoch', image_set, job='twice', epochs=2)
    for batches, passes in ((once, 1), (twice, 2)):
        counts = collections.Counter(label for labels, _ in batches for label in labels)
        assert counts == {label: passes for label in range(24)}, counts
        assert all(pixels.dtype == np.uint8 and pixels.shape[1:] == (SIDE * SIDE * 3,)
                   for _, pixels in batches)


def test_parallel_epochs_workers_shuffle_and_crop_on_seeds_of_their_own(tmp_path):
    image_set = image_records.ImageNetSet(imagenet_folder(str(tmp_path)), 'train', SIDE)
    with local_service(2) as (address, _):
        batches = _read(address, 'parallel_epochs', image_set)
    # Each worker made one whole pass: every example twice, 6 batches of 4 per pass.
    counts = collections.Counter(label for labels, _ in batches for label in labels)
    assert counts == {label: 2 for label in range(24)} and len(batches) == 12
    # On one seed the two passes would be the same batches, each handed out twice.
    orders = [labels for labels, _ in batches]
    assert len(set(orders)) == len(orders), orders
    # ... and each record cropped alike in both: here its two crops differ.
    crops = collections.defaultdict(list)
    for labels, pixels in batches:
        for label, row in zip(labels, pixels):
            crops[label].append(row)
    assert sum(not np.array_equal(*pair) for pair in crops.values()) >= 20


class _Recording:
    """A Session that remembers what each run was fed."""

    def __init__(self, sess):
        self.sess, self.feeds = sess, []

    def run(self, fetches, feed_dict=None, options=None):
        self.feeds.append(feed_dict or {})
        return self.sess.run(fetches, feed_dict, options=options)


def test_a_resumed_input_restarts_at_its_epochs_start_in_a_job_of_that_epoch(tmp_path):
    image_set = image_records.ImageNetSet(imagenet_folder(str(tmp_path)), 'train', SIDE)
    lines = []
    with local_service(1) as (address, _), tf.Graph().as_default() as graph:
        source = DataServiceInput(image_set, address, 'distributed_epoch', steps_per_epoch=6,
                                  num_classes=image_set.num_classes, batch_size=4, job='run')
        slices = source.build(image_set.input_shape, ['/cpu:0'])
        source.announce(lines.append)
        with tf1.Session(graph=graph) as sess:
            recording = _Recording(sess)
            source.start(recording, 14, 20)
            try:
                for step in range(14, 17):
                    source.step(step)
                    images, labels = sess.run([slices[0].images, slices[0].labels])
                    assert images.shape == (4, SIDE, SIDE, 3) and 0 <= images.min() <= 1
            finally:
                source.stop(sess)
    fed = {tensor.op.name: value for tensor, value in recording.feeds[0].items()}
    assert fed == {'data_service/epoch': 2, 'data_service/job_name': 'run-epoch-2'}
    assert ('data service: resumed at step 14, the service starts epoch 2 afresh: its first 2 '
            'batches are seen again') in lines
    assert any(line.startswith('data service: worker localhost:') and 'joined' in line
               for line in lines), lines
