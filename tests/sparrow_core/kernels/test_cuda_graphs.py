"""The GPU decode path of engine/cuda_graphs.py: buckets, and whole generations through the
kernels equal to the reference engine (CPU via the interpreter; CUDA graphs marked gpu)."""

import pytest
import torch

from sparrow_core.engine import Engine, EngineConfig, SamplingParams
from sparrow_core.engine.cuda_graphs import (DecodeGraphs, batch_bucket, sparsity_key,
                                             width_bucket)
from sparrow_core.model import load_model
from sparrow_core.sparse.schedule import Schedule

SCHEDULE = Schedule(name="test", topk_pages=(1, 2), page_size=4, bin_tokens=16,
                    reserved_bos=1, reserved_eos=1, skip_layers=(0,))
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [40, 41, 42]]


def test_buckets():
    assert [batch_bucket(b) for b in (1, 3, 8, 9, 17, 64, 65, 100)] == [
        1, 4, 8, 16, 24, 64, 96, 128]
    assert [width_bucket(w) for w in (1, 64, 65, 2049)] == [64, 64, 128, 4096]
    assert sparsity_key(None, 3) is None
    assert sparsity_key(SCHEDULE, 3) == (4, 1, 1, (False, True, True))
    dense_only = Schedule(name="d", topk_pages=(1,), skip_layers=(0, 1))
    assert sparsity_key(dense_only, 2) is None


def generate(model, device, kernels, use_graphs=True, max_new_tokens=4):
    config = EngineConfig(num_pages=48, page_size=4, max_batch_size=4)
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
            assert a.budget_pages == b.budget_pages
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < atol


def test_kernel_decode_equals_the_reference_engine(interpreted, qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    want = generate(model, "cpu", kernels=False)
    got = generate(model, "cpu", kernels=True, use_graphs=False)
    assert_same(got, want, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("use_graphs", [True, False])
def test_cuda_decode_equals_the_reference_engine(qwen3_checkpoint, use_graphs):
    model = load_model(qwen3_checkpoint, device="cuda", dtype=torch.float32)
    want = generate(model, "cuda", kernels=False, max_new_tokens=40)
    got = generate(model, "cuda", kernels=True, use_graphs=use_graphs, max_new_tokens=40)
    assert_same(got, want, atol=1e-3)
