"""TrainConfig: one rule per setting, checked once when a config is made, named as callers say."""
import dataclasses
import subprocess
import sys

import pytest

from towers.cli.config import flag
from towers.config import RULES, TrainConfig, check
from towers.errors import SettingError, TowersError
from towers.names import INPUT_MODES, OPTIMIZERS, VARIABLE_UPDATES
from towers.schedules import LearningRate


def test_the_defaults_are_a_valid_run():
    config = TrainConfig()
    assert (config.batch_size, config.epochs, config.steps, config.input) == (100, 10.0, None,
                                                                               'feed')
    assert config.schedule().describe() == 'constant 0.001'
    assert config.xla is False  # XLA's auto-clustering only when asked


@pytest.mark.parametrize('settings,message', [
    (dict(batch_size=0), 'batch_size must be at least 1, got 0'),
    (dict(batch_size=2.5), 'batch_size must be at least 1, got 2.5'),
    (dict(steps=0), 'steps must be at least 1, got 0'),
    (dict(epochs=0), 'epochs must be positive, got 0'),
    (dict(epochs=float('nan')), 'epochs must be positive, got nan'),
    (dict(steps_per_epoch=0), 'steps_per_epoch must be at least 1, got 0'),
    (dict(log_every=0), 'log_every must be at least 1, got 0'),
    (dict(checkpoint_every=-1), 'checkpoint_every must be 0 (off) or more, got -1'),
    (dict(keep_checkpoints=0), 'keep_checkpoints must be at least 1, got 0'),
    (dict(eval_every=-1), 'eval_every must be 0 (off) or more epochs, got -1'),
    (dict(warmup_steps=-1), 'warmup_steps must be 0 or more, got -1'),
    (dict(weight_decay=-0.1), 'weight_decay must be 0 or more, got -0.1'),
    (dict(clip_norm=0.0), 'clip_norm must be positive, got 0.0'),
    (dict(ema=1.0), 'ema must lie between 0 and 1 (e.g. 0.999), got 1.0'),
    (dict(seed=-1), 'seed must be 0 or more, got -1'),
    (dict(xla='yes'), 'xla must be True or False, got yes'),
    (dict(variable_update='ring'), "unknown variable_update 'ring'; choose one of: "
     'parameter_server, replicated, independent'),
    (dict(input='disk'), "unknown input 'disk'; choose one of: feed, staging, dataset, synthetic"),
    (dict(optimizer='lbfgs'),
     "unknown optimizer 'lbfgs'; choose one of: sgd, momentum, adam, lars"),
    (dict(learning_rate=0), 'learning_rate must be positive, got 0'),
    (dict(warmup_epochs=-1), 'warmup_epochs must be 0 or more, got -1'),
    (dict(lr_schedule='cosine:x'), "lr_schedule wants constant, piecewise:EPOCH=LR,..., "
     "exponential:FACTOR,EPOCHS, cosine[:EPOCHS] or poly[:POWER[,END]], got 'cosine:x'"),
    (dict(mean=[0.5]), 'mean and std go together'),
    (dict(mean=[0.5], std=[0.2]), 'mean/std normalise in the tf.data pipeline: use them with '
     'input dataset'),
    (dict(mean=[0.5], std=[0.0], input='dataset'), 'std values must be positive, got [0.0]'),
    (dict(learning_rate=LearningRate(0.1), warmup_epochs=1.0), 'learning_rate is a LearningRate, '
     'which holds its own schedule and warm-up: leave lr_schedule and warmup_epochs unset'),
    (dict(freeze='conv1/('), "freeze 'conv1/(' is not a valid regular expression: missing ), "
     'unterminated subpattern at position 6'),
])
def test_each_setting_has_one_rule_and_one_line(settings, message):
    with pytest.raises(SettingError) as error:
        TrainConfig(**settings)
    assert str(error.value) == message


def test_a_config_is_frozen_and_replace_checks_again():
    config = TrainConfig(towers=[0, 1], mean=[0.5], std=[0.25], input='dataset')
    assert config.towers == (0, 1) and config.mean == (0.5,)  # lists held as tuples
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.batch_size = 0
    with pytest.raises(SettingError, match='^batch_size must be at least 1, got 0$'):
        dataclasses.replace(config, batch_size=0)


def test_other_commands_flags_use_the_same_rules():
    assert check('batch_size', 7) == 7
    with pytest.raises(SettingError) as error:
        check('batch_size', 0)
    assert error.value.named(flag) == '--batch-size must be at least 1, got 0'
    assert set(RULES['variable_update'][2]) == set(VARIABLE_UPDATES)
    assert RULES['input'][2] == INPUT_MODES and RULES['optimizer'][2] == OPTIMIZERS


