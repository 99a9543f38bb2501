"""The page-bounds kernel (quest rules) against its torch reference and a plain loop: the same
bits for the pages a step fills, nothing else written."""

import pytest
import torch

from sparrow.kernels.page_bounds import update_page_bounds, update_page_bounds_reference
from sparrow.kernels.runtime import KernelInputError


def cache(pages, hkv, page_size, dim, dtype, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(pages, hkv, page_size, dim, generator=gen, device=device).to(dtype)
    bounds = torch.randn(pages, 2, hkv, dim, generator=gen, device=device).to(dtype)
    return k, bounds


def plain_loop(k, bounds, slots):
    """Each slot at a page's last offset: that page's min and max key per channel."""
    want = bounds.clone()
    page_size = k.shape[2]
    for slot in slots.tolist():
        if slot >= 0 and slot % page_size == page_size - 1:
            page = slot // page_size
            want[page, 0] = k[page].amin(dim=1)
            want[page, 1] = k[page].amax(dim=1)
    return want


# rows: fills page 1, mid-page, padding, fills page 5, fills page 0, mid-page of page 3
SLOTS = [7, 9, -1, 23, 3, 13]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_reference_sets_the_filled_pages_only(dtype):
    k, bounds = cache(6, 2, 4, 24, dtype)
    slots = torch.tensor(SLOTS)
    want = plain_loop(k, bounds, slots)
    update_page_bounds_reference(k, bounds, slots)
    assert torch.equal(bounds, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [24, 32])
def test_the_kernel_gives_the_reference_bits(interpreted, dtype, dim):
    """In Triton's interpreter where triton is installed; without it update_page_bounds
    takes the reference, whose launcher checks and dispatch this still holds."""
    k, bounds = cache(6, 2, 4, dim, dtype)
    slots = torch.tensor(SLOTS)
    want = plain_loop(k, bounds, slots)
    update_page_bounds(k, bounds, slots)
    assert torch.equal(bounds, want)


def test_a_step_that_fills_no_page_writes_nothing(interpreted):
    k, bounds = cache(6, 2, 4, 16, torch.float32)
    before = bounds.clone()
    update_page_bounds(k, bounds, torch.tensor([0, 5, -1, 10]))
    assert torch.equal(bounds, before)


def test_bad_inputs_are_refused_by_name():
    k, bounds = cache(6, 2, 4, 16, torch.float32)
    with pytest.raises(KernelInputError, match="bounds must be"):
        update_page_bounds(k, bounds.to(torch.bfloat16), torch.tensor([3]))
    with pytest.raises(KernelInputError, match="bounds must be"):
        update_page_bounds(k, bounds[:, :1], torch.tensor([3]))
    with pytest.raises(KernelInputError, match="slots"):
        update_page_bounds(k, bounds, torch.tensor([3.0]))


@pytest.mark.gpu
def test_the_kernel_gives_the_reference_bits_on_gpu_at_the_qwen3_shape():
    """Qwen3-1.7B's KV heads (8 x 128), pages of 16, B=16 with padding and mid-page rows."""
    k, bounds = cache(64, 8, 16, 128, torch.bfloat16, device="cuda", seed=3)
    slots = torch.tensor(
        [15, 31, 47, -1, 500, 63, 79, 95, 100, -1, 143, 159, 170, 191, 207, 1023], device="cuda"
    )
    want = bounds.clone()
    update_page_bounds_reference(k, want, slots)
    update_page_bounds(k, bounds, slots)
    assert torch.equal(bounds, want)
    assert torch.equal(bounds.cpu(), plain_loop(k.cpu(), bounds.cpu(), slots.cpu()))


@pytest.mark.gpu
def test_the_kernel_replays_in_a_cuda_graph_with_new_slots():
    """As the decode graphs use it: captured once, replayed after the slots change in place."""
    k, bounds = cache(64, 8, 16, 128, torch.bfloat16, device="cuda", seed=4)
    slots = torch.full((16,), -1, dtype=torch.int64, device="cuda")
    update_page_bounds(k, bounds, slots)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        update_page_bounds(k, bounds, slots)
    for step in range(3):
        new = torch.arange(16, device="cuda") * 16 + 15 - (torch.arange(16, device="cuda") % 3)
        slots.copy_(torch.where(torch.arange(16, device="cuda") % 4 == step, -1, new + 256 * step))
        want = bounds.clone()
        update_page_bounds_reference(k, want, slots)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bounds, want), step
