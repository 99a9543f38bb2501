"""Ctrl-C that always stops the flow: a flag the SIGINT handler sets and every stage checks.

    install_sigint()          # the CLI, before a flow starts
    check()                   # run_stage, before each stage: KeyboardInterrupt once requested

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT lands; if
that is a finalizer (a weakref callback, a __del__), the exception is printed as "ignored" and
the program goes on. The handler therefore also remembers the request, and the next stage
boundary raises it again, so the flow stops within one stage, marks the run interrupted and
leaves it resumable.
"""

from __future__ import annotations

import signal
import sys

_requested = False


def _handler(signum, frame) -> None:
    global _requested
    _requested = True
    raise KeyboardInterrupt


def install_sigint() -> None:
    signal.signal(signal.SIGINT, _handler)
    previous = sys.unraisablehook

    def quiet(unraisable) -> None:
        # the "Exception ignored in ..." report of a Ctrl-C that landed in a finalizer
        if not (_requested and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            previous(unraisable)

    sys.unraisablehook = quiet


def requested() -> bool:
    return _requested


def check() -> None:
    if _requested:
        raise KeyboardInterrupt
