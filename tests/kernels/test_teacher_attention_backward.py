"""Teacher-forced attention backward: the kernels' dq, dk, dv (through the autograd Function)
against autograd of the reference on the same bits, and the lse the forward stores against
the reference's; GQA, ragged sequences, tiles no row reads, bf16. Runs in Triton's
interpreter when triton is installed (`interpreted`), else through the PyTorch fallback; the
`gpu` test runs the compiled kernels:
`python -m pytest -m gpu tests/kernels/test_teacher_attention_backward.py -q`."""

import numpy as np
import pytest
import torch

from sparrow.kernels.teacher_attention import (
    LOG2E,
    teacher_attention_reference,
    teacher_sparse_attention,
)
from sparrow.kernels.teacher_attention_backward import (
    teacher_attention_backward,
    teacher_attention_reference_grad,
    teacher_sparse_attention_trainable,
)
from sparrow.kernels.teacher_pages import pack_page_bits

from .test_teacher_attention import random_bits


def inputs(lens, heads, kv_heads, dim, page_size, density, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    q, k, v = (
        torch.randn(total, h, dim, generator=gen).to(dtype) for h in (heads, kv_heads, kv_heads)
    )
    words = -(-(-(-max(lens) // page_size)) // 32)
    bits = random_bits(gen, lens, kv_heads, page_size, words, density)
    starts = torch.tensor(np.cumsum((0,) + tuple(lens[:-1])), dtype=torch.int32)
    grad_out = torch.randn(total, heads, dim, generator=gen).to(dtype)
    return q, k, v, bits, starts, torch.tensor(lens, dtype=torch.int32), grad_out


CASES = [  # lengths, Hq, Hkv, D, page_size, density, block_m, block_n, dtype
    ((37, 1, 70), 6, 2, 24, 4, 0.3, 16, 16, torch.float32),  # group 3, odd dim, ragged
    ((64, 50), 4, 4, 16, 4, 0.0, 16, 32, torch.float32),  # own page only: most tiles skipped
    ((90,), 8, 2, 32, 8, 1.0, 32, 16, torch.float32),  # every page: dense causal
    ((45, 33), 4, 2, 32, 4, 0.5, None, None, torch.bfloat16),
    # 38 pages: two bit words a row, tiles of 16 pages (the whole int32 half-word, sign bit)
    ((150, 40), 4, 2, 16, 4, 0.2, 32, 64, torch.float32),
]


@pytest.mark.parametrize("case", CASES)
def test_gradients_equal_the_reference_gradient(interpreted, bf16_dot, case):
    lens, heads, kv_heads, dim, page_size, density, block_m, block_n, dtype = case
    q, k, v, bits, starts, seq_lens, grad_out = inputs(
        lens, heads, kv_heads, dim, page_size, density, dtype, len(lens) + heads
    )
    lse = torch.full(q.shape[:2], float("nan"))  # poisoned: every row of a sequence written
    out = teacher_sparse_attention(
        q, k, v, bits, starts, seq_lens, page_size, block_m=block_m, block_n=block_n, lse=lse
    )
    got = teacher_attention_backward(
        q,
        k,
        v,
        bits,
        starts,
        seq_lens,
        page_size,
        out,
        lse,
        grad_out,
        block_m=block_m,
        block_n=block_n,
    )
    want = teacher_attention_reference_grad(
        q.float(), k.float(), v.float(), bits, starts, seq_lens, page_size, grad_out.float()
    )
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == dtype and g.shape == w.shape, name
        scale = float(w.abs().max())
        torch.testing.assert_close(
            g.float(),
            w,
            atol=tol * max(scale, 1.0),
            rtol=0,
            msg=lambda m, name=name: f"{name}: {m}",
        )
    if density < 1.0:  # the masks matter: the dense gradient is another one
        dense = pack_page_bits(
            torch.ones(q.shape[0], kv_heads, bits.shape[2] * 32, dtype=torch.bool), bits.shape[2]
        )
        other = teacher_attention_reference_grad(
            q.float(), k.float(), v.float(), dense, starts, seq_lens, page_size, grad_out.float()
        )
        assert (other[1] - got[1].float()).abs().max() > 1e-2


def test_stored_lse_is_the_reference_log2_sum_exp2(interpreted):
    q, k, v, bits, starts, seq_lens, _ = inputs((29, 40), 4, 2, 16, 4, 0.4, torch.float32, 5)
    lse = torch.full(q.shape[:2], float("nan"))
    teacher_sparse_attention(q, k, v, bits, starts, seq_lens, 4, block_m=16, block_n=16, lse=lse)
    want = torch.zeros_like(lse)
    teacher_attention_reference(q, k, v, bits, starts, seq_lens, 4, lse=want)
    torch.testing.assert_close(lse, want, atol=1e-5, rtol=0)
    # position 0 reads its one key: lse is that score in log2 units
    first = (q[0].view(2, 2, 16) * k[0].view(2, 1, 16)).sum(-1).flatten() / 4.0 * LOG2E
    torch.testing.assert_close(lse[0], first, atol=1e-5, rtol=0)


def test_autograd_function_matches_the_reference_and_leaves_padding_rows_at_zero(interpreted):
    """Rows after the last sequence (a packing's padding) get no gradient."""
    q, k, v, bits, starts, seq_lens, grad_out = inputs((23, 41), 6, 2, 16, 4, 0.3, torch.float32, 9)
    pad = 5
    q, k, v, grad_out = (
        torch.cat([t, torch.randn(pad, *t.shape[1:])]) for t in (q, k, v, grad_out)
    )
    bits = torch.cat(
        [bits, torch.zeros(bits.shape[0], pad, bits.shape[2], dtype=torch.int32)], dim=1
    )
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = teacher_sparse_attention_trainable(*leaves, bits, starts, seq_lens, 4)
    out.backward(grad_out)
    want = teacher_attention_reference_grad(q, k, v, bits, starts, seq_lens, 4, grad_out)
    for leaf, w in zip(leaves, want):
        torch.testing.assert_close(leaf.grad, w, atol=1e-4, rtol=0)
        assert not leaf.grad[-pad:].any()
    reference = teacher_attention_reference(q, k, v, bits, starts, seq_lens, 4)
    torch.testing.assert_close(out.detach(), reference, atol=1e-5, rtol=0)


def test_reference_gradient_of_a_row_reading_nothing_is_zero():
    """A softmax over nothing: 0 out, 0 gradient (not NaN), as in the kernels."""
    q, k, v, _, starts, seq_lens, grad_out = inputs((12,), 2, 1, 8, 4, 0.0, torch.float32, 2)
    bits = torch.zeros(1, 12, 1, dtype=torch.int32)
    bits[0, 5:] = 0b11  # rows 0..4 read nothing
    dq, dk, dv = teacher_attention_reference_grad(q, k, v, bits, starts, seq_lens, 4, grad_out)
    assert torch.isfinite(dq).all() and not dq[:5].any() and dq[5:].abs().sum() > 0
    assert not dk[8:].any() and not dv[8:].any()  # page 2 is read by no row


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "launch", [{}, {"block_m": 32, "block_n": 64}, {"block_m": 128, "block_n": 32}]
)
def test_gradients_equal_the_reference_on_cuda_at_model_heads(dtype, launch):
    """Compiled kernels, Qwen3-1.7B heads (16 q, 8 kv, dim 128), pages of 16, a sequence of
    several bit words, a short one, one of a single position."""
    assert torch.cuda.is_available(), "a gpu test: run it where CUDA is (pytest -m gpu)"
    cuda = torch.device("cuda")
    q, k, v, bits, starts, seq_lens, grad_out = (
        t.to(cuda) for t in inputs((3000, 700, 1), 16, 8, 128, 16, 0.15, dtype, 7)
    )
    lse = torch.full(q.shape[:2], float("nan"), device=cuda)
    out = teacher_sparse_attention(q, k, v, bits, starts, seq_lens, 16, lse=lse)
    got = teacher_attention_backward(
        q, k, v, bits, starts, seq_lens, 16, out, lse, grad_out, **launch
    )
    want = teacher_attention_reference_grad(
        q.float(), k.float(), v.float(), bits, starts, seq_lens, 16, grad_out.float()
    )
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        error = float((g.float() - w).norm() / w.norm())
        assert torch.isfinite(g).all() and error < (1e-4 if dtype == torch.float32 else 2e-2), (
            name,
            error,
        )
