"""The GPU decode path of engine/cuda_graphs.py: buckets, whole generations through the
kernels equal to the reference engine (CPU via the interpreter; CUDA graphs marked gpu), and
the KV write inside qk_norm_rope: one decode step writes the cache as the separate write_kv
did, each layer exactly once."""

import numpy as np
import pytest
import torch

from sparrow.engine import Engine, EngineConfig, SamplingParams, cuda_graphs
from sparrow.engine.cuda_graphs import (
    DecodeGraphs,
    KernelDecodeAttention,
    batch_bucket,
    sparsity_key,
    width_bucket,
)
from sparrow.engine.kv_cache import KVCache
from sparrow.model import layers, load_model
from sparrow.sparse.schedule import Schedule

SCHEDULE = Schedule(
    name="test",
    topk_pages=(1, 2),
    page_size=4,
    bin_tokens=16,
    reserved_bos=1,
    reserved_eos=1,
    skip_layers=(0,),
)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [40, 41, 42]]


def test_buckets():
    assert [batch_bucket(b) for b in (1, 3, 8, 9, 17, 64, 65, 100)] == [
        1,
        4,
        8,
        16,
        24,
        64,
        96,
        128,
    ]
    assert [width_bucket(w) for w in (1, 64, 65, 2049)] == [64, 64, 128, 4096]
    assert sparsity_key(None, 3) is None
    assert sparsity_key(SCHEDULE, 3) == (4, 1, 1, (False, True, True))
    dense_only = Schedule(name="d", topk_pages=(1,), skip_layers=(0, 1))
    assert sparsity_key(dense_only, 2) is None


def generate(model, device, kernels, use_graphs=True, max_new_tokens=4, centroid_dtype="cache"):
    config = EngineConfig(
        num_pages=48, page_size=4, max_batch_size=4, centroid_dtype=centroid_dtype
    )
    engine = Engine(model, None, config, SCHEDULE)
    if kernels and engine.runner.graphs is None:
        engine.runner.graphs = DecodeGraphs(model, engine.cache, use_graphs=use_graphs)
    if not kernels:
        engine.runner.graphs = None
    params = SamplingParams(max_new_tokens=max_new_tokens, n=2, temperature=0.0, seed=0)
    return engine.generate(PROMPTS, params)


def assert_same(got, want, atol):
    for got_group, want_group in zip(got, want):
        for a, b in zip(got_group, want_group):
            assert a.output_ids == b.output_ids
            assert a.pages_read == b.pages_read
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < atol


