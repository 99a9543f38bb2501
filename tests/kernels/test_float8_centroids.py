"""Float8 (e4m3fn) page centroids: the rounding rule against an independent nearest-value
search, and the fused KV write (kernel, in Triton's interpreter on CPU; compiled, marked gpu)
and KVCache.update_centroids against it bit for bit.

Means are made exact in float32 (every key of a page holds the same value, or small
multiples of a power of two), so any summation order gives the same mean and the only
rounding left is the one to float8, which must be: nearest, ties to the even code, subnormals
kept, saturating at +-448, straight from float32 (no bf16 step in between)."""

import math
from types import SimpleNamespace

import pytest
import torch

from sparrow.engine.kv_cache import KVCache
from sparrow.kernels.kv_write import KVStore, round_centroids, write_kv
from sparrow.kernels.qk_norm_rope import qk_norm_rope

F8 = torch.float8_e4m3fn


def e4m3fn_value(code: int) -> float:
    """The value of a float8_e4m3fn bit pattern (finite codes), from the format's definition."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


FINITE = [(code, e4m3fn_value(code)) for code in range(256) if code & 0x7F != 0x7F]


def nearest_code(x: float) -> int:
    """The float8 code nearest x (of two equally near, the even one), 448 past the range;
    the sign kept, zero's included."""
    magnitude = min(abs(x), 448.0)
    code = min(range(0x7F), key=lambda c: (abs(e4m3fn_value(c) - magnitude), c & 1))
    return code | (0x80 if math.copysign(1.0, x) < 0 else 0)


def targets() -> torch.Tensor:
    """float32 values at every kind of boundary: exact codes, midpoints (ties), just either
    side of a midpoint, subnormals, past 448, and a bf16 trap (1.0625 + 2^-10 rounds to
    1.125 directly but to 1.0 through bf16, which first rounds it onto the tie 1.0625)."""
    values = sorted({v for _, v in FINITE})
    mids = [(a + b) / 2 for a, b in zip(values, values[1:])]
    mids32 = torch.tensor(mids, dtype=torch.float32)
    near = torch.cat(
        [torch.nextafter(mids32, torch.tensor(1e9)), torch.nextafter(mids32, torch.tensor(-1e9))]
    )
    extra = torch.tensor(
        [
            449.0,
            463.9,
            464.0,
            465.0,
            1e4,
            -1e4,
            2.0**-10,
            3 * 2.0**-11,
            2.0**-12,
            1.0625 + 2.0**-10,
            -(1.0625 + 2.0**-10),
            0.7265625,
        ]
    )
    return torch.cat([torch.tensor(values), mids32, near, extra]).float()


def test_round_centroids_is_the_nearest_float8_value():
    x = targets()
    got = round_centroids(x, F8).view(torch.uint8).tolist()
    want = [nearest_code(float(v)) for v in x]
    assert got == want
    trap = torch.tensor([1.0625 + 2.0**-10])
    assert float(round_centroids(trap, F8).float()) == 1.125
    assert float(trap.bfloat16().to(F8).float()) == 1.0  # what a bf16 step would give
    # other dtypes: a plain cast (no clamp at 448)
    assert float(round_centroids(torch.tensor([1000.0]), torch.bfloat16)) == 1000.0


