"""--init-from PATH: a new run that starts from another run's (or program's) weights.

Fine-tuning, tensorpack's most asked-for feature: before step 0, each of the model's
variables (its weights and batch-norm statistics; not the optimizer's slots, the step or the
data order) whose name and shape a checkpoint holds is set from it; `--init-map OLD=NEW`
renames a checkpoint's names first (a regex, re.sub, the first rule that matches), for
checkpoints other programs wrote. What is not there, or there in another shape (a new head
for another class count), keeps its initial value; the first lines say what was restored,
what was left and what the checkpoint held that the model does not. A mapped name whose
shape differs is a mistake of the map: one line, nothing trained. It is not a resume: a new
run, from step 0, with slots of its own; a logdir that holds a checkpoint resumes instead.
"""
import os
import re

import tensorflow as tf

from towers import checkpoints
from towers.config import check_pattern
from towers.errors import SettingError

tf1 = tf.compat.v1


def parse_map(rules):
    """[(compiled OLD, NEW)] of 'OLD=NEW' rules; SettingError naming a bad one."""
    parsed = []
    for rule in rules or ():
        old, sep, new = rule.partition('=')
        if not sep or not old:
            raise SettingError('{init_map} wants OLD=NEW (a regex of the checkpoint\'s names '
                               'and its replacement, e.g. "^resnet_v1_50/=" ), got %r', rule)
        parsed.append((check_pattern(old, '{init_map}'), new))
    return parsed


def checkpoint_of(path):
    """The checkpoint prefix PATH names: a towers logdir (its newest whole checkpoint), a
    folder with a `checkpoint` state file, or a prefix; SettingError if none."""
    if os.path.isdir(path):
        latest, _ = checkpoints.to_restore(path)
        if latest is None:
            raise SettingError('{init_from} %s holds no checkpoint (no "checkpoint" state '
                               'file); give the checkpoint\'s prefix, e.g. DIR/model.ckpt-1000',
                               path)
        return latest
    if not os.path.exists(path + '.index'):
        raise SettingError('{init_from} %s is neither a logdir nor a checkpoint prefix', path)
    return path


class InitFrom:
    """The plan of one --init-from, made while the graph is built; restore() runs it.

    Args:
      path: what --init-from names.
      rules: --init-map's 'OLD=NEW' rules.
      variables: {name: variable} a checkpoint holds (a strategy's saved_variables): of
        them, the model's (trainable, and batch norm's moving statistics) are set.
    """

    def __init__(self, path, rules, variables):
        self.checkpoint = checkpoint_of(path)
        held = dict(tf1.train.list_variables(self.checkpoint))
        rules = parse_map(rules)
        mapped, names = {}, {}  # model name -> (checkpoint name, renamed); checkpoint -> model
        for name in held:
            new, renamed = _renamed(name, rules)
            mapped.setdefault(new, (name, renamed))
            names[name] = new
        model = {v.op.name for v in tf1.trainable_variables()
                 + tf1.get_collection(tf1.GraphKeys.MOVING_AVERAGE_VARIABLES)}
        self.restored, self.left, self.reshaped = {}, [], []
        for name, var in sorted(variables.items()):
            if name not in model:
                continue
            source, renamed = mapped.get(name, (None, False))
            shape = var.shape.as_list()
            if source is None:
                self.left.append(name)
            elif held[source] != shape:
                if renamed:
                    raise SettingError('{init_map} maps %s of %s to %s, whose shape is %s here, '
                                       'not %s: fix the map', source, self.checkpoint, name,
                                       shape, held[source])
                self.reshaped.append('%s (%s there, %s here)' % (name, held[source], shape))
            else:
                self.restored[source] = var
        used = set(self.restored)
        self.unused = sorted(n if names[n] == n else '%s (as %s)' % (n, names[n])
                             for n in held if n not in used and _is_model_variable(n))
        self.saver = tf1.train.Saver(self.restored) if self.restored else None

    def restore(self, sess, log):
        """Set the planned variables in sess; log what came from where."""
        if self.saver is not None:
            self.saver.restore(sess, self.checkpoint)
        log('init from %s: %d variable(s) restored, %d left at their initial values%s'
            % (self.checkpoint, len(self.restored), len(self.left) + len(self.reshaped),
               '' if self.restored else ' (no name matched: see --init-map)'))
        for what, names in (('left (not in the checkpoint)', self.left),
                            ('left (another shape)', self.reshaped),
                            ('not in this model', self.unused)):
            if names:
                log('  %s: %s' % (what, _listed(names)))


def _renamed(name, rules):
    for old, new in rules:
        if old.search(name):
            return old.sub(new, name), True
    return name, False


# Names a checkpoint holds that are not a model's: the step, towers' data order and loss
# scale, the optimizers' slots.
_NOT_MODEL = re.compile(r'(^|/)(global_step|data_order|loss_scale)(/|$)|/(Momentum|Adam|Adam_1|'
                        r'RMSProp|LARS|ExponentialMovingAverage)$|^beta[12]_power')


def _is_model_variable(name):
    return not _NOT_MODEL.search(name)


def _listed(names, most=8):
    return ', '.join(names[:most]) + (' and %d more' % (len(names) - most)
                                      if len(names) > most else '')
