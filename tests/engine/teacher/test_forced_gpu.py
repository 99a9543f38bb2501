"""GPU twins of the teacher-forced tests: on CUDA the replay goes through the Triton kernels
(auto, forward and backward) or FlexAttention (compiled, backend="flex") and must equal the
float32 reference path on the same pages, forward and gradients, at bf16 tolerances; the
threshold selection equals the stable sort on CUDA.
Run on the device: `python -m pytest -m gpu tests/engine/teacher/test_forced_gpu.py -q`
(the first test compiles FlexAttention's kernels: a few minutes in all)."""

import pytest
import torch

from sparrow.engine.teacher.forced import TeacherForcedAttention, teacher_forced_logits
from sparrow.engine.teacher.selection import select_by_threshold
from sparrow.model import load_model
from sparrow.sparse.presets import get_preset
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.selection import select_from_scores

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def relative_error(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("levels", [None, 5])
def test_threshold_rule_equals_the_stable_sort_on_cuda(levels):
    gen = torch.Generator(CUDA).manual_seed(0)
    rows, heads, width = 512, 8, 2048
    scores = torch.randn(rows, heads, width, generator=gen, device=CUDA)
    if levels:
        scores = torch.randint(0, levels, scores.shape, generator=gen, device=CUDA).float()
    num_pages = torch.randint(1, width + 1, (rows,), generator=gen, device=CUDA)
    topk = torch.randint(0, 300, (rows,), generator=gen, device=CUDA)
    want = select_from_scores(scores, num_pages, topk, 1, 2)
    assert torch.equal(select_by_threshold(scores, num_pages, topk, 1, 2), want)


@pytest.mark.parametrize("path", ["flex", "triton"])
def test_sparse_paths_equal_reference_forward_and_gradients_at_1p7b_heads(path):
    """FlexAttention and the Triton kernels (forward and backward) against the
    reference: Qwen3-1.7B heads (16 q, 8 kv, dim 128), bf16, the 0.86 preset (pages of 16,
    bins of 2,000 tokens), a sequence crossing a bin and one shorter, each with a prompt."""
    torch._dynamo.reset()
    schedule = get_preset("qwen3-1.7b-0.86")
    lens, prompts = [2600, 900], [300, 100]
    gen = torch.Generator(CUDA).manual_seed(1)
    total = sum(lens)
    leaves = [
        torch.randn(
            total, heads, 128, generator=gen, device=CUDA, dtype=torch.bfloat16
        ).requires_grad_()
        for heads in (16, 8, 8)
    ]
    grad_out = torch.randn(total, 16, 128, generator=gen, device=CUDA, dtype=torch.bfloat16)
    picks, results = {}, {}
    for backend in (path, "reference"):
        hook = lambda layer, index, pages, b=backend: picks.__setitem__((b, index), pages)
        attention = TeacherForcedAttention(
            lens, prompts, schedule, query_chunk=512, backend=backend, on_selection=hook
        )
        # with gradients recorded only an explicit "triton" takes the kernels' backward
        assert attention._use_kernels(*leaves) == (backend == "triton")
        out = attention(5, *leaves)
        results[backend] = (out.detach(), *torch.autograd.grad(out, leaves, grad_out))
    for index in range(len(lens)):
        assert torch.equal(picks[(path, index)], picks[("reference", index)])
    fast, reference = results[path], results["reference"]
    torch.testing.assert_close(fast[0], reference[0], atol=2e-2, rtol=2e-2)
    for name, got, want in zip(("out", "dq", "dk", "dv"), fast, reference):
        assert relative_error(got, want) < 2e-2, name
    # sparse indeed: the last position reads 61 + 1 + 2 of its 163 pages
    assert picks[(path, 0)][-1].sum(-1).max() == 61 + 3


@pytest.mark.parametrize("path", ["triton", "flex", "auto"])
def test_model_replay_and_gradients_equal_on_cuda(qwen3_checkpoint, path):
    model = load_model(qwen3_checkpoint, device="cuda")
    gen = torch.Generator().manual_seed(3)
    sequences = [torch.randint(0, 384, (n,), generator=gen) for n in (400, 170)]
    schedule = Schedule(
        "tight",
        (2, 3, 5),
        page_size=4,
        bin_tokens=64,
        reserved_bos=1,
        reserved_eos=1,
        skip_layers=(0,),
    )
    params = [p for p in model.parameters() if p.requires_grad]
    grads = {}
    for backend in (path, "reference"):
        logits = teacher_forced_logits(model, sequences, [20, 50], schedule, backend=backend)
        loss = sum(x.logsumexp(-1).sum() for x in logits)
        grads[backend] = (
            [x.detach() for x in logits],
            torch.autograd.grad(loss, params, allow_unused=True),
        )
    for got, want in zip(grads[path][0], grads["reference"][0]):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=0)
    checked = 0
    for got, want in zip(grads[path][1], grads["reference"][1]):
        if want is not None:
            assert relative_error(got, want) < 1e-3
            checked += 1
    assert checked > 4