def page_of_values(values: torch.Tensor, page_size: int, kv_heads: int, dim: int):
    """[pages, Hkv, page_size, D] keys whose every page row holds the same value per (head,
    dim): the page means are exactly `values` (padded with zeros) in float32."""
    per_page = kv_heads * dim
    pages = -(-values.numel() // per_page)
    flat = torch.zeros(pages * per_page)
    flat[: values.numel()] = values
    return flat.view(pages, kv_heads, 1, dim).expand(pages, kv_heads, page_size, dim).clone()


def test_fused_write_rounds_means_to_the_nearest_float8(interpreted):
    page_size, kv_heads, dim = 4, 2, 32
    x = targets()
    keys = page_of_values(x, page_size, kv_heads, dim)
    pages = keys.shape[0]
    k_cache, v_cache = keys.clone(), torch.zeros_like(keys)
    centroids = torch.zeros(pages, kv_heads, dim, dtype=F8)
    # each page's last token is written now (the same values): the write fills every page
    slots = torch.arange(pages) * page_size + page_size - 1
    write_kv(k_cache, v_cache, centroids, slots, keys[:, :, -1], keys[:, :, -1])
    got = centroids.view(torch.uint8).flatten()[: x.numel()].tolist()
    assert got == [nearest_code(float(v)) for v in x]


def test_cache_update_equals_the_fused_write(interpreted):
    """KVCache.update_centroids (the reference path) and the kernel store the same bits, for
    random bf16 keys whose float32 sums are exact in any order."""
    gen = torch.Generator().manual_seed(2)
    page_size, kv_heads, dim, pages = 16, 2, 32, 6
    keys = (
        torch.randint(-2000, 2000, (pages, kv_heads, page_size, dim), generator=gen) * 2.0**-8
    ).bfloat16()
    arch = SimpleNamespace(num_layers=1, num_kv_heads=kv_heads, head_dim=dim)
    cache = KVCache.allocate(arch, pages, page_size, torch.bfloat16, "cpu", F8)
    assert cache.centroids.dtype == F8 and cache.k.dtype == torch.bfloat16
    cache.k[0] = keys
    cache.update_centroids(0, torch.arange(pages))
    k_cache, centroids = keys.clone(), torch.zeros(pages, kv_heads, dim, dtype=F8)
    slots = torch.arange(pages) * page_size + page_size - 1
    write_kv(k_cache, torch.zeros_like(keys), centroids, slots, keys[:, :, -1], keys[:, :, -1])
    want = torch.tensor([nearest_code(float(v)) for v in keys.double().mean(2).flatten()])
    assert torch.equal(cache.centroids[0].view(torch.uint8).flatten(), want.to(torch.uint8))
    assert torch.equal(centroids.view(torch.uint8), cache.centroids[0].view(torch.uint8))
    assert len(set(want.tolist())) > 40  # many codes, not a few saturated ones


@pytest.mark.gpu
def test_cuda_fused_writes_round_means_to_the_nearest_float8():
    """The compiled write_kv and qk_norm_rope store (Hopper) against the same values."""
    page_size, kv_heads, dim = 16, 8, 128
    x = targets().cuda()
    keys = page_of_values(x.cpu(), page_size, kv_heads, dim).cuda()
    pages = keys.shape[0]
    want = [nearest_code(float(v)) for v in x.cpu()]
    slots = torch.arange(pages, device="cuda") * page_size + page_size - 1
    centroids = torch.zeros(pages, kv_heads, dim, dtype=F8, device="cuda")
    write_kv(keys.clone(), torch.zeros_like(keys), centroids, slots, keys[:, :, -1], keys[:, :, -1])
    assert centroids.view(torch.uint8).flatten()[: x.numel()].tolist() == want
    # qk_norm_rope with a store: RoPE at position 0 (cos 1, sin 0) leaves k as it is
    k = keys[:, :, -1].contiguous()
    q = torch.zeros(pages, 2 * kv_heads, dim, device="cuda")
    cos = torch.ones(pages, 1, dim, device="cuda")
    sin = torch.zeros(pages, 1, dim, device="cuda")
    stored = torch.zeros(pages, kv_heads, dim, dtype=F8, device="cuda")
    store = KVStore(keys.clone(), torch.zeros_like(keys), stored, slots)
    qk_norm_rope(q, k, cos, sin, None, None, 1e-6, v=k, store=store)
    assert stored.view(torch.uint8).flatten()[: x.numel()].tolist() == want
    # torch's own CUDA cast agrees once clamped (round_centroids)
    assert round_centroids(x, F8).view(torch.uint8).tolist() == want
