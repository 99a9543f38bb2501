"""Per-decode-step cost, integrated over stretches of a generation and over a schedule's bins.

    from sparrow.costmodel.segments import segment_cost, schedule_cost
    segment_cost(model=m, hardware=h, prompt_len=1024, start=0, end=976, samples=8,
                 budget_tokens=512, page_size=16)      # generated tokens [0, 976)

Each published formula of sparrow/costmodel/eflops.py is the integral over t in [0, L_out] of a
per-step cost that is linear in t, the number of tokens generated so far (the context being
L_in + t). Writing those integrands down lets a schedule change its budget at bin edges:
a stretch [t0, t1) costs a (t1 - t0) + b (t1^2 - t0^2) / 2. Per step, for the N samples of
one prompt (D, r, I, S as in costmodel.py):
  dense:  compute 2PN + 2rND (L_in + t)          memory 2D L_in + 2ND t
  sparse: compute 2PN + 2rND B + 2N L_in D + rND t / S
          memory  2ND B + 2 L_in D + ND t / S
  appendix variant: memory + 2P in both.
The scoring terms (2N L_in D, rND t / S; 2 L_in D, ND t / S) price the centroid rule; another
page-scoring rule scales them (scoring_factors: quest reads two vectors a page, maxhead does
r times the products). scoring="pages" prices the prompt's part as the engine scores it, one
summary per page of each sample's prompt (rND L_in / S; ND L_in / S), where the published
term charges the prompt's every key once a step. A step is dense while its budget B covers
the context (L_in + t <= B), sparse after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparrow.costmodel.presets import CostModelError, Hardware, ModelShape
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import get_rule

VARIANTS = ("paper", "appendix")
SCORING_PRICES = ("published", "pages")


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise CostModelError(
            f"unknown cost model variant {variant!r}; valid: {', '.join(VARIANTS)}"
        )


def check_scoring(scoring: str) -> None:
    if scoring not in SCORING_PRICES:
        raise CostModelError(
            f"unknown scoring price {scoring!r}; valid: {', '.join(SCORING_PRICES)}"
        )


@dataclass(frozen=True)
class Cost:
    """Compute (FLOPs), memory (bytes as the formulas count them) and their eFLOPs total."""

    compute: float
    memory: float
    intensity: float

    def __post_init__(self) -> None:
        for name in ("compute", "memory", "intensity"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise CostModelError(f"cost {name} must be finite and >= 0, got {value!r}")

    @property
    def total(self) -> float:
        """eFLOPs: C_comp + I C_mem."""
        return self.compute + self.intensity * self.memory

    def __add__(self, other: Cost) -> Cost:
        if other.intensity != self.intensity:
            raise CostModelError("cannot add costs taken at different FLOP-per-byte ratios")
        return Cost(self.compute + other.compute, self.memory + other.memory, self.intensity)

    def to_dict(self) -> dict[str, float]:
        return {"compute": self.compute, "memory": self.memory, "total": self.total}


def scoring_factors(selection: str, gqa_ratio: float) -> tuple[float, float]:
    """(compute, memory) multipliers of the published scoring terms, which price the centroid
    rule (one vector per page and KV head): a rule reads summary_vectors vectors (quest: the
    two key bounds) and, scoring each query head (maxhead), does r times the products."""
    try:
        rule = get_rule(selection)
    except ValueError as err:
        raise CostModelError(str(err)) from None
    if not rule.decodes:
        raise CostModelError(f"page-scoring rule {selection!r} does not decode: no decode cost")
    vectors = rule.summary_vectors
    return vectors * (gqa_ratio if rule.per_head else 1), vectors


def _step_rates(
    model: ModelShape,
    samples: int,
    prompt_len: float,
    budget_tokens: float | None,
    page_size: int,
    variant: str,
    selection: str = "centroid",
    scoring: str = "published",
) -> tuple[float, float, float, float]:
    """(compute at t=0, compute slope, memory at t=0, memory slope); budget None is dense."""
    P, N, L_in, D, r = model.parameters, samples, prompt_len, model.kv_dim, model.gqa_ratio
    if budget_tokens is None:
        c0, c1 = 2 * P * N + 2 * r * N * D * L_in, 2 * r * N * D
        m0, m1 = 2 * D * L_in, 2 * N * D
    else:
        B, S = budget_tokens, page_size
        flops, reads = scoring_factors(selection, r)
        if scoring == "pages":
            prompt_flops, prompt_reads = r * N * D * L_in / S, N * D * L_in / S
        else:
            prompt_flops, prompt_reads = 2 * N * L_in * D, 2 * L_in * D
        c0 = 2 * P * N + 2 * r * N * D * B + flops * prompt_flops
        c1 = flops * r * N * D / S
        m0, m1 = 2 * N * D * B + reads * prompt_reads, reads * N * D / S
    if variant == "appendix":
        m0 += 2 * P
    return c0, c1, m0, m1


def _integrate(
    rates: tuple[float, float, float, float], t0: float, t1: float, intensity: float
) -> Cost:
    c0, c1, m0, m1 = rates
    width, squares = t1 - t0, (t1 * t1 - t0 * t0) / 2
    return Cost(c0 * width + c1 * squares, m0 * width + m1 * squares, intensity)


def dense_tokens_in(
    prompt_len: float, start: float, end: float, budget_tokens: float | None
) -> float:
    """How many of the generated tokens [start, end) the budget covers (decoded densely)."""
    if budget_tokens is None:
        return end - start
    return max(0, min(end, budget_tokens - prompt_len) - start)


def segment_cost(
    *,
    model: ModelShape,
    hardware: Hardware,
    prompt_len: float,
    start: float,
    end: float,
    samples: int,
    budget_tokens: float | None = None,
    page_size: int = 16,
    variant: str = "paper",
    selection: str = "centroid",
    scoring: str = "published",
) -> Cost:
    """Cost of decoding generated tokens [start, end) with one budget (None: dense); the
    sparse steps' page scoring priced for the rule `selection` (scoring_factors), its prompt
    part as published or per page (`scoring`)."""
    check_variant(variant)
    check_scoring(scoring)
    if not 0 <= start <= end:
        raise CostModelError(f"need 0 <= start <= end, got start={start}, end={end}")
    if budget_tokens is not None and budget_tokens < 1:
        raise CostModelError(f"budget_tokens must be >= 1, got {budget_tokens}")
    I = hardware.intensity
    split = start + dense_tokens_in(prompt_len, start, end, budget_tokens)
    dense = _step_rates(model, samples, prompt_len, None, page_size, variant)
    cost = _integrate(dense, start, split, I)
    if split < end:
        sparse = _step_rates(
            model, samples, prompt_len, budget_tokens, page_size, variant, selection, scoring
        )
        cost = cost + _integrate(sparse, split, end, I)
    return cost


@dataclass(frozen=True)
class BinCost:
    """One length bin of a schedule: the generated tokens in it and their two costs."""

    index: int
    start_position: int
    end_position: int
    topk_pages: int
    budget_tokens: int
    dense_tokens: float
    dense: Cost
    sparse: Cost

    def __post_init__(self) -> None:
        if not 0 <= self.dense_tokens <= self.end_position - self.start_position:
            raise CostModelError(f"bin {self.index}: dense_tokens outside the bin")

    @property
    def generated_tokens(self) -> int:
        return self.end_position - self.start_position

    @property
    def speedup(self) -> float:
        return self.dense.total / self.sparse.total

    def to_row(self) -> dict:
        return {
            "bin": self.index,
            "start_position": self.start_position,
            "end_position": self.end_position,
            "generated_tokens": self.generated_tokens,
            "topk_pages": self.topk_pages,
            "budget_tokens": self.budget_tokens,
            "dense_tokens": self.dense_tokens,
            "dense_eflops": self.dense.total,
            "sparse_eflops": self.sparse.total,
            "speedup": self.speedup,
        }


@dataclass(frozen=True)
class ScheduleCost:
    """A whole generation under a schedule, against the same generation decoded densely."""

    schedule: str
    model: str
    hardware: str
    variant: str
    prompt_len: int
    gen_len: int
    samples: int
    bins: tuple[BinCost, ...]
    scoring: str = "published"

    @property
    def dense(self) -> Cost:
        return _sum(b.dense for b in self.bins)

    @property
    def sparse(self) -> Cost:
        return _sum(b.sparse for b in self.bins)

    @property
    def predicted_speedup(self) -> float:
        return self.dense.total / self.sparse.total

    def to_dict(self) -> dict:
        return {
            "schedule": self.schedule,
            "model": self.model,
            "hardware": self.hardware,
            "variant": self.variant,
            "scoring": self.scoring,
            "prompt_len": self.prompt_len,
            "gen_len": self.gen_len,
            "samples": self.samples,
            "dense_eflops": self.dense.total,
            "sparse_eflops": self.sparse.total,
            "predicted_speedup": self.predicted_speedup,
            "dense": self.dense.to_dict(),
            "sparse": self.sparse.to_dict(),
            "bins": [b.to_row() for b in self.bins],
        }


def _sum(costs) -> Cost:
    costs = list(costs)
    total = costs[0]
    for cost in costs[1:]:
        total = total + cost
    return total


def schedule_cost(
    schedule: Schedule,
    *,
    model: ModelShape,
    hardware: Hardware,
    prompt_len: int,
    gen_len: int,
    samples: int,
    variant: str = "paper",
    scoring: str = "published",
) -> ScheduleCost:
    """Cost of N samples of gen_len tokens after a prompt, bin by bin (bin = position // width);
    `scoring` prices the prompt's page scoring as published or per page (segment_cost)."""
    check_variant(variant)
    check_scoring(scoring)
    checks = (("prompt_len", prompt_len, 0), ("gen_len", gen_len, 1), ("samples", samples, 1))
    for name, value, low in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CostModelError(f"{name} must be an integer >= {low}, got {value!r}")
    bins = []
    common = dict(
        model=model,
        hardware=hardware,
        prompt_len=prompt_len,
        samples=samples,
        page_size=schedule.page_size,
        variant=variant,
    )
    for index, topk in enumerate(schedule.topk_pages):
        first, last = schedule.bin_bounds(index)
        t0 = max(0, first - prompt_len)
        t1 = gen_len if last is None else min(gen_len, last - prompt_len)
        if t1 <= t0:
            continue
        budget = schedule.pages_for_topk(topk) * schedule.page_size
        bins.append(
            BinCost(
                index=index,
                start_position=prompt_len + t0,
                end_position=prompt_len + t1,
                topk_pages=topk,
                budget_tokens=budget,
                dense_tokens=dense_tokens_in(prompt_len, t0, t1, budget),
                dense=segment_cost(start=t0, end=t1, budget_tokens=None, **common),
                sparse=segment_cost(
                    start=t0,
                    end=t1,
                    budget_tokens=budget,
                    selection=schedule.selection,
                    scoring=scoring,
                    **common,
                ),
            )
        )
    return ScheduleCost(
        schedule.name,
        model.name,
        hardware.name,
        variant,
        prompt_len,
        gen_len,
        samples,
        tuple(bins),
        scoring,
    )
