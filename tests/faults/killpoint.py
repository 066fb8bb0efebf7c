"""`towers ARGV` that kills itself, as kill -9 does, at one exact moment of a save.

    python -m tests.faults.killpoint MOMENT CALL train --logdir ...

The function that begins or ends the moment is wrapped; at its CALL-th call
(1: the first) the process sends itself SIGKILL, so no Python code, no
`finally`, runs after it:

  graph      a checkpoint's graph (.meta) is written, its variables not yet
  listing    its variables are written whole, the state file does not list it yet
  renaming   the state file's new text is under its temporary name, not yet renamed
  deleting   one file of the oldest checkpoint kept is deleted, the others not yet
  recording  the best checkpoint is saved, best.json does not name it yet

A kill from outside lands at a moment chosen by chance (test_kill.py does
that too); these are the moments in between TensorFlow's and towers' writes
that such a kill is unlikely to hit.
"""
import importlib
import os
import signal
import sys


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def kill_at(owner, name, call, after=False, counts=lambda *args: True):
    """Wrap owner.name: its call-th counted call kills this process, before it or after it."""
    original = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        counted = counts(*args)
        calls[0] += counted
        if counted and calls[0] == call and not after:
            _die()
        result = original(*args, **kwargs)
        if counted and calls[0] == call and after:
            _die()
        return result
    setattr(owner, name, wrapper)


def arm(moment, call):
    """Set the kill at moment's call-th time (see the module's docstring)."""
    import tensorflow as tf
    from tensorflow.python.checkpoint import checkpoint_management
    from tensorflow.python.lib.io import file_io

    from towers.callbacks import evaluate
    if moment == 'graph':  # towers.checkpoints.save writes the graph, then calls Saver.save
        kill_at(tf.compat.v1.train.Saver, 'save', call)
    elif moment == 'listing':
        kill_at(checkpoint_management, 'update_checkpoint_state_internal', call)
    elif moment == 'renaming':
        kill_at(file_io, 'rename', call,
                counts=lambda source, *rest: os.path.basename(source).startswith('checkpoint.tmp'))
    elif moment == 'deleting':
        kill_at(checkpoint_management, '_delete_file_if_exists', call, after=True)
    elif moment == 'recording':
        kill_at(evaluate, 'atomic_output', call)
    else:
        raise SystemExit('unknown moment %r' % moment)


if __name__ == '__main__':
    cli = importlib.import_module('towers.cli.main')
    cli._import_tensorflow()  # the patches need TensorFlow; its banner stays quiet
    arm(sys.argv[1], int(sys.argv[2]))
    sys.exit(cli.main(sys.argv[3:]))
