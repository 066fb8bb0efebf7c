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


def op_error_summary(error):
    """The line of a TensorFlow OpError's message that says what went wrong.

    Graph-mode messages wrap the cause in 'Graph execution error', the node's
    Python stack and '[[{{node ...}}]]'; this is the cause alone, e.g. 'Read
    less bytes than requested' or 'No space left on device'.
    """
    noise = ('Graph execution error', 'Detected at node', 'File "', 'Node:', '[[',
             'Original stack', 'Traceback',
             # Ends every RESOURCE_EXHAUSTED, a full disk too: a hint, not the cause.
             'Hint: If you want to see a list of allocated tensors')
    lines = [line.strip() for line in error.message.splitlines()]
    causes = [line for line in lines if line and not line.startswith(noise)
              and not line.endswith('(most recent call last):')]
    return causes[-1] if causes else error.message.strip()
