"""The classic multi-GPU recipe, top to bottom, in one file, on towers' functions.

This is the CIFAR-10 multi-GPU tutorial's `cifar10_multi_gpu_train.py`, on the
shipped MNIST digits: the same five steps in the same order, with the few
helpers towers adds to make them exact for any split of the batch.

  1. a placeholder batch, sliced across the devices       split_batch
  2. one tower per device, one shared variable scope       tower_loss, variables_on
  3. the towers' gradients combined                        average_gradients
  4. one apply_gradients updates the single set of weights optimizer.apply_gradients
  5. a Session loop runs it                                tf.compat.v1.Session

Without GPUs the devices are virtual CPUs (`session_config` makes them), so

    python examples/classic_recipe.py --towers 2 --steps 200

runs on two "devices" anywhere; on a machine with GPUs the same file uses them
(`--devices cpu` keeps it on virtual CPUs there).
towers' Trainer (towers/trainer.py) is this loop with callbacks around it.
"""
import argparse

import tensorflow as tf

from towers import data, models
from towers.devices import resolve_devices, session_config
from towers.gradients import average_gradients
from towers.slicing import split_batch
from towers.tower import tower_loss, variables_on

tf1 = tf.compat.v1


def build_graph(model_fn, input_shape, devices, learning_rate):
    """The training step and an evaluation of the shared weights, in the default graph.

    Returns:
      (images, labels, train_op, loss, accuracy): placeholders [None, H, W, C]
      float32 and [None] int64; the op of one synchronous step; the global
      batch's mean loss; the inference-mode accuracy on the fed batch.
    """
    images = tf1.placeholder(tf.float32, [None] + list(input_shape), name='images')
    labels = tf1.placeholder(tf.int64, [None], name='labels')
    global_step = tf1.train.get_or_create_global_step()
    opt = tf1.train.GradientDescentOptimizer(learning_rate)

    # 1. Slice the global batch on the host, as the tutorial dequeues there:
    #    100 over 3 towers is 34/33/33, each slice weighted by its share.
    with tf.device('/cpu:0'):
        slices = split_batch(images, labels, len(devices))

    # 2. One tower per device. Tower 0 creates the variables, the others reuse
    #    them; variables_on keeps them on /cpu:0 (the tutorial's
    #    _variable_on_cpu) while each tower computes on its own device.
    tower_grads, weights, losses = [], [], []
    with tf1.variable_scope(tf1.get_variable_scope()):
        for i, (device, piece) in enumerate(zip(devices, slices)):
            with tf1.device(variables_on('/cpu:0', device)), tf1.name_scope('tower_%d' % i):
                loss, _ = tower_loss(model_fn, piece.images, piece.labels, piece.count, True)
                tf1.get_variable_scope().reuse_variables()
                tower_grads.append(opt.compute_gradients(loss))
                weights.append(tf.cast(piece.count, tf.float32) / tf.cast(piece.batch, tf.float32))
                losses.append(loss)

    # 3. Average the gradients where the variables live, each tower weighted by
    #    its share of the batch (the tutorial's plain mean assumes equal shares).
    grads = average_gradients(tower_grads, weights)

    # 4. One apply_gradients: the single set of variables takes one step.
    train_op = opt.apply_gradients(grads, global_step=global_step)
    loss = tf.add_n([weight * value for weight, value in zip(weights, losses)], name='loss')

    # The same weights in inference mode, on the host, for the test set.
    with tf1.variable_scope(tf1.get_variable_scope(), reuse=True), tf.device('/cpu:0'):
        _, metrics = tower_loss(model_fn, images, labels, tf.shape(labels)[0], False)
    return images, labels, train_op, loss, metrics['accuracy']


def train(model='mnist_convnet', num_towers=2, steps=200, batch_size=100, learning_rate=0.05,
          seed=0, log=print, devices=None):
    """Train on the shipped digits; returns the final {variable name: value}.

    5. The Session loop: feed a batch, run the step; then test once.

    devices: None (GPUs where there are any, else virtual CPUs), a kind ('cpu'
    or 'gpu': num_towers of them) or explicit names ('/gpu:0,/gpu:1').
    """
    mnist = data.load_dataset('mnist_sample', seed=seed)
    devices = resolve_devices(num_towers, devices)
    options = {'dropout_rate': 0.0} if model == 'mnist_convnet' else {}  # one mask per tower
    model_fn = models.build_model(model, mnist.train.images.shape[1:], 10, **options)
    with tf.Graph().as_default():
        tf1.set_random_seed(seed)
        images, labels, train_op, loss, accuracy = build_graph(
            model_fn, mnist.train.images.shape[1:], devices, learning_rate)
        init = tf1.global_variables_initializer()
        with tf1.Session(config=session_config(devices)) as sess:
            sess.run(init)
            for step in range(1, steps + 1):
                batch_images, batch_labels = mnist.train.next_batch(batch_size)
                _, loss_value = sess.run([train_op, loss],
                                         {images: batch_images, labels: batch_labels})
                if step % 50 == 0 or step == steps:
                    log('step %d: loss %.4f' % (step, loss_value))
            right = sess.run(accuracy, {images: mnist.test.images, labels: mnist.test.labels})
            log('test accuracy %.4f on %d images, %d tower(s) %s'
                % (right, len(mnist.test.labels), len(devices), ','.join(devices)))
            return sess.run({v.op.name: v for v in tf1.global_variables()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='mnist_convnet')
    parser.add_argument('--towers', type=int, default=2)
    parser.add_argument('--steps', type=int, default=200)
    parser.add_argument('--batch-size', type=int, default=100)
    parser.add_argument('--lr', type=float, default=0.05)
    parser.add_argument('--devices', default=None,
                        help='cpu or gpu (default: GPUs where there are any), or device names')
    args = parser.parse_args()
    train(args.model, args.towers, args.steps, args.batch_size, args.lr, devices=args.devices)


if __name__ == '__main__':
    main()
