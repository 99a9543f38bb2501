"""select_pages against a plain-loop reference, a hand-worked example, and its edge cases."""

import numpy as np
import pytest
import torch

from sparrow.sparse.selection import (
    group_query_mean,
    pages_read,
    select_from_scores,
    select_pages,
    token_mask,
)


def loop_selection(q_mean, centroids, num_pages, topk, rbos, reos):
    """One query, one head at a time: reserved pages plus the top-k eligible by score."""
    batch, heads, _ = q_mean.shape
    width = centroids.shape[1]
    out = np.zeros((batch, heads, width), dtype=bool)
    for b in range(batch):
        n, k = int(num_pages[b]), int(topk[b])
        for h in range(heads):
            eligible = [p for p in range(n) if rbos <= p < n - reos]
            for p in range(n):
                if p not in eligible:
                    out[b, h, p] = True
            scores = {p: float(np.dot(q_mean[b, h], centroids[b, p, h])) for p in eligible}
            ranked = sorted(eligible, key=lambda p: (-scores[p], p))
            for p in ranked[:k]:
                out[b, h, p] = True
    return out


@pytest.mark.parametrize("rbos,reos", [(1, 2), (0, 1), (2, 3)])
def test_matches_plain_loop_on_ragged_batch(rbos, reos):
    gen = torch.Generator().manual_seed(rbos * 10 + reos)
    batch, heads, width, dim = 6, 3, 14, 8
    q_mean = torch.randn(batch, heads, dim, generator=gen)
    centroids = torch.randn(batch, width, heads, dim, generator=gen)
    num_pages = torch.tensor([1, 3, 5, 9, 14, 12])
    topk = torch.tensor([2, 1, 2, 4, 5, 20])
    got = select_pages(q_mean, centroids, num_pages, topk, rbos, reos)
    want = loop_selection(q_mean.numpy(), centroids.numpy(), num_pages, topk, rbos, reos)
    np.testing.assert_array_equal(got.numpy(), want)
    # the count per row is the reported page budget
    counts = got.sum(-1)
    budget = pages_read(num_pages, topk, rbos, reos)
    assert torch.equal(counts, budget.view(-1, 1).expand_as(counts))


def test_worked_example_from_the_docs():
    # 7 pages, reserved_bos 1, reserved_eos 2: pages 0, 5, 6 always; 1..4 scored; top-2 read
    q_mean = torch.tensor([[[1.0, 0.0]]])
    scores = [0.0, 0.3, -1.0, 0.9, 0.5, 0.0, 0.0]
    centroids = torch.tensor([[[[s, 7.0]] for s in scores]])  # [1, 7, 1, 2]
    mask = select_pages(q_mean, centroids, torch.tensor([7]), 2, 1, 2)
    assert torch.nonzero(mask[0, 0]).flatten().tolist() == [0, 3, 4, 5, 6]
    # top-k 4 covers all eligible pages: the step is dense
    mask = select_pages(q_mean, centroids, torch.tensor([7]), 4, 1, 2)
    assert mask[0, 0].all()


def test_ties_go_to_the_lower_page_and_padding_is_never_read():
    scores = torch.zeros(1, 1, 10)
    mask = select_from_scores(scores, torch.tensor([8]), 2, 1, 1)
    assert torch.nonzero(mask[0, 0]).flatten().tolist() == [0, 1, 2, 7]
    assert not mask[0, 0, 8:].any()


def test_group_query_mean_uses_repeat_kv_grouping():
    q = torch.arange(2 * 6 * 3, dtype=torch.float32).view(2, 6, 3)
    got = group_query_mean(q, 2)
    want = torch.stack([q[:, 0:3].mean(1), q[:, 3:6].mean(1)], dim=1)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="4 KV groups"):
        group_query_mean(q, 4)


def test_token_mask_expands_pages_and_hides_unwritten_slots():
    page_mask = torch.tensor([[[True, False, True]]])
    mask = token_mask(page_mask, 4, torch.tensor([10]))
    want = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0]
    assert mask[0, 0].int().tolist() == want


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="num_pages must have shape"):
        select_from_scores(torch.zeros(2, 1, 4), torch.tensor([3]), 1, 1, 1)
    with pytest.raises(ValueError, match="only 4 columns"):
        select_from_scores(torch.zeros(1, 1, 4), torch.tensor([5]), 1, 1, 1)
    with pytest.raises(ValueError, match="reserved_eos >= 1"):
        select_from_scores(torch.zeros(1, 1, 4), torch.tensor([3]), 1, 1, 0)
