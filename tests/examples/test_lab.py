"""The lab (examples/lab/): every output its sheet shows is what its command prints now, and its
code (the skeleton, the answer, the three classic mistakes) graded by `towers check --average`,
which names what a wrong average did."""
import importlib.util
import pathlib

import pytest

from towers.cli import main

LAB = pathlib.Path(__file__).resolve().parents[2] / 'examples' / 'lab'
# 10 examples over 3 towers: 4/3/3, shares an unweighted mean gets wrong.
CHECK = ['check', '--model', 'small_convnet', '--towers', '3', '--batch-size', '10',
         '--steps', '1', '--devices', 'cpu']


def _transcript():
    spec = importlib.util.spec_from_file_location('lab_transcript', LAB / 'transcript.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRANSCRIPT = _transcript()
BLOCKS = TRANSCRIPT.blocks((LAB / 'README.md').read_text(encoding='utf-8'))


@pytest.mark.parametrize('command,expected', [block[:2] for block in BLOCKS],
                         ids=['step-%d' % i for i in range(len(BLOCKS))])
def test_the_sheet_shows_what_its_command_prints(command, expected):
    """The skeleton's line, the answer passing and the unweighted mean named among them: the
    sheet shows each whole (python examples/lab/transcript.py --write regenerates them)."""
    status, printed = TRANSCRIPT.run(command)
    assert status == (1 if any('towers: error: ' in line for line in expected) else 0), printed
    assert TRANSCRIPT.differs(expected, printed) is None, TRANSCRIPT.differs(expected, printed)


def test_the_sheet_has_a_command_for_every_step_that_runs_one():
    assert len(BLOCKS) == 14
    assert [' '.join(c.split()[:2]) if c.startswith('python') else 'towers'
            for c, _, _ in BLOCKS] == (['python examples/classic_recipe.py'] + ['towers'] * 10
                                       + ['python examples/lab/sweep.py'] + ['towers'] * 2)


def test_what_the_comparison_masks_and_what_it_does_not():
    row = 'synthetic  2       fp32       /cpu:0,/cpu:1      8079.5 ± 286.7       1.000  1.110'
    assert TRANSCRIPT.differs([row], [row.replace('8079.5 ± 286.7', '612.0 ± 9.1')
                                      .replace('1.110', '0.982')]) is None
    line = 'largest gradient difference: 2.98e-08 (conv1/biases); gradients reach 0.112'
    assert TRANSCRIPT.differs([line], [line.replace('2.98e-08', '0')
                                       .replace('0.112', '0.1135')]) is not None  # 0 not masked
    assert TRANSCRIPT.differs([line], [line.replace('2.98e-08', '5.96e-08')]) is None
    assert TRANSCRIPT.differs([line], [line.replace('0.112', '0.1135')]) is None  # within 2%
    assert TRANSCRIPT.differs([line], [line.replace('0.112', '0.118')]) is not None
    assert TRANSCRIPT.differs([line], [line.replace('conv1', 'conv2')]) is not None
    assert TRANSCRIPT.differs([line], [line, line]) == 'printed 2 lines, the sheet shows 1'


def _check(capsys, spec, *flags):
    status = main(CHECK + list(flags) + ['--average', spec])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.strip().splitlines()


@pytest.mark.exact
def test_a_sum_is_named_with_the_first_gradient_off(capsys):
    # (The unweighted mean: the sheet's step 4 shows its line.)
    spec, words = '%s:summed' % (LAB / 'mistakes.py'), (
        "a sum, not a mean: the step is 3 times one device's; weight each tower by its share "
        "of the batch")
    status, _, err = _check(capsys, spec)
    assert status == 1 and len(err) == 1, err
    assert err[0].startswith('towers: error: 3 towers differ from one device by ')
    assert "; the first gradient off is conv1/weights's: %s is %s" % (spec, words) in err[0]


def test_the_wrong_axis_is_named_before_a_step_runs(capsys):
    status, out, err = _check(capsys, '%s:wrong_axis' % (LAB / 'mistakes.py'))
    assert status == 1 and not any(line.startswith('largest') for line in out)
    # 3 towers and a 3x3x1x32 kernel: the wrong axis leaves the kernel its shape, not the bias.
    assert err == ['towers: error: your wrong_axis averaged over the wrong axis: it gives '
                   'conv1/biases a gradient of shape [3], its shape is [32]; stack the towers\' '
                   'gradients on a new axis 0 and reduce over that axis']


def test_equal_shares_are_said_to_hide_the_unweighted_mean(capsys):
    status, out, _ = _check(capsys, '%s:unweighted_mean' % (LAB / 'mistakes.py'),
                            '--towers', '2')
    assert status == 0
    assert out[1].endswith("in place of towers' average_gradients (the towers' shares are "
                           "equal here, 5/5: an unweighted mean is right on them; 3 towers "
                           "cut it unevenly)")


def test_a_module_on_the_path_and_bad_names_are_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'mine.py').write_text('import tensorflow as tf\n\n\ndef average(grads):\n'
                                      '    return 1 / 0\n')
    (tmp_path / 'broken.py').write_text('x = (\n')
    cases = [('mine:average', 'your average raised ZeroDivisionError at mine.py line 5: '
                              'division by zero'),
             ('mine:other', '--average: mine has no function other (it has average)'),
             ('nowhere:f', '--average: no module nowhere here or on the path (a file: give '
                           'its path, ending .py)'),
             ('no/file.py:f', '--average: there is no file no/file.py'),
             ('broken.py:f', '--average: importing broken.py raised SyntaxError: '),
             ('mine', "--average takes MODULE:FUNCTION (a module or a .py file, a colon, the "
                      "function's name), got 'mine'")]
    for spec, message in cases:
        assert main(CHECK + ['--average', spec]) == 1, spec
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith('towers: error: ' + message), (spec, err)


