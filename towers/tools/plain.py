"""The plain twin `towers bench --compare` holds towers against: a careful hand-written TF1 graph.

What a user who knows graph-mode TensorFlow well would write for one model,
without towers: no checks, no custom gradients, no per-step extras.

- input: tf.data of ready batches (from_tensor_slices, repeat, batch,
  prefetch), one get_next per step on the host, tf.split over the towers;
- the net: tf.nn ops directly (conv2d, bias_add, relu, max_pool, matmul),
  the same layers and shapes as towers' registry model;
- bf16 or fp16 by casting: the images where they enter a tower, each variable
  on read (a custom getter), the logits back to float32 for the loss;
- the average: tf.add_n of the towers' gradients times 1/towers, on the
  variable's device (colocated with it), then one apply_gradients.

Only the models with a hand-written net here have a twin (plain_twin).
"""
import tensorflow as tf

from towers.devices import session_config
from towers.tools import stepgraph
from towers.tower import variables_on

tf1 = tf.compat.v1


def _conv(x, filters, size, padding, name):
    with tf1.variable_scope(name):
        w = tf1.get_variable('weights', [size, size, x.shape[-1], filters])
        b = tf1.get_variable('biases', [filters], initializer=tf1.zeros_initializer())
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, padding), b))


def _dense(x, units, name, activation=None):
    x = tf.reshape(x, [-1, x.shape[1:].num_elements()])
    with tf1.variable_scope(name):
        w = tf1.get_variable('weights', [x.shape[-1], units])
        b = tf1.get_variable('biases', [units], initializer=tf1.zeros_initializer())
        y = tf.nn.bias_add(tf.matmul(x, w), b)
        return activation(y) if activation else y


def _mnist_convnet(images, num_classes):
    net = _conv(images, 32, 5, 'SAME', 'conv1')
    net = tf.nn.max_pool2d(net, 2, 2, 'SAME')
    net = _conv(net, 64, 5, 'SAME', 'conv2')
    net = tf.nn.max_pool2d(net, 2, 2, 'SAME')
    net = tf.nn.dropout(_dense(net, 1024, 'fc1', tf.nn.relu), rate=0.5)
    return _dense(net, num_classes, 'fc2')


def _small_convnet(images, num_classes):
    net = tf.nn.max_pool2d(_conv(images, 32, 3, 'VALID', 'conv1'), 2, 2, 'VALID')
    return _dense(net, num_classes, 'logits')


NETS = {'mnist_convnet': _mnist_convnet, 'small_convnet': _small_convnet}


def plain_twin(model_name):
    """net(images, num_classes) -> logits of the model's hand-written twin, or None."""
    return NETS.get(model_name)


def _cast_getter(dtype):
    def cast_on_read(getter, *args, **kwargs):  # TF passes the getter by keyword
        return tf.cast(getter(*args, **kwargs), dtype)
    return cast_on_read


class Plain:
    """The plain twin's training loop, stepped a block at a time (a bench runner).

    Args:
      net: plain_twin(model_name).
      dtype: the towers' compute type (tf.float32, tf.bfloat16, tf.float16);
        fp16 is run unscaled, as a plain graph would be timed.
      dataset: images [N, H, W, C] float32, labels [N].
    """

    def __init__(self, net, num_classes, tower_devices, dataset, batch_size, dtype,
                 num_steps, per_gpu=None):
        del num_steps  # the dataset repeats
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf1.set_random_seed(0)
            with tf.device('/cpu:0'):
                data = tf.data.Dataset.from_tensor_slices((dataset.images, dataset.labels))
                images, labels = tf1.data.make_one_shot_iterator(
                    data.repeat().batch(batch_size, drop_remainder=True).prefetch(2)).get_next()
            opt = tf1.train.GradientDescentOptimizer(0.01)
            image_parts = tf.split(images, len(tower_devices))
            label_parts = tf.split(labels, len(tower_devices))
            tower_grads = []
            getter = _cast_getter(dtype) if dtype != tf.float32 else None
            for i, device in enumerate(tower_devices):
                with tf1.device(variables_on('/cpu:0', device)), \
                        tf1.variable_scope('net', reuse=i > 0, custom_getter=getter):
                    logits = tf.cast(net(tf.cast(image_parts[i], dtype), num_classes),
                                     tf.float32)
                    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                        labels=label_parts[i], logits=logits))
                    variables = tf1.trainable_variables()
                    tower_grads.append(tf.gradients(loss, variables))
            averaged = []
            for grads, var in zip(zip(*tower_grads), variables):
                with tf.device(var.device):  # on the variable's device
                    total = grads[0] if len(grads) == 1 else tf.add_n(list(grads))
                    averaged.append((total * (1.0 / len(grads)), var))
            self.train_op = opt.apply_gradients(averaged)
            init = tf1.global_variables_initializer()
        # per_gpu: the process's logical GPUs per GPU (towers/devices.py process_split).
        self.sess = tf1.Session(graph=self.graph,
                                config=session_config(tower_devices, per_gpu=per_gpu))
        self.sess.run(init)
        self.rates, self.batch_size = [], batch_size

    def run(self, steps, clock, timed=True):
        for _ in range(steps):
            start = clock()
            self.sess.run(self.train_op)
            if timed:
                self.rates.append(self.batch_size / (clock() - start))

    def step_graph(self):
        return stepgraph.of_run(self.sess, self.train_op)[1]

    def close(self):
        self.sess.close()
