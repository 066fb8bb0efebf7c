"""The tower core: N towers equal one device, one copy of each variable, placement."""
import numpy as np
import pytest
import tensorflow as tf

from towers import models
from towers.devices import session_config
from towers.gradients import build_train_op
from towers.model import make_optimizer
from towers.slicing import share_of, split_sizes
from towers.tower import build_towers, tower_loss

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)


def _batch(size, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(size, *SHAPE).astype(np.float32), rng.randint(0, 10, size).astype(np.int64)


class _Towers:
    """mnist_convnet on num_towers CPU towers (momentum) and its Session, built once and
    trained again from the given values by each test that asks (the module's `nets`)."""

    def __init__(self, num_towers):
        devices = ['/cpu:%d' % i for i in range(num_towers)]
        model_fn = models.build_model('mnist_convnet', SHAPE, 10, dropout_rate=0.0)
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf1.set_random_seed(1)
            self.images = tf1.placeholder(tf.float32, [None] + list(SHAPE))
            self.labels = tf1.placeholder(tf.int64, [None])
            self.global_step = tf1.train.get_or_create_global_step()
            opt = make_optimizer('momentum', 0.01)
            towers = build_towers(model_fn, self.images, self.labels, devices, optimizer=opt)
            self.train_op, grads = build_train_op(towers, opt, self.global_step)
            self.trainable = tf1.trainable_variables()
            self.grad_tensors = [tf.convert_to_tensor(g) for g, _ in grads]
            self.init = tf1.global_variables_initializer()
        self.sess = tf1.Session(graph=self.graph, config=session_config(devices))

    def train(self, batches, initial=None):
        """Run len(batches) steps from the initializers (momentum 0, step 0), the trainable
        variables then set to `initial`; return (first step's averaged grads, final variables)."""
        sess = self.sess
        sess.run(self.init)
        if initial is not None:
            with self.graph.as_default():  # load() runs its initializer, fed: no new op
                for var, value in zip(self.trainable, initial):
                    var.load(value, sess)
        first_grads = None
        for x, y in batches:
            feed = {self.images: x, self.labels: y}
            if first_grads is None:
                first_grads = sess.run(self.grad_tensors, feed)
            sess.run(self.train_op, feed)
        assert sess.run(self.global_step) == len(batches)
        return first_grads, sess.run(self.trainable)


@pytest.fixture(scope='module')
def nets():
    """nets(num_towers): one _Towers of each tower count, shared by the module's tests (one
    device's graph serves every case's reference run, 3 towers' both 3-tower cases)."""
    built = {}

    def get(num_towers):
        if num_towers not in built:
            built[num_towers] = _Towers(num_towers)
        return built[num_towers]
    yield get
    for net in built.values():
        net.sess.close()


def _canonical(device):
    return tf.DeviceSpec.from_string(device).to_string()


@pytest.fixture(scope='module')
def initial(nets):
    """One set of initial values, loaded into every graph."""
    _, variables = nets(1).train([])
    return variables


@pytest.mark.parametrize('num_towers,batch_size', [(2, 8), (3, 10), (3, 2)],
                         ids=['2 towers', '3 towers uneven 4/3/3',
                              '3 towers batch 2 (empty tower)'])
@pytest.mark.exact
def test_n_towers_equal_one_device(nets, initial, num_towers, batch_size):
    batches = [_batch(batch_size, seed) for seed in range(3)]
    grads_1, vars_1 = nets(1).train(batches, initial)
    grads_n, vars_n = nets(num_towers).train(batches, initial)
    for one, many in zip(grads_1 + vars_1, grads_n + vars_n):
        assert np.all(np.isfinite(many))
        # float32 sums in another order: equal to ~1e-6 of the tensor's scale.
        np.testing.assert_allclose(many, one, rtol=1e-5, atol=2e-6 * np.abs(one).max())
    # The steps really moved the variables, so equality means something.
    assert max(np.abs(a - b).max() for a, b in zip(vars_1, initial)) > 1e-4


def test_split_sizes_are_as_even_as_possible():
    with tf.Graph().as_default(), tf1.Session() as sess:
        assert list(sess.run(split_sizes(100, 3))) == [34, 33, 33]
        assert list(sess.run(split_sizes(2, 3))) == [1, 1, 0]
        assert list(sess.run(split_sizes(8, 4))) == [2, 2, 2, 2]


@pytest.mark.parametrize('optimizer', ['momentum', 'adam'])
@pytest.mark.parametrize('num_towers', [1, 2, 3, 4])
def test_exactly_one_copy_of_each_variable(num_towers, optimizer):
    devices = ['/cpu:%d' % i for i in range(num_towers)]
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [None] + list(SHAPE))
        labels = tf1.placeholder(tf.int64, [None])
        opt = make_optimizer(optimizer, 0.01)
        towers = build_towers(model_fn, images, labels, devices, optimizer=opt)
        with tf.device('/cpu:0'):
            global_step = tf1.train.get_or_create_global_step()
        build_train_op(towers, opt, global_step)
        trainable = sorted(v.op.name for v in tf1.trainable_variables())
        assert trainable == ['conv1/biases', 'conv1/weights', 'logits/biases', 'logits/weights']
        slots = {'momentum': ['Momentum'], 'adam': ['Adam', 'Adam_1']}[optimizer]
        expected = len(trainable) * (1 + len(slots)) + 1 + (2 if optimizer == 'adam' else 0)
        assert len(tf1.global_variables()) == expected
        # Every variable handle lives on the parameter device.
        handles = [op for op in tf1.get_default_graph().get_operations()
                   if op.type == 'VarHandleOp']
        assert len(handles) == expected
        assert {_canonical(op.device) for op in handles} == {_canonical('/cpu:0')}


