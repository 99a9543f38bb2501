"""benchmarks/tracking_start.py runs and reports both ways (its figures are docs/tracking.md's)."""

from __future__ import annotations

import json
import os

from benchmarks.tracking_start import main


def test_reports_both_ways_and_leaves_the_users_cache_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARROW_CACHE_DIR", str(tmp_path / "users-cache"))
    out = tmp_path / "t.json"
    result = main(["--starts", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert len(result["migrated_s"]) == len(result["copied_s"]) == 1
    assert result["ratio"] == result["migrated_median_s"] / result["copied_median_s"] > 0
    assert not (tmp_path / "users-cache").exists()
    assert os.environ["SPARROW_CACHE_DIR"] == str(tmp_path / "users-cache")
