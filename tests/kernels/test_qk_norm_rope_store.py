"""qk_norm_rope with a KVStore (norm + RoPE + KV cache write + centroid in one launch) against
qk_norm_rope then write_kv: bit for bit on q, k, both caches and the centroids, kernels in
Triton's interpreter on CPU (`interpreted`), references off it; a GPU twin is marked gpu."""

import pytest
import torch

from sparrow.kernels import qk_norm_rope as qk_norm_rope_module
from sparrow.kernels.kv_write import KVStore, write_kv, write_kv_reference
from sparrow.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_reference
from sparrow.kernels.runtime import KernelInputError
from sparrow.model.layers import Rotary

PAGE_SIZE = 4
# row 0 fills page 1, row 2 fills page 5, row 1 is a padded batch row; one token a page
SLOTS = [7, -1, 23, 10, 1]


def make_inputs(
    seed,
    hq,
    hkv,
    dim,
    dtype,
    cache_dtype,
    centroid_dtype,
    norm,
    device="cpu",
    pages=8,
    page_size=PAGE_SIZE,
    slots=SLOTS,
):
    """q, k, v as the model hands them (strided views of one qkv row), cos, sin, weights and
    a store over caches full of earlier keys."""
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = len(slots)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    qkv = randn(tokens, (hq + 2 * hkv) * dim).to(dtype)
    q, k, v = qkv.split((hq * dim, hkv * dim, hkv * dim), dim=-1)
    q, k, v = (t.view(tokens, heads, dim) for t, heads in zip((q, k, v), (hq, hkv, hkv)))
    weights = (
        ((1 + randn(dim) / 4).to(dtype), (1 + randn(dim) / 4).to(dtype)) if norm else (None, None)
    )
    positions = torch.randint(0, 5000, (tokens,), generator=gen, device=device)
    cos, sin = Rotary(dim, 1e6, None).cos_sin(positions, dtype)
    store = KVStore(
        randn(pages, hkv, page_size, dim).to(cache_dtype),
        randn(pages, hkv, page_size, dim).to(cache_dtype),
        randn(pages, hkv, dim).to(centroid_dtype),
        torch.tensor(slots, dtype=torch.long, device=device),
    )
    return (q, k, cos, sin, *weights, 1e-6), v, store


def cloned(store):
    return KVStore(*(t.clone() for t in store.tensors))


