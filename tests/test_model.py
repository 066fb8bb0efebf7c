"""The Trainer API end to end: a ModelDesc of one's own, trained, resumed, checked."""
import json

import numpy as np
import pytest
import tensorflow as tf

from towers import data
from towers.errors import TowersError
from towers.model import ModelDesc
from towers.models import layers
from towers.schedules import LearningRate
from towers.trainer import Trainer

tf1 = tf.compat.v1

SHAPE = (8, 8, 1)


class _Linear(ModelDesc):
    """Softmax regression with two metrics: accuracy and the mean top logit."""

    def __init__(self, shape=SHAPE, lr_seen=None):
        self.shape, self.lr_seen = shape, lr_seen

    def inputs(self):
        return [tf.TensorSpec((None,) + self.shape, tf.float32, 'images'),
                tf.TensorSpec((None,), tf.int64, 'labels')]

    def build_graph(self, images, labels, *, training):
        logits = layers.dense(images, 4, name='logits')
        cost = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        right = tf.equal(tf.argmax(logits, axis=1), labels)
        return {'cost': cost, 'accuracy': tf.reduce_mean(tf.cast(right, tf.float32)),
                'top_logit': tf.reduce_mean(tf.reduce_max(logits, axis=1))}

    def optimizer(self, learning_rate):
        if self.lr_seen is not None:
            self.lr_seen.append(learning_rate)
        return tf1.train.GradientDescentOptimizer(learning_rate)


def _datasets(num_train=60, num_test=22, seed=0):
    """Class c lights quadrant c of an 8x8 image."""
    rng = np.random.RandomState(seed)

    def make(num):
        labels = rng.randint(0, 4, num)
        images = rng.rand(num, *SHAPE).astype(np.float32) * 0.2
        for image, label in zip(images, labels):
            row, col = divmod(label, 2)
            image[row * 4:row * 4 + 4, col * 4:col * 4 + 4] += 0.8
        return data.DataSet(images, labels)
    empty = data.DataSet(np.zeros((0,) + SHAPE, np.float32), np.zeros([0], np.int64))
    return data.Datasets(make(num_train), empty, make(num_test))


# One tower, where what a test checks does not depend on the tower count: half the graph
# to build (a Trainer's CPU is mostly its graph).
ONE = ['/cpu:0']


def _trainer(**options):
    settings = dict(towers=['/cpu:0', '/cpu:1'], batch_size=8, epochs=3, learning_rate=0.5,
                    callbacks=[], log=lambda line: None, warmup_steps=0, seed=1)
    settings.update(options)
    model = settings.pop('model', None) or _Linear()
    return Trainer(model, settings.pop('data', None) or _datasets(), **settings)


def _variables(logdir):
    return {name: tf.train.load_variable(logdir, name)
            for name, _ in tf1.train.list_variables(logdir)}


def test_a_model_desc_trains_and_reports_its_own_metrics():
    lines = []
    result = _trainer(log=lines.append).train()
    assert result['steps'] == 3 * 8  # ceil(60 / 8) steps per epoch
    assert set(result['test']) == {'loss', 'accuracy', 'top_logit'}
    assert result['test_accuracy'] == 1.0
    assert lines[-1] == 'test: loss %.4f accuracy %.4f top_logit %.4f (22 images)' % (
        result['test']['loss'], result['test']['accuracy'], result['test']['top_logit'])


def test_steps_per_epoch_and_max_epoch_set_the_length():
    assert _trainer(towers=ONE, steps_per_epoch=5, epochs=2.5).train()['steps'] == 13
    assert _trainer(towers=ONE, steps_per_epoch=5, steps=4).train()['steps'] == 4


def test_the_optimizer_gets_the_scheduled_rate_tensor():
    seen = []
    trainer = _trainer(model=_Linear(lr_seen=seen), steps=2,
                       learning_rate=LearningRate.parse(0.5, 'piecewise:1=0.1'))
    trainer.train()
    assert len(seen) == 1 and isinstance(seen[0], tf.Tensor)


