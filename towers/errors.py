"""The exceptions towers raises for problems a user can fix."""


class TowersError(Exception):
    """Base class: bad configuration or input, with a message that says what to do."""


class DeviceError(TowersError, ValueError):
    """A requested device does not exist or the device list is malformed."""


class GradientError(TowersError, ValueError):
    """Towers produced gradient lists that cannot be combined."""
