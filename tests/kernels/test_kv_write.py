"""The fused KV write + centroid kernel against a plain loop and the cache's own update."""

import pytest
import torch

from sparrow.kernels.kv_write import write_kv
from sparrow.kernels.runtime import KernelInputError


@pytest.mark.parametrize(
    "dtype,centroid_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_write_and_centroid_equal_a_plain_loop(interpreted, dtype, centroid_dtype):
    gen = torch.Generator().manual_seed(0)
    pages, page_size, hkv, dim = 6, 4, 2, 24
    k_cache = torch.randn(pages, hkv, page_size, dim, generator=gen).to(dtype)  # head-major
    v_cache = torch.randn(pages, hkv, page_size, dim, generator=gen).to(dtype)
    centroids = torch.randn(pages, hkv, dim, generator=gen).to(centroid_dtype)
    slots = torch.tensor([7, -1, 12, 23, 2])  # fills pages 1 and 5; row 1 is padding
    k = torch.randn(5, hkv, dim, generator=gen)
    v = torch.randn(5, hkv, dim, generator=gen)
    want_k, want_v, want_c = k_cache.clone(), v_cache.clone(), centroids.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        want_k[slot // page_size, :, slot % page_size] = k[t].to(dtype)
        want_v[slot // page_size, :, slot % page_size] = v[t].to(dtype)
    for page in (1, 5):
        for h in range(hkv):
            rows = [want_k[page, h, i].double() for i in range(page_size)]
            # float64 mean, rounded once to the centroids' dtype
            want_c[page, h] = (sum(rows) / page_size).to(centroid_dtype)
    write_kv(k_cache, v_cache, centroids, slots, k.to(dtype), v.to(dtype))
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    if centroid_dtype == torch.float32:
        torch.testing.assert_close(centroids, want_c, atol=1e-6, rtol=1e-6)
    else:  # one bf16 step at most: Triton's CPU interpreter truncates where GPUs round
        step = want_c.float().abs().clamp(min=2**-100) * 2**-7
        assert torch.all((centroids.float() - want_c.float()).abs() <= step)
    assert not torch.equal(centroids[1], torch.zeros_like(centroids[1]))


def test_prefill_write_leaves_centroids(interpreted):
    gen = torch.Generator().manual_seed(1)
    k_cache = torch.zeros(3, 1, 4, 16)
    v_cache = torch.zeros(3, 1, 4, 16)
    centroids = torch.full((3, 1, 16), 7.0)
    k, v = torch.randn(4, 1, 16, generator=gen), torch.randn(4, 1, 16, generator=gen)
    write_kv(k_cache, v_cache, centroids, torch.tensor([4, 5, 6, 7]), k, v, update_centroids=False)
    assert torch.equal(k_cache[1, 0], k[:, 0]) and torch.equal(v_cache[1, 0], v[:, 0])
    assert torch.all(centroids == 7.0)


def test_write_checks_its_inputs():
    cache = torch.zeros(3, 2, 4, 16)  # 3 pages, 2 KV heads, 4 tokens a page
    with pytest.raises(KernelInputError, match="centroids must be float32"):
        write_kv(
            cache,
            cache.clone(),
            torch.zeros(3, 2, 16, dtype=torch.float16),
            torch.tensor([0]),
            torch.zeros(1, 2, 16),
            torch.zeros(1, 2, 16),
        )
    with pytest.raises(KernelInputError, match="slots must be"):
        write_kv(
            cache,
            cache.clone(),
            torch.zeros(3, 2, 16),
            torch.tensor([0, 1]),
            torch.zeros(1, 2, 16),
            torch.zeros(1, 2, 16),
        )
