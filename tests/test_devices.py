"""Device choice: defaults, explicit lists, errors instead of fallbacks, session config."""
import pytest
import tensorflow as tf

from towers.cli import main
from towers.devices import (
    gpu_split,
    physical_gpus,
    resolve_devices,
    resolve_param_device,
    session_config,
)
from towers.errors import DeviceError
from towers.exactness import describe
from towers.tools import check

tf1 = tf.compat.v1


@pytest.mark.skipif(bool(tf.config.list_physical_devices('GPU')), reason='a GPU is visible')
def test_default_on_this_cpu_only_machine():
    assert resolve_devices() == ['/cpu:0']
    assert resolve_devices(num_towers=3) == ['/cpu:0', '/cpu:1', '/cpu:2']


def test_without_gpus_num_towers_gives_virtual_cpus():
    assert resolve_devices(num_gpus=0) == ['/cpu:0']
    assert resolve_devices(num_towers=3, num_gpus=0) == ['/cpu:0', '/cpu:1', '/cpu:2']


def test_gpus_are_the_default():
    assert resolve_devices(num_gpus=2) == ['/gpu:0', '/gpu:1']
    assert resolve_devices(num_towers=1, num_gpus=2) == ['/gpu:0']


@pytest.mark.parametrize('num_towers,num_gpus,expected,gpus,per_gpu', [
    (2, 1, ['/gpu:0', '/gpu:1'], (0, 0), 2),
    (4, 1, ['/gpu:0', '/gpu:1', '/gpu:2', '/gpu:3'], (0, 0, 0, 0), 4),
    (3, 2, ['/gpu:0', '/gpu:1', '/gpu:2'], (0, 0, 1), 2),
    # Dealt out evenly: two on GPU 0, one on each other, never three GPUs' worth on two.
    (5, 4, ['/gpu:0', '/gpu:1', '/gpu:2', '/gpu:4', '/gpu:6'], (0, 0, 1, 2, 3), 2),
    (4, 2, ['/gpu:0', '/gpu:1', '/gpu:2', '/gpu:3'], (0, 0, 1, 1), 2),
])
def test_more_towers_than_gpus_split_the_gpus_into_logical_gpus(num_towers, num_gpus, expected,
                                                                gpus, per_gpu):
    towers = resolve_devices(num_towers=num_towers, num_gpus=num_gpus)
    assert towers == expected
    assert physical_gpus(towers, num_gpus) == gpus
    config = session_config(towers, num_gpus=num_gpus)
    assert config.gpu_options.experimental.num_virtual_devices_per_gpu == per_gpu
    assert gpu_split(towers, num_gpus) == per_gpu


def test_towers_that_fit_the_gpus_split_nothing():
    towers = resolve_devices(num_towers=2, num_gpus=2)
    config = session_config(towers, num_gpus=2)
    assert config.gpu_options.experimental.num_virtual_devices_per_gpu == 0  # unset
    assert physical_gpus(towers, 2) == (0, 1)
    assert physical_gpus(['/cpu:0', '/cpu:1'], 2) == (None, None)


def test_a_process_of_several_tower_counts_keeps_its_largest_split():
    # bench 1,2,4 on two GPUs: every row under 2 logical GPUs per GPU, 2 towers a GPU apart.
    assert resolve_devices(num_towers=2, num_gpus=2, per_gpu=2) == ['/gpu:0', '/gpu:2']
    assert resolve_devices(num_towers=1, num_gpus=2, per_gpu=2) == ['/gpu:0']
    assert physical_gpus(['/gpu:0', '/gpu:2'], 2, per_gpu=2) == (0, 1)
    config = session_config(['/gpu:0'], num_gpus=2, per_gpu=2)
    assert config.gpu_options.experimental.num_virtual_devices_per_gpu == 2
    with pytest.raises(DeviceError, match='3 towers do not fit in 1 GPU'):
        resolve_devices(num_towers=3, num_gpus=1, per_gpu=2)


