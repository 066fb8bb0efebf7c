"""towers explain --plan-only: GPU and cluster plans, built on this CPU-only machine, never run."""
import json
import os

import pytest

from towers.cli import main
from towers.cluster.launch import SHARED_GPUS

GPU = '/device:GPU:%d'

# The plans made so far in this process, {(flags, SHARED_GPUS): its JSON}: a test asking for a
# plan another made reads it again (a cluster's plan builds a graph a task, over a CPU-s).
_PLANS = {}

# Two workers of two GPUs each, collective: a plan three tests read.
COLLECTIVE = ('--workers', '2', '--ps', '0', '--gpus-per-worker', '2', '--cluster-mode',
              'collective')


def _plan(capsys, *flags):
    key = (flags, os.environ.get(SHARED_GPUS))
    if key not in _PLANS:
        assert main(['explain', '--plan-only', '--model', 'small_convnet', '--batch-size', '8',
                     '--json'] + list(flags)) == 0
        _PLANS[key] = capsys.readouterr().out
    return json.loads(_PLANS[key])


def _tower_ops(report):
    """{device: {tower: ops}} of the devices that hold any tower's ops."""
    return {d: e['towers'] for d, e in report['devices'].items() if e['towers']}


def test_four_gpu_towers_replicated_meet_in_nccl(capsys):
    report = _plan(capsys, '--devices', '/gpu:0,/gpu:1,/gpu:2,/gpu:3', '--variable-update',
                   'replicated')
    assert report['towers'] == [['/gpu:0', '/gpu:1', '/gpu:2', '/gpu:3']]
    assert report['off_device'] == []  # every tower op on its own GPU (reads with their copy)
    for i in range(4):
        assert report['devices'][GPU % i]['towers'].get('tower_%d' % i, 0) > 50
        assert report['devices'][GPU % i]['variables'] == 4  # its copy of small_convnet's 4
    assert report['all_reduce'] == {'NcclAllReduce': {
        'count': 4, 'devices': [GPU % i for i in range(4)], 'hints': ['nccl']}}


def test_replicated_on_cpus_sums_in_shared_memory_without_collectives(capsys):
    report = _plan(capsys, '--towers', '3', '--devices', 'cpu', '--variable-update', 'replicated')
    assert report['all_reduce'] == {} and report['off_device'] == []
    assert sorted(_tower_ops(report)) == ['/device:CPU:%d' % i for i in range(3)]


@pytest.mark.parametrize('mode,ps', [('in-graph', 1), ('collective', 0),
                                     ('parameter-server', 1)])
def test_every_cluster_mode_puts_each_task_towers_on_its_gpus(capsys, mode, ps):
    report = _plan(capsys, '--workers', '2', '--ps', str(ps), '--gpus-per-worker', '2',
                   '--cluster-mode', mode)
    towers = ['/job:worker/task:%d/device:GPU:%d' % (k, i) for k in range(2) for i in range(2)]
    if mode == 'in-graph':  # the chief's one graph holds every task's towers
        assert report['towers'] == [towers]
    else:  # each worker's own graph, its own towers
        assert report['towers'] == [towers[:2], towers[2:]]
    assert report['off_device'] == []
    on_gpus = {d for d in _tower_ops(report) if 'GPU' in d}
    assert on_gpus == set(towers)


def test_collective_workers_all_reduce_gpu_gradients_with_the_nccl_hint(capsys):
    report = _plan(capsys, *COLLECTIVE)
    collectives = report['all_reduce']['CollectiveReduce']
    assert set(collectives['hints']) == {'nccl', 'auto'}  # gradients on GPU, results on CPU
    assert {'/job:worker/task:%d/device:GPU:0' % k for k in range(2)} <= set(
        collectives['devices'])
    # Each worker's copy of the variables sits on its first GPU.
    assert report['devices']['/job:worker/task:1/device:GPU:0']['variables'] == 4


@pytest.mark.parametrize('mode,ps', [('in-graph', 1), ('collective', 0)])
def test_more_towers_than_a_tasks_gpus_take_its_logical_gpus(capsys, mode, ps):
    report = _plan(capsys, '--workers', '2', '--ps', str(ps), '--gpus-per-worker', '1',
                   '--towers', '2', '--cluster-mode', mode)
    towers = ['/job:worker/task:%d/device:GPU:%d' % (k, i) for k in range(2) for i in range(2)]
    assert sum(report['towers'], []) == towers and report['off_device'] == []


def test_collective_workers_that_share_a_gpu_all_reduce_without_nccl(capsys, monkeypatch):
    monkeypatch.setenv(SHARED_GPUS, '1')  # as towers launch tells two workers on one GPU
    report = _plan(capsys, '--workers', '2', '--gpus-per-worker', '1', '--cluster-mode',
                   'collective')
    assert set(report['all_reduce']['CollectiveReduce']['hints']) == {'auto'}


