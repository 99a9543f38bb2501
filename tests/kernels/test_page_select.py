"""Page scoring and top-k selection against plain loops and sparse/selection.py."""

import pytest
import torch

from sparrow.kernels.page_scores import page_scores
from sparrow.kernels.page_topk import lists_from_mask, page_topk, select_page_lists
from sparrow.kernels.runtime import KernelInputError
from sparrow.sparse.selection import group_query_mean, select_pages


def loop_select(scores, n, k, bos, eos):
    """One row by hand: reserved pages, then the k best eligible (ties to the lower page)."""
    eligible = list(range(bos, max(bos, n - eos)))
    always = [p for p in range(n) if p not in eligible]
    if len(eligible) <= k:
        return sorted(always + eligible)
    ranked = sorted(eligible, key=lambda p: (-float(scores[p]), p))
    return sorted(always + ranked[:k])


@pytest.mark.parametrize(
    "centroid_dtype,launch",
    [
        (torch.float32, {}),
        (torch.bfloat16, {}),
        (torch.float8_e4m3fn, {}),
        # several blocks per program, a pipelined loop and a block past the widest row
        (torch.bfloat16, dict(block_pages=2, blocks_per_program=3, num_stages=2)),
        (torch.float32, dict(block_pages=4, blocks_per_program=2)),
    ],
)
def test_scores_equal_a_plain_loop(interpreted, centroid_dtype, launch):
    gen = torch.Generator().manual_seed(0)
    pages, hkv, hq, dim, page_size, width = 30, 2, 6, 24, 4, 9
    centroids = torch.randn(pages, hkv, dim, generator=gen).to(centroid_dtype)
    q = torch.randn(3, hq, dim, generator=gen)
    tables = torch.randint(0, pages, (3, width), generator=gen, dtype=torch.int32)
    num_tokens = torch.tensor([width * page_size, 13, 0], dtype=torch.int32)
    scores = page_scores(q, centroids, tables, num_tokens, page_size, **launch)
    qn, cn = q.double().numpy(), centroids.double().numpy()  # bf16, fp8 exact in float64
    for b in range(3):
        n = -(-int(num_tokens[b]) // page_size)
        for h in range(hkv):
            q_mean = qn[b, 3 * h : 3 * h + 3].mean(axis=0)
            for p in range(width):
                got = float(scores[b, h, p])
                if p < n:
                    assert got == pytest.approx(cn[tables[b, p], h] @ q_mean, abs=1e-5)
                else:
                    assert got == float("-inf")


@pytest.mark.parametrize("radix_bits", [8, 4, 1])
def test_topk_equals_the_rule_with_ties_and_edge_rows(interpreted, radix_bits):
    gen = torch.Generator().manual_seed(1)
    batch, hkv, width, page_size = 6, 2, 40, 4
    scores = torch.randn(batch, hkv, width, generator=gen)
    scores[0, 0, 3:12] = 0.25  # a run of ties across the cut
    scores[1, 1, 2:30] = -0.0  # signed zeros tie with zeros
    scores[1, 1, 7] = 0.0
    scores[2] = torch.round(scores[2] * 2)  # many ties
    num_tokens = torch.tensor([160, 117, 93, 9, 1, 0], dtype=torch.int32)
    topk = torch.tensor([5, 4, 3, 10, 2, 0], dtype=torch.int32)
    for bos, eos in ((1, 2), (0, 1), (3, 3)):
        lists, counts, mask = page_topk(
            scores, num_tokens, topk, page_size, bos, eos, want_mask=True, radix_bits=radix_bits
        )
        for b in range(batch):
            n = -(-int(num_tokens[b]) // page_size)
            for h in range(hkv):
                want = loop_select(scores[b, h], n, int(topk[b]), bos, eos)
                assert lists[b, h, : counts[b, h]].tolist() == want, (bos, eos, b, h)
                assert torch.nonzero(mask[b, h]).flatten().tolist() == want


def test_score_and_select_equal_the_selection_reference(interpreted):
    gen = torch.Generator().manual_seed(2)
    pages, hkv, hq, dim, page_size, width = 50, 2, 4, 16, 4, 12
    centroids = torch.randn(pages, hkv, dim, generator=gen)
    q = torch.randn(4, hq, dim, generator=gen)
    tables = torch.randint(0, pages, (4, width), generator=gen, dtype=torch.int32)
    num_tokens = torch.tensor([48, 47, 20, 5], dtype=torch.int32)
    topk = torch.tensor([3, 6, 1, 2], dtype=torch.int32)
    lists, counts, mask = select_page_lists(
        q, centroids, tables, num_tokens, topk, page_size, 1, 2, want_mask=True
    )
    n_pages = (num_tokens.long() + page_size - 1) // page_size
    want = select_pages(
        group_query_mean(q, hkv), centroids[tables.long()], n_pages, topk.long(), 1, 2
    )
    assert torch.equal(mask, want)
    want_lists, want_counts = lists_from_mask(want)
    assert torch.equal(counts, want_counts)
    for b in range(4):
        for h in range(hkv):
            assert torch.equal(lists[b, h, : counts[b, h]], want_lists[b, h, : counts[b, h]])


def test_lists_from_mask_keeps_page_order():
    mask = torch.tensor([[[False, True, False, True, True]]])
    lists, counts = lists_from_mask(mask)
    assert counts.tolist() == [[3]]
    assert lists[0, 0, :3].tolist() == [1, 3, 4]


def test_select_checks_its_inputs():
    scores = torch.zeros(2, 1, 4)
    with pytest.raises(KernelInputError, match="num_tokens and topk"):
        page_topk(
            scores, torch.zeros(3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 4, 1, 1
        )
    with pytest.raises(KernelInputError, match="reserved_eos >= 1"):
        page_topk(
            scores, torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 4, 1, 0
        )
    with pytest.raises(KernelInputError, match="centroids must be float32"):
        page_scores(
            torch.zeros(2, 2, 8),
            torch.zeros(5, 1, 8, dtype=torch.int32),
            torch.zeros(2, 3, dtype=torch.int32),
            torch.zeros(2, dtype=torch.int32),
            4,
        )
