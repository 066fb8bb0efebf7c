"""Exceptions raised by the `data` package.

Every message is a single line that names the file or folder involved and
says what the user can do about it, so the CLI can print it as is.
"""


class DataError(Exception):
    """Base class for every error raised while finding or reading a dataset."""


class IdxFormatError(DataError, ValueError):
    """An IDX file is malformed: bad magic, wrong rank, truncated, corrupt gzip."""


class ChecksumError(DataError):
    """A file's SHA-256 differs from the expected one."""


class DownloadError(DataError):
    """Every mirror failed for a file.

    Attributes:
        reasons: list of (url, reason) pairs, one per mirror tried, in order.
    """

    def __init__(self, message, reasons=()):
        super().__init__(message)
        self.reasons = list(reasons)


class DatasetNotFoundError(DataError):
    """Dataset files are missing locally and could not be downloaded."""


class DataMismatchError(DataError, ValueError):
    """A file's images or labels are not what its dataset or the model declares.

    Wrong image shape or dtype, labels of another count, type or range. The
    message names the file and says what it holds and what was expected.
    """


# The mark of a bad record's message inside a TensorFlow error (data/imagenet.py asserts it).
BAD_RECORD = 'bad record: '


def bad_record(message):
    """'FILE record N: what is wrong' from a TensorFlow error message, or None if it is not
    a bad record's."""
    start = message.find('[' + BAD_RECORD)
    if start < 0:
        return None
    line = message[start + 1 + len(BAD_RECORD):].split('\n', 1)[0]
    return line[:line.rfind(']')] if ']' in line else line
