"""`towers`: parse the flags, run the command, and turn errors into one line.

TensorFlow is imported here, after its C++ log level is set, so that
`towers --help` is instant and a run prints our lines rather than TF's
banner. Errors a user can fix become one line, naming flags, and exit
status 1; --debug shows the traceback instead.
"""
import argparse
import contextlib
import functools
import os
import sys
import traceback

from towers.cli.parsers import build_parser
from towers.names import XLA_CPU_FLAG
from towers.quiet import native_stderr_silenced
from towers.recipes import MODEL_SETTINGS, apply_recipe, explicit_flags

# What TensorFlow imports as it starts and towers' graphs never use: Keras (its optimizers,
# loaded eagerly for Keras' SavedModel registrations) and, through Keras, matplotlib. Kept out
# while TensorFlow starts, they cost a `towers` process 1.8 s of its ~7 s of CPU before its
# first line on a 2-core AMD EPYC (`python -X importtime`), and the suite starts hundreds of
# them. Imported later (compare's Keras twins, --plot), they load as ever.
KEPT_OUT_OF_START = ('keras', 'matplotlib')


def _import_tensorflow(quietly=True):
    """Import TensorFlow without KEPT_OUT_OF_START, and (quietly) without its import-time
    C++ log lines.

    TensorFlow 2.21 writes its oneDNN notice through absl before absl logging is
    initialised, where TF_CPP_MIN_LOG_LEVEL cannot reach it; only the file
    descriptor can. A Python error raised by the import still shows: stderr is
    restored before it propagates. A module set to None in sys.modules raises
    ImportError when imported, which TensorFlow's optional imports of Keras take as
    Keras not installed; each is taken out again after the import.
    """
    if 'tensorflow' in sys.modules:
        return
    kept_out = [name for name in KEPT_OUT_OF_START if name not in sys.modules]
    sys.modules.update(dict.fromkeys(kept_out))
    try:
        with native_stderr_silenced() if quietly else contextlib.nullcontext():
            import tensorflow  # noqa: F401
    finally:
        for name in kept_out:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def _imported_tensorflow():
    """Whether TensorFlow imports (quietly); where it does not, each task says why."""
    try:
        _import_tensorflow()
    except ImportError:
        return False
    return True


def _set_xla_flag(args, cuda_build=None):
    """--xla on CPU towers: TF_XLA_FLAGS gains --tf_xla_cpu_global_jit, without which TensorFlow
    clusters nothing on CPUs. On GPU towers it is left out, so that XLA clusters the towers'
    GPUs and not the host's ops. TensorFlow reads TF_XLA_FLAGS once, when it first looks at its
    devices: this runs after its import and before that. cuda_build: None asks TensorFlow."""
    if getattr(args, 'xla', False) and XLA_CPU_FLAG not in os.environ.get('TF_XLA_FLAGS', '') \
            and _towers_on_cpus(getattr(args, 'devices', None), cuda_build):
        os.environ['TF_XLA_FLAGS'] = (os.environ.get('TF_XLA_FLAGS', '')
                                      + ' ' + XLA_CPU_FLAG).strip()


def _towers_on_cpus(devices, cuda_build=None):
    """Whether --devices (a kind, a list or None) gives CPU towers, told without asking
    TensorFlow for its devices: by the kind or the names, else (GPUs where there are any) by
    a build or a CUDA_VISIBLE_DEVICES without GPUs. A CUDA build whose driver finds no GPU is
    taken for GPUs: its trainer says that XLA clusters nothing on its CPU towers."""
    if devices and devices.strip(' ,'):
        return 'gpu' not in devices.lower()
    if cuda_build is None:
        import tensorflow as tf
        cuda_build = tf.sysconfig.get_build_info().get('is_cuda_build', False)
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    return not cuda_build or (visible is not None and not visible.strip(' ,'))


def use_onednn(environ=os.environ):
    """TF_ENABLE_ONEDNN_OPTS=1 unless the user set it: oneDNN's CPU kernels, wherever they run.

    TensorFlow turns oneDNN on by itself only on CPUs with AVX-512 VNNI, BF16 or AMX; on an
    AVX2-only x86 CPU it keeps its Eigen kernels, which on a 2-core AMD EPYC (AVX2, no
    AVX-512) trained resnet20 at 0.47x and mnist_convnet at 0.51x oneDNN's images/sec in
    float32 (`towers bench --devices cpu`, each way in turns), and have no NCHW max pool or
    conv gradient on a CPU. Set before TensorFlow reads it (its first Session); tasks and
    workers that towers starts inherit it. A user's own setting wins.
    """
    environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')


