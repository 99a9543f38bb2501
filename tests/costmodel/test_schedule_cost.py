"""Cost of a schedule: the per-bin closed forms against per-token loops and the published formulas."""

from __future__ import annotations

import dataclasses

import pytest

from sparrow.costmodel import (
    CostModelError,
    dense_cost,
    get_hardware,
    get_model,
    schedule_cost,
    segment_cost,
    sparse_cost,
)
from sparrow.sparse.presets import get_preset
from sparrow.sparse.schedule import Schedule

MODEL, HW = get_model("qwen3-1.7b"), get_hardware("h200")


def _symbols(prompt_len, gen_len, samples, model=MODEL, hardware=HW):
    return dict(
        params=model.parameters,
        samples=samples,
        prompt_len=prompt_len,
        gen_len=gen_len,
        kv_dim=model.kv_dim,
        gqa_ratio=model.gqa_ratio,
        intensity=hardware.intensity,
    )


def _loop(schedule, prompt_len, gen_len, samples, offset, variant="paper", model=MODEL):
    """Explicit per-token sum. Token i decodes with `generated = i + offset` tokens already
    in the context beyond the prompt: offset 0.5 is the midpoint rule (exact for the linear
    per-step cost), offset 1 counts the token's own KV (what an engine reads)."""
    P, D, r, S = model.parameters, model.kv_dim, model.gqa_ratio, schedule.page_size
    N, L_in = samples, prompt_len
    total_dense = total_sparse = 0.0
    for i in range(gen_len):
        t = i + offset
        budget = schedule.budget_tokens(L_in + i)
        params_traffic = 2 * P if variant == "appendix" else 0
        # dense: every sample attends to the shared prompt and its own t tokens
        dense_compute = N * 2 * P + 2 * r * D * N * (L_in + t)
        dense_memory = 2 * D * L_in + N * 2 * D * t + params_traffic
        dense = dense_compute + HW.intensity * dense_memory
        total_dense += dense
        if L_in + t <= budget:
            total_sparse += dense
            continue
        compute = N * (2 * P + 2 * r * D * budget) + 2 * N * L_in * D + r * N * D * t / S
        memory = 2 * N * D * budget + 2 * L_in * D + N * D * t / S + params_traffic
        total_sparse += compute + HW.intensity * memory
    return total_dense, total_sparse


@pytest.mark.parametrize("variant", ["paper", "appendix"])
def test_closed_forms_equal_midpoint_loop(variant):
    # qwen3-1.7b-0.86 over 9 bins, prompt 1500: bins 0 and 1 are partly dense
    s = get_preset("qwen3-1.7b-0.86")
    result = schedule_cost(
        s, model=MODEL, hardware=HW, prompt_len=1500, gen_len=16_000, samples=4, variant=variant
    )
    dense, sparse = _loop(s, 1500, 16_000, 4, offset=0.5, variant=variant)
    assert result.dense.total == pytest.approx(dense, rel=1e-12)
    assert result.sparse.total == pytest.approx(sparse, rel=1e-12)
    assert [b.index for b in result.bins] == list(range(9))
    assert sum(b.generated_tokens for b in result.bins) == 16_000


def test_closed_forms_against_discrete_loop_within_continuous_approximation():
    # the engine's count (t = i + 1) differs from the integral by half a token of context per
    # step and by at most one token's cost at each bin edge and dense/sparse switch
    s = get_preset("tiny-0.86")
    prompt_len, gen_len = 37, 2000
    result = schedule_cost(
        s, model=MODEL, hardware=HW, prompt_len=prompt_len, gen_len=gen_len, samples=8
    )
    dense, sparse = _loop(s, prompt_len, gen_len, 8, offset=1.0)
    bound = (1 + 2 * s.num_bins) / gen_len
    assert abs(result.dense.total - dense) / dense < bound
    assert abs(result.sparse.total - sparse) / sparse < bound
    assert result.sparse.total != pytest.approx(sparse, rel=1e-9)  # not identical: discrete


@pytest.mark.parametrize("variant", ["paper", "appendix"])
def test_dense_sum_over_bins_is_the_dense_formula(variant):
    result = schedule_cost(
        get_preset("qwen3-1.7b-0.80"),
        model=MODEL,
        hardware=HW,
        prompt_len=1024,
        gen_len=32_768,
        samples=8,
        variant=variant,
    )
    published = dense_cost(**_symbols(1024, 32_768, 8), variant=variant)
    assert result.dense.compute == pytest.approx(published.compute, rel=1e-12)
    assert result.dense.memory == pytest.approx(published.memory, rel=1e-12)


