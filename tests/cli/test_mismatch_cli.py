"""`sparrow mismatch stats` on real Parquet files written with pyarrow into tmp_path."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.cli.main import main


def _write(path, **columns):
    pq.write_table(pa.table(columns), path)
    return str(path)


def _tokens(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    positions = rng.integers(0, 7000, n)
    acceptance = np.where(rng.random(n) < 0.4, 0.999 * rng.beta(3.0, 1.0, n), 1.0)
    return positions, acceptance


def _error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_json_rows_match_numpy_per_bin(tmp_path, capsys):
    positions, acceptance = _tokens()
    path = _write(
        tmp_path / "t.parquet",
        position=positions,
        acceptance=acceptance,
        step=np.zeros(positions.size, dtype=np.int64),
        sample=["s"] * positions.size,
    )
    assert main(["mismatch", "stats", path, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["bin"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        assert list(row) == [
            "bin",
            "n",
            "mean",
            "p1",
            "p5",
            "p10",
            "p50",
            "beta_a",
            "beta_b",
            "beta_var",
            "ks",
        ]
        values = acceptance[positions // 2000 == row["bin"]]
        assert row["n"] == values.size
        assert row["mean"] == pytest.approx(values.mean(), abs=1e-12)
        assert row["p5"] == pytest.approx(np.percentile(values, 5), abs=1e-12)
        assert row["p50"] == pytest.approx(np.percentile(values, 50), abs=1e-12)
        assert 2.0 < row["beta_a"] < 4.0 and 0.0 < row["ks"] < 0.1  # drawn from Beta(3, 1)


def test_bin_tokens_and_num_bins(tmp_path, capsys):
    positions, acceptance = _tokens()
    path = _write(tmp_path / "t.parquet", position=positions, acceptance=acceptance)
    assert main(["mismatch", "stats", path, "--json", "--bin-tokens", "5000"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["bin"], r["n"]) for r in rows] == [
        (0, int((positions < 5000).sum())),
        (1, int((positions >= 5000).sum())),
    ]
    assert main(["mismatch", "stats", path, "--json", "--num-bins", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["bin"], r["n"]) for r in rows] == [
        (0, int((positions < 2000).sum())),
        (1, int((positions >= 2000).sum())),
    ]


def test_small_bin_prints_null_fit(tmp_path, capsys):
    path = _write(tmp_path / "t.parquet", position=[5, 6, 2500], acceptance=[0.2, 1.0, 0.7])
    assert main(["mismatch", "stats", path, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["n"] == 2 and rows[0]["p50"] == pytest.approx(0.6)
    assert rows[0]["beta_a"] is None and rows[1]["ks"] is None


def test_table_shows_each_bin(tmp_path, capsys):
    path = _write(tmp_path / "t.parquet", position=[10, 20, 4100], acceptance=[0.25, 0.75, 0.125])
    assert main(["mismatch", "stats", path]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("│")]
    assert len(lines) == 2
    # bin 0: p5 of (0.25, 0.75) by linear interpolation is 0.25 + 0.05 * 0.5 = 0.275
    assert lines[0].split("│")[1:5] == ["   0 ", " 2 ", " 0.255 ", " 0.275 "]
    assert "0.125" in lines[1] and "…" not in out


def test_missing_file(tmp_path, capsys):
    path = str(tmp_path / "nope.parquet")
    assert main(["mismatch", "stats", path]) == 2
    assert _error(capsys) == f"error: {path}: no such file"


def test_not_parquet(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    path.write_text("position,acceptance\n1,0.5\n")
    assert main(["mismatch", "stats", str(path)]) == 2
    assert _error(capsys).startswith(f"error: {path}: not a readable Parquet file")


def test_missing_columns_are_named_with_the_columns_present(tmp_path, capsys):
    path = _write(tmp_path / "t.parquet", pos=[1, 2], acceptance=[0.5, 0.5], step=[0, 0])
    assert main(["mismatch", "stats", path]) == 2
    assert _error(capsys) == (
        f"error: {path}: missing column(s) position; columns present: pos, acceptance, step"
    )


def test_bad_acceptance_gives_count_first_row_and_value(tmp_path, capsys):
    acceptance = [0.5, 0.9, 1.25, float("nan"), -0.5]
    path = _write(tmp_path / "t.parquet", position=list(range(5)), acceptance=acceptance)
    assert main(["mismatch", "stats", path]) == 2
    line = _error(capsys)
    assert line.startswith(f"error: {path}: acceptance must be in [0, 1]")
    assert line.endswith("3 bad rows, first at row 2: 1.25")


def test_negative_positions(tmp_path, capsys):
    path = _write(tmp_path / "t.parquet", position=[3, 0, -7], acceptance=[0.5, 0.5, 0.5])
    assert main(["mismatch", "stats", path]) == 2
    assert _error(capsys) == f"error: {path}: position must be >= 0: 1 bad row, first at row 2: -7"


def test_null_and_non_numeric_columns(tmp_path, capsys):
    path = _write(
        tmp_path / "a.parquet", position=pa.array([1, None, None]), acceptance=[0.1, 0.2, 0.3]
    )
    assert main(["mismatch", "stats", path]) == 2
    assert _error(capsys) == f"error: {path}: column 'position' has 2 null rows, first at row 1"
    path = _write(tmp_path / "b.parquet", position=[1, 2], acceptance=["high", "low"])
    assert main(["mismatch", "stats", path]) == 2
    assert "column 'acceptance' has type string" in _error(capsys)


def test_empty_file_prints_no_rows(tmp_path, capsys):
    path = _write(
        tmp_path / "t.parquet",
        position=pa.array([], pa.int64()),
        acceptance=pa.array([], pa.float64()),
    )
    assert main(["mismatch", "stats", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
