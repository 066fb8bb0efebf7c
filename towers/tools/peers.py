"""The peers `towers bench --compare` times towers against, as bench runners.

Each has what bench.measure_interleaved steps: run(steps, clock, timed), rates
(images/sec of each timed step) and close().

  Textbook   the classic CIFAR-10 multi-GPU tutorial's loop, as printed there
  Mirrored   Keras model.fit under tf.distribute.MirroredStrategy, on a Keras
             twin of the registry model (keras_twin), in float32 or under a
             Keras mixed-precision policy
"""
import warnings

import tensorflow as tf

from towers.data.sampler import EpochSampler
from towers.devices import session_config
from towers.tools import stepgraph
from towers.tower import variables_on

tf1 = tf.compat.v1


class Textbook:
    """The classic tutorial's multi-GPU loop, as printed there, stepped a block at a time."""

    def __init__(self, model_fn, input_shape, tower_devices, dataset, batch_size, num_steps,
                 per_gpu=None):
        self.dataset, self.sampler = dataset, EpochSampler(dataset.num_examples, batch_size)
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf1.set_random_seed(0)
            self.images = tf1.placeholder(tf.float32, [batch_size] + list(input_shape))
            self.labels = tf1.placeholder(tf.int64, [batch_size])
            opt = tf1.train.GradientDescentOptimizer(0.01)
            image_splits = tf.split(self.images, len(tower_devices))
            label_splits = tf.split(self.labels, len(tower_devices))
            tower_grads = []
            with tf1.variable_scope(tf1.get_variable_scope()):
                for i, device in enumerate(tower_devices):
                    # _variable_on_cpu: the variables on /cpu:0, the compute on the tower.
                    with tf1.device(variables_on('/cpu:0', device)), \
                            tf1.name_scope('tower_%d' % i):
                        logits = model_fn(image_splits[i], True)
                        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                            labels=label_splits[i], logits=logits))
                        tf1.get_variable_scope().reuse_variables()
                        tower_grads.append(opt.compute_gradients(loss))
            with tf.device('/cpu:0'):
                self.train_op = opt.apply_gradients(tutorial_average_gradients(tower_grads))
            init = tf1.global_variables_initializer()
        # per_gpu: the process's logical GPUs per GPU (towers/devices.py process_split).
        self.sess = tf1.Session(graph=self.graph,
                                config=session_config(tower_devices, per_gpu=per_gpu))
        self.sess.run(init)
        self.step, self.rates, self.batch_size = 0, [], batch_size

    def _feed(self):
        index = self.sampler.indices(self.step)
        if len(index) < self.batch_size:  # tf.split needs the full batch
            index = self.sampler.indices(self.step + 1)
        self.step += 1
        return {self.images: self.dataset.images[index], self.labels: self.dataset.labels[index]}

    def run(self, steps, clock, timed=True):
        for _ in range(steps):
            start = clock()
            self.sess.run(self.train_op, self._feed())
            elapsed = clock() - start
            if timed:
                self.rates.append(self.batch_size / elapsed)

    def step_graph(self):
        return stepgraph.of_run(self.sess, self.train_op, self._feed())[1]

    def close(self):
        self.sess.close()


def tutorial_average_gradients(tower_grads):
    """cifar10_multi_gpu_train.py's average_gradients, line for line."""
    average_grads = []
    for grad_and_vars in zip(*tower_grads):
        grads = [tf.expand_dims(g, 0) for g, _ in grad_and_vars]
        grad = tf.reduce_mean(tf.concat(axis=0, values=grads), 0)
        average_grads.append((grad, grad_and_vars[0][1]))
    return average_grads


# The keras.applications net of each ImageNet model. Keras' ResNet50 is v1 (the stride on the
# first 1x1 of a block, not the 3x3 as in v1.5: 3.9 GMACs against 4.1) and gives its
# convolutions biases (26,560 parameters more); the other nets are the same.
KERAS_APPLICATIONS = {'resnet50': 'ResNet50', 'resnet101': 'ResNet101',
                      'resnet152': 'ResNet152', 'inception3': 'InceptionV3', 'vgg16': 'VGG16'}
