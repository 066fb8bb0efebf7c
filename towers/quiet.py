"""Silencing what TensorFlow's C++ side writes straight to the process's stderr.

Some of its log lines bypass TF_CPP_MIN_LOG_LEVEL (written before absl logging
is set up) or are errors that are not ours to show (oneDNN's "supports DT_HALF
only on platforms with AVX-512" when the precision probe tries float16); only
the file descriptor reaches them. TensorFlow-free.
"""
import contextlib
import os
import sys


@contextlib.contextmanager
def native_stderr_silenced():
    """File descriptor 2 points at /dev/null inside, and is restored on the way out.

    A Python exception raised inside still shows: stderr is back before it propagates.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, 'w') as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