def test_two_towers_equal_one_device(tmp_path):
    # The same seed gives the same initial weights and batches: the tower count
    # must not change the training.
    _trainer(towers=['/cpu:0'], steps=10, logdir=str(tmp_path / 'one'),
             callbacks=None).train()
    _trainer(towers=['/cpu:0', '/cpu:1', '/cpu:2'], steps=10,
             logdir=str(tmp_path / 'three'), callbacks=None).train()
    one, three = _variables(str(tmp_path / 'one')), _variables(str(tmp_path / 'three'))
    assert one.keys() == three.keys()
    for name in one:
        np.testing.assert_allclose(three[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_stopped_and_resumed_equals_uninterrupted_exactly(tmp_path):
    straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
    _trainer(steps=13, logdir=straight, callbacks=None).train()
    stops = iter([None] * 4 + ['SIGTERM'])
    first = _trainer(steps=13, logdir=resumed, callbacks=None,
                     stop_requested=lambda: next(stops)).train()
    assert first['stopped'] == 'SIGTERM' and first['steps'] == 5 and first['test'] is None
    lines = []
    second = _trainer(steps=13, logdir=resumed, callbacks=None, log=lines.append).train()
    assert 'resumed from %s/model.ckpt-5' % resumed in lines
    assert second['steps'] == 13
    expected, actual = _variables(straight), _variables(resumed)
    assert expected.keys() == actual.keys()
    for name in expected:
        # Same ops, same order of the same batches, on one process: bit for bit.
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def test_an_input_source_without_steps_per_epoch_needs_one():
    from towers.inputs import InputSource
    with pytest.raises(TowersError, match='give steps_per_epoch'):
        _trainer(source=InputSource())


def test_settings_a_model_desc_gives_itself_are_refused_not_ignored():
    with pytest.raises(TowersError) as error:
        _trainer(optimizer='momentum', weight_decay=0.1)
    assert str(error.value) == (
        'optimizer, weight_decay describe the ClassifierModel of towers.train; _Linear says its '
        'own in optimizer(), weight_decay() and gradient_processors()')


@pytest.mark.parametrize('old,new', [('max_epoch', 'epochs'), ('max_steps', 'steps'),
                                     ('ema_decay', 'ema'), ('tower_devices', 'towers')])
def test_a_keyword_of_before_the_train_config_names_what_it_became(old, new):
    with pytest.raises(TypeError, match='^the Trainer setting %s is now %s$' % (old, new)):
        _trainer(**{old: 1})


def test_default_callbacks_takes_a_train_config():
    from towers.callbacks import default_callbacks
    with pytest.raises(TypeError, match=r"^default_callbacks takes a TrainConfig, e\.g\. "):
        default_callbacks('/tmp/logdir')


@pytest.mark.parametrize('inputs', [
    [tf.TensorSpec((None, 8, 8, 1), tf.float32)],
    [tf.TensorSpec((None, 8, 8), tf.float32), tf.TensorSpec((None,), tf.int64)],
    [tf.TensorSpec((None, None, 8, 1), tf.float32), tf.TensorSpec((None,), tf.int64)],
    [tf.TensorSpec((None, 8, 8, 1), tf.float32), tf.TensorSpec((None,), tf.float32)]])
def test_inputs_must_be_images_and_labels(inputs):
    model = _Linear()
    model.inputs = lambda: inputs
    with pytest.raises(TowersError, match=r'_Linear.inputs\(\) must return \[TensorSpec'):
        _trainer(model=model).train()


def test_build_graph_returning_a_dict_needs_a_cost():
    model = _Linear()
    build = model.build_graph
    model.build_graph = lambda *a, training: {k: v for k, v in build(*a, training=training)
                                              .items() if k != 'cost'}
    with pytest.raises(TowersError, match='without a "cost" entry'):
        _trainer(model=model).train()


def test_a_scalar_cost_is_enough():
    model = _Linear()
    build = model.build_graph
    model.build_graph = lambda *a, training: build(*a, training=training)['cost']
    result = _trainer(model=model, steps=3).train()
    assert set(result['test']) == {'loss'} and result['test_accuracy'] is None


def _dropout_net(images, training):
    hidden = layers.dense(images, 16, activation=tf.nn.relu, name='hidden')
    return layers.dense(layers.dropout(hidden, 0.5, training), 4, name='logits')


def test_a_resume_draws_the_dropout_masks_an_uninterrupted_run_draws(tmp_path):
    from towers.model import ClassifierModel

    def run(logdir, stop_after=None):
        stops = iter([None] * (stop_after - 1) + ['SIGTERM']) if stop_after else None
        return _trainer(model=ClassifierModel(_dropout_net, SHAPE, 4, optimizer='sgd'),
                        steps=9, logdir=logdir, callbacks=None,
                        stop_requested=(lambda: next(stops)) if stops else None).train()

    straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
    run(straight)
    assert run(resumed, stop_after=4)['steps'] == 4
    run(resumed)
    expected, actual = _variables(straight), _variables(resumed)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def test_the_default_callbacks_take_a_model_with_a_scalar_cost(tmp_path):
    model = _Linear()
    build = model.build_graph
    model.build_graph = lambda *a, training: build(*a, training=training)['cost']
    sets = _datasets()
    sets = data.Datasets(sets.train, sets.test, sets.test)  # a validation set: a best checkpoint
    lines = []
    _trainer(model=model, data=sets, towers=ONE, steps=8, logdir=str(tmp_path),
             callbacks=None, log=lines.append).train()
    with open(tmp_path / 'best' / 'best.json') as f:
        assert json.load(f)['metric'] == 'loss'  # there is no accuracy to choose by


@pytest.mark.parametrize('name', ['loss', 'batch', 'learning_rate', 'seconds'])
def test_a_metric_may_not_take_a_name_the_trainer_uses(name):
    model = _Linear()
    build = model.build_graph
    model.build_graph = lambda *a, training: dict(build(*a, training=training),
                                                  **{name: tf.constant(1.0)})
    with pytest.raises(TowersError, match="the model names a metric '%s'" % name):
        _trainer(model=model, towers=ONE, steps=1).train()


@pytest.mark.parametrize('settings,options,schedule', [
    # EMA, a warmed-up piecewise schedule, weight decay on the kernels and clipping.
    (dict(decay_pattern='weights', clip_norm=1.0), dict(ema=0.9), 'piecewise:2=0.05'),
    # The recipes': label smoothing, decay on every variable, a warmed-up cosine.
    (dict(decay_pattern='all', label_smoothing=0.1), {}, 'cosine'),
])
def test_every_trainer_setting_on_three_towers_equals_one_device(tmp_path, settings, options,
                                                                 schedule):
    """Through the Trainer, each setting on three towers trains as one device does."""
    from towers.model import ClassifierModel

    def run(towers, logdir):
        model = ClassifierModel(lambda images, training: layers.dense(images, 4, name='logits'),
                                SHAPE, 4, optimizer='momentum', weight_decay=0.01, **settings)
        _trainer(model=model, towers=towers, steps=12, logdir=logdir, callbacks=None,
                 steps_per_epoch=4, learning_rate=LearningRate.parse(0.5, schedule, 1.0),
                 **options).train()
        return _variables(logdir)

    one = run(['/cpu:0'], str(tmp_path / 'one'))
    three = run(['/cpu:0', '/cpu:1', '/cpu:2'], str(tmp_path / 'three'))
    assert ('logits/weights/ExponentialMovingAverage' in one) == ('ema' in options)
    assert one.keys() == three.keys()
    for name in one:
        np.testing.assert_allclose(three[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
