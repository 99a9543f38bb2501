"""Advantage estimators against plain-Python loops over groups (statistics module for the std)."""

import statistics

import pytest
import torch

from sparrow.rl import ADVANTAGE_ESTIMATORS, RLInputError, per_token_advantages


def grpo_loop(rewards, group_size, eps=1e-6):
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        if len(set(group)) == 1:
            out += [0.0] * len(group)
            continue
        mean = sum(group) / len(group)
        std = statistics.stdev(group)  # sample std, n - 1
        out += [(r - mean) / (std + eps) for r in group]
    return out


def rloo_loop(rewards, group_size):
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        for i, r in enumerate(group):
            others = [x for j, x in enumerate(group) if j != i]
            out.append(r - sum(others) / len(others))
    return out


@pytest.mark.parametrize("group_size", [2, 3, 8])
def test_grpo_matches_loop(group_size):
    gen = torch.Generator().manual_seed(group_size)
    rewards = torch.rand(5 * group_size, generator=gen, dtype=torch.float64)
    rewards[:group_size] = (rewards[:group_size] > 0.5).double()  # a binary group too
    got = ADVANTAGE_ESTIMATORS.get("grpo")(rewards, group_size, eps=1e-3)
    want = grpo_loop(rewards.tolist(), group_size, eps=1e-3)
    assert got.tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_grpo_binary_group_by_hand():
    # mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735: advantages +-0.866025
    got = ADVANTAGE_ESTIMATORS.get("grpo")(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, eps=0.0)
    assert got.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)


@pytest.mark.parametrize("group_size", [2, 4, 7])
def test_rloo_matches_loop(group_size):
    gen = torch.Generator().manual_seed(100 + group_size)
    rewards = torch.randn(3 * group_size, generator=gen, dtype=torch.float64)
    got = ADVANTAGE_ESTIMATORS.get("rloo")(rewards, group_size)
    assert got.tolist() == pytest.approx(rloo_loop(rewards.tolist(), group_size), abs=1e-12)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_constant_group_is_exactly_zero(name):
    # 0.7 is not representable: a naive mean leaves a residue that eps would blow up
    rewards = torch.tensor([0.7] * 8 + [0.0, 1.0, 1.0, 1.0, 0.1, 0.7, 0.7, 0.7])
    got = ADVANTAGE_ESTIMATORS.get(name)(rewards, 8)
    assert torch.equal(got[:8], torch.zeros(8))
    assert bool((got[8:] != 0).any())


def test_grpo_single_sample_groups_give_zero_and_rloo_refuses():
    assert torch.equal(
        ADVANTAGE_ESTIMATORS.get("grpo")(torch.tensor([0.0, 1.0, 0.5]), 1), torch.zeros(3)
    )
    with pytest.raises(RLInputError, match="group_size"):
        ADVANTAGE_ESTIMATORS.get("rloo")(torch.tensor([0.0, 1.0]), 1)


def test_integer_and_bool_rewards_become_float32():
    got = ADVANTAGE_ESTIMATORS.get("rloo")(torch.tensor([True, False]), 2)
    assert got.dtype == torch.float32 and got.tolist() == [1.0, -1.0]


@pytest.mark.parametrize(
    "rewards, group_size, match",
    [
        (torch.zeros(6), 4, "multiple of group_size"),
        (torch.zeros(2, 4), 4, "1-D"),
        (torch.tensor([0.0, float("nan")]), 2, "finite"),
        ([0.0, 1.0], 2, "torch.Tensor"),
        (torch.zeros(4), 0, "group_size"),
    ],
)
def test_bad_input_names_the_problem(rewards, group_size, match):
    with pytest.raises(RLInputError, match=match):
        ADVANTAGE_ESTIMATORS.get("grpo")(rewards, group_size)


def test_per_token_advantages_spreads_over_mask_only():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    got = per_token_advantages(torch.tensor([2.0, -1.0]), mask)
    assert got.tolist() == [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]
    with pytest.raises(RLInputError, match="advantages"):
        per_token_advantages(torch.tensor([1.0, 2.0, 3.0]), mask)