@pytest.mark.parametrize("centroid_dtype", ["cache", "float8_e4m3fn"])
def test_kernel_decode_equals_the_reference_engine(interpreted, qwen3_checkpoint, centroid_dtype):
    model = load_model(qwen3_checkpoint)
    want = generate(model, "cpu", kernels=False, centroid_dtype=centroid_dtype)
    got = generate(model, "cpu", kernels=True, use_graphs=False, centroid_dtype=centroid_dtype)
    assert_same(got, want, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("centroid_dtype", ["cache", "float8_e4m3fn"])
@pytest.mark.parametrize("use_graphs", [True, False])
def test_cuda_decode_equals_the_reference_engine(qwen3_checkpoint, use_graphs, centroid_dtype):
    model = load_model(qwen3_checkpoint, device="cuda", dtype=torch.float32)
    want = generate(model, "cuda", kernels=False, max_new_tokens=40, centroid_dtype=centroid_dtype)
    got = generate(
        model,
        "cuda",
        kernels=True,
        use_graphs=use_graphs,
        max_new_tokens=40,
        centroid_dtype=centroid_dtype,
    )
    assert_same(got, want, atol=1e-3)


# decode inputs of three sequences (bucket 4: one padded row): the first and third fill
# pages 2 and 7 this step, so the centroids a sparse layer scores come from this write
TABLES = [[0, 1, 2], [3, 4, 5, 6], [7]]
POSITIONS = np.array([11, 13, 3])


def random_cache(model, dtype, centroid_dtype=None):
    cache = KVCache.allocate(
        model.arch,
        num_pages=12,
        page_size=4,
        dtype=dtype,
        device="cpu",
        centroid_dtype=centroid_dtype,
    )
    gen = torch.Generator().manual_seed(7)
    for t in (cache.k, cache.v, cache.centroids):  # earlier steps' keys and values
        t.copy_(torch.randn(t.shape, generator=gen))
    return cache


def counted_writes(monkeypatch, cache):
    """(path, layer) of every KV write: write_kv in the attention, or qk_norm_rope's store."""
    writes = []
    layer_of = {cache.k[i].data_ptr(): i for i in range(cache.num_layers)}
    write_kv, qk_norm_rope = cuda_graphs.write_kv, layers.qk_norm_rope

    def counting_write_kv(k_cache, *args, **kwargs):
        writes.append(("write_kv", layer_of[k_cache.data_ptr()]))
        return write_kv(k_cache, *args, **kwargs)

    def counting_qk_norm_rope(*args, store=None, **kwargs):
        if store is not None:
            writes.append(("qk_norm_rope", layer_of[store.k_cache.data_ptr()]))
        return qk_norm_rope(*args, store=store, **kwargs)

    monkeypatch.setattr(cuda_graphs, "write_kv", counting_write_kv)
    monkeypatch.setattr(layers, "qk_norm_rope", counting_qk_norm_rope)
    return writes


def decode_step(model, cache, fuse_kv_write):
    tables = np.zeros((3, 4), dtype=np.int32)
    for row, table in enumerate(TABLES):
        tables[row, : len(table)] = table
    slots = tables[np.arange(3), POSITIONS // 4] * 4 + POSITIONS % 4
    topk = np.array([SCHEDULE.topk_for_position(int(p)) for p in POSITIONS])
    graphs = DecodeGraphs(model, cache, use_graphs=False, fuse_kv_write=fuse_kv_write)
    return graphs.decode(np.array([5, 6, 7]), POSITIONS, slots, tables, topk, SCHEDULE)


def bits(t):
    """float8 tensors as their bytes (torch.equal has no float8 CPU kernel)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("checkpoint", ["qwen3_checkpoint", "llama_checkpoint"])
@pytest.mark.parametrize(
    "dtype,centroid_dtype",
    [(torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, torch.float8_e4m3fn)],
)
def test_decode_writes_each_layer_once_as_write_kv_did(
    interpreted, monkeypatch, request, checkpoint, dtype, centroid_dtype
):
    model = load_model(request.getfixturevalue(checkpoint), dtype=dtype)
    before = random_cache(model, dtype, centroid_dtype)
    results = {}
    for fuse in (False, True):
        cache = KVCache(*(t.clone() for t in (before.k, before.v, before.centroids)))
        with monkeypatch.context() as patched:
            writes = counted_writes(patched, cache)
            logits = decode_step(model, cache, fuse)
        results[fuse] = (logits, cache, writes)
    every_layer = range(model.arch.num_layers)
    assert results[False][2] == [("write_kv", i) for i in every_layer]
    assert results[True][2] == [("qk_norm_rope", i) for i in every_layer]
    (want, unfused, _), (got, fused, _) = results[False], results[True]
    assert torch.equal(got, want)
    for name in ("k", "v", "centroids"):
        assert torch.equal(bits(getattr(fused, name)), bits(getattr(unfused, name))), name
    # this step wrote slots 11 (page 2 filled), 25 and 31 (page 7 filled) of every layer
    got, old = bits(fused.centroids), bits(before.centroids)
    assert not torch.equal(got[:, 2], old[:, 2]) and not torch.equal(got[:, 7], old[:, 7])
    assert torch.equal(got[:, 6], old[:, 6])
    assert not torch.equal(fused.v[:, 6, :, 1], before.v[:, 6, :, 1])


def test_a_layer_store_is_handed_out_once_per_call(interpreted, monkeypatch, qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    cache = random_cache(model, torch.float32)
    writes = counted_writes(monkeypatch, cache)
    zeros, table = torch.zeros(1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)
    attention = KernelDecodeAttention(cache, torch.tensor([-1]), table, zeros, zeros, None)
    store = attention.kv_store(1)
    assert store.k_cache.data_ptr() == cache.k[1].data_ptr()
    assert store.centroids.data_ptr() == cache.centroids[1].data_ptr()
    with pytest.raises(RuntimeError, match="layer 1's KV store was already taken"):
        attention.kv_store(1)
    arch = model.arch
    q = torch.zeros(1, arch.num_q_heads, arch.head_dim)
    k = torch.zeros(1, arch.num_kv_heads, arch.head_dim)
    attention(1, q, k, k)  # stored by the taker: no write_kv
    assert writes == []
    attention(1, q, k, k)  # no store taken since the last call: write_kv
    assert writes == [("write_kv", 1)]
    assert attention.kv_store(1) is not None  # the call settled the earlier one
    unfused = KernelDecodeAttention(
        cache, torch.tensor([-1]), table, zeros, zeros, None, fuse_kv_write=False
    )
    assert unfused.kv_store(0) is None


def test_graphs_outlive_a_cache_only_at_its_addresses_and_shapes(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    cache = KVCache.allocate(
        model.arch, num_pages=12, page_size=4, dtype=torch.float32, device="cpu"
    )
    graphs = DecodeGraphs(model, cache, use_graphs=False)
    captured = {(8, 64, None): ("graph", "logits")}
    graphs.graphs.update(captured)
    graphs.pool = "pool"
    graphs.release_cache()
    assert graphs.cache is None and graphs.graphs == captured  # asleep: the graphs stay
    same = KVCache(cache.k, cache.v, cache.centroids)
    assert graphs.attach(same) and graphs.cache is same and graphs.graphs == captured
    assert graphs.kept_wakes == 1
    graphs.release_cache()
    fewer_pages = KVCache(cache.k[:, :6], cache.v[:, :6], cache.centroids[:, :6])
    assert fewer_pages.k.data_ptr() == cache.k.data_ptr()  # same address, other shape
    assert not graphs.attach(fewer_pages)
    assert graphs.graphs == {} and graphs.pool is None and graphs.cache is fewer_pages
    graphs.graphs.update(captured)
    graphs.release_cache()
    moved = KVCache.allocate(
        model.arch, num_pages=6, page_size=4, dtype=torch.float32, device="cpu"
    )  # while `cache` lives: other addresses
    assert not graphs.attach(moved) and graphs.graphs == {} and graphs.kept_wakes == 1


@pytest.mark.parametrize("keep_graphs", [True, False])
def test_engine_keeps_its_graphs_through_sleep_with_keep_graphs(
    interpreted, qwen3_checkpoint, keep_graphs
):
    model = load_model(qwen3_checkpoint)
    config = EngineConfig(num_pages=48, page_size=4, max_batch_size=4, keep_graphs=keep_graphs)
    engine = Engine(model, None, config, SCHEDULE)
    engine.runner.graphs = DecodeGraphs(model, engine.cache, use_graphs=False)
    params = SamplingParams(max_new_tokens=4, n=2, temperature=0.0, seed=0)
    want = engine.generate(PROMPTS, params)
    graphs = engine.graphs
    engine.sleep()
    assert engine.graphs is (graphs if keep_graphs else None)
    assert graphs.cache is None or not keep_graphs  # kept graphs hold no cache while asleep
    engine.wake()
    assert (engine.runner.graphs is graphs) == keep_graphs
    assert engine.graphs.cache is engine.cache if keep_graphs else engine.graphs is None
    assert_same(engine.generate(PROMPTS, params), want, atol=1e-4)  # False: reference path


@pytest.mark.gpu
def test_graphs_kept_through_sleep_replay_into_the_new_cache(qwen3_checkpoint):
    """Waking at the same addresses replays the graphs captured before the sleep; a cache
    that lands elsewhere (the old one still held) has them captured again; the same tokens
    either way."""
    model = load_model(qwen3_checkpoint, device="cuda", dtype=torch.float32)
    # tensors of several MiB, each in a segment of its own, as at real size
    config = EngineConfig(num_pages=8192, page_size=4, max_batch_size=4)
    engine = Engine(model, None, config, SCHEDULE)
    params = SamplingParams(max_new_tokens=40, n=2, temperature=0.0, seed=0)
    want = engine.generate(PROMPTS, params)
    graphs = engine.graphs
    captured, seconds = dict(graphs.graphs), graphs.capture_seconds
    assert captured and engine.cache.k.numel() * 4 > 4 * 2**20
    engine.sleep()
    # the freed range is not handed to other allocations made while the engine sleeps
    other = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    engine.wake()
    assert engine.graphs is graphs and graphs.graphs == captured
    del other
    assert_same(engine.generate(PROMPTS, params), want, atol=1e-5)
    assert graphs.capture_seconds == seconds  # replayed, nothing captured
    held = engine.cache
    engine.sleep()
    engine.wake()
    assert engine.cache.k.data_ptr() != held.k.data_ptr() and graphs.graphs == {}
    assert_same(engine.generate(PROMPTS, params), want, atol=1e-5)
    assert graphs.capture_seconds > seconds


@pytest.mark.gpu
def test_a_cache_sized_from_memory_keeps_its_size_through_small_swings(qwen3_checkpoint):
    """memory_utilization sizes the cache at each wake; a few MiB more in use leave its size
    (and so its shape) as it was, a few GiB shrink it."""
    model = load_model(qwen3_checkpoint, device="cuda", dtype=torch.float32)
    config = EngineConfig(memory_utilization=0.25, page_size=16, max_batch_size=4)
    engine = Engine(model, None, config)  # ~12 KiB pages: about 1.5M of them on an H100
    pages = engine.cache.num_pages
    engine.sleep()
    small = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    engine.wake()
    assert engine.cache.num_pages == pages
    engine.sleep()
    large = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    engine.wake()
    assert engine.cache.num_pages < pages
    del small, large
