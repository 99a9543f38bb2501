"""benchmarks/handover.py on CPU: both ways timed per call, the frozen heap holds the imports'
objects, and the process's heap is thawed after (the timings themselves are the benchmark's,
not asserted here).

Run: `python -m pytest tests/benchmarks/test_handover.py -q`.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import handover  # noqa: E402


def test_both_ways_are_timed_and_the_heap_thaws_after(tmp_path):
    before = gc.get_freeze_count()
    out = tmp_path / "handover.json"
    result = handover.main(["--device", "cpu", "--calls", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["device"] == "cpu" and result["calls"] == 2
    assert len(result["in_sight_calls_s"]) == len(result["frozen_calls_s"]) == 2
    # the imports of a run are frozen: most of the heap the first way had in sight
    assert result["objects_frozen"] > 0.9 * result["objects_after_imports"] > 100_000
    assert result["ratio"] == result["in_sight_s"] / max(result["frozen_s"], 1e-9)
    assert gc.get_freeze_count() == before