def test_refusing_logical_gpus_keeps_one_tower_per_gpu():
    assert resolve_devices(num_towers=2, num_gpus=2, logical_gpus=False) == ['/gpu:0', '/gpu:1']
    with pytest.raises(DeviceError) as error:
        resolve_devices(num_towers=3, num_gpus=2, logical_gpus=False)
    assert str(error.value) == (
        'asked for 3 GPU towers but this machine has 2 visible GPU(s), and no_logical_gpus '
        'refuses to split a GPU into logical ones; use towers 2 or fewer, or devices cpu for '
        'CPU towers')
    with pytest.raises(DeviceError, match='refuses to split'):
        resolve_devices(devices='/gpu:0,/gpu:1', num_gpus=1, logical_gpus=False)


def test_devices_may_name_a_kind():
    assert resolve_devices(num_towers=2, devices='cpu', num_gpus=2) == ['/cpu:0', '/cpu:1']
    assert resolve_devices(devices='cpu', num_gpus=2) == ['/cpu:0']
    assert resolve_devices(num_towers=2, devices='GPU', num_gpus=1) == ['/gpu:0', '/gpu:1']
    with pytest.raises(DeviceError, match=r'/gpu:0 does not exist: this machine has 0 visible'):
        resolve_devices(num_towers=2, devices='gpu', num_gpus=0)


def test_named_logical_gpus_exist_as_far_as_the_split_goes():
    assert resolve_devices(devices='/gpu:0,/gpu:1', num_gpus=1) == ['/gpu:0', '/gpu:1']
    with pytest.raises(DeviceError, match=r'^/gpu:2 does not exist: this machine has 1 visible '
                                          r'GPU\(s\) split into 2 logical GPUs each$'):
        resolve_devices(devices='/gpu:0,/gpu:2', num_gpus=1)


@pytest.mark.parametrize('devices,num_gpus,expected', [
    ('/gpu:0,/gpu:1', 2, ['/gpu:0', '/gpu:1']),
    (' /GPU:1 , /gpu:0 ', 2, ['/gpu:1', '/gpu:0']),  # order is kept: tower_0 on /gpu:1
    ('GPU:1', 2, ['/gpu:1']),
    ('/device:CPU:0', 0, ['/cpu:0']),
    (['cpu:2', '/device:cpu:0'], 0, ['/cpu:2', '/cpu:0']),
])
def test_explicit_lists_are_canonicalised(devices, num_gpus, expected):
    assert resolve_devices(devices=devices, num_gpus=num_gpus) == expected


def test_explicit_list_with_agreeing_tower_count():
    devices = resolve_devices(num_towers=2, devices='/cpu:0,/cpu:1', num_gpus=0)
    assert devices == ['/cpu:0', '/cpu:1']


def test_a_missing_gpu_is_an_error_never_a_cpu_fallback():
    with pytest.raises(DeviceError, match=r'/gpu:0 does not exist.*0 visible GPU'):
        resolve_devices(devices='/gpu:0', num_gpus=0)
    with pytest.raises(DeviceError, match=r'/gpu:2 does not exist.*2 visible GPU'):
        resolve_devices(devices='/gpu:0,/gpu:2', num_gpus=2)


@pytest.mark.parametrize('kwargs,match', [
    (dict(devices='/gpu:0,/gpu:0', num_gpus=2), 'twice'),
    (dict(devices='/cpu:1,cpu:1', num_gpus=0), 'twice'),
    (dict(devices='/cpu:0,/gpu:0', num_gpus=1), 'mixes CPUs and GPUs'),
    (dict(devices='/tpu:0', num_gpus=0), 'bad device name'),
    (dict(devices='/gpu:x', num_gpus=1), 'bad device name'),
    (dict(devices='/gpu:0/gpu:1', num_gpus=2), 'bad device name'),
    (dict(devices=',', num_gpus=0), 'names no device'),
    (dict(num_towers=3, devices='/cpu:0,/cpu:1', num_gpus=0), 'towers 3 disagrees with 2'),
    (dict(num_towers=0, num_gpus=0), 'at least 1, got 0'),
    (dict(num_towers=0, num_gpus=2), 'at least 1, got 0'),
    (dict(num_towers=-1, num_gpus=0), 'at least 1, got -1'),
])
def test_bad_requests_are_device_errors(kwargs, match):
    with pytest.raises(DeviceError, match=match):
        resolve_devices(**kwargs)


