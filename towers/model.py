"""ModelDesc: what the Trainer needs to know about a model, in tensorpack's shape.

A ModelDesc says what goes in (`inputs`), what one tower computes from it
(`build_graph` -> the cost and named metrics), how to step (`optimizer`), and
what happens to the averaged gradients before they are applied
(`gradient_processors`, `weight_decay`). The Trainer builds one tower per
device from it with towers/tower.py and combines them with towers/gradients.py,
so a ModelDesc never sees devices, towers or the Session.

ClassifierModel wraps a registry model_fn (images, training) -> logits: the
cost is the mean softmax cross-entropy and the metric is accuracy.
"""
import tensorflow as tf

from towers import processors
from towers.config import CLASSIFIER_SETTINGS, TrainConfig, check
from towers.errors import SettingError, TowersError
from towers.lars import LARSOptimizer
from towers.tower import TOP_K, tower_loss

tf1 = tf.compat.v1


# --decay-on: the variables weight decay applies to, as a regex searched in their names.
DECAY_PATTERNS = {
    'weights': r'(^|/)weights$',  # the conv and dense kernels: not biases, not batch norm
    'not-norms': r'^(?!(.*/)?(beta|gamma)$)',  # all but batch norm's (tf_cnn_benchmarks)
    'all': r'.',  # every trainable variable
}


def make_optimizer(name, learning_rate, momentum=0.9, weight_decay=0.0, decay_pattern=r'.'):
    """A tf.compat.v1 optimizer by name: 'sgd', 'momentum', 'adam' or 'lars'.

    learning_rate may be a float or a scalar tensor (a schedule, towers/schedules.py).
    weight_decay, decay_pattern: LARS decays (and scales) the variables the pattern finds
    itself (towers/lars.py); the others' decay is the trainer's (WeightDecay).
    """
    check('optimizer', name)
    if name == 'sgd':
        return tf1.train.GradientDescentOptimizer(learning_rate)
    if name == 'momentum':
        return tf1.train.MomentumOptimizer(learning_rate, momentum)
    if name == 'lars':
        return LARSOptimizer(learning_rate, momentum, weight_decay, decay_pattern)
    return tf1.train.AdamOptimizer(learning_rate)


class ModelDesc:
    """Base class: override inputs, build_graph and optimizer.

    The towers' input sources carry (images, labels), so `inputs()` describes
    exactly those two: images [None, H, W, C] float32 and labels [None] int64.
    """

    def inputs(self):
        """[tf.TensorSpec images [None, H, W, C] float32, tf.TensorSpec labels [None] int64]."""
        raise NotImplementedError

    def build_graph(self, images, labels, *, training):
        """One tower's computation on its slice.

        Called once per tower under the tower's name scope and the shared
        variable scope: create variables with tf.compat.v1.get_variable.

        Args:
          images: [m, H, W, C] float32, the tower's slice.
          labels: [m] int64.
          training: the tower's towers.context.TowerContext: truthy in training,
            false for the evaluation towers; pass it on to the layers.
        Returns:
          The cost, a scalar float32 mean over the slice; or a dict with 'cost'
          and named metrics, each a scalar float32 mean over the slice (towers
          are combined weighted by their share of the batch, so a mean is what
          makes the combination exact). A tower whose share of a short batch is
          empty computes on a stand-in example and gets weight 0.
        """
        raise NotImplementedError

    def optimizer(self, learning_rate):
        """A tf.compat.v1 optimizer; learning_rate is a scalar tensor that follows the schedule."""
        raise NotImplementedError

    def gradient_processors(self):
        """Processors for the averaged gradients, in order (towers/processors.py)."""
        return []

    def weight_decay(self):
        """A towers.processors.WeightDecay added once to the averaged gradients, or None."""
        return None

    # What the Trainer uses; built from the methods above.

    def check_settings(self, config):
        """SettingError for a TrainConfig setting this model would ignore.

        A ModelDesc says its optimizer, weight decay and gradient processors
        itself; the config's are for the ClassifierModel of towers.train.
        """
        defaults = TrainConfig()
        given = [name for name in CLASSIFIER_SETTINGS
                 if getattr(config, name) != getattr(defaults, name)]
        if given:
            raise SettingError('%s describe%s the ClassifierModel of towers.train; %s says its '
                               'own in optimizer(), weight_decay() and gradient_processors()'
                               % (', '.join('{%s}' % n for n in given),
                                  's' if len(given) == 1 else '', type(self).__name__))

    @property
    def input_shape(self):
        images, labels = self._checked_inputs()
        return tuple(images.shape[1:])

    def _checked_inputs(self):
        specs = list(self.inputs())
        if (len(specs) != 2 or specs[0].dtype != tf.float32 or specs[0].shape.rank != 4
                or not specs[0].shape[1:].is_fully_defined() or specs[1].shape.rank != 1
                or not specs[1].dtype.is_integer):
            raise TowersError(
                '%s.inputs() must return [TensorSpec([None, H, W, C], tf.float32), '
                'TensorSpec([None], tf.int64)] (images and labels), got %s'
                % (type(self).__name__, specs))
        return specs

    def tower_loss(self, images, labels, count, training):
        """build_graph as towers/tower.py calls it: (cost, metrics)."""
        del count  # a ModelDesc sees its slice; an empty share's stand-in has weight 0
        result = self.build_graph(images, labels, training=training)
        if not isinstance(result, dict):
            return result, {}
        if 'cost' not in result:
            raise TowersError('%s.build_graph returned a dict without a "cost" entry: %s'
                              % (type(self).__name__, sorted(result)))
        metrics = {name: value for name, value in result.items() if name != 'cost'}
        return result['cost'], metrics