def _module(name):
    spec = importlib.util.spec_from_file_location('lab_' + name, LAB / (name + '.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sweep_plots_its_rows_and_says_a_bad_grid_in_one_line(tmp_path, capsys):
    sweep = _module('sweep')
    rows = [(2, 50, 0.001, 200, 0.918), (2, 200, 0.001, 50, 0.867),
            (2, 50, 0.004, 200, 0.948), (2, 200, 0.004, 50, 0.919)]
    sweep.plot(rows, str(tmp_path / 'sweep.png'))
    assert (tmp_path / 'sweep.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert sweep.main(['--batch-size', '50,0']) == 1
    assert capsys.readouterr().err.strip() == (
        "sweep: error: batch_size wants positive integers like 1,2,4, got '50,0'")


SPLITS = '''import tensorflow as tf
from towers.slicing import TowerSlice
from examples_answer import split_batch as right


def own_batch(images, labels, num_towers):
    return [s._replace(batch=s.count) for s in right(images, labels, num_towers)]


def no_stand_in(images, labels, num_towers):
    cut = right(images, labels, num_towers)
    return [s._replace(images=s.images[:s.count], labels=s.labels[:s.count]) for s in cut]


def overlapping(images, labels, num_towers):
    cut = right(images, labels, num_towers)
    start = cut[0].count - 1  # tower 1 begins one example early
    return [cut[0], cut[1]._replace(images=images[start:start + cut[1].count],
                                    labels=labels[start:start + cut[1].count])] + cut[2:]


def one_short(images, labels, num_towers):
    return right(images, labels, num_towers)[:-1]


def one_list(images, labels, num_towers):
    return TowerSlice(images, labels, tf.shape(labels)[0], tf.shape(labels)[0])
'''


def test_each_mistake_of_a_cut_is_named_before_a_step(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'examples_answer.py').write_text((LAB / 'answers' / 'split.py').read_text())
    (tmp_path / 'cuts.py').write_text(SPLITS)
    cases = [
        (str(LAB / 'split.py') + ':split_batch', 'your split_batch is not written yet '
         '(NotImplementedError: cut the batch in examples/lab/split.py)'),
        ('cuts:own_batch', "your own_batch says tower 0's batch is 4, with 10 examples over 3 "
         'towers: a tower counts count / batch of the update, so batch is the whole '
         "batch's size"),
        ('cuts:no_stand_in', 'your no_stand_in hands tower 2 no image at all, with 2 examples '
         'over 3 towers: give a tower without examples a stand-in'),
        ('cuts:overlapping', 'your overlapping gives example 3 to two towers and example 6 to '
         'none, with 10 examples over 3 towers: each example to exactly one'),
        ('cuts:one_short', 'your one_short cut 2 slices for 3 towers: one per tower'),
        ('cuts:one_list', 'your one_list returned TowerSlice: it returns one '
         'TowerSlice(images, labels, count, batch) per tower'),
    ]
    for spec, message in cases:
        assert main(CHECK + ['--split', spec]) == 1, spec
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith('towers: error: ' + message), (spec, err)
