"""The exceptions towers raises for problems a user can fix.

A message that names a setting writes it as `{name}`, the parameter's name
(`{batch_size}`): the library prints `batch_size`, and the command line, which
knows its flags, prints `--batch-size` (towers/cli/config.py). So the core
never spells a flag, and every message still tells a CLI user what to change.
"""
import re

_SETTING = re.compile(r'\{([a-z][a-z0-9_]*)\}')


class TowersError(Exception):
    """Base class: bad configuration or input, with a message that says what to do.

    Args:
      message: one line; `{setting}` marks the name of a parameter.
      *args: values for the message's %-conversions, put in after the marks are
        named, so that a value a user gave is printed as it is.
    """

    def __init__(self, message, *args):
        self.template, self.args_ = message, args
        super().__init__(self.named(lambda setting: setting))

    def named(self, name_of):
        """The message with each `{setting}` spelled by name_of(setting) (e.g. as a flag)."""
        text = _SETTING.sub(lambda m: name_of(m.group(1)), self.template)
        return text % self.args_ if self.args_ else text


class SettingError(TowersError):
    """A setting with a value no run can use (a batch size of 0, an unknown strategy)."""


class DeviceError(TowersError, ValueError):
    """A requested device does not exist or the device list is malformed."""


class GradientError(TowersError, ValueError):
    """Towers produced gradient lists that cannot be combined."""


# TensorFlow's frame around the causes when one run fails in several places (on
# GPUs the same failure surfaces in several partitions): 'N root error(s) found.',
# one '  (i) CODE: message' per cause, then counts; logs and RPC details may follow.
_ROOT_CAUSE = re.compile(r'^\(\d+\) ([A-Z_]+): ?(.*)$')
_COUNTS = re.compile(r'^\d+ (root errors?(\(s\))? found|successful operations?'
                     r'|derived errors? ignored)\.$')
_TAILS = ('Recent warning and error logs:', 'Additional GRPC error information')
_NOISE = ('Graph execution error', 'Detected at node', 'File "', 'Node:', '[[',
          'Original stack', 'Traceback',
          # Ends every RESOURCE_EXHAUSTED, a full disk too: a hint, not the cause.
          'Hint: If you want to see a list of allocated tensors')


# What TensorFlow adds around a cause for its own developers: the wrapped function an eager op
# ran in ('{{function_node __wrapped__DecodeImage_device_/job:localhost/...}}') and the graph
# node it failed at ('[[{{node decode}}]]').
_INTERNAL = re.compile(r'\{\{function_node [^}]*\}\}\s*|\s*\[\[\{\{node [^}]*\}\}\]\]')


def in_user_words(message):
    """A TensorFlow error message without its internal frame: the function and node names
    it wraps a cause in."""
    return _INTERNAL.sub('', message).strip()


def op_error_summary(error):
    """The line of a TensorFlow OpError's message that says what went wrong.

    Graph-mode messages wrap the cause in 'Graph execution error', the node's
    Python stack and '[[{{node ...}}]]'; several causes come as '(0) CODE:
    message', '(1) ...' between counts. This is the (first) cause alone, the
    same on every device, e.g. 'Read less bytes than requested' or
    '/data/train-00001; No such file or directory'.
    """
    lines, tail = [], False
    for line in (line.strip() for line in error.message.splitlines()):
        # Logs and RPC details after a cause repeat it or say less: skip to the next cause.
        tail = (tail or line.startswith(_TAILS)) and not _ROOT_CAUSE.match(line)
        if line and not tail and not _COUNTS.match(line):
            lines.append(line)
    roots = [_ROOT_CAUSE.match(line) for line in lines]
    # The first cause TensorFlow did not cancel is the one its error's code is taken from.
    roots = sorted((m for m in roots if m), key=lambda m: m.group(1) == 'CANCELLED')
    if roots:
        after = lines[lines.index(roots[0].group(0)) + 1:]
        # (The code is dropped: the error's type says it, and one cause alone has none.)
        lines = [roots[0].group(2)] if roots[0].group(2) else after[:1]
    causes = [in_user_words(line) for line in lines if not line.startswith(_NOISE)
              and not line.endswith('(most recent call last):')]
    causes = [line for line in causes if line]
    return causes[-1] if causes else in_user_words(error.message)
