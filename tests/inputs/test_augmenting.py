"""Augmentation in every input mode: the global batch augmented before it is cut, so a
cluster worker's share gets those rows of it, feed and staging agree, a resumed pipeline
augments as the uninterrupted one, N towers train as one device; what does not apply is
refused in one line."""
import numpy as np
import pytest
import tensorflow as tf

from towers import data
from towers.cli import main
from towers.config import TrainConfig
from towers.data.sampler import EpochSampler
from towers.devices import session_config
from towers.errors import SettingError
from towers.inputs import DatasetInput, FeedInput, InputSource, StagingInput, source_for
from towers.model import ClassifierModel
from towers.models import layers
from towers.trainer import train

tf1 = tf.compat.v1

SHAPE = (6, 5, 3)
TWO = ['/cpu:0', '/cpu:1']


def _train_set(num=20):
    rng = np.random.RandomState(0)
    return data.DataSet(rng.randint(1, 256, (num,) + SHAPE).astype(np.uint8),
                        rng.randint(0, 4, num), num_classes=4)


def _images(source, devices, num_steps, start=0):
    """Per step, per tower: the images a source gives, run alone from step `start`."""
    return _runs(source, devices, [(start, num_steps)])[0]


def _runs(source, devices, runs):
    """_images of each (start, num_steps) of runs, each run the source started anew as a
    resumed training starts it, in one graph and Session (building them is most of a run's
    cost)."""
    with tf.Graph().as_default() as graph:
        slices = source.build(SHAPE, devices)
        init = tf1.local_variables_initializer()
    results = []
    with tf1.Session(graph=graph, config=session_config(TWO)) as sess:
        for start, num_steps in runs:
            steps = []
            sess.run(init)
            source.start(sess, start, start + num_steps)
            try:
                for step in range(start, start + num_steps):
                    extra, feed = source.step(step)
                    values = sess.run([(s.images, s.count) for s in slices] + extra, feed)
                    steps.append([images[:count] for images, count in values[:len(slices)]])
            finally:
                source.stop(sess)
            results.append(steps)
    return results


@pytest.mark.parametrize('kind', [FeedInput, StagingInput])
def test_a_workers_share_of_a_fed_batch_gets_those_rows_of_the_whole_batch(kind):
    train_set, sampler = _train_set(), EpochSampler(20, 7, seed=3)  # batches of 7, 7, 6

    def source(share=None):
        return kind(train_set, sampler, augment='pad-crop-flip', seed=5, share=share)
    whole = _images(source(), TWO, 4)
    plain = _images(FeedInput(train_set, sampler), TWO, 4)
    for k in (0, 1):
        mine = _images(source((k, 2)), ['/cpu:0'], 4)
        for step in range(4):
            np.testing.assert_array_equal(mine[step][0], whole[step][k])
    # Moved, not replaced: each augmented image has its plain one's pixels or zeros.
    assert all(set(np.unique(a)) <= set(np.unique(p)) | {0}
               for a_step, p_step in zip(whole, plain) for a, p in zip(a_step, p_step))
    assert not all(np.array_equal(a, p) for a_step, p_step in zip(whole, plain)
                   for a, p in zip(a_step, p_step))
    if kind is StagingInput:  # what the loader augments is what feed augments
        fed = _images(FeedInput(train_set, sampler, augment='pad-crop-flip', seed=5), TWO, 4)
        for a_step, f_step in zip(whole, fed):
            for a, f in zip(a_step, f_step):
                np.testing.assert_array_equal(a, f)


def test_a_workers_share_of_the_pipeline_gets_those_rows_resumed_or_not():
    train_set = _train_set()

    def source(share=None):
        return DatasetInput(train_set.images, train_set.labels, num_classes=4, batch_size=7,
                            seed=3, augment='inception', share=share)
    starts = [(0, 3), (4, 3)]  # from the first step, and resumed at step 4
    *wholes, uninterrupted = _runs(source(), TWO, starts + [(0, 7)])
    workers = [_runs(source((k, 2)), ['/cpu:0'], starts) for k in (0, 1)]
    for run, whole in enumerate(wholes):
        for k in (0, 1):
            mine = workers[k][run]
            for step in range(3):
                np.testing.assert_array_equal(mine[step][0], whole[step][k])
    for a_step, b_step in zip(uninterrupted[4:], whole):  # the resumed run's, from step 4
        for a, b in zip(a_step, b_step):
            np.testing.assert_array_equal(a, b)


def _train(tmp_path, towers, input_mode, augment, name):
    """4 steps of a softmax regression over 8x8x3 images; (its variables, its log)."""
    rng = np.random.RandomState(1)
    images = rng.rand(40, 8, 8, 3).astype(np.float32)
    labels = rng.randint(0, 4, 40)
    empty = data.DataSet(images[:0], labels[:0], num_classes=4)
    datasets = data.Datasets(data.DataSet(images, labels, num_classes=4), empty, empty)
    logdir = str(tmp_path / name)
    config = TrainConfig(towers=towers, batch_size=10, steps=4, input=input_mode,
                         augment=augment, optimizer='sgd', learning_rate=0.5, seed=2,
                         logdir=logdir, eval_every=0, warmup_steps=0, log_every=100,
                         tensorboard=False)
    lines = []
    train(config, lambda x, training: layers.dense(x, 4, name='logits'), datasets, (8, 8, 3),
          4, log=lines.append)
    return {name: tf.train.load_variable(logdir, name)
            for name, _ in tf1.train.list_variables(logdir)}, lines


