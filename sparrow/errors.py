"""The project's error base: the CLI prints these as one line and exits 2."""


class SparrowError(Exception):
    """A user-facing error whose message names the thing that is wrong."""


class SparrowWarning(UserWarning):
    """Something skipped or degraded that the run survives; the CLI prints it as one line."""
