"""The split combine inside the decode kernel (the last split of each (sequence, KV head)
to arrive merges them) against the two-kernel path and the PyTorch references: dense and
sparse, uneven and empty splits, padded rows, GQA groups, float32 and bfloat16, and the
arrival counters left at zero. The interpreter runs programs one after another, so the CPU
tests check the arrival logic; the GPU tests (marked gpu) race the programs for real,
eagerly and under a replayed CUDA graph, with and without programmatic dependent launch."""

import numpy as np
import pytest
import torch

from sparrow_core.kernels.paged_decode import (
    paged_decode_attention, paged_decode_reference, sparse_paged_decode_attention,
    sparse_paged_decode_reference)
from sparrow_core.kernels.runtime import HAS_TRITON, arrival_counters, programmatic_launch

PAGE_SIZE = 4


@pytest.fixture
def bf16_dot(monkeypatch):
    """Triton 3.6's interpreter multiplies bfloat16 tl.dot operands as their uint16 bit
    patterns (it stores bfloat16 as uint16); widen them to float32 first, which is exact,
    as the tensor cores are."""
    if not HAS_TRITON:
        return
    from triton.runtime import interpreter

    tl = interpreter.tl
    original = interpreter.InterpreterBuilder.create_dot

    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        return interpreter.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32),
                                        tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


