"""What a run says of its exactness, and a resume that changes it."""
from towers import exactness
from towers.cli import main


def test_each_run_says_whether_a_resume_of_it_is_bit_exact():
    assert exactness.resume_line(['/cpu:0', '/cpu:1']) == (
        'exact: a resume continues bit-exactly (CPU kernels; op determinism off)')
    assert exactness.resume_line(['/gpu:0']) == (
        'not exact: op determinism off on GPU towers, so a resume continues, not bit-exactly '
        "(cuDNN's algorithms and the GPU's reductions vary from process to process); op "
        'determinism (train --deterministic) makes it exact')
    with exactness.exact():
        assert exactness.resume_line(['/gpu:0']) == (
            'exact: TF32 off, op determinism on; this run and a resume of it are bit-exact')


def test_a_resume_without_the_determinism_its_run_had_is_said_to_be_inexact(tmp_path, capsys):
    run = ['train', '--devices', 'cpu', '--model', 'small_convnet', '--quiet', '--eval-every',
           '0', '--batch-size', '20', '--logdir', str(tmp_path / 'run')]
    assert main(run + ['--steps', '1', '--deterministic']) == 0
    assert 'exact: TF32 off, op determinism on; this run and a resume of it are bit-exact' in \
        capsys.readouterr().out.splitlines()
    assert main(run + ['--steps', '2']) == 0
    out = capsys.readouterr().out.splitlines()
    assert ('warning: %s was trained with op determinism on and resumes with it off: it '
            'continues, not bit-exactly' % (tmp_path / 'run')) in out
    assert main(run + ['--steps', '3']) == 0  # made without, resumed without: nothing to say
    assert not [line for line in capsys.readouterr().out.splitlines()
                if line.startswith('warning:')]


def test_bench_times_bit_exact_runs_and_leaves_the_process_as_it_was(capsys):
    before = exactness.describe()
    assert main(['bench', '--deterministic', '--devices', 'cpu', '--towers', '1', '--model',
                 'small_convnet', '--batch-size', '16', '--warmup', '1', '--window', '2']) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'deterministic: TF32 off, op determinism on'
    assert out[-1].startswith('synthetic  1       fp32       /cpu:0')
    assert exactness.describe() == before
    assert main(['bench', '--deterministic', '--input-only', '--dataset', 'imagenet:x']) == 1
    assert capsys.readouterr().err.strip() == (
        "towers: error: --deterministic times one process's towers: not with --cluster-mode "
        'or --input-only')