@pytest.mark.parametrize('tower_devices,param_device,cpus', [
    (['/cpu:0'], '/cpu:0', 1),
    (['/cpu:0', '/cpu:1', '/cpu:2'], '/cpu:0', 3),
    (['/cpu:2', '/cpu:0'], '/cpu:0', 3),
    (['/cpu:0'], '/cpu:3', 4),
    (['/gpu:0', '/gpu:1'], '/cpu:0', 1),
    (['/gpu:0'], '/gpu:0', 1),
])
def test_session_config_counts_the_highest_cpu(tower_devices, param_device, cpus):
    config = session_config(tower_devices, param_device, num_gpus=2)
    assert config.device_count['CPU'] == cpus
    # Devices are checked here, so soft placement only ever moves a single op
    # that has no kernel on its device (as in the classic tutorial).
    assert config.allow_soft_placement is True


@pytest.mark.parametrize('tower_devices,param_device,num_gpus,missing', [
    (['/gpu:0', '/gpu:2'], '/cpu:0', 1, 2),  # 2 towers: 2 logical GPUs, /gpu:0 and /gpu:1
    (['/cpu:0'], '/gpu:0', 0, 0),
    (['/gpu:2'], '/cpu:0', 2, 2),
])
def test_session_config_refuses_gpus_that_do_not_exist(tower_devices, param_device, num_gpus,
                                                       missing):
    with pytest.raises(DeviceError, match='/gpu:%d does not exist: this machine has %d visible'
                       % (missing, num_gpus)):
        session_config(tower_devices, param_device, num_gpus=num_gpus)


def test_session_config_passes_other_fields_through():
    config = session_config(['/cpu:0'], intra_op_parallelism_threads=1)
    assert config.intra_op_parallelism_threads == 1
    assert config.device_count['CPU'] == 1


def test_a_session_with_that_config_has_that_many_cpus():
    config = session_config(['/cpu:0', '/cpu:1', '/cpu:3'])
    with tf.Graph().as_default() as graph, tf1.Session(graph=graph, config=config) as sess:
        cpus = sorted(d.name.split('/')[-1] for d in sess.list_devices()
                      if d.device_type == 'CPU')
    assert cpus == ['device:CPU:0', 'device:CPU:1', 'device:CPU:2', 'device:CPU:3']


def test_param_device_choices():
    cpu_towers = ['/cpu:0', '/cpu:1']
    assert resolve_param_device('cpu', cpu_towers) == '/cpu:0'
    assert resolve_param_device(None, cpu_towers) == '/cpu:0'
    assert resolve_param_device('/cpu:1', cpu_towers) == '/cpu:1'
    assert resolve_param_device('device:CPU:2', cpu_towers) == '/cpu:2'
    assert resolve_param_device('gpu', ['/gpu:1', '/gpu:0'], num_gpus=2) == '/gpu:1'
    assert resolve_param_device('/gpu:1', ['/gpu:0'], num_gpus=2) == '/gpu:1'
    with pytest.raises(DeviceError, match='needs GPU towers'):
        resolve_param_device('gpu', cpu_towers)
    with pytest.raises(DeviceError, match='bad device name'):
        resolve_param_device('host', cpu_towers)