def decode_inputs(seed, group, dtype, hkv=2, dim=24, pages=40, width=9, device="cpu"):
    """Rows: a full table, 13 tokens (4 pages: 5 splits leave one empty), a padded row with
    no tokens, 2 tokens; sparse lists hold random ascending pages of each row, one row and
    head listing none."""
    gen = torch.Generator().manual_seed(seed)
    batch = 4
    k = torch.randn(pages, hkv, PAGE_SIZE, dim, generator=gen).to(dtype)
    v = torch.randn(pages, hkv, PAGE_SIZE, dim, generator=gen).to(dtype)
    q = torch.randn(batch, hkv * group, dim, generator=gen).to(dtype)
    tables = torch.randint(0, pages, (batch, width), generator=gen, dtype=torch.int32)
    num_tokens = torch.tensor([width * PAGE_SIZE - 1, 13, 0, 2], dtype=torch.int32)
    lists = torch.zeros(batch, hkv, width, dtype=torch.int32)
    counts = torch.zeros(batch, hkv, dtype=torch.int32)
    for b in range(batch):
        present = -(-int(num_tokens[b]) // PAGE_SIZE)
        for h in range(hkv):
            n = int(torch.randint(1, present + 1, (1,), generator=gen)) if present else 0
            n = 0 if (b, h) == (0, 1) else n
            chosen = torch.randperm(present, generator=gen)[:n].sort().values
            lists[b, h, :n], counts[b, h] = chosen.int(), n
    tensors = (q, k, v, tables, num_tokens, lists, counts)
    return tuple(t.to(device) for t in tensors)


def attend(inputs, sparse, fuse_combine=True, **launch):
    """The kernel with the combine inside it unless fuse_combine=False (the launchers'
    default is False: measured faster)."""
    q, k, v, tables, num_tokens, lists, counts = inputs
    launch["fuse_combine"] = fuse_combine
    if sparse:
        return sparse_paged_decode_attention(q, k, v, tables, num_tokens, lists, counts,
                                             **launch)
    return paged_decode_attention(q, k, v, tables, num_tokens, **launch)


def reference(inputs, sparse):
    q, k, v, tables, num_tokens, lists, counts = inputs
    if sparse:
        return sparse_paged_decode_reference(q, k, v, tables, num_tokens, lists, counts)
    return paged_decode_reference(q, k, v, tables, num_tokens)


def counters_left(device):
    """Nonzero arrival counters of the decode kernel on device (as the launcher names it)."""
    return int(arrival_counters(device, 1, "paged_decode").count_nonzero())


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_combine_equals_the_two_kernel_path(interpreted, bf16_dot, sparse, splits, group,
                                                  dtype, tol):
    inputs = decode_inputs(splits * 10 + group, group, dtype)
    launch = dict(num_splits=splits, pages_per_block=1)
    two_kernels = attend(inputs, sparse, fuse_combine=False, **launch)
    # other queries first: their partials stay in the memory the next launch's partials
    # likely reuse, so a merge that ran before every split had stored would show
    attend((-inputs[0],) + inputs[1:], sparse, **launch)
    fused = attend(inputs, sparse, **launch)
    assert fused.dtype == dtype and fused.shape == inputs[0].shape
    assert counters_left(torch.device("cpu")) == 0  # the next launch starts from zero
    again = attend(inputs, sparse, fuse_combine=True, **launch)
    # same partials merged in the same order: identical in the interpreter
    assert torch.equal(fused, two_kernels)
    assert torch.equal(again, fused)
    assert not fused[2].any()  # the padded row is zero, not NaN
    want = reference(inputs, sparse)
    torch.testing.assert_close(fused.float(), want.float(), atol=tol, rtol=tol)


def test_automatic_splits_and_prefetched_ids_fuse_too(interpreted):
    inputs = decode_inputs(7, 2, torch.float32)
    for sparse in (False, True):
        want = reference(inputs, sparse)
        for launch in (dict(), dict(prefetch_ids=True, num_splits=3, pages_per_block=2)):
            torch.testing.assert_close(attend(inputs, sparse, **launch), want, atol=1e-5,
                                       rtol=1e-5)
            assert counters_left(torch.device("cpu")) == 0


# on the GPU: B=16, Hq=16, Hkv=8, head dim 128, bf16, 4K-16K tokens in 16-token pages

GPU_PAGE = 16


def gpu_inputs(seed, max_tokens=16384):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    batch, hq, hkv, dim = 16, 16, 8, 128
    lengths = torch.randint(4096, max_tokens + 1, (batch,), generator=gen, device="cuda")
    lengths[0], lengths[5] = max_tokens, 0  # one full-width row, one padded row
    width = max_tokens // GPU_PAGE
    pages = batch * width + 7
    k = torch.randn(pages, hkv, GPU_PAGE, dim, generator=gen, device="cuda").bfloat16()
    v = torch.randn(pages, hkv, GPU_PAGE, dim, generator=gen, device="cuda").bfloat16()
    tables = torch.randperm(pages, generator=gen, device="cuda")[:batch * width]
    tables = tables.view(batch, width).int()
    # sparse: a random ascending quarter of each row's pages per KV head, one head empty
    present = (lengths + GPU_PAGE - 1) // GPU_PAGE
    keys = torch.rand(batch, hkv, width, generator=gen, device="cuda")
    keys = keys.masked_fill(torch.arange(width, device="cuda") >= present.view(-1, 1, 1), 2.0)
    counts = (present // 4).view(-1, 1).expand(batch, hkv).clone().int()
    counts[1, 3] = 0
    chosen = keys.argsort(dim=-1)  # the first `counts` are random pages below present
    entry = torch.arange(width, device="cuda")
    lists = torch.where(entry < counts.unsqueeze(-1), chosen, width).sort(dim=-1).values
    lists = lists.clamp_max(width - 1).int()
    queries = torch.randn(8, batch, hq, dim, generator=gen, device="cuda").bfloat16()
    return queries, (queries[0], k, v, tables, lengths.int(), lists, counts)


def poison():
    """Leave NaN in the allocator's free blocks so that torch.empty hands them out."""
    torch.full((64 << 20,), float("nan"), device="cuda")
    torch.cuda.synchronize()


def close_bf16(got, want):
    """Fused and two-kernel outputs: the same partials merged in the same order, so equal
    but for the compiler's freedom in the merge's float32 arithmetic."""
    assert not got.isnan().any()
    diff = (got.float() - want.float()).abs()
    assert float(diff.max()) <= 2 ** -7 * float(want.float().abs().max())
    assert float((got == want).float().mean()) > 0.99


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
def test_gpu_fused_combine_repeated_launches(sparse, pdl):
    """Eight launches back to back, each on other queries, so that a merge which read a
    stale or unwritten partial (NaN poisoned) would differ from the two-kernel result."""
    queries, inputs = gpu_inputs(11)
    launch = dict(num_splits=8)
    with programmatic_launch(pdl):
        poison()
        fused = [attend((q,) + inputs[1:], sparse, **launch) for q in queries]
        torch.cuda.synchronize()
        assert counters_left(inputs[0].device) == 0
        for q, got in zip(queries, fused):
            equals_two_kernel_path(got, q, inputs, sparse, launch)
            ref = reference((q,) + inputs[1:], sparse).float()
            assert float((got.float() - ref).norm() / ref.norm()) < 1e-2
        # deterministic: whichever split arrives last, the merge reads the same partials
        assert torch.equal(attend(inputs, sparse, **launch), fused[0])


def equals_two_kernel_path(got, q, inputs, sparse, launch):
    """got (the in-kernel combine's output for query q) against the two-kernel path; row 5
    is the padded one and must be zero."""
    close_bf16(got, attend((q,) + inputs[1:], sparse, fuse_combine=False, **launch))
    assert not got[5].any()


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
def test_gpu_fused_combine_in_a_replayed_cuda_graph(sparse, pdl):
    queries, inputs = gpu_inputs(12)
    static_q = inputs[0].clone()
    launch = dict(num_splits=8)
    with programmatic_launch(pdl):
        attend((static_q,) + inputs[1:], sparse, **launch)  # compiles, allocates counters
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = attend((static_q,) + inputs[1:], sparse, **launch)
        outs = []
        for q in queries:
            static_q.copy_(q)
            graph.replay()
            outs.append(static_out.clone())
        torch.cuda.synchronize()
        assert counters_left(inputs[0].device) == 0
        for q, got in zip(queries, outs):
            equals_two_kernel_path(got, q, inputs, sparse, launch)
