"""Presets against the method's published table, and the Schedule type's invariants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparrow.sparse.presets import PRESETS, get_preset
from sparrow.sparse.schedule import Schedule, ScheduleError

# the paper's table of reference schedules, pasted as published
PUBLISHED = """
qwen3-1.7b-0.75: 29 29 45 45 61 61 77 77 93 93 93 93 93 93 93 93 93 93 93 93
qwen3-1.7b-0.80: 29 45 61 77 93 93 125 125 125 157 157 157 157 157 157 157 157 157 157 157
qwen3-1.7b-0.83: 29 61 77 93 125 125 157 157 189 189 189 189 189 189 189 189 189 189 189 189
qwen3-1.7b-0.86: 29 61 93 93 125 157 189 221 221 253 253 253 253 253 253 253 253 253 253 253
qwen3-1.7b-0.88: 45 77 125 157 157 189 221 253 253 317 317 317 317 317 317 317 317 317 317 317
qwen3-1.7b-0.90: 45 93 157 189 221 253 317 317 381 381 381 381 381 381 381 381 381 381 381 381
qwen3-1.7b-0.92: 61 125 189 221 253 317 381 381 445 509 509 509 509 509 509 509 509 509 509 509
qwen3-1.7b-0.94: 77 157 221 317 381 445 509 509 637 765 765 765 765 765 765 765 765 765 765 765
qwen3-4b-0.75: 29 29 29 29 45 61 77 93 125 125 125 125 157 157 157 157 157 157 189 189
qwen3-4b-0.80: 29 29 45 61 77 93 125 157 157 157 189 221 221 221 221 221 221 221 221 221
qwen3-4b-0.86: 29 45 61 77 93 125 157 221 253 253 317 317 317 317 381 381 381 381 509 509
qwen3-4b-0.88: 29 61 93 125 157 189 253 317 381 445 445 509 509 509 637 637 637 637 637 637
qwen3-4b-0.90: 45 77 125 157 189 253 317 445 637 765 765 765 765 765 765 893 893 893 893 893
qwen3-4b-0.92: 45 93 157 189 253 381 445 765 893 1021 1021 1149 1149 1149 1149 1149 1149 1149 1149 1149
qwen3-8b-0.75: 29 29 29 45 45 77 77 77 93 93 93 93 125 125 125 125 125 125 157 157
qwen3-8b-0.80: 29 29 45 61 77 93 125 125 157 157 189 189 189 221 221 221 221 253 253 253
qwen3-8b-0.86: 29 45 61 77 125 157 189 253 253 253 253 317 317 317 317 317 317 385 445 445
qwen3-8b-0.87: 29 61 77 93 157 189 221 317 317 317 317 381 381 381 381 381 445 445 509 509
qwen3-8b-0.92: 45 93 125 189 253 445 509 637 765 765 765 893 893 893 893 893 1021 1021 1021 1021
qwen3-14b-0.86: 29 45 77 125 253 381 381 381 381 381 381 381 381 381 381 509 637 637 893 893
"""


def _published() -> dict[str, list[int]]:
    rows = {}
    for line in PUBLISHED.strip().splitlines():
        name, values = line.split(":")
        rows[name.strip()] = [int(v) for v in values.split()]
    return rows


def test_reference_presets_match_published_table():
    published = _published()
    reference = {n: s for n, s in PRESETS.items() if not n.startswith("tiny")}
    assert sorted(reference) == sorted(published)
    for name, topk in published.items():
        s = reference[name]
        assert list(s.topk_pages) == topk, name
        assert len(s.topk_pages) == 20
        assert (s.page_size, s.bin_tokens, s.reserved_bos, s.reserved_eos) == (16, 2000, 1, 2)
        assert s.skip_layers == (0, 1)
        assert s.target == float(name.split("-")[-1])


def test_tiny_presets():
    tiny = get_preset("tiny-0.86")
    assert tiny.topk_pages == (4, 8, 16, 16, 20, 24, 28, 32)
    assert (tiny.page_size, tiny.bin_tokens, tiny.skip_layers, tiny.target) == (8, 64, (0,), 0.86)
    cheap = get_preset("tiny-0.80")
    assert cheap.topk_pages == (4, 6, 10, 12, 14, 16, 18, 20)
    assert cheap.target == 0.80 and cheap.bin_tokens == 64
    # cheaper in every bin
    assert all(a <= b for a, b in zip(cheap.topk_pages, tiny.topk_pages))


def test_get_preset_unknown_lists_known_names():
    with pytest.raises(ScheduleError) as err:
        get_preset("qwen3-1.7b-0.99")
    assert "qwen3-1.7b-0.99" in str(err.value)
    assert "qwen3-1.7b-0.86" in str(err.value) and "tiny-0.80" in str(err.value)


def test_budget_by_position_reference():
    s = get_preset("qwen3-1.7b-0.86")
    # hand: position 1999 is bin 0 (29 pages), 2000 is bin 1 (61), 10_000 is bin 5 (157)
    assert s.bin_of(1999) == 0 and s.bin_of(2000) == 1
    assert s.pages_read(1999) == 29 + 3
    assert s.pages_read(1999, num_pages=20) == 20  # no more than k eligible pages: dense
    assert s.pages_for_topk(61) == 61 + 3
    assert s.budget_tokens(2000) == (61 + 3) * 16
    assert s.budget_tokens(10_000) == (157 + 3) * 16
    # past the last bin the last budget holds
    assert s.bin_of(10**6) == 19 and s.topk_for_position(10**6) == 253
    # arrays and tensors bin the same way, clamped too
    positions = [0, 1999, 2000, 38_000, 10**6]
    assert s.bin_of(np.array(positions)).tolist() == [0, 0, 1, 19, 19]
    assert s.bin_of(torch.tensor(positions)).tolist() == [0, 0, 1, 19, 19]
    with pytest.raises(ValueError, match="position"):
        s.bin_of(-1)
    assert s.bin_bounds(0) == (0, 2000) and s.bin_bounds(19) == (38_000, None)
    assert s.is_sparse_layer(2) and not s.is_sparse_layer(1)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(topk_pages=(3, 2)), "non-decreasing"),
        (dict(topk_pages=(0, 2)), "positive"),
        (dict(topk_pages=()), "at least one bin"),
        (dict(topk_pages=(2, 2.5)), "integers"),
        (dict(topk_pages=(2, "3")), "integers"),
        (dict(topk_pages=(2,), page_size=24), "power of two"),
        (dict(topk_pages=(2,), page_size="16"), "page_size must be an integer"),
        (dict(topk_pages=(2,), bin_tokens=0), "bin_tokens"),
        (dict(topk_pages=(2,), reserved_eos=0), "reserved_eos"),
        (dict(topk_pages=(2,), skip_layers=(-1,)), "skip_layers"),
        (dict(topk_pages=(2,), target=1.5), "target"),
        (dict(topk_pages=(2,), target=True), "target must be a number"),
    ],
)
def test_schedule_invariants(kwargs, fragment):
    with pytest.raises(ScheduleError, match=fragment):
        Schedule(name="bad", **kwargs)


def test_schedule_accepts_integral_floats_and_numpy_ints():
    np = pytest.importorskip("numpy")
    s = Schedule(name="ok", topk_pages=[np.int64(2), 3.0, 4], skip_layers=[np.int32(0)])
    assert s.topk_pages == (2, 3, 4) and type(s.topk_pages[0]) is int
    assert s.skip_layers == (0,)
