"""The pre-registered verdict of DistillSparse's fair test (docs/distill.md, "A fair test,
written before it runs"), written before any run of it. Pure: numbers in, numbers out.

    verdict([{"seed": 0, "low": 0.01, "high": 0.03, "delta": 0.02, "p5_lora": 0.80}, ...])

Per seed: the paired difference of the fixed set's p5 (with minus without the LoRA, after the
last step, the same tokens), its 95% cluster-bootstrap interval (low, high) and the fixed set's
p5 with the LoRA. The LoRA helps when every seed's interval lies above 0 (low > 0); the test
refutes it when two or more seeds' intervals do not (low <= 0: the interval holds 0 or lies
under it); anything else is inconclusive. Enough to switch: every seed's p5 with the LoRA at
or above the target (the controller could then take the cheaper schedule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TARGET = 0.86
SEEDS = 3
REFUTING_SEEDS = 2


def seed_row(seed: int, report: Mapping[str, Any]) -> dict[str, Any]:
    """One seed's figures from benchmarks/distill.py's JSON."""
    fixed = report["fixed_set"]
    paired = fixed["lora_minus_base_after"]["p5"]
    return {
        "seed": seed,
        "delta": paired["delta"],
        "low": paired["low"],
        "high": paired["high"],
        "p5_lora": fixed["after_lora"]["p5"],
        "p5_base": fixed["after_base"]["p5"],
        "prompts": fixed["prompts"],
        "tokens": fixed["tokens"],
        "steps": len(report.get("steps", [])),
    }


def verdict(rows: Sequence[Mapping[str, Any]], target: float = TARGET) -> dict[str, Any]:
    """The module doc's verdicts over the seeds' rows; fewer than SEEDS seeds is
    "incomplete" whatever they show (the plan asks for three)."""
    above = [r["seed"] for r in rows if r["low"] > 0]
    not_above = [r["seed"] for r in rows if not r["low"] > 0]
    if len(rows) < SEEDS:
        helps = "incomplete"
    elif not not_above:
        helps = "helps"
    elif len(not_above) >= REFUTING_SEEDS:
        helps = "refuted"
    else:
        helps = "inconclusive"
    reached = [r["seed"] for r in rows if r["p5_lora"] >= target]
    return {
        "seeds": [r["seed"] for r in rows],
        "interval_above_zero": above,
        "interval_not_above_zero": not_above,
        "lora_helps": helps,
        "target": target,
        "reached_target": reached,
        "enough_to_switch": len(rows) >= SEEDS and len(reached) == len(rows),
    }
