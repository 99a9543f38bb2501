"""benchmarks/bin_bootstrap.py: every case timed, and --against a copy of the same module
gives the same intervals (the timings themselves are the benchmark's, not asserted here).

Run: `python -m pytest tests/benchmarks/test_bin_bootstrap.py -q`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bin_bootstrap  # noqa: E402


def test_every_case_is_timed_and_a_copy_gives_the_same_intervals(tmp_path):
    copy = tmp_path / "copy.py"
    shutil.copy(ROOT / "sparrow" / "mismatch" / "bootstrap.py", copy)
    out = tmp_path / "b.json"
    result = bin_bootstrap.main(["--repeats", "1", "--against", str(copy), "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert set(result["cases"]) == set(bin_bootstrap.CASES)
    for row in result["cases"].values():
        assert row["same_intervals"] is True and row["seconds"] > 0
        assert row["speedup"] == row["against_seconds"] / row["seconds"]


def test_an_against_file_that_is_not_python_is_one_error(tmp_path):
    with pytest.raises(SystemExit, match="not a Python file"):
        bin_bootstrap.main(["--against", str(tmp_path / "nothing.txt")])