@pytest.mark.exact
def test_three_towers_train_as_one_device_with_augmentation_on(tmp_path):
    for input_mode, augment in (('feed', 'inception'), ('dataset', None)):
        one, lines = _train(tmp_path, ('/cpu:0',), input_mode, augment, input_mode + '1')
        three, _ = _train(tmp_path, ('/cpu:0', '/cpu:1', '/cpu:2'), input_mode, augment,
                          input_mode + '3')
        plain, _ = _train(tmp_path, ('/cpu:0',), input_mode, 'center', input_mode + '0')
        assert one.keys() == three.keys()
        for name in one:
            np.testing.assert_allclose(three[name], one[name], rtol=1e-5, atol=1e-6,
                                       err_msg=name)
        assert not np.allclose(plain['logits/weights'], one['logits/weights'])
        said = [line for line in lines if line.startswith('augment: ')]
        assert said == ['augment: inception (as asked; evaluation: centre)'
                        if augment else
                        'augment: pad-crop-flip (the default for 8x8x3 images; evaluation: '
                        'centre)']


def test_augment_where_it_does_not_apply_is_one_line(tmp_path, capsys):
    datasets = data.Datasets(_train_set(), _train_set(0), _train_set(0))
    model = ClassifierModel(lambda x, training: x, SHAPE, 4)
    with pytest.raises(SettingError, match=r'^augment varies the training images; input '
                                           r'synthetic has none \(one random batch, for '
                                           r'benchmarks\)$'):
        TrainConfig(towers=('/cpu:0',), input='synthetic', augment='center')
    with pytest.raises(SettingError, match=r'^augment varies the images of a dataset towers '
                                           r'reads; an input source of your own '
                                           r'\(InputSource\) varies its own batches$'):
        source_for(TrainConfig(augment='inception', steps_per_epoch=3), datasets, model,
                   InputSource())
    logdir = tmp_path / 'run'
    assert main(['train', '--input', 'synthetic', '--augment', 'pad-crop-flip', '--steps', '1',
                 '--logdir', str(logdir), '--devices', 'cpu']) == 1
    assert capsys.readouterr().err.strip() == (
        'towers: error: --augment varies the training images; --input synthetic has none '
        '(one random batch, for benchmarks)')
    assert not logdir.exists()


def test_the_data_services_workers_augment_as_the_pipeline_does(tmp_path):
    """The pipeline a service worker runs (read here, without a service): the same batches,
    each image moved in zeros and flipped, as bytes."""
    from towers.data import records
    from towers.data.pipeline import drain
    from towers.inputs.dataservice import service_pipeline
    train_set = _train_set(12)
    records.write_records({'train': (np.round(train_set.images * 255).astype(np.uint8),
                                     train_set.labels)}, str(tmp_path), 2, 't', 4)
    record_set = records.RecordSet(str(tmp_path), 'train')

    def read(augment):
        return drain(lambda: service_pipeline(record_set, SHAPE, 4, 4, 'distributed_epoch',
                                              seed=1, augment=augment, epochs=1))
    augmented, plain = read('pad-crop-flip'), read(None)
    assert [len(labels) for _, labels in augmented] == [4, 4, 4]
    for (pixels, labels), (centred, same) in zip(augmented, plain):
        np.testing.assert_array_equal(labels, same)
        assert pixels.dtype == np.uint8
        for row, centre in zip(pixels, centred):
            assert set(np.unique(row)) <= set(np.unique(centre)) | {0}
    assert not all(np.array_equal(a, p) for (a, _), (p, _) in zip(augmented, plain))


def test_train_augmentation_is_the_default_for_the_split_or_the_one_asked():
    """What train (and bench's rows) take: none for imagenet-synthetic's noise unless asked."""
    from towers.data.synthetic import synthetic_datasets
    from towers.inputs import train_augmentation
    noise = synthetic_datasets((8, 8, 3), 10, 4).train
    colour = data.DataSet(np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4, np.int64))
    assert train_augmentation(None, noise, (8, 8, 3)).line() == (
        'augment: center (the default for random images; evaluation: centre)')
    assert train_augmentation('inception', noise, (8, 8, 3)).name == 'inception'
    assert train_augmentation(None, colour, (8, 8, 3)).name == 'pad-crop-flip'


def test_a_share_augmented_without_its_sampler_is_refused_in_one_line():
    with pytest.raises(SettingError, match=r'^a share of each global batch is augmented as those '
                                           r'rows of the whole batch: give the sampler the '
                                           r'batches follow$'):
        FeedInput(batches=lambda step: None, share=(0, 2), augment='pad-crop-flip')
