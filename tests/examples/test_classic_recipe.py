"""examples/classic_recipe.py: the tutorial's recipe in one file runs, learns, and is exact."""
import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, 'examples', 'classic_recipe.py')


def _recipe():
    spec = importlib.util.spec_from_file_location('classic_recipe', RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# As a script (`python examples/classic_recipe.py ... --towers 3 --steps 60`), learning far
# above chance: the lab's step 2 shows its whole output, held by tests/examples/test_lab.py.


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
