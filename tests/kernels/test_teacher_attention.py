"""Teacher-forced kernels: the selection bits against a plain loop of the decode rule and
against select_from_scores; the attention against a float64 numpy loop, its reference and
the decode kernel's launcher fed each position's pages. Runs in Triton's interpreter when
triton is installed (`interpreted`), else through the launchers' PyTorch fallback."""

import math

import numpy as np
import pytest
import torch

from sparrow.kernels.paged_decode import sparse_paged_decode_attention
from sparrow.kernels.runtime import KernelInputError
from sparrow.kernels.teacher_attention import teacher_attention_reference, teacher_sparse_attention
from sparrow.kernels.teacher_pages import (
    pack_page_bits,
    page_bits_reference,
    select_page_bits,
    unpack_page_bits,
)
from sparrow.sparse.selection import select_from_scores


def loop_selection(scores, position, prompt_len, k, page_size, bos, eos):
    """One row of one head: the decode rule written out (a sort by score, lower page first)."""
    n = position // page_size + 1
    if position < prompt_len:
        return set(range(n))
    eligible = list(range(bos, max(bos, n - eos)))
    keep = set(range(n)) - set(eligible)
    if len(eligible) <= k:
        return keep | set(eligible)
    ranked = sorted(eligible, key=lambda p: (-float(scores[p]), p))
    return keep | set(ranked[:k])


