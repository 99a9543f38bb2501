"""The project's error base: the CLI prints these as one line and exits 2."""


class SparrowError(Exception):
    """A user-facing error whose message names the thing that is wrong."""