def bits(t):
    """float8 tensors as their bytes (torch.equal has no float8 CPU kernel)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def assert_same(fused, unfused, fused_store, unfused_store):
    for got, want in zip((*fused, *fused_store.tensors), (*unfused, *unfused_store.tensors)):
        assert got.dtype == want.dtype and torch.equal(bits(got), bits(want))


CASES = [
    (torch.float32, torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16, torch.float32),
    (torch.float32, torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.float8_e4m3fn),
    (torch.float32, torch.float32, torch.float8_e4m3fn),
]


@pytest.mark.parametrize("dtype,cache_dtype,centroid_dtype", CASES)
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "rope_only"])
@pytest.mark.parametrize("hq,hkv,dim", [(6, 2, 16), (3, 1, 24)])
def test_store_equals_rope_then_write_kv(
    interpreted, monkeypatch, dtype, cache_dtype, centroid_dtype, norm, hq, hkv, dim
):
    args, v, store = make_inputs(0, hq, hkv, dim, dtype, cache_dtype, centroid_dtype, norm)
    before = cloned(store)
    unfused_store = cloned(store)
    unfused = qk_norm_rope(*args)
    write_kv(*unfused_store.tensors, unfused[1], v)
    if interpreted:  # the store must happen in the kernel, not in the fallback's write_kv
        monkeypatch.setattr(qk_norm_rope_module, "write_kv", None)
    fused = qk_norm_rope(*args, v=v, store=store)
    assert_same(fused, unfused, store, unfused_store)
    # the comparison means something: pages 1 and 5 were filled, the padded row wrote nothing
    got, old = bits(store.centroids), bits(before.centroids)
    assert not torch.equal(got[1], old[1]) and not torch.equal(got[5], old[5])
    assert torch.equal(got[2], old[2])
    # row 3's rotated k at slot 10 (the interpreter truncates to bf16 where torch rounds)
    torch.testing.assert_close(
        store.k_cache[2, :, 2].float(), fused[1][3].float(), rtol=2**-7, atol=1e-6
    )
    untouched = [p for p in range(8) if p not in (0, 1, 2, 5)]
    assert torch.equal(store.k_cache[untouched], before.k_cache[untouched])


@pytest.mark.parametrize("centroid_dtype", [torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "rope_only"])
def test_reference_path_equals_the_unfused_references(norm, centroid_dtype):
    # CPU tensors outside the interpreter block: both launchers run their references
    args, v, store = make_inputs(1, 4, 2, 16, torch.bfloat16, torch.bfloat16, centroid_dtype, norm)
    unfused_store = cloned(store)
    unfused = qk_norm_rope_reference(*args)
    write_kv_reference(*unfused_store.tensors, unfused[1], v)
    fused = qk_norm_rope(*args, v=v, store=store)
    assert_same(fused, unfused, store, unfused_store)


def test_autograd_keeps_the_reference_and_still_stores(interpreted):
    args, v, store = make_inputs(
        2, 4, 2, 16, torch.float32, torch.float32, torch.float32, norm=True
    )
    q_weight = args[4].clone().requires_grad_(True)
    args = (*args[:4], q_weight, *args[5:])
    unfused_store = cloned(store)
    unfused = qk_norm_rope(*args)
    write_kv(*unfused_store.tensors, unfused[1].detach(), v)
    fused = qk_norm_rope(*args, v=v, store=store)
    assert fused[0].requires_grad
    fused[0].sum().backward()
    assert q_weight.grad is not None
    assert_same([t.detach() for t in fused], [t.detach() for t in unfused], store, unfused_store)


def test_no_tokens_store_nothing(interpreted):
    args, v, store = make_inputs(
        3, 4, 2, 16, torch.float32, torch.float32, torch.float32, norm=True, slots=[]
    )
    before = cloned(store)
    q, k = qk_norm_rope(*args, v=v, store=store)
    assert q.shape == (0, 4, 16) and k.shape == (0, 2, 16)
    assert_same((), (), store, before)


def test_store_checks_name_the_bad_input():
    args, v, store = make_inputs(
        4, 4, 2, 16, torch.float32, torch.float32, torch.float32, norm=False
    )
    bad = {
        "centroids must be float32": KVStore(
            store.k_cache, store.v_cache, store.centroids.half(), store.slots
        ),
        "k_cache and v_cache must share a shape": KVStore(
            store.k_cache, store.v_cache[:, :1], store.centroids, store.slots
        ),
        r"slots must be \[5\]": KVStore(*store.tensors[:3], store.slots[:3]),
        "slots must hold integers": KVStore(*store.tensors[:3], store.slots.float()),
        r"k and v must be \[T, 1, 16\]": KVStore(
            store.k_cache[:, :1], store.v_cache[:, :1], store.centroids[:, :1], store.slots
        ),
    }
    for message, target in bad.items():
        with pytest.raises(KernelInputError, match=message):
            qk_norm_rope(*args, v=v, store=target)
    with pytest.raises(KernelInputError, match=r"k and v must be \[T, 2, 16\]"):
        qk_norm_rope(*args, v=v[:, :1], store=store)
    with pytest.raises(KernelInputError, match="give v and store"):
        qk_norm_rope(*args, v=v)
    with pytest.raises(KernelInputError, match="give v and store"):
        qk_norm_rope(*args, store=store)
    with pytest.raises(KernelInputError, match="store must be a KVStore"):
        qk_norm_rope(*args, v=v, store=store.tensors)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,cache_dtype,centroid_dtype", CASES)
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "rope_only"])
def test_cuda_store_equals_rope_then_write_kv(dtype, cache_dtype, centroid_dtype, norm):
    """Qwen3-1.7B heads, 16-token pages, 64 tokens on distinct pages: the compiled fused kernel
    equals the compiled pair bit for bit, and the references to their own tolerance."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    pages, page_size, tokens = 300, 16, 64
    pages_hit = torch.randperm(pages, generator=gen, device="cuda")[:tokens]
    offsets = torch.randint(0, page_size - 1, (tokens,), generator=gen, device="cuda")
    offsets[:8] = page_size - 1  # these fill their pages
    slots = pages_hit * page_size + offsets
    slots[8:16] = -1
    args, v, store = make_inputs(
        6,
        16,
        8,
        128,
        dtype,
        cache_dtype,
        centroid_dtype,
        norm,
        device="cuda",
        pages=pages,
        page_size=page_size,
        slots=slots.tolist(),
    )
    unfused_store, reference_store = cloned(store), cloned(store)
    unfused = qk_norm_rope(*args)
    write_kv(*unfused_store.tensors, unfused[1], v)
    fused = qk_norm_rope(*args, v=v, store=store)
    assert_same(fused, unfused, store, unfused_store)
    reference = qk_norm_rope_reference(*args)
    write_kv_reference(*reference_store.tensors, reference[1], v)
    tol = 1e-5 if dtype == torch.float32 else 2**-6
    for got, want in zip((*fused, *store.tensors[:3]), (*reference, *reference_store.tensors)):
        if want.dtype == torch.float8_e4m3fn:  # a mean that moved a little: one float8 step
            step = want.float().abs().clamp(min=2**-6) * 2**-3
            assert bool(((got.float() - want.float()).abs() <= step).all())
            continue
        scale = float(want.float().abs().max())
        assert float((got.float() - want.float()).abs().max()) <= tol * scale
