"""--init-from: a new run from another run's weights, a new head where the classes differ."""
import numpy as np
import pytest
import tensorflow as tf

from tests.easy_digits import SHAPE, images_and_labels
from towers import TrainConfig, data, models
from towers.errors import SettingError
from towers.trainer import train

tf1 = tf.compat.v1


def _data(classes, rng):
    images, labels = images_and_labels(300, rng)
    keep = labels < classes
    train_set = data.DataSet(images[keep][:200], labels[keep][:200].astype(np.int64))
    test_set = data.DataSet(images[keep][:50], labels[keep][:50].astype(np.int64))
    empty = data.DataSet(np.zeros([0, *SHAPE], np.float32), np.zeros([0], np.int64))
    return data.Datasets(train_set, empty, test_set)


def _run(logdir, classes, lines, **settings):
    config = TrainConfig(towers=('/cpu:0',), batch_size=20, steps=3, eval_every=0, quiet=True,
                         logdir=logdir, optimizer='momentum', learning_rate=0.05, **settings)
    model_fn = models.build_model('small_convnet', SHAPE, classes)
    return train(config, model_fn, _data(classes, np.random.RandomState(classes)), SHAPE,
                 classes, log=lines.append)


def _variables(logdir):
    prefix = tf1.train.latest_checkpoint(logdir)
    return {name: tf.train.load_variable(prefix, name)
            for name, _ in tf1.train.list_variables(prefix)}


@pytest.fixture(scope='module')
def ten_classes(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp('pretrained') / 'run')
    _run(logdir, 10, [])
    return logdir


def test_a_new_head_is_left_and_the_rest_restored_at_step_0(tmp_path, ten_classes):
    lines = []
    # Frozen: the restored layers keep the pretrained values, only the new head trains.
    result = _run(str(tmp_path / 'five'), 5, lines, init_from=ten_classes,
                  freeze='^(?!logits/)')
    assert result['steps'] == 3  # a new run, not a resume of the other's 3 steps
    checkpoint = tf1.train.latest_checkpoint(ten_classes)
    init = [line for line in lines if line.startswith('init from ')]
    assert init == ['init from %s: 2 variable(s) restored, 2 left at their initial values'
                    % checkpoint]
    pretrained, tuned = _variables(ten_classes), _variables(str(tmp_path / 'five'))
    assert ('  left (another shape): logits/biases ([10] there, [5] here), logits/weights '
            '([%d, 10] there, [%d, 5] here)' % ((pretrained['logits/weights'].shape[0],) * 2)
            in lines)
    for name in ('conv1/weights', 'conv1/biases'):
        np.testing.assert_array_equal(tuned[name], pretrained[name], err_msg=name)
    # Its own slots and step: the pretrained run's momentum was not carried over.
    assert int(tuned['global_step']) == 3


def _foreign(folder, pretrained):
    """A checkpoint another program wrote: the pretrained conv1 under 'net/', and a layer of
    its own."""
    with tf.Graph().as_default(), tf1.Session() as sess:
        saved = [tf1.get_variable('net/' + name, initializer=pretrained[name])
                 for name in ('conv1/weights', 'conv1/biases')]
        saved.append(tf1.get_variable('net/aux/kernel', initializer=np.ones([3, 2], np.float32)))
        sess.run(tf1.global_variables_initializer())
        return tf1.train.Saver(saved).save(sess, str(folder / 'foreign.ckpt'))


def test_a_map_renames_the_checkpoints_names_and_a_bad_one_is_one_line(tmp_path, ten_classes):
    pretrained = _variables(ten_classes)
    foreign = _foreign(tmp_path, pretrained)
    lines = []
    _run(str(tmp_path / 'renamed'), 10, lines, init_from=foreign, init_map=('^net/=',),
         freeze='^conv1/')
    assert ('init from %s: 2 variable(s) restored, 2 left at their initial values' % foreign
            in lines)
    assert '  not in this model: net/aux/kernel (as aux/kernel)' in lines
    tuned = _variables(str(tmp_path / 'renamed'))
    np.testing.assert_array_equal(tuned['conv1/weights'], pretrained['conv1/weights'])
    # Mapped onto a variable of another shape: the map is wrong, nothing trains.
    with pytest.raises(SettingError, match=r'^init_map maps net/aux/kernel of .* to '
                                           r'logits/weights, whose shape is \[.*, 10\] here, '
                                           r'not \[3, 2\]: fix the map$'):
        _run(str(tmp_path / 'bad'), 10, [], init_from=foreign,
             init_map=('^net/aux/kernel$=logits/weights', '^net/='))
    assert tf1.train.latest_checkpoint(str(tmp_path / 'bad')) is None


def test_a_path_without_a_checkpoint_is_one_line(tmp_path):
    with pytest.raises(SettingError, match=r'^init_from .* holds no checkpoint'):
        _run(str(tmp_path / 'run'), 10, [], init_from=str(tmp_path))
