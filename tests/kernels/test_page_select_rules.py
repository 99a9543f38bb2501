"""The scoring kernel under each decoding rule (centroid_maxhead, quest, quest_maxhead) and
dense heads: the launcher against a plain loop (in Triton's interpreter when triton is
installed, else its fallback), decode through the kernels equal to the reference engine, and
GPU twins at model shapes (marked gpu)."""

import dataclasses

import numpy as np
import pytest
import torch

from sparrow.engine import Engine, EngineConfig, SamplingParams
from sparrow.engine.cuda_graphs import DecodeGraphs, sparsity_key
from sparrow.kernels.page_scores import page_scores, page_scores_reference
from sparrow.kernels.page_topk import page_topk, page_topk_reference, select_page_lists
from sparrow.kernels.runtime import KernelInputError
from sparrow.model import load_model
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import page_bounds

RULES = ("centroid_maxhead", "quest", "quest_maxhead")
SCHEDULE = Schedule(
    "test", (1, 2), page_size=4, bin_tokens=16, reserved_bos=1, reserved_eos=1, skip_layers=(0,)
)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [40, 41, 42]]


def loop_scores(rule, q, keys, tables, n_pages):
    """Plain loop in float64 over rows, KV heads and listed pages; keys [P, Hkv, page, D]."""
    batch, heads, _ = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    out = np.full((batch, kv_heads, tables.shape[1]), -np.inf)
    for b in range(batch):
        for h in range(kv_heads):
            queries = q[b, h * group : (h + 1) * group]
            for i in range(n_pages[b]):
                page = keys[tables[b, i], h]
                if rule.startswith("quest"):
                    low, high = page.min(axis=0), page.max(axis=0)

                    def score(x, low=low, high=high):
                        return float(np.maximum(x * low, x * high).sum())

                else:

                    def score(x, page=page):
                        return float(page.mean(axis=0) @ x)

                if rule.endswith("maxhead"):
                    out[b, h, i] = max(score(x) for x in queries)
                else:
                    out[b, h, i] = score(queries.mean(axis=0))
    return out


def summary_of(rule, keys):
    """What the cache keeps for `rule`: centroids [P, Hkv, D] or bounds [P, 2, Hkv, D]."""
    if rule.startswith("quest"):
        return page_bounds(keys.transpose(1, 2))
    return keys.float().mean(dim=2).to(keys.dtype)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rule_scores_equal_a_plain_loop(interpreted, rule, dtype):
    gen = torch.Generator().manual_seed(0)
    pages, hkv, hq, dim, page_size, width = 30, 2, 6, 24, 4, 9
    keys = torch.randn(pages, hkv, page_size, dim, generator=gen).to(dtype)
    q = torch.randn(3, hq, dim, generator=gen).to(dtype)
    tables = torch.randint(0, pages, (3, width), generator=gen, dtype=torch.int32)
    num_tokens = torch.tensor([width * page_size, 13, 0], dtype=torch.int32)
    scores = page_scores(q, summary_of(rule, keys), tables, num_tokens, page_size, selection=rule)
    n_pages = [-(-int(n) // page_size) for n in num_tokens]
    keys64 = keys.double().numpy()
    if not rule.startswith("quest"):  # the stored centroid, as the cache rounds it
        keys64 = np.repeat(summary_of(rule, keys).double().numpy()[:, :, None], page_size, 2)
    want = loop_scores(rule, q.double().numpy(), keys64, tables.numpy(), n_pages)
    np.testing.assert_allclose(scores.numpy(), want, rtol=1e-5, atol=1e-4)


def test_a_bounds_rule_refuses_centroids_and_the_oracle_is_refused():
    q = torch.zeros(1, 2, 8)
    tables = torch.zeros(1, 2, dtype=torch.int32)
    tokens = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(KernelInputError, match="key bounds"):
        page_scores(q, torch.zeros(3, 1, 8), tables, tokens, 4, selection="quest")
    with pytest.raises(KernelInputError, match="oracle"):
        page_scores(q, torch.zeros(3, 1, 8), tables, tokens, 4, selection="oracle")


def generate(model, device, kernels, schedule, use_graphs=False, max_new_tokens=6):
    config = EngineConfig(num_pages=48, page_size=4, max_batch_size=4)
    engine = Engine(model, None, config, schedule)
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


CASES = [(rule, ()) for rule in RULES] + [("centroid", ((1, 0),)), ("quest", ((2, 1),))]


@pytest.mark.parametrize("selection,dense_heads", CASES)
def test_kernel_decode_equals_the_reference_engine(
    interpreted, qwen3_checkpoint, selection, dense_heads
):
    schedule = dataclasses.replace(SCHEDULE, selection=selection, dense_heads=dense_heads)
    assert sparsity_key(schedule, 3)[4:] == (selection, dense_heads)
    model = load_model(qwen3_checkpoint)
    want = generate(model, "cpu", kernels=False, schedule=schedule)
    got = generate(model, "cpu", kernels=True, schedule=schedule)
    assert_same(got, want, atol=1e-4)


# GPU twins at the 1.7B heads (python3 -m pytest -m gpu tests/kernels -q)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rule_pipeline_on_gpu(rule, dtype):
    gen = torch.Generator(device="cuda").manual_seed(1)
    batch, hq, hkv, dim, page = 8, 16, 8, 128, 16
    lengths = torch.randint(1, 4000, (batch,), generator=gen, device="cuda").int()
    lengths[3] = 0
    width = -(-int(lengths.max()) // page)
    pages = batch * width + 7
    keys = torch.randn(pages, hkv, page, dim, generator=gen, device="cuda").to(dtype)
    q = torch.randn(batch, hq, dim, generator=gen, device="cuda").to(dtype)
    tables = torch.randperm(pages, generator=gen, device="cuda")[: batch * width]
    tables = tables.view(batch, width).int()
    summary = summary_of(rule, keys)
    topk = torch.randint(0, 60, (batch,), generator=gen, device="cuda", dtype=torch.int32)
    scores = page_scores(q, summary, tables, lengths, page, selection=rule)
    want = page_scores_reference(q, summary, tables, lengths, page, rule)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(scores))
    torch.testing.assert_close(scores[finite], want[finite], atol=1e-3, rtol=1e-5)
    lists, counts, mask = page_topk(scores, lengths, topk, page, 1, 2, want_mask=True)
    _, want_counts, want_mask = page_topk_reference(scores, lengths, topk, page, 1, 2)
    assert torch.equal(mask, want_mask) and torch.equal(counts, want_counts)
    selected = select_page_lists(q, summary, tables, lengths, topk, page, 1, 2, selection=rule)
    assert torch.equal(selected[1], counts)


@pytest.mark.gpu
@pytest.mark.parametrize("selection,dense_heads", CASES)
@pytest.mark.parametrize("use_graphs", [True, False])
def test_cuda_decode_equals_the_reference_engine(
    qwen3_checkpoint, selection, dense_heads, use_graphs
):
    schedule = dataclasses.replace(SCHEDULE, selection=selection, dense_heads=dense_heads)
    model = load_model(qwen3_checkpoint, device="cuda", dtype=torch.float32)
    want = generate(model, "cuda", False, schedule, max_new_tokens=40)
    got = generate(model, "cuda", True, schedule, use_graphs=use_graphs, max_new_tokens=40)
    assert_same(got, want, atol=1e-3)