def test_staging_puts_a_staging_area_on_each_gpu(capsys):
    report = _plan(capsys, '--devices', '/gpu:0,/gpu:1', '--input', 'staging')
    assert report['staging'] == {GPU % i: {'put': 1, 'get': 1, 'images': 'float32'}
                                 for i in range(2)}


def test_the_dataset_input_is_staged_on_gpus_and_its_bytes_cross_as_bytes(capsys):
    report = _plan(capsys, '--devices', '/gpu:0,/gpu:1', '--input', 'dataset')
    assert report['staging'] == {GPU % i: {'put': 1, 'get': 1, 'images': 'uint8'}
                                 for i in range(2)}
    assert report['off_device'] == []
    # On CPU towers the host's memory is the towers': nothing is staged.
    assert _plan(capsys, '--towers', '2', '--devices', 'cpu', '--input', 'dataset')[
        'staging'] == {}


def test_more_towers_than_gpus_plan_logical_gpus_that_share_a_sum_instead_of_nccl(capsys):
    report = _plan(capsys, '--towers', '4', '--gpus-per-worker', '1', '--variable-update',
                   'replicated')
    assert report['towers'] == [['/gpu:%d' % i for i in range(4)]]
    assert report['gpus'] == [[0, 0, 0, 0]]  # four logical GPUs of GPU 0
    assert report['all_reduce'] == {} and report['off_device'] == []  # no NCCL between them
    for i in range(4):  # and the step counter on /gpu:0: --param-device auto keeps the host
        # ops of towers that share one GPU on it
        assert report['devices'][GPU % i]['variables'] == 4 + (i == 0)
    two = _plan(capsys, '--towers', '4', '--gpus-per-worker', '2', '--variable-update',
                'replicated')
    assert two['gpus'] == [[0, 0, 1, 1]] and two['all_reduce'] == {}
    whole = _plan(capsys, '--towers', '2', '--gpus-per-worker', '2', '--variable-update',
                  'replicated')
    assert whole['gpus'] == [[0, 1]] and list(whole['all_reduce']) == ['NcclAllReduce']
    assert main(['explain', '--plan-only', '--model', 'small_convnet', '--towers', '3',
                 '--gpus-per-worker', '2']) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        'logical GPUs: 2 tower(s) on GPU 0 (/gpu:0, /gpu:1), an equal share of its memory '
        'each; 1 tower(s) on GPU 1 (/gpu:2), an equal share of its memory each')


def test_the_plan_reads_as_lines(capsys):
    assert main(['explain', '--plan-only', '--model', 'small_convnet', '--devices',
                 '/gpu:0,/gpu:1', '--variable-update', 'replicated']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ('explain: small_convnet on 2 tower(s), global batch 100, feed input, '
                        'replicated, variables: a copy on each tower (replicated), all-reduced '
                        'by NCCL')
    assert lines[1].startswith('plan only: nothing ran')
    assert ('all-reduce: NcclAllReduce x2 on /device:GPU:0, /device:GPU:1 (communication '
            'hint nccl)') in lines
    assert lines[-1] == "every tower's ops are planned on its tower's device"


@pytest.mark.parametrize('flags,message', [
    (['--gpus-per-worker', '2'], '--gpus-per-worker, --cluster-mode and --input staging or '
                                 'dataset go with --plan-only'),
    (['--plan-only', '--towers', '2', '--gpus-per-worker', '1', '--no-logical-gpus'],
     'asked for 2 GPU towers but this machine has 1 visible GPU(s), and --no-logical-gpus '
     'refuses to split a GPU into logical ones'),
    (['--plan-only', '--workers', '2', '--variable-update', 'replicated'],
     'a cluster mode decides where the variables live'),
    (['--plan-only', '--devices', '/gpu:0,/cpu:1'], 'mixes CPUs and GPUs'),
])
def test_bad_plan_flags_are_one_line(capsys, flags, message):
    assert main(['explain', '--model', 'small_convnet'] + flags) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith('towers: error: ') and message in err[0], err


def test_gpu_towers_build_their_maps_channels_first_unless_asked(capsys):
    """NCHW on GPUs (cuDNN's float32 preference), NHWC on CPUs, --data-format over both."""
    devices = ['--devices', '/gpu:0,/gpu:1']
    assert set(_plan(capsys, *devices)['convolutions']) == {'NCHW'}
    assert set(_plan(capsys, *devices, '--data-format', 'NHWC')['convolutions']) == {'NHWC'}
    assert set(_plan(capsys, '--towers', '2', '--devices', 'cpu')['convolutions']) == {'NHWC'}
    report = _plan(capsys, *COLLECTIVE)
    assert set(report['convolutions']) == {'NCHW'} and report['off_device'] == []
