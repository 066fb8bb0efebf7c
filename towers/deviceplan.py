"""The device plan: where every part of a run goes, decided once.

tf_cnn_benchmarks decides placement inside each VariableMgr class, tensorpack
inside each trainer; towers decides it in one object, made from the devices,
the --variable-update and, in a cluster, the task's role, and every part of the
graph reads it (towers, strategies, the graph builder, the cluster modes):

  towers      each tower's compute device: /gpu:i, a virtual /cpu:i, or a
              task's /job:worker/task:k/device:CPU:i
  variables   where the one copy of the variables lives: a device (the
              classic /cpu:0), or a Spread over several by bytes (the towers'
              devices for --param-device spread, a cluster's ps tasks); or
              None where a copy sits on each tower's device (replicated,
              independent) or the graph's device function places them (a
              parameter-server worker's replica_device_setter)
  copies      whether each tower has a copy of its own (tower 0's is the
              master, with the plain names; tower i's is replica_<i>/...)
  host        the single ops: the step counter, the learning rate, the data
              order, the batch split
  default     what completes every device without a job: the task's
              /job:worker/task:k in a cluster, or a device function; None in
              one process
  gpus        the GPU each tower is on: logical GPUs split from one GPU
              (towers/devices.py) share it; None for a CPU tower
  all_reduce  how the towers' copies meet (towers/allreduce.py): 'nccl' where
              the towers are GPUs of their own, 'host' (one sum per variable,
              read by every tower) on the CPUs of one process or where towers
              share a GPU (NCCL cannot all-reduce between two logical GPUs of
              one GPU), or 'ring' (TensorFlow's collective ring) when asked;
              None without copies, or where they never meet (independent)
  data_format the layout the towers' maps are built in (towers/models/layout.py):
              NCHW on GPU towers (cuDNN's float32 kernels prefer it, as
              tf_cnn_benchmarks' default), NHWC elsewhere, unless asked
  config      the Session's ConfigProto (with_xla: asking for XLA's auto-clustering)

A --param-device (auto, cpu, gpu, spread, a device name) is an input to the plan,
never something a module re-interprets.
"""
import dataclasses
import os
import re

import tensorflow as tf

from towers.devices import resolve_process_devices
from towers.errors import DeviceError
from towers.logicalgpus import share_text
from towers.names import SPREAD, XLA_CPU_FLAG
from towers.spread import Spread

# --variable-update names whose towers hold copies of their own.
COPIES = ('replicated', 'independent')