@pytest.mark.parametrize("variant", ["paper", "appendix"])
def test_constant_budget_below_prompt_is_the_sparse_formula(variant):
    # one budget (29 + 3 pages = 512 tokens) below the prompt: every step sparse
    s = Schedule(name="flat", topk_pages=(29,) * 5)
    result = schedule_cost(
        s, model=MODEL, hardware=HW, prompt_len=2048, gen_len=9000, samples=8, variant=variant
    )
    published = sparse_cost(
        **_symbols(2048, 9000, 8), budget_tokens=512, page_size=16, variant=variant
    )
    assert result.sparse.total == pytest.approx(published.total, rel=1e-12)
    assert all(b.dense_tokens == 0 for b in result.bins)
    # and the midpoint loop lands on the published formula too
    _, loop_sparse = _loop(s, 2048, 9000, 8, offset=0.5, variant=variant)
    assert loop_sparse == pytest.approx(published.total, rel=1e-12)


def test_budget_above_prompt_is_cheaper_than_published_sparse():
    # the published sparse formula charges B tokens and scoring from the first step even while
    # the budget still covers the context; the schedule decodes those steps densely
    s = Schedule(name="flat", topk_pages=(125,) * 3)  # 2048 tokens
    result = schedule_cost(s, model=MODEL, hardware=HW, prompt_len=512, gen_len=6000, samples=8)
    published = sparse_cost(**_symbols(512, 6000, 8), budget_tokens=2048, page_size=16)
    assert result.sparse.total < published.total
    # dense while 512 + t <= 2048: 1488 tokens in bin 0 (up to position 2000), 48 in bin 1
    assert [b.dense_tokens for b in result.bins] == [1488, 48, 0]


def test_dense_tokens_and_bins_by_hand():
    # with prompt 10: bin 0 is generated [0, 118), budget (2+3)*16 = 80 covers the
    # context while 10 + t <= 80, so 70 tokens are dense; bin 1 (budget 96 < 128) none
    schedule = Schedule(
        name="small",
        topk_pages=(2, 3, 4, 5, 6, 6, 6, 6),
        page_size=16,
        bin_tokens=128,
        skip_layers=(0,),
    )
    result = schedule_cost(
        schedule, model=MODEL, hardware=HW, prompt_len=10, gen_len=300, samples=2
    )
    first, second, third = result.bins
    assert (first.start_position, first.end_position, first.budget_tokens) == (10, 128, 80)
    assert first.dense_tokens == 70 and second.dense_tokens == 0
    assert (third.start_position, third.end_position, third.topk_pages) == (256, 310, 4)


def test_budget_covering_everything_gives_speedup_one():
    s = Schedule(name="wide", topk_pages=(1000,))
    result = schedule_cost(s, model=MODEL, hardware=HW, prompt_len=100, gen_len=5000, samples=8)
    assert result.predicted_speedup == pytest.approx(1.0, rel=1e-12)


def test_generation_starting_past_early_bins_skips_them():
    result = schedule_cost(
        get_preset("qwen3-1.7b-0.86"),
        model=MODEL,
        hardware=HW,
        prompt_len=5000,
        gen_len=1000,
        samples=1,
    )
    assert [b.index for b in result.bins] == [2]
    assert result.bins[0].budget_tokens == (93 + 3) * 16


def test_larger_budgets_cost_more_and_speedups_fall_with_model_size():
    kwargs = dict(hardware=HW, prompt_len=1024, gen_len=32_768, samples=8)
    cheap = schedule_cost(get_preset("qwen3-1.7b-0.80"), model=MODEL, **kwargs)
    safe = schedule_cost(get_preset("qwen3-1.7b-0.86"), model=MODEL, **kwargs)
    assert 1 < safe.predicted_speedup < cheap.predicted_speedup
    small = schedule_cost(get_preset("qwen3-14b-0.86"), model=MODEL, **kwargs)
    big = schedule_cost(get_preset("qwen3-14b-0.86"), model=get_model("qwen3-14b"), **kwargs)
    assert big.predicted_speedup < small.predicted_speedup


def test_segment_and_schedule_errors():
    with pytest.raises(CostModelError, match="start <= end"):
        segment_cost(model=MODEL, hardware=HW, prompt_len=0, start=5, end=2, samples=1)
    with pytest.raises(CostModelError, match="gen_len"):
        schedule_cost(
            get_preset("tiny-0.86"), model=MODEL, hardware=HW, prompt_len=0, gen_len=0, samples=1
        )
    with pytest.raises(CostModelError, match="variant"):
        schedule_cost(
            get_preset("tiny-0.86"),
            model=MODEL,
            hardware=HW,
            prompt_len=0,
            gen_len=10,
            samples=1,
            variant="nope",
        )


