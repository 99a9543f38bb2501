"""The testbed run's arithmetic: steps that fit a wall-clock budget, the learning rate of a
step, the FLOPs a step costs, and the wrong-hop rate that brings accuracy to a target.

    from sparrow.experiments.testbed.budget import fit_steps, learning_rate, train_flops_per_token
    steps = fit_steps(plan_shares, seconds_per_step, seconds=360.0)   # from measured steps
    lr = learning_rate(step, steps, peak=1e-3, warmup=90, min_ratio=0.1)
    rate = hop_noise_for(accuracy=0.9, target=0.4, num_hops=600)

Steps are fitted once, from one measured forward and backward per curriculum shape, so the
schedule (curriculum, warmup, cosine) is a function of the step count alone: a rerun with
that count (--steps) trains on the same plan however fast its machine is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sparrow.experiments.testbed.data import Stage

# the measured step time leaves out the optimizer and the host's batch building
STEP_TIME_MARGIN = 0.92


def fit_steps(
    shares: Sequence[tuple[Stage, float]], seconds_per_step: dict[Stage, float], seconds: float
) -> int:
    """Most steps whose expected time, stage shares weighting each stage's step time, fits
    `seconds` (with STEP_TIME_MARGIN); at least 1."""
    mean = sum(share * seconds_per_step[stage] for stage, share in shares)
    if mean <= 0:
        raise ValueError(f"measured step times must be positive, got {seconds_per_step}")
    return max(1, int(STEP_TIME_MARGIN * seconds / mean))


def learning_rate(step: int, steps: int, peak: float, warmup: int, min_ratio: float) -> float:
    """Linear warmup over `warmup` steps, then cosine from peak to peak * min_ratio at the
    last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup - 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return peak * (min_ratio + (1 - min_ratio) * cosine)


def train_flops_per_token(params: int, layers: int, q_width: int, length: int) -> float:
    """Forward and backward FLOPs per token: 6 per weight, plus causal attention (scores and
    values: 4 * q_width per past token per layer, over length / 2 past tokens on average,
    times 3 for the backward)."""
    return 6.0 * params + 6.0 * layers * q_width * length


def hop_noise_for(accuracy: float, target: float, num_hops: int) -> float:
    """The wrong-hop rate r with (1 - r) ** num_hops * accuracy = target: a model sampling
    right with probability `accuracy` that also errs at r per hop samples right at `target`;
    0 when accuracy is already at or below the target."""
    if accuracy <= target:
        return 0.0
    return 1.0 - (target / accuracy) ** (1.0 / num_hops)
