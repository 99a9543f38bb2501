"""Phase progress of long flows (sparrow calibrate): a line as each phase starts and ends, in
order, numbered; nothing when quiet.

Run: `python -m pytest tests/flows/test_progress.py -q`.
"""

from __future__ import annotations

import io

from rich.console import Console

from sparrow.flows.progress import PhaseProgress


def test_each_phase_prints_when_it_starts_and_ends():
    out = io.StringIO()
    phases = PhaseProgress(2, console=Console(file=out, width=200))
    with phases.phase("sampling"):
        assert out.getvalue() == "[1/2] sampling ...\n"  # before the work, not after
    with phases.phase("replaying"):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "[1/2] sampling ..." and lines[2] == "[2/2] replaying ..."
    assert lines[1].startswith("[1/2] sampling: done in ") and lines[1].endswith(" s")
    assert len(lines) == 4


def test_quiet_prints_nothing(capsys):
    with PhaseProgress(1, quiet=True).phase("x"):
        pass
    assert capsys.readouterr() == ("", "")