def test_each_rule_pays_its_scoring_bytes_and_flops():
    """quest reads two vectors a page (the scoring memory doubles), maxhead does r times the
    scoring products on the same bytes; the rest of the sparse cost is the centroid rule's."""
    from dataclasses import replace

    from sparrow.costmodel.segments import scoring_factors

    model, hardware = get_model("qwen3-1.7b"), get_hardware("h100")
    common = dict(
        model=model,
        hardware=hardware,
        prompt_len=1024,
        start=2000,
        end=6000,
        samples=8,
        budget_tokens=2048,
        page_size=16,
    )
    cost = {
        rule: segment_cost(selection=rule, **common)
        for rule in ("centroid", "centroid_maxhead", "quest", "quest_maxhead")
    }
    D, N, r, S = model.kv_dim, 8, model.gqa_ratio, 16
    t0, t1, L_in = 2000, 6000, 1024
    scoring_bytes = 2 * L_in * D * (t1 - t0) + N * D * (t1**2 - t0**2) / 2 / S
    scoring_flops = 2 * N * L_in * D * (t1 - t0) + r * N * D * (t1**2 - t0**2) / 2 / S
    base = cost["centroid"]
    assert cost["quest"].memory - base.memory == pytest.approx(scoring_bytes)
    assert cost["quest"].compute - base.compute == pytest.approx(scoring_flops)
    assert cost["centroid_maxhead"].memory == pytest.approx(base.memory)
    assert cost["centroid_maxhead"].compute - base.compute == pytest.approx((r - 1) * scoring_flops)
    assert cost["quest_maxhead"].compute - base.compute == pytest.approx(
        (2 * r - 1) * scoring_flops
    )
    assert scoring_factors("centroid", r) == (1, 1)
    schedule = get_preset("qwen3-1.7b-0.86")
    shape = dict(model=model, hardware=hardware, prompt_len=1024, gen_len=8192, samples=8)
    plain = schedule_cost(schedule, **shape)
    quest = schedule_cost(replace(schedule, selection="quest"), **shape)
    assert quest.sparse.memory > plain.sparse.memory and quest.dense == plain.dense
    with pytest.raises(CostModelError, match="oracle"):
        segment_cost(selection="oracle", **common)


def test_pages_scoring_prices_the_prompt_by_its_pages():
    # every step sparse (512-token budget below a 2048 prompt); the per-page price replaces
    # the published prompt term 2 N L_in D (compute) and 2 L_in D (bytes) by one summary per
    # page of each sample's prompt: r N D L_in / S and N D L_in / S, every step
    s = Schedule(name="flat", topk_pages=(29,) * 5)
    N, L_in, L_out, S = 8, 2048, 9000, 16
    D, r, intensity = MODEL.kv_dim, MODEL.gqa_ratio, HW.intensity
    common = dict(model=MODEL, hardware=HW, prompt_len=L_in, gen_len=L_out, samples=N)
    published = schedule_cost(s, **common)
    pages = schedule_cost(s, **common, scoring="pages")
    assert pages.scoring == "pages" and pages.to_dict()["scoring"] == "pages"
    removed = (2 * N * L_in * D + intensity * 2 * L_in * D) * L_out
    added = (r * N * D * L_in / S + intensity * N * D * L_in / S) * L_out
    assert published.sparse.total - pages.sparse.total == pytest.approx(removed - added, rel=1e-9)
    assert pages.dense.total == published.dense.total  # dense decode does not score
    closed = sparse_cost(
        **_symbols(L_in, L_out, N), budget_tokens=512, page_size=S, scoring="pages"
    )
    assert pages.sparse.total == pytest.approx(closed.total, rel=1e-12)
    # quest reads two summaries a page: twice the per-page scoring bytes of centroid
    quest = schedule_cost(dataclasses.replace(s, selection="quest"), **common, scoring="pages")
    extra = quest.sparse.memory - pages.sparse.memory
    assert extra == pytest.approx(N * D * L_in * L_out / S + N * D * L_out**2 / (2 * S), rel=1e-9)


def test_unknown_scoring_price_is_refused_with_the_valid_ones():
    with pytest.raises(CostModelError, match="scoring price 'exact'.*published, pages"):
        schedule_cost(
            get_preset("qwen3-1.7b-0.86"), model=MODEL, hardware=HW, prompt_len=10,
            gen_len=100, samples=1, scoring="exact",
        )  # fmt: skip