# The Keras mixed-precision policy of each towers precision (fp32: Keras' default).
KERAS_POLICIES = {'fp32': None, 'bf16': 'mixed_bfloat16', 'fp16': 'mixed_float16'}


def keras_twin(model_name, input_shape, num_classes, policy=None):
    """A builder of the Keras twin of a registry model, for MirroredStrategy; None if none.

    policy: a Keras mixed-precision policy ('mixed_bfloat16', 'mixed_float16'),
    global only while the model is built; the logits stay float32, as the Keras
    mixed-precision guide keeps its last layer, and compile() wraps the
    optimizer of a mixed_float16 model in its LossScaleOptimizer.
    """
    import keras
    layers = keras.layers
    body = {
        'mnist_convnet': lambda: [
            layers.Conv2D(32, 5, padding='same', activation='relu'),
            layers.MaxPooling2D(2, padding='same'),
            layers.Conv2D(64, 5, padding='same', activation='relu'),
            layers.MaxPooling2D(2, padding='same'), layers.Flatten(),
            layers.Dense(1024, activation='relu'), layers.Dropout(0.5)],
        'small_convnet': lambda: [layers.Conv2D(32, 3, activation='relu'),
                                  layers.MaxPooling2D(2), layers.Flatten()],
    }.get(model_name)
    application = KERAS_APPLICATIONS.get(model_name)
    if application is not None:  # keras.applications' net, its top but the logits as here
        def body():
            trunk = getattr(keras.applications, application)
            if model_name == 'vgg16':  # its top is two dense layers of 4096 (fc1, fc2)
                return [trunk(weights=None, include_top=False, input_shape=tuple(input_shape)),
                        layers.Flatten(), layers.Dense(4096, activation='relu'),
                        layers.Dense(4096, activation='relu')]
            return [trunk(weights=None, include_top=False, pooling='avg',
                          input_shape=tuple(input_shape))]
    if body is None:
        return None

    def build():
        previous = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(policy or 'float32')
        try:
            return keras.Sequential([keras.Input(tuple(input_shape))] + body()
                                    + [layers.Dense(num_classes, dtype='float32')])
        finally:
            keras.mixed_precision.set_global_policy(previous)
    return build


class Mirrored:
    """Keras model.fit under MirroredStrategy, each batch timed by a callback."""

    def __init__(self, build, tower_devices, dataset, batch_size, num_steps):
        import keras
        # On CPUs the default all-reduce is collective ops, whose group keys every
        # MirroredStrategy in a process numbers from 1: a second strategy with
        # another device count would collide. Reducing to one device is what
        # MirroredStrategy does without NCCL; on GPUs its default (NCCL) stays.
        gpus = all(d.startswith('/gpu') for d in tower_devices)
        self.strategy = tf.distribute.MirroredStrategy(
            devices=tower_devices,
            cross_device_ops=None if gpus else tf.distribute.ReductionToOneDevice())
        with self.strategy.scope():
            self.model = build()
            self.model.compile(optimizer=keras.optimizers.SGD(0.01),
                               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.data = tf.data.Dataset.from_tensor_slices(
            (dataset.images, dataset.labels)).repeat().batch(
                batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        self.rates, self.batch_size, self._starts = [], batch_size, []

    def run(self, steps, clock, timed=True):
        import keras
        elapsed = []
        callback = keras.callbacks.LambdaCallback(
            on_train_batch_begin=lambda batch, logs: self._starts.append(clock()),
            on_train_batch_end=lambda batch, logs: elapsed.append(clock() - self._starts[-1]))
        with warnings.catch_warnings():  # Keras notes that a tf.data input is not reshuffled
            warnings.simplefilter('ignore')
            self.model.fit(self.data, epochs=1, steps_per_epoch=steps, verbose=0,
                           callbacks=[callback])
        if timed:
            self.rates.extend(self.batch_size / e for e in elapsed)

    def close(self):
        pass