@dataclasses.dataclass(frozen=True, eq=False)
class DevicePlan:
    """Where a run's towers, variables and host ops go; see the module's docstring.

    Attributes:
      towers: one device string per tower.
      variables: the shared copy's device or Spread, or None (see copies, and a
        default device function that places them).
      copies: each tower has copies of its own, on its own device.
      host: the device of the single ops.
      default_device: completes every device of the graph, or None.
      read_cache: where the towers read the shared variables through, once a step (the
        variable scope's caching_device), or None: each tower reads each variable itself.
        A parameter-server worker's CPU: its G towers then take one copy of each variable
        off the network instead of G, as tf_cnn_benchmarks' distributed parameter_server.
      gpus: the GPU each tower is on (towers/devices.py physical_gpus), None for a CPU
        tower; None: each tower on a device of its own.
      all_reduce: how the copies' gradients meet ('nccl', 'host', 'ring'), or None.
      variable_update: the --variable-update the plan was made for.
      data_format: 'NHWC' or 'NCHW'; None: NCHW where the towers are GPUs.
      config: the Session's ConfigProto.
    """
    towers: tuple
    variables: object = '/cpu:0'
    copies: bool = False
    host: str = '/cpu:0'
    default_device: object = None
    read_cache: str = None
    gpus: tuple = None
    all_reduce: str = None
    variable_update: str = 'parameter_server'
    data_format: str = None
    config: object = None

    def __post_init__(self):
        object.__setattr__(self, 'towers', tuple(self.towers))
        if self.data_format is None:
            object.__setattr__(self, 'data_format',
                               'NCHW' if device_kind(self.towers) == 'GPU' else 'NHWC')

    def with_data_format(self, data_format):
        """This plan with its maps in data_format; None keeps its own."""
        return dataclasses.replace(self, data_format=data_format) if data_format else self

    def with_xla(self, xla):
        """This plan with its Session's config asking for XLA's auto-clustering (global_jit_level
        ON_1, as tf_cnn_benchmarks' --xla) when xla, in a copy; False keeps its own."""
        if not xla:
            return self
        config = tf.compat.v1.ConfigProto()
        if self.config is not None:
            config.CopyFrom(self.config)
        config.graph_options.optimizer_options.global_jit_level = (
            tf.compat.v1.OptimizerOptions.ON_1)
        return dataclasses.replace(self, config=config)

    @property
    def num_towers(self):
        return len(self.towers)

    def on_cpus(self):
        """Whether every tower is on a CPU (virtual CPUs, on a GPU host too)."""
        return device_kind(self.towers) == 'CPU'

    def shared_gpus(self):
        """{GPU: [tower indices]} of every GPU that more than one tower shares."""
        towers = {}
        for index, gpu in enumerate(self.gpus or ()):
            if gpu is not None:
                towers.setdefault(gpu, []).append(index)
        return {gpu: indices for gpu, indices in towers.items() if len(indices) > 1}

    def param_device(self):
        """Where the shared variables were asked to go, resolved: a device, or 'spread'."""
        return SPREAD if isinstance(self.variables, Spread) else self.host

    def variable_home(self, index):
        """(variable scope, device or device function) where tower `index` gets its variables.

        The scope is None where the towers share one copy (tower 0 creates it,
        the others reuse it), 'replica_<i>' for a copy of tower i's own; the
        device None leaves them to the graph's device function.
        """
        if self.copies:
            return replica_scope(index), self.towers[index]
        return None, self.variables

    def for_evaluation(self):
        """The plan of an evaluation graph: one copy, where this plan keeps the master's."""
        if not self.copies:
            return self
        return dataclasses.replace(self, copies=False, variables=self.towers[0],
                                   all_reduce=None)

    def describe(self):
        """One line: where the variables are, and how copies meet."""
        if self.copies:
            where = 'a copy on each tower (%s)' % self.variable_update
            if not self.all_reduce:
                return where + ', never combined'
            where += ', all-reduced by %s' % ALL_REDUCE_NAMES[self.all_reduce]
            shared = self.shared_gpus()
            if shared and self.all_reduce == 'host':
                where += ' (not NCCL: %s)' % share_text(shared)
            return where
        if isinstance(self.variables, Spread):
            return 'spread by bytes over %s' % ','.join(self.variables.devices)
        return self.variables or 'placed by the cluster (replica_device_setter)'


ALL_REDUCE_NAMES = {'nccl': 'NCCL', 'ring': "TensorFlow's collective ring",
                    'host': 'one sum per variable that every tower reads (shared memory)'}


def device_kind(devices):
    """'GPU' when every device is a GPU, 'CPU' when every one is a CPU, else 'mixed'."""
    # A device that names no type (a task's) is placed on its CPU, as the host ops are.
    kinds = {(tf.DeviceSpec.from_string(d).device_type or 'CPU').upper() for d in devices}
    return kinds.pop() if len(kinds) == 1 else 'mixed'


def xla_reaches(devices):
    """Whether XLA's auto-clustering reaches these devices: GPUs, or CPUs in a process whose
    TF_XLA_FLAGS holds --tf_xla_cpu_global_jit (TensorFlow reads it once, at its first Session)."""
    return device_kind(devices) == 'GPU' or XLA_CPU_FLAG in os.environ.get('TF_XLA_FLAGS', '')


def replica_scope(index):
    """Tower 0 holds the masters under the plain names; tower i its copies in replica_<i>."""
    return 'replica_%d' % index if index else None


def local_plan(towers=None, param_device=None, variable_update='parameter_server',
               devices=None, num_gpus=None, all_reduce=None, data_format=None,
               logical_gpus=True, per_gpu=None):
    """The plan of one process.

    Args:
      towers: a tower count (None: every visible GPU, else one CPU), or a list
        of device names (resolved already: a run resolves its devices once).
      param_device: --param-device: 'auto', 'cpu' (None), 'gpu', 'spread' or a device.
      variable_update: 'parameter_server', 'replicated' or 'independent'.
      devices: --devices, e.g. '/gpu:0,/gpu:2' (agreeing with a tower count), or a
        kind, 'cpu' or 'gpu'.
      num_gpus: GPUs to assume; None asks TensorFlow.
      all_reduce: replicated's all-reduce; None: the devices' best (make_plan).
      data_format: the towers' layout; None: by their kind (DevicePlan).
      logical_gpus: False refuses more GPU towers than GPUs (towers/devices.py).
      per_gpu: logical GPUs per GPU where a process runs several plans (as
        resolve_devices has it); None: the towers' own split.
    Raises:
      DeviceError: a device that does not exist, or a tower count that cannot be met.
    """
    found = resolve_process_devices(towers, param_device, devices, num_gpus, logical_gpus,
                                    per_gpu)
    # What no device scope places (the fed placeholders, the Saver's ops) stays on the
    # host: on a GPU machine TensorFlow would otherwise take GPU 0 for it.
    return make_plan(found.towers, found.param, variable_update, default_device='/cpu:0',
                     config=found.config, all_reduce=all_reduce, gpus=found.gpus
                     ).with_data_format(data_format)


