"""Paged decode attention (dense and per-head page lists) and the split-K combine against
plain numpy loops in float64 and against engine/attention.py's references; split counts
that leave splits empty, GQA groups, float32 and bfloat16 against the kernels' references."""

import math

import numpy as np
import pytest
import torch

from sparrow.engine.attention import dense_decode_attention, sparse_decode_attention
from sparrow.kernels.paged_decode import (
    paged_decode_attention,
    paged_decode_reference,
    sparse_paged_decode_attention,
    sparse_paged_decode_reference,
)
from sparrow.kernels.runtime import KernelInputError
from sparrow.kernels.split_combine import combine_splits


def make_inputs(seed, batch=3, hq=6, hkv=2, dim=24, page_size=4, pages=20, width=7):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(pages, hkv, page_size, dim, generator=gen)  # head-major cache layout
    v = torch.randn(pages, hkv, page_size, dim, generator=gen)
    q = torch.randn(batch, hq, dim, generator=gen)
    tables = torch.randint(0, pages, (batch, width), generator=gen, dtype=torch.int32)
    # ragged: a full table, a single token, an empty (padded) row
    num_tokens = torch.tensor([width * page_size - 1, 1, 0][:batch], dtype=torch.int32)
    return q, k, v, tables, num_tokens


def loop_attention(q, k, v, tables, num_tokens, pages_read):
    """pages_read(b, h) -> logical pages; numpy float64, one query head at a time."""
    q, k, v = (t.double().numpy() for t in (q, k, v))
    batch, hq, dim = q.shape
    hkv, page_size = k.shape[1], k.shape[2]
    out = np.zeros_like(q)
    for b in range(batch):
        for h in range(hq):
            g = h // (hq // hkv)
            pos = [
                p * page_size + o
                for p in sorted(pages_read(b, g))
                for o in range(page_size)
                if p * page_size + o < int(num_tokens[b])
            ]
            if not pos:
                continue
            keys = np.stack([k[tables[b, p // page_size], g, p % page_size] for p in pos])
            vals = np.stack([v[tables[b, p // page_size], g, p % page_size] for p in pos])
            s = keys @ q[b, h] / math.sqrt(dim)
            w = np.exp(s - s.max())
            out[b, h] = (w / w.sum()) @ vals
    return out


@pytest.mark.parametrize(
    "splits,per_block,prefetch",
    [(1, 1, False), (3, 2, False), (8, 1, False), (None, None, False), (1, 1, True), (3, 2, True)],
)
def test_dense_equals_a_plain_loop(interpreted, splits, per_block, prefetch):
    q, k, v, tables, num_tokens = make_inputs(seed=splits or 0)
    out = paged_decode_attention(
        q,
        k,
        v,
        tables,
        num_tokens,
        num_splits=splits,
        pages_per_block=per_block,
        prefetch_ids=prefetch,
    )
    want = loop_attention(q, k, v, tables, num_tokens, lambda b, g: range(tables.shape[1]))
    np.testing.assert_allclose(out.double().numpy(), want, atol=1e-5)
    assert not out[2].any()  # the empty row is zero, not NaN
    ref = dense_decode_attention(q[:2], k, v, tables[:2].long(), num_tokens[:2].long())
    torch.testing.assert_close(out[:2], ref, atol=1e-5, rtol=1e-5)


def test_sparse_reads_only_the_listed_pages(interpreted):
    q, k, v, tables, num_tokens = make_inputs(seed=5)
    lists = torch.tensor(
        [
            [[6, 0, 3, 1, 0], [2, 5, 0, 0, 0]],
            [[0, 4, 4, 4, 4], [0, 0, 0, 0, 0]],
            [[0, 1, 0, 0, 0], [0, 0, 0, 0, 0]],
        ],
        dtype=torch.int32,
    )
    counts = torch.tensor([[4, 2], [1, 1], [2, 0]], dtype=torch.int32)
    read = lambda b, g: lists[b, g, : counts[b, g]].tolist()
    # prefetched page ids (loaded a block ahead) must read exactly the same pages
    for splits, per_block, prefetch in (
        (1, 1, False),
        (2, 1, False),
        (None, 1, False),
        (1, 1, True),
        (2, 1, True),
        (2, 2, True),
        (3, 1, True),
    ):
        out = sparse_paged_decode_attention(
            q,
            k,
            v,
            tables,
            num_tokens,
            lists,
            counts,
            num_splits=splits,
            pages_per_block=per_block,
            prefetch_ids=prefetch,
        )
        want = loop_attention(q, k, v, tables, num_tokens, read)
        np.testing.assert_allclose(out.double().numpy(), want, atol=1e-5)
    mask = torch.zeros(2, 2, tables.shape[1], dtype=torch.bool)
    for b in range(2):
        for g in range(2):
            mask[b, g, read(b, g)] = True
    ref = sparse_decode_attention(q[:2], k, v, tables[:2].long(), num_tokens[:2].long(), mask)
    torch.testing.assert_close(out[:2], ref, atol=1e-5, rtol=1e-5)


def split_inputs(seed, group, dtype, hkv=2, dim=24, page_size=4, pages=40, width=9):
    """Rows: a full table, 13 tokens (4 pages: 5 splits leave one empty), a padded row with
    no tokens, 2 tokens; sparse lists hold random ascending pages of each row, one row and
    head listing none."""
    gen = torch.Generator().manual_seed(seed)
    batch = 4
    k = torch.randn(pages, hkv, page_size, dim, generator=gen).to(dtype)
    v = torch.randn(pages, hkv, page_size, dim, generator=gen).to(dtype)
    q = torch.randn(batch, hkv * group, dim, generator=gen).to(dtype)
    tables = torch.randint(0, pages, (batch, width), generator=gen, dtype=torch.int32)
    num_tokens = torch.tensor([width * page_size - 1, 13, 0, 2], dtype=torch.int32)
    lists = torch.zeros(batch, hkv, width, dtype=torch.int32)
    counts = torch.zeros(batch, hkv, dtype=torch.int32)
    for b in range(batch):
        present = -(-int(num_tokens[b]) // page_size)
        for h in range(hkv):
            n = int(torch.randint(1, present + 1, (1,), generator=gen)) if present else 0
            n = 0 if (b, h) == (0, 1) else n
            chosen = torch.randperm(present, generator=gen)[:n].sort().values
            lists[b, h, :n], counts[b, h] = chosen.int(), n
    return q, k, v, tables, num_tokens, lists, counts


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_splits_and_their_combine_equal_the_reference(
    interpreted, bf16_dot, sparse, splits, group, dtype, tol
):
    q, k, v, tables, num_tokens, lists, counts = split_inputs(splits * 10 + group, group, dtype)
    launch = dict(num_splits=splits, pages_per_block=1)
    if sparse:
        out = sparse_paged_decode_attention(q, k, v, tables, num_tokens, lists, counts, **launch)
        want = sparse_paged_decode_reference(q, k, v, tables, num_tokens, lists, counts)
    else:
        out = paged_decode_attention(q, k, v, tables, num_tokens, **launch)
        want = paged_decode_reference(q, k, v, tables, num_tokens)
    assert out.dtype == dtype and out.shape == q.shape
    assert not out[2].any()  # the padded row is zero, not NaN
    torch.testing.assert_close(out.float(), want.float(), atol=tol, rtol=tol)


def test_combine_splits_equals_softmax_over_all_keys(interpreted):
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, 10, generator=gen, dtype=torch.float64) * 3
    values = torch.randn(2, 3, 10, 5, generator=gen, dtype=torch.float64)
    cuts = [(0, 4), (4, 4), (4, 10)]  # the middle split is empty
    outs, lses = [], []
    for lo, hi in cuts:
        s, vv = scores[..., lo:hi], values[..., lo:hi, :]
        if hi == lo:
            outs.append(torch.zeros(2, 3, 5, dtype=torch.float64))
            lses.append(torch.full((2, 3), -math.inf, dtype=torch.float64))
            continue
        lses.append(torch.logsumexp(s, -1) / math.log(2))
        outs.append(torch.einsum("bhk,bhkd->bhd", torch.softmax(s, -1), vv))
    out = combine_splits(torch.stack(outs, 2).float(), torch.stack(lses, 2).float(), torch.float32)
    want = torch.einsum("bhk,bhkd->bhd", torch.softmax(scores, -1), values)
    np.testing.assert_allclose(out.numpy(), want.numpy(), atol=1e-5)


def test_launchers_name_what_is_wrong():
    q, k, v, tables, num_tokens = make_inputs(seed=1)
    with pytest.raises(KernelInputError, match="share a float dtype"):
        paged_decode_attention(q.double(), k, v, tables, num_tokens)
    with pytest.raises(KernelInputError, match="page_tables must be"):
        paged_decode_attention(q, k, v, tables[:2], num_tokens)
    with pytest.raises(KernelInputError, match="do not split"):
        paged_decode_attention(q[:, :5], k, v, tables, num_tokens)
    with pytest.raises(KernelInputError, match="page_tables must hold integers"):
        paged_decode_attention(q, k, v, tables.float(), num_tokens)
    with pytest.raises(KernelInputError, match="page_counts must be"):
        sparse_paged_decode_attention(
            q,
            k,
            v,
            tables,
            num_tokens,
            torch.zeros(3, 2, 4, dtype=torch.int32),
            torch.zeros(3, dtype=torch.int32),
        )
