"""`sparrow schedule list|show`, called through sparrow.cli.main.main."""

from __future__ import annotations

import json

from sparrow.cli.main import main
from sparrow.sparse.io import save_schedule_yaml
from sparrow.sparse.presets import PRESETS
from sparrow.sparse.schedule import Schedule


def test_list_json_rows(capsys):
    assert main(["schedule", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == set(PRESETS)
    row = by_name["qwen3-1.7b-0.86"]
    # hand: 20 bins, 29 pages first, 253 last, 253 + 1 + 2 read
    assert row == {
        "name": "qwen3-1.7b-0.86",
        "target": 0.86,
        "bins": 20,
        "page_size": 16,
        "bin_tokens": 2000,
        "first_topk": 29,
        "last_topk": 253,
        "last_pages_read": 256,
    }
    assert by_name["tiny-0.80"]["last_pages_read"] == 20 + 3


def test_list_table_shows_full_names(capsys):
    assert main(["schedule", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("qwen3-14b-0.86", "qwen3-1.7b-0.94", "tiny-0.80"):
        assert name in out
    assert "1149" in out  # qwen3-4b-0.92 last top-k


def test_show_json_is_the_file_format(capsys):
    assert main(["schedule", "show", "qwen3-8b-0.86", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["topk_pages"][17] == 385 and len(data["topk_pages"]) == 20
    assert data["skip_layers"] == [0, 1] and data["target"] == 0.86


def test_show_file_human_form_has_bins(tmp_path, capsys):
    s = Schedule(name="mine", topk_pages=(2, 7), page_size=32, bin_tokens=100, reserved_bos=0)
    path = save_schedule_yaml(s, tmp_path / "mine.yaml")
    assert main(["schedule", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mine" in out and "0-99" in out and "100-" in out
    # hand: bin 1 reads 7 + 0 + 2 = 9 pages, 9 * 32 = 288 tokens
    assert "288" in out and "9" in out


def test_show_unknown_is_one_line_error(capsys):
    assert main(["schedule", "show", "no-such-schedule"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-schedule" in err and "tiny-0.86" in err


def test_show_a_binary_file_is_one_line(tmp_path, capsys):
    binary = tmp_path / "weights.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    assert main(["schedule", "show", str(binary)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {binary}: not a schedule file (not UTF-8 text)"]


def test_show_looks_in_sparrow_work_without_workdir(tmp_path, monkeypatch, capsys):
    from sparrow.runtime.ledger.schedules import insert_schedule
    from sparrow.sparse.presets import get_preset
    from sparrow.storage import Store

    base = get_preset("tiny-0.86")
    stored = base.__class__(**{**base.__dict__, "name": "cal-y", "topk_pages": (7,) * 8})
    with Store.open_writer(tmp_path / "sparrow-work") as store, store.connect() as conn:
        insert_schedule(conn, stored, 1, "cal-1", 0, "calibration cal-1")
    monkeypatch.chdir(tmp_path)
    assert main(["schedule", "show", "cal-y", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["topk_pages"] == [7] * 8
    monkeypatch.chdir(tmp_path / "sparrow-work")  # no ./sparrow-work here: presets only
    assert main(["schedule", "show", "cal-y"]) == 2
    assert "unknown schedule 'cal-y'" in capsys.readouterr().err
