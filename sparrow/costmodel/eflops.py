"""The eFLOPs cost model: dense and block-sparse decode cost, cost of a schedule, speedup.

    from sparrow.costmodel import get_model, get_hardware, schedule_cost
    from sparrow.sparse.presets import get_preset
    result = schedule_cost(get_preset("qwen3-1.7b-0.86"), model=get_model("qwen3-1.7b"),
                           hardware=get_hardware("h200"), prompt_len=1024, gen_len=32768,
                           samples=8)
    result.predicted_speedup

`dense_cost` and `sparse_cost` are the method's formulas as published (docs/method.md,
"Cost model"; variant "paper"), or its appendix variant ("appendix": parameter traffic 2 P L_out
added to memory, the quadratic term replaced by H(L_in, L_out, K)). Symbols: P parameters,
N samples, L_in prompt, L_out generated tokens, D = layers x KV heads x head dim (the KV width
of one token; the formulas carry no layer or head count), r query heads per KV head, I the
hardware's FLOP per byte, B = K the KV budget in tokens, S the page size. Total eFLOPs =
C_comp + I C_mem. Prefill is dense either way and counted in neither.

`schedule_cost` integrates, bin by bin, the per-decode-step cost whose integral over
[0, L_out] the whole-generation formulas are (sparrow/costmodel/segments.py), with each
bin's budget (top-k + reserved pages) x S, dense where the budget covers the context.
docs/costmodel.md derives it and lists where the published formulas approximate.
"""

from __future__ import annotations

import numbers

from sparrow.costmodel.presets import (
    CostModelError,
)
from sparrow.costmodel.segments import (
    Cost,
    check_scoring,
    check_variant,
)


def _check_lengths(**values: float) -> None:
    for name, value in values.items():
        low = 0 if name == "prompt_len" else 1
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < low:
            raise CostModelError(f"{name} must be a number >= {low}, got {value!r}")


def dense_cost(
    *,
    params: float,
    samples: int,
    prompt_len: float,
    gen_len: float,
    kv_dim: float,
    gqa_ratio: float,
    intensity: float,
    variant: str = "paper",
) -> Cost:
    """Dense decode of N samples of L_out tokens after a shared L_in prompt.

    paper:    C_comp = 2 P N L_out + r (2 L_in + L_out) L_out N D
              C_mem  = 2 L_in L_out D + N L_out^2 D
    appendix: C_mem += 2 P L_out  (H(L_in, L_out, K) with K >= L_in + L_out is the paper's
              quadratic term, so C_comp is unchanged)
    """
    check_variant(variant)
    _check_lengths(
        params=params,
        samples=samples,
        prompt_len=prompt_len,
        gen_len=gen_len,
        kv_dim=kv_dim,
        gqa_ratio=gqa_ratio,
        intensity=intensity,
    )
    P, N, L_in, L_out, D, r = params, samples, prompt_len, gen_len, kv_dim, gqa_ratio
    compute = 2 * P * N * L_out + r * (2 * L_in + L_out) * L_out * N * D
    memory = 2 * L_in * L_out * D + N * L_out**2 * D
    if variant == "appendix":
        memory += 2 * P * L_out
    return Cost(compute, memory, intensity)


def attended_tokens(prompt_len: float, gen_len: float, budget_tokens: float) -> float:
    """H(L_in, L_out, K) = (2 L_in + L_dense) L_dense + 2 K (L_out - L_dense).

    L_dense = min(L_out, K - L_in), floored at 0 (a budget below the prompt is sparse from the
    first step; the published form leaves that case undefined).
    """
    L_dense = max(0.0, min(gen_len, budget_tokens - prompt_len))
    return (2 * prompt_len + L_dense) * L_dense + 2 * budget_tokens * (gen_len - L_dense)


def sparse_cost(
    *,
    params: float,
    samples: int,
    prompt_len: float,
    gen_len: float,
    kv_dim: float,
    gqa_ratio: float,
    intensity: float,
    budget_tokens: float,
    page_size: int,
    variant: str = "paper",
    scoring: str = "published",
) -> Cost:
    """Block-sparse decode with a constant KV budget B, page scoring included.

    paper:    without scoring 2 N P L_out + 2 r N D B L_out + I (2 N D B L_out);
              scoring 2 N L_in D L_out + r N D L_out^2 / (2S) + I (2 L_in D L_out + N D L_out^2 / (2S))
    appendix: 2 r N D B L_out -> r N D H(L_in, L_out, B), 2 N D B L_out -> N D H(L_in, L_out, B),
              and C_mem += 2 P L_out
    scoring="pages": the prompt's scoring as the engine does it, one centroid per page of each
              sample's prompt: 2 N L_in D L_out -> r N D L_in L_out / S, 2 I L_in D L_out ->
              I N D L_in L_out / S
    """
    check_variant(variant)
    check_scoring(scoring)
    _check_lengths(
        params=params,
        samples=samples,
        prompt_len=prompt_len,
        gen_len=gen_len,
        kv_dim=kv_dim,
        gqa_ratio=gqa_ratio,
        intensity=intensity,
        budget_tokens=budget_tokens,
        page_size=page_size,
    )
    P, N, L_in, L_out, D, r = params, samples, prompt_len, gen_len, kv_dim, gqa_ratio
    B, S = budget_tokens, page_size
    attended = 2 * B * L_out if variant == "paper" else attended_tokens(L_in, L_out, B)
    compute = 2 * N * P * L_out + r * N * D * attended
    memory = N * D * attended
    # scoring, as published: a prompt term without 1/S, and the generated pages' centroids
    if scoring == "pages":
        compute += r * N * D * L_in * L_out / S
        memory += N * D * L_in * L_out / S
    else:
        compute += 2 * N * L_in * D * L_out
        memory += 2 * L_in * D * L_out
    compute += r * N * D * L_out**2 / (2 * S)
    memory += N * D * L_out**2 / (2 * S)
    if variant == "appendix":
        memory += 2 * P * L_out
    return Cost(compute, memory, intensity)
