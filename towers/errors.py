"""The exceptions towers raises for problems a user can fix."""


class TowersError(Exception):
    """Base class: bad configuration or input, with a message that says what to do."""


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
             'Original stack', 'Traceback')
    lines = [line.strip() for line in error.message.splitlines()]
    causes = [line for line in lines if line and not line.startswith(noise)
              and not line.endswith('(most recent call last):')]
    return causes[-1] if causes else error.message.strip()
