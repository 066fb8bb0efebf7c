"""Atomic file output: a destination is either absent, its old self, or complete."""
import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_output(path, suffix='.tmp'):
    """Opens a temporary file that replaces `path` only if the block succeeds.

    The temporary file lives in the destination's folder (so the final rename
    stays on one file system) and is named `.<name>.<random><suffix>`. On a
    clean exit it is flushed, fsynced, made 0644 and renamed over `path`; the
    fsync comes first so that a crash after the rename cannot leave an empty
    or partial file under the final name. On any exception, KeyboardInterrupt
    included, the temporary file is removed and `path` is left as it was.

    Args:
        path: str or os.PathLike, the destination; its folder must exist.
        suffix: ending of the temporary file's name.

    Yields:
        A binary file object open for writing.
    """
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    fd, tmp_path = tempfile.mkstemp(dir=folder, prefix=f'.{name}.', suffix=suffix)
    try:
        with os.fdopen(fd, 'wb') as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp_path, 0o644)  # mkstemp creates 0600; data files should be readable.
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path)
        raise


@contextlib.contextmanager
def written_beside(path, suffix='.partial'):
    """Yields a path beside `path` for a writer that wants a file name (a TFRecordWriter).

    When the block succeeds the file is fsynced and renamed over `path`; when it
    fails it is removed: `path` is never a half-written file.
    """
    partial = os.fspath(path) + suffix
    try:
        yield partial
        with open(partial, 'rb+') as f:
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise
