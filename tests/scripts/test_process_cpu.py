"""scripts/process_cpu.py: a child that burns CPU is counted under its kind, the exit status
comes back, and a command line is sorted into the kinds the suite's processes have."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import process_cpu  # noqa: E402

BURN = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_child_that_burns_cpu_is_counted_under_its_kind():
    result = process_cpu.measure([sys.executable, "-c", BURN], interval_s=0.2)
    assert result["returncode"] == 0
    kinds = {k["kind"]: k for k in result["kinds"]}
    assert kinds["other Python"]["cpu_s"] >= 1.3
    assert result["cpu_s"] >= kinds["other Python"]["cpu_s"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_commands_exit_status_comes_back():
    assert process_cpu.main(["--", sys.executable, "-c", "raise SystemExit(3)"]) == 3


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        ("python -m sparrow.cli.main train pipeline.steps=2", "sparrow command"),
        ("ray::RolloutWorker.generate", "Ray worker or actor"),
        ("python -m uvicorn --factory prefect.server.api.server:create_app", "Prefect server"),
        ("python -u -c import sys;exec(eval(sys.stdin.readline()))", "pytest-xdist worker"),
        ("/bin/bash -c true", "other"),
    ],
)
def test_command_lines_are_sorted_into_kinds(command, kind):
    assert process_cpu.kind_of(command) == kind
