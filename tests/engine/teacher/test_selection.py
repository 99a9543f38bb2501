"""Teacher-forced page selection: the threshold rule equals select_from_scores (ties included)
and the chunked selection equals the whole-sequence rule whatever the chunk size."""

import pytest
import torch

from sparrow.engine.teacher.selection import (
    gather_pages,
    page_centroids,
    select_by_threshold,
    select_chunks,
)
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.selection import group_query_mean, select_from_scores

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("bos,eos", [(0, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("levels", [None, 3])  # 3 levels: most scores tie
def test_threshold_rule_equals_the_stable_sort(bos, eos, levels):
    gen = torch.Generator().manual_seed(bos * 10 + eos)
    rows, heads, width = 64, 3, 40
    scores = torch.randn(rows, heads, width, generator=gen)
    if levels:
        scores = torch.randint(0, levels, scores.shape, generator=gen).float()
    num_pages = torch.randint(1, width + 1, (rows,), generator=gen)
    topk = torch.randint(0, width + 4, (rows,), generator=gen)  # 0 and more than the width
    want = select_from_scores(scores, num_pages, topk, bos, eos)
    got = select_by_threshold(scores, num_pages, topk, bos, eos)
    assert torch.equal(got, want)
    assert torch.equal(
        select_by_threshold(scores, num_pages, topk, bos, eos, int(topk.max())), want
    )


def whole_sequence_pages(q, k, prompt_len, schedule):
    """The rule on the whole sequence at once (the former teacher-forced selection)."""
    size = schedule.page_size
    length, kv_heads, _ = k.shape
    scores = torch.einsum(
        "thd,phd->thp", group_query_mean(q, kv_heads), page_centroids(k, size, "cache")
    )
    position = torch.arange(length)
    num_pages = position // size + 1
    bins = (position // schedule.bin_tokens).clamp(max=schedule.num_bins - 1)
    topk = torch.tensor(schedule.topk_pages)[bins]
    mask = select_from_scores(scores, num_pages, topk, schedule.reserved_bos, schedule.reserved_eos)
    mask[:prompt_len] = True
    return mask & (torch.arange(scores.shape[-1]) < num_pages.view(-1, 1, 1))


@pytest.mark.parametrize("rows", [1, 7, 128, 1000])
@pytest.mark.parametrize("prompt_len", [1, 45, 200])
def test_chunks_equal_the_whole_sequence_rule(rows, prompt_len):
    schedule = Schedule(
        "t", (2, 4, 9), page_size=4, bin_tokens=64, reserved_bos=1, reserved_eos=2, skip_layers=()
    )
    gen = torch.Generator().manual_seed(rows + prompt_len)
    length = 203
    q, k = torch.randn(length, 6, 8, generator=gen), torch.randn(length, 2, 8, generator=gen)
    want = whole_sequence_pages(q, k, prompt_len, schedule)
    chunks, ends = [], []
    for first, last, pages in select_chunks(q, k, prompt_len, schedule, "cache", rows):
        assert first == (ends[-1] if ends else 0) and last - first <= rows
        assert pages.shape == (last - first, 2, (last - 1) // 4 + 1)
        chunks.append(pages)
        ends.append(last)
    assert ends[-1] == length
    got = gather_pages(chunks, want.shape[-1])
    assert torch.equal(got, want)
    # generated positions past the dense start read fewer pages than they have
    assert got[-1].sum(-1).max() == 2 + 1 + 9 < (length - 1) // 4 + 1


def test_selection_builds_no_graph():
    schedule = Schedule(
        "t", (2,), page_size=4, bin_tokens=64, reserved_bos=1, reserved_eos=1, skip_layers=()
    )
    q = torch.randn(40, 2, 8, requires_grad=True)
    k = torch.randn(40, 1, 8, requires_grad=True)
    for _, _, pages in select_chunks(q, k, 3, schedule, "cache", 16):
        assert not pages.requires_grad