def main(argv=None):
    """Run `towers ARGV`; returns the exit status (0, 1 for an error, 130 when interrupted)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    use_onednn()
    if args.command == 'launch':
        # It starts processes: forks of this one once it has imported TensorFlow (--start
        # fork, and no task imports it again), or new ones that import their own (spawn).
        from towers.cli.launcher import forks_tasks, run_launch
        return _run(args, functools.partial(run_launch, fork=main if forks_tasks(args.start)
                                            and _imported_tensorflow() else None))
    try:
        _import_tensorflow(quietly=not args.debug)
        import tensorflow
    except ImportError as e:
        print("towers: error: TensorFlow cannot be imported (%s); install it with "
              "pip install -e '.[cpu]' on a CPU-only machine or '.[gpu]' with GPUs" % e,
              file=sys.stderr)
        return 1
    _set_xla_flag(args)
    if not args.debug:
        # TensorFlow's Python deprecation notices are for us, not for users.
        tensorflow.get_logger().setLevel('ERROR')
    from towers.cli.commands import COMMANDS
    if getattr(args, 'dataset', False) is None:  # the model's own kind of images
        from towers.cli.datasets import default_dataset
        args.dataset = default_dataset(args.model)
    command = COMMANDS[args.command]
    if getattr(args, 'recipe', None) or (args.command == 'train'
                                         and args.model in MODEL_SETTINGS):
        command = _with_recipe(command, explicit_flags(_subparser(parser, args.command), argv))
    return _run(args, command)


def _subparser(parser, name):
    """The parser of the command `name`."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


def _with_recipe(command, given):
    """command, run with --recipe's settings filled in where `given` (the flags given by hand)
    has none, and where each comes from said first."""
    def run(args, log):
        for line in apply_recipe(args, given):
            log(line)
        return command(args, log)
    return run


class _NotLoaded(Exception):
    """Stands for the exceptions of a module this run never loaded (none can be raised)."""


def _raised_by(module, name):
    """The exception class `name` of `module` if the run loaded it, else _NotLoaded."""
    return getattr(sys.modules[module], name) if module in sys.modules else _NotLoaded


def _exact_if_asked(args, log):
    """--deterministic (train's, bench's): the command runs under towers.exactness.exact(),
    said in one line; nothing changes for a command without it."""
    if not getattr(args, 'deterministic', False):
        return contextlib.nullcontext()
    from towers.exactness import exact_if
    return exact_if(True, log)


def _run(args, command):
    from towers import data
    from towers.cli.config import flag
    from towers.errors import TowersError, op_error_summary

    def log(line):
        print(line, flush=True)

    try:
        with _exact_if_asked(args, log):
            status = command(args, log)
    except _raised_by('towers.cluster.runtime', 'LostTaskError') as e:
        if args.debug:
            traceback.print_exc()
        print('towers: error: %s' % e.named(flag), file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # Its Session to the cluster can never close (nor can Python at exit): end here.
        os._exit(1)
    except (TowersError, data.DataError, _raised_by('towers.models.errors', 'ModelError')) as e:
        if args.debug:
            raise
        message = e.named(flag) if isinstance(e, TowersError) else str(e)
        print('towers: error: %s' % message, file=sys.stderr)
        return 1
    except OSError as e:
        # A disk that fills up or a folder that turns read-only outside the checkpoints
        # (best.json, stats.jsonl, run.json): what and where, in one line.
        if args.debug:
            raise
        print('towers: error: %s%s' % (e.strerror or e, ': %s' % e.filename if e.filename
                                       else ''), file=sys.stderr)
        return 1
    except _raised_by('tensorflow.python.framework.errors_impl', 'OpError') as e:
        # What only TensorFlow noticed (a disk that fills up, a device that
        # fails): its own message's first line, without the graph dump.
        if args.debug:
            raise
        print('towers: error: TensorFlow %s: %s (--debug shows where)'
              % (type(e).__name__, op_error_summary(e)), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('towers: interrupted', file=sys.stderr)
        return 130
    return status or 0
