"""The lab's code (examples/lab/): its skeleton, its answer and the three classic mistakes, each
graded by `towers check --average`, which names what a wrong average did."""
import pathlib

import pytest

from towers.cli import main

LAB = pathlib.Path(__file__).resolve().parents[2] / 'examples' / 'lab'
# 10 examples over 3 towers: 4/3/3, shares an unweighted mean gets wrong.
CHECK = ['check', '--model', 'small_convnet', '--towers', '3', '--batch-size', '10',
         '--steps', '1', '--devices', 'cpu']


def _check(capsys, spec, *flags):
    status = main(CHECK + list(flags) + ['--average', spec])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.strip().splitlines()


@pytest.mark.exact
def test_the_answer_gives_one_devices_update(capsys):
    spec = '%s:average_gradients' % (LAB / 'answers' / 'average.py')
    status, out, err = _check(capsys, spec)
    assert status == 0, err
    assert out[1] == "averaging with %s in place of towers' average_gradients" % spec
    assert out[-1].endswith('3 towers train the same model as one device, averaged by ' + spec)


def test_the_skeleton_says_it_is_not_written_yet(capsys):
    status, _, err = _check(capsys, '%s:average_gradients' % (LAB / 'average.py'))
    assert status == 1
    assert err == ["towers: error: your average_gradients is not written yet "
                   "(NotImplementedError: combine the towers' gradients in "
                   "examples/lab/average.py)"]


@pytest.mark.exact
@pytest.mark.parametrize('mistake,words', [
    ('unweighted_mean', 'an unweighted mean: each tower counts 1/3 however many examples it '
                        'had; weight tower i by its share of the batch, count_i / batch'),
    ('summed', "a sum, not a mean: the step is 3 times one device's; weight each tower by its "
               "share of the batch")])
def test_each_classic_mistake_is_named_with_the_first_gradient_off(capsys, mistake, words):
    spec = '%s:%s' % (LAB / 'mistakes.py', mistake)
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