def test_messages_name_parameters_and_the_cli_names_flags():
    error = TowersError('{learning_rate} must be positive; lower {clip_norm}, not %s', '{x} 5%')
    assert str(error) == 'learning_rate must be positive; lower clip_norm, not {x} 5%'
    assert error.named(flag) == '--lr must be positive; lower --clip-norm, not {x} 5%'
    # A brace a user gave, inside the message itself, is left alone.
    text = 'regex a{2} and {not a mark} stay'
    assert str(TowersError(text)) == text
    assert [flag(s) for s in ('batch_size', 'tensorboard', 'timed_steps', 'param_device')] == [
        '--batch-size', '--no-tensorboard', '--window', '--param-device']
    # A parameter no command has a flag for keeps its name.
    assert flag('decay_pattern') == 'decay_pattern' and flag('steps_per_epoch') == 'steps_per_epoch'


def test_every_setting_rule_names_a_real_flag_of_towers_train():
    from towers.cli.parsers import build_parser
    train = build_parser()._subparsers._group_actions[0].choices['train']
    flags = {option for action in train._actions for option in action.option_strings}
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {'towers', 'steps_per_epoch',
                                                                    'warmup_steps'}
    assert {flag(name) for name in fields} - flags == set()


def test_the_names_the_parser_needs_come_without_tensorflow(tmp_path):
    code = ('import sys, towers.names, towers.config, towers.cli.parsers, towers.context; '
            'towers.config.TrainConfig(batch_size=3); '
            'sys.exit("tensorflow" in sys.modules)')
    assert subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path)).returncode == 0


# Flags of a setting whose command means another default, on purpose: (command, setting) ->
# why. Any other flag of a setting takes its default from the setting's TrainConfig field.
OWN_DEFAULTS = {
    ('train', 'input'): 'None: feed, or dataset for a split on disk (the dataset decides)',
    ('explain', 'input'): 'as train',
    ('bench', 'towers'): 'the tower counts to time, 1,2,4',
    ('bench', 'input'): 'the input modes to time, synthetic',
    ('bench', 'batch_size'): "tf_cnn_benchmarks' batch, 128",
    ('bench', 'variable_update'): 'the strategies to time',
    ('bench', 'optimizer'): "None: the model's own (sgd, or the recipe's)",
    ('bench', 'all_reduce_bucket'): 'the buckets to time, auto',
    ('plan', 'batch_size'): "tf_cnn_benchmarks' batch, 128",
    ('plan', 'cluster_mode'): 'the modes to plan',
    ('plan', 'all_reduce_bucket'): 'the buckets to plan, auto',
    ('plan', 'warmup_steps'): 'steps before a measured window',
    ('explain', 'optimizer'): "sgd, the textbook's: the bytes of its one apply",
    ('explain', 'cluster_mode'): 'the mode explained with --workers, in-graph',
    ('check', 'towers'): 'N towers against one device: 2',
    ('check', 'steps'): 'the steps compared, 5',
    ('eval', 'precision'): "None: the run's own",
    ('server', 'towers'): "a task's devices, 1",
}


def _setting_flags():
    """[(command, setting, the flag's default)] of every flag of a TrainConfig setting."""
    from towers.cli.config import FLAGS
    from towers.cli.parsers import build_parser
    settings = {f.name for f in dataclasses.fields(TrainConfig)}
    by_flag = {flag_name: setting for setting, flag_name in FLAGS.items()}
    found = []
    for command, parser in build_parser()._subparsers._group_actions[0].choices.items():
        for action in parser._actions:
            for option in action.option_strings:
                setting = by_flag.get(option, option[2:].replace('-', '_'))
                if option.startswith('--') and setting in settings:
                    found.append((command, setting, action.default))
    return found


def test_every_flag_of_a_setting_defaults_to_its_field_or_says_why_not():
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    flags = _setting_flags()
    assert len({setting for command, setting, _ in flags if command == 'train'}) >= 40
    differ = {(command, setting): default for command, setting, default in flags
              if default != defaults[setting]}
    assert set(differ) == set(OWN_DEFAULTS), sorted(set(differ) ^ set(OWN_DEFAULTS))
    # The one that disagreed by accident: --best-metric said accuracy, the field auto.
    assert ('train', 'best_metric', 'auto') in flags


def test_each_input_mode_is_a_class_that_says_the_facts_of_its_name():
    from towers.inputs import INPUTS
    from towers.names import InputMode
    assert list(INPUTS) == list(INPUT_MODES)
    for name, source in INPUTS.items():
        assert source.name == name
        assert InputMode(name, source.tf_data, source.stages, source.has_images) == \
            INPUT_MODES[name]
    # What the string tests asked, now facts: a tf.data pipeline (normalises, streams records),
    # a loader that stages, images to augment.
    assert [n for n, m in INPUT_MODES.items() if m.tf_data] == ['dataset']
    assert [n for n, m in INPUT_MODES.items() if m.stages] == ['staging']
    assert [n for n, m in INPUT_MODES.items() if not m.has_images] == ['synthetic']
