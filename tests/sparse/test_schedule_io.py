"""Schedule files: round trips, error messages, and name-or-path resolution."""

from __future__ import annotations

import json

import pytest
import yaml

from sparrow.sparse.io import (
    KEYS,
    load_schedule_yaml,
    resolve_schedule,
    save_schedule_yaml,
    schedule_from_dict,
    schedule_to_dict,
)
from sparrow.sparse.presets import PRESETS
from sparrow.sparse.schedule import Schedule, ScheduleError

CUSTOM = Schedule(
    name="custom",
    topk_pages=(4, 8, 8),
    page_size=32,
    bin_tokens=512,
    reserved_bos=0,
    reserved_eos=3,
    skip_layers=(0, 5),
    target=0.9,
    description="a test schedule",
)


def test_to_dict_has_plain_lists_and_every_key():
    d = schedule_to_dict(CUSTOM)
    assert list(d) == list(KEYS)
    assert d["topk_pages"] == [4, 8, 8] and isinstance(d["topk_pages"], list)
    assert d["skip_layers"] == [0, 5] and d["page_size"] == 32 and d["reserved_bos"] == 0
    assert d["description"] == "a test schedule"


def test_yaml_round_trip_keeps_every_field(tmp_path):
    path = save_schedule_yaml(CUSTOM, tmp_path / "sub" / "custom.yaml")
    raw = yaml.safe_load(path.read_text())
    assert raw["topk_pages"] == [4, 8, 8] and raw["bin_tokens"] == 512
    back = load_schedule_yaml(path)
    assert back == CUSTOM and back.description == CUSTOM.description
    # nothing left behind by the write-then-rename
    assert [p.name for p in path.parent.iterdir()] == ["custom.yaml"]


def test_json_file_and_defaults(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "j", "topk_pages": [1, 2]}))
    s = resolve_schedule(str(path))
    assert s.topk_pages == (1, 2)
    # omitted keys take the reference defaults
    assert (s.page_size, s.bin_tokens, s.reserved_bos, s.reserved_eos) == (16, 2000, 1, 2)
    assert s.skip_layers == (0, 1) and s.target == 0.86


def test_unknown_key_names_it_and_valid_keys():
    with pytest.raises(ScheduleError) as err:
        schedule_from_dict({"name": "x", "topk_pages": [1], "topk": [2]}, source="f.yaml")
    msg = str(err.value)
    assert "'topk'" in msg and "f.yaml" in msg and "reserved_eos" in msg and "page_size" in msg


@pytest.mark.parametrize("missing", ["name", "topk_pages"])
def test_missing_required_key(missing):
    d = {"name": "x", "topk_pages": [1, 2]}
    del d[missing]
    with pytest.raises(ScheduleError, match=f"missing required schedule key '{missing}'"):
        schedule_from_dict(d)


def test_invalid_values_name_the_source(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ntopk_pages: [5, 3]\n")
    with pytest.raises(ScheduleError) as err:
        load_schedule_yaml(path)
    assert str(path) in str(err.value) and "non-decreasing" in str(err.value)
    path.write_text("name: bad\ntopk_pages: 5 3\n")
    with pytest.raises(ScheduleError, match="topk_pages must be a list"):
        load_schedule_yaml(path)
    path.write_text("- just\n- a list\n")
    with pytest.raises(ScheduleError, match="must be a mapping"):
        load_schedule_yaml(path)
    path.write_text("name: [unclosed\n")
    with pytest.raises(ScheduleError, match="not a valid schedule file"):
        load_schedule_yaml(path)


def test_resolve_preset_extra_and_missing(tmp_path):
    assert resolve_schedule("qwen3-4b-0.86") is PRESETS["qwen3-4b-0.86"]
    stored = Schedule(name="calibrated-7", topk_pages=(3, 4))
    assert resolve_schedule("calibrated-7", extra={"calibrated-7": stored}) is stored
    shadow = Schedule(name="tiny-0.86", topk_pages=(9,))
    assert resolve_schedule("tiny-0.86", extra={"tiny-0.86": shadow}) is shadow
    with pytest.raises(ScheduleError) as err:
        resolve_schedule("nope", extra={"calibrated-7": stored})
    assert "'nope'" in str(err.value)
    assert "tiny-0.86" in str(err.value) and "calibrated-7" in str(err.value)
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ScheduleError, match="not found") as err:
        resolve_schedule(str(missing))
    assert str(missing) in str(err.value)


def test_resolve_existing_file_without_suffix(tmp_path):
    path = save_schedule_yaml(CUSTOM, tmp_path / "schedule-file")
    assert resolve_schedule(str(path)) == CUSTOM