def random_bits(gen, lengths, kv_heads, page_size, words, density):
    """Per row, each present page set with probability `density`; the row's own page always."""
    rows = []
    for length in lengths:
        position = torch.arange(length).view(-1, 1, 1)
        page = torch.arange(words * 32).view(1, 1, -1)
        read = torch.rand(length, kv_heads, words * 32, generator=gen) < density
        own = page == position // page_size
        rows.append((read | own) & (page <= position // page_size))
    return pack_page_bits(torch.cat(rows), words)


def test_pack_and_unpack_are_inverse_and_put_page_p_at_bit_p_mod_32():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(5, 3, 70, generator=gen) < 0.5
    bits = pack_page_bits(mask, 3)
    assert bits.shape == (3, 5, 3) and bits.dtype == torch.int32
    for r, h, p in [(0, 0, 0), (1, 2, 31), (4, 1, 63), (2, 0, 69), (3, 2, 45)]:
        word = int(bits[h, r, p // 32]) & 0xFFFFFFFF
        assert bool((word >> (p % 32)) & 1) == bool(mask[r, h, p])
    assert torch.equal(unpack_page_bits(bits, 70), mask)
    assert not unpack_page_bits(bits, 96)[..., 70:].any()


@pytest.mark.parametrize(
    "levels,first,prompt_len", [(None, 0, 9), (3, 0, 9), (None, 40, 50), (2, 17, 0), (None, 0, 200)]
)
def test_selection_bits_equal_the_decode_rule(interpreted, levels, first, prompt_len):
    """Ties (few score levels), -0.0, rows before, across and after the prompt's end, k of 0
    and k above the eligible pages, bins changing inside the chunk."""
    gen = torch.Generator().manual_seed(first + prompt_len)
    rows, heads, page_size, bos, eos = 90, 3, 4, 1, 2
    width = (first + rows - 1) // page_size + 1
    scores = torch.randn(rows, heads, width, generator=gen)
    if levels:
        scores = torch.randint(-1, levels, scores.shape, generator=gen).float()
        scores[scores == 0] = -0.0
    topk = torch.tensor([(0, 3, 9, 40)[((first + r) // 30) % 4] for r in range(rows)])
    bits = torch.full((heads, rows, 2), -7, dtype=torch.int32)  # poison: every word written
    select_page_bits(scores, first, prompt_len, topk, page_size, bos, eos, 2, out=bits)
    got = unpack_page_bits(bits, 64)
    for r in range(rows):
        for h in range(heads):
            want = loop_selection(
                scores[r, h], first + r, prompt_len, int(topk[r]), page_size, bos, eos
            )
            assert set(torch.nonzero(got[r, h]).flatten().tolist()) == want, (r, h)
    position = torch.arange(first, first + rows)
    decode = select_from_scores(scores, position // page_size + 1, topk, bos, eos)
    generated = position >= prompt_len
    assert torch.equal(got[generated][..., :width], decode[generated])


def test_prompt_only_rows_need_no_scores(interpreted):
    topk = torch.zeros(20, dtype=torch.int64)
    bits = select_page_bits(None, 3, 30, topk, 4, 1, 2, 1, kv_heads=2)
    want = page_bits_reference(None, 3, 30, topk, 4, 1, 2, 1, rows=20, kv_heads=2)
    assert torch.equal(bits, want)
    assert unpack_page_bits(bits, 32)[-1, 0].sum() == (22 // 4 + 1)
    with pytest.raises(KernelInputError, match="prompt row"):
        select_page_bits(None, 3, 10, topk, 4, 1, 2, 1, kv_heads=2)


def loop_attention(q, k, v, bits, starts, lens, page_size):
    """float64 numpy, one (position, query head) at a time."""
    q, k, v = (t.double().numpy() for t in (q, k, v))
    heads, dim = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    mask = unpack_page_bits(bits, bits.shape[2] * 32).numpy()
    out = np.zeros_like(q)
    for start, length in zip(starts, lens):
        for t in range(length):
            for h in range(heads):
                g = h // group
                keys = [j for j in range(t + 1) if mask[start + t, g, j // page_size]]
                if not keys:
                    continue
                s = np.array([k[start + j, g] @ q[start + t, h] for j in keys]) / math.sqrt(dim)
                w = np.exp(s - s.max())
                out[start + t, h] = (w / w.sum()) @ v[[start + j for j in keys], g]
    return out


CASES = [  # lengths, Hq, Hkv, D, page_size, density, block_m, block_n, dtype
    ((37, 1, 70), 6, 2, 24, 4, 0.3, 16, 16, torch.float32),  # group 3, odd dim, ragged
    ((64, 50), 4, 4, 16, 4, 0.0, 16, 32, torch.float32),  # own page only: most tiles skipped
    ((90,), 8, 2, 32, 8, 1.0, 32, 16, torch.float32),  # every page: dense causal
    ((45, 33), 4, 2, 32, 4, 0.5, None, None, torch.bfloat16),
]


@pytest.mark.parametrize("case", CASES)
def test_attention_equals_a_plain_loop_and_the_reference(interpreted, bf16_dot, case):
    lens, heads, kv_heads, dim, page_size, density, block_m, block_n, dtype = case
    gen = torch.Generator().manual_seed(len(lens) + heads)
    total = sum(lens)
    q, k, v = (
        torch.randn(total, h, dim, generator=gen).to(dtype) for h in (heads, kv_heads, kv_heads)
    )
    words = -(-(-(-max(lens) // page_size)) // 32)
    bits = random_bits(gen, lens, kv_heads, page_size, words, density)
    starts = torch.tensor(np.cumsum((0,) + lens[:-1]), dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))  # poisoned: every row of every sequence written
    teacher_sparse_attention(
        q, k, v, bits, starts, seq_lens, page_size, block_m=block_m, block_n=block_n, out=out
    )
    want = loop_attention(q, k, v, bits, starts.tolist(), lens, page_size)
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    np.testing.assert_allclose(out.double().numpy(), want, atol=atol)
    reference = teacher_attention_reference(
        q, k, v, bits, starts, seq_lens, page_size, query_chunk=7
    )
    torch.testing.assert_close(out.float(), reference.float(), atol=atol, rtol=0)
    skipped = teacher_sparse_attention(
        q,
        k,
        v,
        bits,
        starts,
        seq_lens,
        page_size,
        block_m=block_m,
        block_n=block_n,
        skip_empty=True,
    )
    torch.testing.assert_close(skipped, out, atol=atol, rtol=0)
    if density < 1.0:  # the masks do matter here
        dense = pack_page_bits(torch.ones(total, kv_heads, words * 32, dtype=torch.bool), words)
        full = teacher_attention_reference(q, k, v, dense, starts, seq_lens, page_size)
        assert (full.float() - out.float()).abs().max() > 1e-2


def test_attention_equals_the_decode_kernel_on_each_positions_pages(interpreted):
    """Position t of a sequence against a decode step with t + 1 tokens cached and the same
    page lists (paged_decode.py's launcher), GQA 4:2."""
    gen = torch.Generator().manual_seed(11)
    length, heads, kv_heads, dim, page_size = 61, 4, 2, 16, 4
    q, k, v = (torch.randn(length, h, dim, generator=gen) for h in (heads, kv_heads, kv_heads))
    bits = random_bits(gen, [length], kv_heads, page_size, 1, 0.4)
    got = teacher_sparse_attention(
        q, k, v, bits, torch.tensor([0]), torch.tensor([length]), page_size, block_m=16, block_n=16
    )
    pages = -(-length // page_size)
    padded = torch.zeros(pages * page_size, kv_heads, dim)
    k_pages = padded.clone().index_copy_(0, torch.arange(length), k)
    v_pages = padded.clone().index_copy_(0, torch.arange(length), v)
    # the cache's head-major layout [P, Hkv, page_size, D]
    k_pages, v_pages = (
        t.view(pages, page_size, kv_heads, dim).transpose(1, 2).contiguous()
        for t in (k_pages, v_pages)
    )
    mask = unpack_page_bits(bits, pages)  # [T, Hkv, P]
    order = torch.sort((~mask).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    counts = mask.sum(-1, dtype=torch.int32)
    tables = torch.arange(pages, dtype=torch.int32).expand(length, pages).contiguous()
    want = sparse_paged_decode_attention(
        q,
        k_pages,
        v_pages,
        tables,
        torch.arange(1, length + 1, dtype=torch.int32),
        order.contiguous(),
        counts,
        num_splits=2,
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_launchers_name_bad_arguments():
    q = torch.zeros(8, 4, 16)
    k = torch.zeros(8, 2, 16)
    bits = torch.zeros(2, 8, 1, dtype=torch.int32)
    one = torch.tensor([0]), torch.tensor([8])
    with pytest.raises(KernelInputError, match="page_size"):
        teacher_sparse_attention(q, k, k, bits, *one, 3)
    with pytest.raises(KernelInputError, match="bits must be"):
        teacher_sparse_attention(q, k, k, bits[:, :4], *one, 4)
    with pytest.raises(KernelInputError, match="query heads"):
        teacher_sparse_attention(q[:, :3], k, k, bits, *one, 4)
    with pytest.raises(KernelInputError, match="scores hold"):
        select_page_bits(torch.zeros(8, 2, 1), 0, 0, torch.ones(8, dtype=torch.long), 4, 1, 2, 1)
