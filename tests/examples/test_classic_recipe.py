"""examples/classic_recipe.py: the tutorial's recipe in one file runs, learns, and is exact."""
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, 'examples', 'classic_recipe.py')


def _recipe():
    spec = importlib.util.spec_from_file_location('classic_recipe', RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recipe_runs_as_a_script_and_learns(tmp_path):
    process = subprocess.run(
        [sys.executable, RECIPE, '--model', 'small_convnet', '--towers', '3', '--steps', '60',
         '--batch-size', '50', '--lr', '0.2', '--devices', 'cpu'],
        capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    assert process.returncode == 0, process.stderr
    lines = process.stdout.splitlines()
    assert [line.split(':')[0] for line in lines[:2]] == ['step 50', 'step 60']
    match = re.fullmatch(r'test accuracy (\d\.\d+) on 1000 images, 3 tower\(s\) '
                         r'/cpu:0,/cpu:1,/cpu:2', lines[2])
    assert match, lines
    assert float(match.group(1)) > 0.5  # 10 classes: chance is 0.1


@pytest.mark.exact
def test_three_towers_of_the_recipe_train_as_one_device():
    recipe = _recipe()
    lines = []
    one = recipe.train('small_convnet', 1, steps=4, batch_size=10, learning_rate=0.1,
                       log=lines.append, devices='cpu')
    # 10 over 3 towers is 4/3/3: the weighted average makes the split exact.
    three = recipe.train('small_convnet', 3, steps=4, batch_size=10, learning_rate=0.1,
                         log=lines.append, devices='cpu')
    assert sorted(one) == sorted(three) == ['conv1/biases', 'conv1/weights', 'global_step',
                                            'logits/biases', 'logits/weights']
    assert three['global_step'] == one['global_step'] == 4
    moved = max(float(np.max(np.abs(one[name] - three[name]))) for name in one)
    assert moved <= 1e-6, moved
    assert lines[1].endswith('1 tower(s) /cpu:0') and lines[3].endswith('/cpu:0,/cpu:1,/cpu:2')
