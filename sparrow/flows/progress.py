"""Progress of long flows, phase by phase, on stderr (stdout stays the command's result).

    phases = PhaseProgress(3)
    with phases.phase("sampling trajectories"):
        ...                        # "[1/3] sampling trajectories ..." then "... done in 12.3 s"

In a terminal a rich spinner with the elapsed time runs while a phase works; in a log each
phase is one line when it starts and one when it ends, so a 20-minute calibration is never
silent. quiet=True prints nothing (tests, --json callers that want stderr clean).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

from rich.console import Console


class PhaseProgress:
    def __init__(self, total: int, quiet: bool = False, console: Console | None = None):
        self.total, self.done = total, 0
        self.console = console or Console(stderr=True, quiet=quiet, highlight=False)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.done += 1
        label = f"[{self.done}/{self.total}] {name}"
        self.console.print(f"{label} ...", markup=False)
        clock = time.perf_counter()
        spinner = (
            self.console.status(label, spinner="dots")
            if self.console.is_terminal and sys.stderr.isatty()
            else contextlib.nullcontext()
        )
        with spinner:
            yield
        self.console.print(f"{label}: done in {time.perf_counter() - clock:.1f} s", markup=False)
