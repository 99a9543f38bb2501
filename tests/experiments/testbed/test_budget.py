"""The testbed run's arithmetic: fitted steps, the learning-rate schedule, FLOPs per token."""

import pytest

from sparrow.experiments.testbed.budget import (
    STEP_TIME_MARGIN,
    fit_steps,
    hop_noise_for,
    learning_rate,
    train_flops_per_token,
)
from sparrow.experiments.testbed.data import StepPlan, curriculum


def test_fit_steps_weights_each_stage_by_its_share():
    stages = curriculum(256, 600)
    shares = StepPlan(stages, 1_000_000, 0.15).step_shares()
    seconds = {stage: 0.1 * (i + 1) for i, stage in enumerate(stages)}
    mean = sum(share * seconds[stage] for stage, share in shares)
    assert fit_steps(shares, seconds, 300.0) == int(STEP_TIME_MARGIN * 300.0 / mean)
    assert fit_steps(shares, seconds, 0.0) == 1
    with pytest.raises(ValueError, match="positive"):
        fit_steps(shares, dict.fromkeys(stages, 0.0), 10.0)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    lrs = [learning_rate(s, 100, peak=1e-3, warmup=10, min_ratio=0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert lrs[10] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_flops_per_token_counts_weights_and_causal_attention():
    # 104M weights, 12 layers of 768 query width at the default 7,568-token sequence
    assert train_flops_per_token(104_000_000, 12, 768, 7568) == pytest.approx(
        6 * 104e6 + 6 * 12 * 768 * 7568
    )


def test_hop_noise_brings_the_sampled_accuracy_to_the_target():
    rate = hop_noise_for(accuracy=0.9, target=0.4, num_hops=600)
    assert 0.0 < rate < 0.002
    assert (1 - rate) ** 600 * 0.9 == pytest.approx(0.4)
    assert hop_noise_for(accuracy=0.3, target=0.4, num_hops=600) == 0.0
