"""The three attention entry points against a plain per-query, per-head loop in numpy."""

import math

import numpy as np
import pytest
import torch

from sparrow.engine.attention import (
    dense_decode_attention,
    prefill_attention,
    sparse_decode_attention,
)


def softmax_attend(q, keys, values):
    """One query [D] over keys/values [K, D], numpy float64."""
    scores = keys @ q / math.sqrt(q.shape[0])
    weights = np.exp(scores - scores.max())
    weights /= weights.sum()
    return weights @ values


def test_prefill_is_causal_within_each_sequence():
    gen = torch.Generator().manual_seed(0)
    lens, hq, hkv, dim = [3, 5, 1], 6, 2, 4
    total = sum(lens)
    q = torch.randn(total, hq, dim, generator=gen)
    k = torch.randn(total, hkv, dim, generator=gen)
    v = torch.randn(total, hkv, dim, generator=gen)
    out = prefill_attention(q, k, v, lens).double().numpy()
    qn, kn, vn = q.double().numpy(), k.double().numpy(), v.double().numpy()
    start = 0
    for n in lens:
        for t in range(n):
            for h in range(hq):
                g = h // (hq // hkv)
                keys = kn[start : start + t + 1, g]
                want = softmax_attend(qn[start + t, h], keys, vn[start : start + t + 1, g])
                np.testing.assert_allclose(out[start + t, h], want, atol=1e-5)
        start += n
    with pytest.raises(ValueError, match="seq_lens sum to 8"):
        prefill_attention(q, k, v, [3, 5])


def paged_setup(seed=1):
    gen = torch.Generator().manual_seed(seed)
    num_pages, page_size, hkv, dim, hq = 9, 4, 2, 8, 4
    k_pages = torch.randn(num_pages, hkv, page_size, dim, generator=gen)  # head-major
    v_pages = torch.randn(num_pages, hkv, page_size, dim, generator=gen)
    # two sequences: 10 tokens in pages [7, 2, 5], 4 tokens in page [3] (+ padding entries)
    page_tables = torch.tensor([[7, 2, 5], [3, 0, 0]])
    num_tokens = torch.tensor([10, 4])
    q = torch.randn(2, hq, dim, generator=gen)
    return q, k_pages, v_pages, page_tables, num_tokens


def gather_tokens(pages_np, table, count, page_size):
    rows = [pages_np[table[p // page_size], :, p % page_size] for p in range(count)]
    return np.stack(rows)  # [count, Hkv, D]


def test_dense_decode_reads_every_cached_token_of_its_sequence():
    q, k_pages, v_pages, tables, counts = paged_setup()
    out = dense_decode_attention(q, k_pages, v_pages, tables, counts).double().numpy()
    kn, vn, qn = k_pages.double().numpy(), v_pages.double().numpy(), q.double().numpy()
    for b in range(2):
        keys = gather_tokens(kn, tables[b].tolist(), int(counts[b]), 4)
        values = gather_tokens(vn, tables[b].tolist(), int(counts[b]), 4)
        for h in range(4):
            want = softmax_attend(qn[b, h], keys[:, h // 2], values[:, h // 2])
            np.testing.assert_allclose(out[b, h], want, atol=1e-5)


def test_sparse_decode_reads_only_the_selected_pages_per_kv_head():
    q, k_pages, v_pages, tables, counts = paged_setup(2)
    # sequence 0: head 0 reads logical pages 0 and 2 (the partial one), head 1 reads 1 and 2
    mask = torch.tensor(
        [[[True, False, True], [False, True, True]], [[True, False, False], [True, False, False]]]
    )
    out = sparse_decode_attention(q, k_pages, v_pages, tables, counts, mask).double().numpy()
    kn, vn, qn = k_pages.double().numpy(), v_pages.double().numpy(), q.double().numpy()
    for b in range(2):
        for h in range(4):
            g = h // 2
            positions = [p for p in range(int(counts[b])) if mask[b, g, p // 4]]
            table = tables[b].tolist()
            keys = np.stack([kn[table[p // 4], g, p % 4] for p in positions])
            values = np.stack([vn[table[p // 4], g, p % 4] for p in positions])
            np.testing.assert_allclose(out[b, h], softmax_attend(qn[b, h], keys, values), atol=1e-5)
    with pytest.raises(ValueError, match="page_mask must have shape"):
        sparse_decode_attention(q, k_pages, v_pages, tables, counts, mask[:, :1])


def test_all_pages_selected_equals_dense():
    q, k_pages, v_pages, tables, counts = paged_setup(3)
    every = torch.ones(2, 2, 3, dtype=torch.bool)
    dense = dense_decode_attention(q, k_pages, v_pages, tables, counts)
    sparse = sparse_decode_attention(q, k_pages, v_pages, tables, counts, every)
    assert torch.equal(dense, sparse)
