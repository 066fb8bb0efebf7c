"""The README's Python API example is real code: it must run as printed."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / 'README.md'


def _python_blocks():
    return re.findall(r'```python\n(.*?)```', README.read_text(encoding='utf-8'), re.S)


def test_readme_recipe_runs_and_trains_on_two_towers():
    block, = _python_blocks()
    assert 'range(200)' in block
    namespace = {}
    # Fewer steps than printed: the point is that the code runs as written.
    exec(compile(block.replace('range(200)', 'range(5)'), str(README), 'exec'), namespace)
    towers = namespace['towers']
    assert [t.device for t in towers] == ['/cpu:0', '/cpu:1']
    assert namespace['step'] == 4
    assert namespace['mnist'].train.epochs_completed == 0