@pytest.mark.parametrize(
    "dtype,heads", [(torch.bfloat16, (16, 8)), (torch.float16, (32, 8)), (torch.float32, (16, 8))]
)
def test_triton_kernels_equal_the_reference_at_model_heads(dtype, heads):
    """The replay's Triton path (selection bits + attention kernel) against the float32
    reference path, 0.86 preset, a sequence crossing bins, a short one, an all-prompt one;
    the attention kernel over NaN-poisoned memory writes every row."""
    from sparrow.engine.teacher.kernel import selection_bits
    from sparrow.kernels.teacher_attention import (
        teacher_attention_reference,
        teacher_sparse_attention,
    )

    schedule = get_preset("qwen3-1.7b-0.86")
    lens, prompts = [4500, 900, 130], [300, 100, 130]
    gen = torch.Generator(CUDA).manual_seed(2)
    q, k, v = (
        torch.randn(sum(lens), h, 128, generator=gen, device=CUDA, dtype=dtype)
        for h in (heads[0], heads[1], heads[1])
    )
    picks, results = {}, {}
    for backend in ("auto", "reference"):
        hook = lambda layer, index, pages, b=backend: picks.__setitem__((b, index), pages)
        attention = TeacherForcedAttention(
            lens, prompts, schedule, backend=backend, on_selection=hook
        )
        with torch.no_grad():
            results[backend] = attention(5, q, k, v)
    # the all-prompt sequence (index 2) selects nothing on either path
    assert sorted(picks) == sorted((b, i) for b in ("auto", "reference") for i in (0, 1))
    for index in (0, 1):
        assert torch.equal(picks[("auto", index)], picks[("reference", index)]), index
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(results["auto"], results["reference"], atol=tol, rtol=tol)
    # sparse indeed: position 4499 (bin 2) reads 93 + 1 + 2 of its 282 pages
    assert picks[("auto", 0)][-1].sum(-1).max() == 93 + 3
    bits = selection_bits(q, k, lens, prompts, schedule, "cache")
    starts = torch.tensor([0, lens[0], lens[0] + lens[1]], device=CUDA, dtype=torch.int32)
    seq_lens = torch.tensor(lens, device=CUDA, dtype=torch.int32)
    poisoned = torch.full_like(q, float("nan"))
    launches = [(None, None), (64, 32)] + ([(128, 128)] if dtype != torch.float32 else [])
    for block_m, block_n in launches:
        out = teacher_sparse_attention(
            q,
            k,
            v,
            bits,
            starts,
            seq_lens,
            16,
            block_m=block_m,
            block_n=block_n,
            out=poisoned.clone(),
        )
        assert torch.isfinite(out).all()
        want = teacher_attention_reference(q, k, v, bits, starts, seq_lens, 16)
        assert relative_error(out, want) < (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("levels", [None, 4])
def test_page_bits_kernel_equals_the_stable_sort_on_cuda(levels):
    from sparrow.kernels.teacher_pages import page_bits_reference, select_page_bits

    gen = torch.Generator(CUDA).manual_seed(4)
    rows, heads, first = 700, 8, 20000
    width = (first + rows - 1) // 16 + 1
    scores = torch.randn(rows, heads, width, generator=gen, device=CUDA)
    if levels:
        scores = torch.randint(0, levels, scores.shape, generator=gen, device=CUDA).float()
    topk = torch.randint(0, 400, (rows,), generator=gen, device=CUDA)
    words = -(-width // 32) + 1
    got = select_page_bits(
        scores,
        first,
        first + 100,
        topk,
        16,
        1,
        2,
        words,
        out=torch.full((heads, rows, words), -1, dtype=torch.int32, device=CUDA),
    )
    want = page_bits_reference(scores, first, first + 100, topk, 16, 1, 2, words)
    assert torch.equal(got, want)


def test_model_replay_takes_the_kernels_and_equals_the_reference(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint, device="cuda")
    gen = torch.Generator().manual_seed(5)
    sequences = [torch.randint(0, 384, (n,), generator=gen) for n in (400, 170)]
    schedule = Schedule(
        "tight",
        (2, 3, 5),
        page_size=4,
        bin_tokens=64,
        reserved_bos=1,
        reserved_eos=1,
        skip_layers=(0,),
    )
    chosen = TeacherForcedAttention([400, 170], [20, 50], schedule)
    leaf = torch.zeros(1, 1, 1, device=CUDA, requires_grad=True)
    with torch.no_grad():
        assert chosen._use_kernels(leaf, leaf, leaf)
        kernels = teacher_forced_logits(model, sequences, [20, 50], schedule)
        reference = teacher_forced_logits(model, sequences, [20, 50], schedule, backend="reference")
    assert chosen._use_kernels(leaf, leaf, leaf)  # gradients recorded too: their backward
    assert not TeacherForcedAttention([400, 170], [20, 50], schedule, backend="flex")._use_kernels(
        leaf, leaf, leaf
    )
    for got, want in zip(kernels, reference):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=0)
