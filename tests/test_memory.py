"""Memory: a step's peak per device, and an out-of-memory error in one line with advice."""
import os

import numpy as np
import pytest
import tensorflow as tf

from towers import data
from towers.cli.config import flag
from towers.config import TrainConfig
from towers.deviceplan import local_plan
from towers.memory import OutOfMemoryError, out_of_memory, step_peaks
from towers.models import layers
from towers.tools.explain import explain
from towers.trainer import train

tf1 = tf.compat.v1

SHAPE = (8, 8, 1)


def _records(*pairs):
    """RunMetadata of one device whose allocation records are (micros, bytes) pairs."""
    metadata = tf1.RunMetadata()
    device = metadata.step_stats.dev_stats.add(device='/job:localhost/replica:0/task:0/'
                                               'device:CPU:1')
    memory = device.node_stats.add(node_name='op').memory.add(allocator_name='cpu')
    for micros, size in pairs:
        memory.allocation_records.add(alloc_micros=micros, alloc_bytes=size)
    return metadata


def test_the_peak_is_the_most_the_records_held_at_once():
    # 100 and 50 live (150), 100 freed, 70 more (120): the peak is 150.
    metadata = _records((1, 100), (2, 50), (3, -100), (4, 70), (5, -50), (6, -70))
    assert step_peaks(metadata) == {'/job:localhost/replica:0/task:0/device:CPU:1': 150}
    # A release and an allocation in the same microsecond: counted allocation first.
    assert list(step_peaks(_records((1, 100), (2, -100), (2, 80))).values()) == [180]


def _convnet(images, training):
    return layers.dense(tf.nn.relu(layers.conv2d(images, 16, 3, name='conv')), 10,
                        name='logits')


def test_explain_gives_each_towers_peak_and_it_follows_the_batch():
    plan = local_plan(['/cpu:0', '/cpu:1'])
    peaks = {batch: [explain(_convnet, (16, 16, 3), 10, plan, batch_size=batch)['devices'][d]
                     ['peak_bytes'] for d in ('/cpu:0', '/cpu:1')]
             for batch in (32, 128)}
    for small, large in zip(peaks[32], peaks[128]):
        # The activations grow with the batch four times over; the variables, the
        # gradients and the apply's tensors do not.
        assert 2 * small < large < 4.5 * small, peaks


def _greedy(images, training):
    """A dense layer whose second tower asks its CPU for 128 TiB in training: more memory
    than any machine has, asked of TensorFlow's allocator as a real graph asks it."""
    logits = layers.dense(images, 4, name='logits')
    if training and tf1.get_default_graph().get_name_scope().startswith('tower_1'):
        huge = tf.zeros(tf.stack([tf.shape(images, out_type=tf.int64)[0], 2 ** 43]))
        logits += tf.reduce_sum(huge)
    return logits


def _datasets(count=16):
    images = np.random.RandomState(0).rand(count, *SHAPE).astype(np.float32)
    labels = np.arange(count) % 4
    return data.Datasets(data.DataSet(images, labels), data.DataSet(images[:0], labels[:0]),
                         data.DataSet(images, labels))


def test_out_of_memory_in_a_tower_is_one_line_naming_the_tower_and_what_to_try(tmp_path):
    logdir = tmp_path / 'run'
    config = TrainConfig(towers=('/cpu:0', '/cpu:1'), batch_size=8, steps=2,
                         logdir=str(logdir), accumulate=2)
    with pytest.raises(OutOfMemoryError) as raised:
        train(config, _greedy, _datasets(), SHAPE, 4, log=lambda line: None)
    assert str(raised.value) == (
        'out of memory on /cpu:1 (tower 1 of 2, 4 images a tower, in micro-batches of 2) '
        'allocating a float32 tensor of [2,8796093022208] (64.0 TiB): give each '
        'tower fewer images: more towers, a smaller batch_size, or accumulate K to keep the '
        'global batch in K micro-batches')
    # The command line names its flags (and ends with status 1, as for any TowersError).
    assert raised.value.named(flag).endswith('a smaller --batch-size, or --accumulate K to '
                                             'keep the global batch in K micro-batches')
    assert isinstance(raised.value.__cause__, tf.errors.ResourceExhaustedError)
    # Nothing written half: the run's record and no checkpoint (the first step never ran).
    assert not [name for name in os.listdir(logdir) if name.startswith('model.ckpt')]


def test_a_full_disk_is_not_called_out_of_memory():
    error = tf.errors.ResourceExhaustedError(None, None, '/ckpt/model.ckpt-80_temp/part-0; '
                                             'No space left on device')
    assert out_of_memory(error, local_plan(['/cpu:0']), 8) is None