def test_each_towers_ops_run_on_its_own_device():
    devices = ['/cpu:0', '/cpu:1', '/cpu:2']
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    with tf.Graph().as_default() as graph:
        images = tf1.placeholder(tf.float32, [None] + list(SHAPE))
        labels = tf1.placeholder(tf.int64, [None])
        opt = make_optimizer('sgd', 0.1)
        towers = build_towers(model_fn, images, labels, devices, optimizer=opt)
        train_op, _ = build_train_op(towers, opt, tf1.train.get_or_create_global_step())
        for i, device in enumerate(devices):
            # Variable reads are colocated with the variable (the parameter
            # device) and their value is copied to the tower, as in the tutorial.
            ops = [op for op in graph.get_operations()
                   if op.name.startswith('tower_%d/' % i) and op.type != 'ReadVariableOp']
            assert ops and {_canonical(op.device) for op in ops} == {_canonical(device)}
        # Run one traced step: each tower's convolution executed on its device.
        with tf1.Session(config=session_config(devices)) as sess:
            sess.run(tf1.global_variables_initializer())
            metadata = tf1.RunMetadata()
            x, y = _batch(6)
            sess.run(train_op, {images: x, labels: y}, run_metadata=metadata,
                     options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))
        ran = {}
        for dev_stats in metadata.step_stats.dev_stats:
            for node in dev_stats.node_stats:
                ran.setdefault(node.node_name, set()).add(dev_stats.device.split('/')[-1])
        for i in range(3):
            conv = [n for n in ran if n.startswith('tower_%d/' % i) and n.endswith('Conv2D')]
            assert conv and ran[conv[0]] == {'device:CPU:%d' % i}


def test_batch_norm_moving_averages_move_once_from_tower_0():
    decay = 0.9

    def model_fn(images, training):
        x = models.layers.batch_norm(images, training, decay=decay)
        return models.layers.dense(x, 10, name='logits')

    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [None] + list(SHAPE))
        labels = tf1.placeholder(tf.int64, [None])
        opt = make_optimizer('sgd', 0.1)
        towers = build_towers(model_fn, images, labels, ['/cpu:0', '/cpu:1'], optimizer=opt)
        train_op, _ = build_train_op(towers, opt, tf1.train.get_or_create_global_step())
        assert len(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)) == 4  # 2 per tower
        moving_mean, moving_var = [v for v in tf1.global_variables()
                                   if v.op.name.startswith('batch_norm/moving')]
        x, y = _batch(4)
        x[2:] += 5.0  # tower 1's half differs, so using it would show
        with tf1.Session(config=session_config(['/cpu:0', '/cpu:1'])) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train_op, {images: x, labels: y})
            mean, var = sess.run([moving_mean, moving_var])
    tower0 = x[:2]
    np.testing.assert_allclose(mean, [(1 - decay) * tower0.mean()], rtol=1e-5)
    np.testing.assert_allclose(var, [decay * 1.0 + (1 - decay) * tower0.var()], rtol=1e-5)


@pytest.mark.parametrize('param_device', ['/cpu:0', '/cpu:3'])
def test_variables_and_their_updates_live_on_the_parameter_device(param_device):
    devices = ['/cpu:1', '/cpu:2']
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    with tf.Graph().as_default() as graph:
        images = tf1.placeholder(tf.float32, [None] + list(SHAPE))
        labels = tf1.placeholder(tf.int64, [None])
        opt = make_optimizer('adam', 0.01)
        towers = build_towers(model_fn, images, labels, devices, param_device, optimizer=opt)
        with tf.device(param_device):
            global_step = tf1.train.get_or_create_global_step()
        train_op, grads = build_train_op(towers, opt, global_step)
        handles = [op for op in graph.get_operations() if op.type == 'VarHandleOp']
        assert len(handles) == 1 + 4 * 3 + 2  # step, 4 variables and 2 Adam slots each, betas
        assert {_canonical(op.device) for op in handles} == {_canonical(param_device)}
        assert {_canonical(g.device) for g, _ in grads} == {_canonical(param_device)}
        # The towers' compute stays off the parameter device.
        assert not any(_canonical(op.device) == _canonical(param_device)
                       for op in graph.get_operations()
                       if op.name.startswith('tower_') and op.type != 'ReadVariableOp')
        with tf1.Session(config=session_config(devices, param_device)) as sess:
            sess.run(tf1.global_variables_initializer())
            x, y = _batch(4)
            sess.run(train_op, {images: x, labels: y})
            assert sess.run(global_step) == 1


@pytest.mark.parametrize('batch,parts', [(100, 3), (2, 3), (7, 7), (5, 1)])
def test_a_share_is_where_split_sizes_cuts(batch, parts):
    sizes = split_sizes(batch, parts).numpy().tolist()
    starts = [sum(sizes[:i]) for i in range(parts)]
    assert [share_of(batch, parts, i) for i in range(parts)] == list(zip(starts, sizes))


def test_label_smoothing_is_the_cross_entropy_with_smoothed_targets():
    """(1 - eps) on the label plus eps / K on every class; a stand-in example still counts 0."""
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 3.0], [1.0, 1.0, 1.0]], np.float32)
    labels = np.array([0, 2, 1])
    targets = np.full((3, 3), 0.1 / 3) + 0.9 * np.eye(3)[labels]
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    expected = -(targets * log_softmax).sum(1)[:2].mean()  # the third is a stand-in
    with tf.Graph().as_default():
        loss, _ = tower_loss(lambda images, training: images, tf.constant(logits),
                             tf.constant(labels, tf.int64), tf.constant(2), True,
                             label_smoothing=0.1)
        with tf1.Session() as sess:
            assert sess.run(loss) == pytest.approx(expected, rel=1e-6)
