"""The README's Python examples are real code: they must run as printed."""
import pathlib
import re

import numpy as np
import tensorflow as tf

README = pathlib.Path(__file__).resolve().parent.parent / 'README.md'


def _python_blocks():
    return re.findall(r'```python\n(.*?)```', README.read_text(encoding='utf-8'), re.S)


def test_readme_has_the_recipe_and_the_trainer():
    recipe, trainer = _python_blocks()
    assert 'average_gradients' in recipe and 'Trainer(' in trainer


def test_readme_recipe_runs_and_trains_on_two_towers():
    block = _python_blocks()[0]
    assert 'range(200)' in block and 'resolve_devices(num_towers=2)' in block
    namespace = {}
    # Fewer steps than printed: the point is that the code runs as written. On two CPU
    # towers, GPU machines too (where the printed call gives GPUs).
    block = block.replace('range(200)', 'range(5)').replace(
        'resolve_devices(num_towers=2)', "resolve_devices(num_towers=2, devices='cpu')")
    exec(compile(block, str(README), 'exec'), namespace)
    towers = namespace['towers']
    assert [t.device for t in towers] == ['/cpu:0', '/cpu:1']
    assert namespace['step'] == 4
    assert namespace['mnist'].train.epochs_completed == 0


def test_readme_trainer_runs_its_model_desc_with_every_callback(tmp_path):
    block = _python_blocks()[1]
    assert "epochs=3, logdir='/tmp/towers-digits'" in block
    # One short epoch into a temporary folder instead of three into /tmp.
    block = block.replace("epochs=3, logdir='/tmp/towers-digits'",
                          "epochs=3, steps=4, steps_per_epoch=2, logdir=%r" % str(tmp_path))
    namespace = {}
    exec(compile(block, str(README), 'exec'), namespace)
    result = namespace['result']
    assert result['steps'] == 4 and set(result['test']) == {'loss', 'accuracy'}
    assert (tmp_path / 'stats.jsonl').read_text().count('\n') == 2
    assert (tmp_path / 'best' / 'best.json').exists()
    # The decayed rate and the processors reached the graph: the variables moved and are finite.
    weights = tf.train.load_variable(str(tmp_path), 'conv1/weights')
    assert np.isfinite(weights).all()