def normalization_of(mean, std):
    """(mean, std) as tuples of floats, or None when there is none."""
    return None if mean is None else (tuple(map(float, mean)), tuple(map(float, std)))


def normalize(images, normalization):
    """images [b, H, W, C] in [0, 1], less the mean, over the std, per channel (None: as
    they are)."""
    if normalization is None:
        return images
    mean, std = normalization
    return (images - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


class ClassifierModel(ModelDesc):
    """A model_fn (images, training) -> logits as a ModelDesc.

    Args:
      model_fn: e.g. models.build_model('mnist_convnet', ...).
      input_shape: (H, W, C).
      num_classes: labels lie in [0, num_classes).
      optimizer: 'sgd', 'momentum' or 'adam'.
      momentum: for 'momentum'.
      weight_decay: L2 rate on variables whose name matches decay_pattern
        (default: every `weights`, not biases or batch-norm), 0 for none.
      decay_pattern: regex searched in variable names, or a name of DECAY_PATTERNS
        (--decay-on: 'weights', 'not-norms', 'all').
      label_smoothing: the training targets put this much of their mass evenly on every
        class (Szegedy et al. 2016); 0 for one-hot targets.
      clip_norm: clip the averaged gradients to this global norm, or None.
      freeze: regex; variables it matches are not updated, or None.
      normalization: (mean, std), per channel, that the training input applied to images
        in [0, 1] (--mean/--std); evaluation, which feeds images in [0, 1], applies it
        before the model. None: none.
    """

    # What evaluation reports, and --best-metric chooses from (top5 with more than 5 classes).
    METRICS = ('loss', 'accuracy', 'top%d' % TOP_K)

    def __init__(self, model_fn, input_shape, num_classes, optimizer='adam', momentum=0.9,
                 weight_decay=0.0, decay_pattern='weights', clip_norm=None, freeze=None,
                 normalization=None, label_smoothing=0.0):
        self.model_fn, self.num_classes, self.normalization = model_fn, num_classes, normalization
        self.label_smoothing = check('label_smoothing', label_smoothing)
        decay_pattern = DECAY_PATTERNS.get(decay_pattern, decay_pattern)
        self._input_shape = tuple(input_shape)
        self._optimizer, self._momentum = check('optimizer', optimizer), momentum
        # LARS takes the decay into its trust ratio: its own, not added to the gradients.
        self._weight_decay, self._decay_pattern = weight_decay, decay_pattern
        self._decay = processors.WeightDecay(weight_decay, decay_pattern) \
            if weight_decay and optimizer != 'lars' else None
        self._processors = []
        if freeze:
            self._processors.append(processors.FreezeVariables(freeze))
        if clip_norm:
            self._processors.append(processors.ClipGlobalNorm(clip_norm))

    @classmethod
    def from_config(cls, model_fn, input_shape, num_classes, config):
        """The classifier a TrainConfig describes (its optimizer and gradient settings)."""
        return cls(model_fn, input_shape, num_classes, optimizer=config.optimizer,
                   momentum=config.momentum, weight_decay=config.weight_decay,
                   decay_pattern=config.decay_on, label_smoothing=config.label_smoothing,
                   clip_norm=config.clip_norm, freeze=config.freeze,
                   normalization=normalization_of(config.mean, config.std))

    def check_settings(self, config):
        """Every setting of a TrainConfig applies to a ClassifierModel."""

    def inputs(self):
        return [tf.TensorSpec([None] + list(self._input_shape), tf.float32, 'images'),
                tf.TensorSpec([None], tf.int64, 'labels')]

    def build_graph(self, images, labels, *, training):
        count = tf.shape(labels)[0]
        cost, metrics = tower_loss(self.model_fn, images, labels, count, training,
                                   self.label_smoothing)
        return dict(metrics, cost=cost)

    def tower_loss(self, images, labels, count, training):
        # With the count, a stand-in example of an empty share is masked out:
        # the tower reports loss 0 and accuracy 0 for it (its weight is 0 anyway).
        return tower_loss(self.model_fn, images, labels, count, training, self.label_smoothing)

    def optimizer(self, learning_rate):
        return make_optimizer(self._optimizer, learning_rate, self._momentum,
                              self._weight_decay, self._decay_pattern)

    def gradient_processors(self):
        return list(self._processors)

    def weight_decay(self):
        return self._decay