@pytest.mark.parametrize('tower_devices,num_gpus,per_gpu,expected', [
    (['/cpu:0'], 0, None, '/cpu:0'),  # CPU towers: the classic /cpu:0, as before
    (['/cpu:0', '/cpu:1'], 2, None, '/cpu:0'),  # on a GPU machine too (--devices cpu)
    (['/gpu:0'], 1, None, '/gpu:0'),  # one GPU tower: on its GPU
    (['/gpu:1'], 2, None, '/gpu:1'),  # the one GPU the towers use, not the first there
    (['/gpu:0', '/gpu:1'], 1, None, '/gpu:0'),  # logical GPUs of one GPU: its first tower
    (['/gpu:2', '/gpu:3'], 2, 2, '/gpu:2'),  # both on GPU 1 (split into two)
    (['/gpu:0'], 2, 2, '/gpu:0'),  # one tower under a bench's split of two
    (['/gpu:0', '/gpu:1'], 2, None, '/cpu:0'),  # two GPUs: the host, as before
    (['/gpu:0', '/gpu:2'], 2, 2, '/cpu:0'),  # one tower on each GPU under a split of two
    (['/gpu:0', '/gpu:1', '/gpu:2'], 2, None, '/cpu:0'),  # 2 on GPU 0, 1 on GPU 1
])
def test_auto_keeps_the_variables_on_the_gpu_where_every_tower_is_on_one(
        tower_devices, num_gpus, per_gpu, expected):
    assert resolve_param_device('auto', tower_devices, num_gpus, per_gpu) == expected


def test_param_device_on_a_missing_gpu_is_an_error():
    with pytest.raises(DeviceError, match=r'/gpu:0 does not exist.*0 visible GPU'):
        resolve_param_device('/gpu:0', ['/cpu:0'], num_gpus=0)
    with pytest.raises(DeviceError, match=r'/gpu:2 does not exist.*2 visible GPU'):
        resolve_param_device('/gpu:2', ['/gpu:0'], num_gpus=2)


@pytest.mark.parametrize('cuda_build,visible,reason', [
    (False, None, "this TensorFlow is a CPU-only build (tensorflow-cpu): on a GPU machine, "
                  "pip install -e '.[gpu]'"),
    (True, '', 'CUDA_VISIBLE_DEVICES is empty, which hides every GPU'),
    (True, '0,1', 'TensorFlow found no CUDA GPU: check the NVIDIA driver (nvidia-smi) and that '
                  'CUDA_VISIBLE_DEVICES names the GPUs'),
])
def test_asking_for_gpus_where_there_are_none_says_why_in_one_line(monkeypatch, cuda_build,
                                                                   visible, reason):
    monkeypatch.setattr(tf.sysconfig, 'get_build_info', lambda: {'is_cuda_build': cuda_build})
    if visible is None:
        monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    else:
        monkeypatch.setenv('CUDA_VISIBLE_DEVICES', visible)
    with pytest.raises(DeviceError) as info:
        resolve_devices(devices='/gpu:0,/gpu:1', num_gpus=0)
    assert str(info.value) == ('/gpu:1 does not exist: this machine has 0 visible GPU(s); %s '
                               '(or use /cpu:N, virtual devices)' % reason)


def test_check_and_train_deterministic_run_exact_and_leave_the_process_as_it_was(
        monkeypatch, capsys):
    before, seen = describe(), []
    assert before == 'TF32 on, op determinism off'
    monkeypatch.setattr(check, 'run_check', lambda *args, **kwargs: seen.append(describe()))
    assert main(['check', '--towers', '2', '--devices', 'cpu', '--model', 'small_convnet']) == 0
    assert seen == ['TF32 off, op determinism on'] and describe() == before
    assert main(['train', '--deterministic', '--devices', 'cpu', '--steps', '1', '--model',
                 'small_convnet', '--quiet', '--eval-every', '0']) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        'deterministic: TF32 off, op determinism on')
    assert describe() == before