def make_plan(tower_devices, param, variable_update='parameter_server', default_device=None,
              config=None, all_reduce=None, gpus=None):
    """The plan of resolved devices: the one place a parameter device's forms are read.

    Args:
      tower_devices: one device per tower.
      param: where the shared variables go: a device; 'spread' over the tower
        devices; or a list of devices to spread them over (a cluster's ps tasks).
      variable_update: 'parameter_server', or 'replicated' / 'independent' (a
        copy per tower; param then holds only the host ops).
      default_device, config: as DevicePlan has them.
      all_reduce: replicated's all-reduce (towers/allreduce.py); None: 'nccl' on
        GPUs of their own, 'host' on CPUs (measured the faster there) and where towers
        share a GPU.
      gpus: the GPU of each tower (DevicePlan.gpus), None: each its own device.
    Raises:
      DeviceError: NCCL asked for between towers that share a GPU.
    """
    on_gpus = device_kind(tower_devices) == 'GPU'
    spread = param == SPREAD or isinstance(param, (list, tuple))
    copies = variable_update in COPIES
    if copies:
        variables = None
    elif spread:
        variables = Spread(tower_devices if param == SPREAD else param)
    else:
        variables = param
    plan = DevicePlan(tower_devices, variables=variables, copies=copies,
                      host='/cpu:0' if spread else param,
                      default_device=default_device, gpus=gpus,
                      variable_update=variable_update, config=config)
    if variable_update != 'replicated':
        return plan
    shared = plan.shared_gpus()
    if all_reduce == 'nccl' and shared:
        raise DeviceError('NCCL cannot all-reduce between logical GPUs of one GPU (%s): leave '
                          '{all_reduce} to choose, or give each tower a GPU of its own'
                          % share_text(shared))
    nccl = on_gpus and not shared
    return dataclasses.replace(plan, all_reduce=all_reduce or ('nccl' if nccl else 'host'))


def uses_variable(op):
    """Whether op reads or writes a variable (a resource input)."""
    return any(tensor.dtype == tf.resource for tensor in op.inputs)


def planned_device(op):
    """Where the plan puts op: for an op that uses a variable (reads it, or assigns to it
    under a tower's device scope), the variable's, as TensorFlow's placer puts every op
    that uses a resource with it; else its device, or that of the op it is colocated
    with."""
    for tensor in op.inputs:
        if tensor.dtype == tf.resource:
            return planned_device(tensor.op)
    if op.device:
        return canonical_device(op.device)
    for group in op.colocation_groups():
        name = group.decode()[len('loc:@'):]
        if name != op.name:
            return planned_device(op.graph.get_operation_by_name(name))
    return ''


def canonical_device(device):
    """'/gpu:1' -> '/device:GPU:1'; a task's devices keep their job and task."""
    return tf.DeviceSpec.from_string(device).to_string()


def short_device(name):
    """'/job:localhost/replica:0/task:0/device:CPU:1' -> '/cpu:1' (other names unchanged);
    a cluster's keeps its task: '/job:worker/task:1/cpu:0'."""
    match = re.search(r'device:([A-Za-z]+):(\d+)(/stream:all)?$', name)
    if not match:
        return name
    task = re.search(r'/job:(\w+)(?:/replica:\d+)?/task:(\d+)', name)
    prefix = ('/job:%s/task:%s' % task.groups()) if task and task.group(1) != 'localhost' \
        else ''
    return '%s/%s:%s' % (prefix, match.group(1).lower(), match.group(2))


def ran_as_planned(planned, ran):
    """Whether a device an op ran on is the one planned: every field the plan names agrees
    (a local plan names no job or task; the runtime's names carry replica:0)."""
    want, got = tf.DeviceSpec.from_string(planned), tf.DeviceSpec.from_string(ran)
    return all(getattr(want, field) is None or str(getattr(want, field)).upper()
               == str(getattr(got, field)).upper()
               for field in ('job', 'task', 'device_type', 'device_index'))
