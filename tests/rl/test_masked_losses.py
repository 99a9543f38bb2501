"""The masking mismatch corrections (mis_token, mis_sequence, icepop, geo_mask) against plain
Python loops over batch and tokens, their gradients, and what they mask."""

import math

import pytest
import torch

from sparrow.config.schema import AlgoConfig, CorrectionConfig
from sparrow.rl import POLICY_LOSSES, PolicyLossConfig, RLInputError, count_for

CFG = PolicyLossConfig(mis_cap=1.5, icepop_low=0.6, icepop_high=1.8, geo_low=0.7, geo_high=1.3)


def weight_loop(name, old, actor, mask, cfg):
    """Per-token weights with Python floats only (module doc of losses_masked.py)."""
    out = []
    for b in range(len(old)):
        rhos = [math.exp(old[b][t] - actor[b][t]) for t in range(len(old[b])) if mask[b][t]]
        row = []
        if name == "mis_sequence":
            seq = math.prod(rhos) if rhos else 1.0
            row = [seq if seq <= cfg.mis_cap else 0.0] * len(rhos)
        elif name == "geo_mask":
            geo = math.exp(sum(math.log(r) for r in rhos) / max(len(rhos), 1))
            kept = cfg.geo_low <= geo <= cfg.geo_high
            cap = cfg.tis_cap if cfg.tis_cap > 0 else math.inf
            row = [min(r, cap) if kept else 0.0 for r in rhos]
        else:
            low, high = (
                (0.0, cfg.mis_cap) if name == "mis_token" else (cfg.icepop_low, cfg.icepop_high)
            )
            row = [r if low <= r <= high else 0.0 for r in rhos]
        out.append(row)
    return out


def loss_loop(name, lp, old, actor, adv, mask, cfg):
    weights = weight_loop(name, old, actor, mask, cfg)
    rows = []
    for b in range(len(lp)):
        kept = [t for t in range(len(lp[b])) if mask[b][t]]
        row = []
        for w, t in zip(weights[b], kept):
            ratio = math.exp(lp[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - cfg.eps_low), 1 + cfg.eps_high)
            row.append(-w * min(ratio * adv[b][t], clipped * adv[b][t]))
        rows.append(row)
    if cfg.loss_agg == "token_mean":
        loss = sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    else:
        means = [sum(r) / len(r) for r in rows if r]
        loss = sum(means) / len(means)
    masked = sum(w == 0.0 for row in weights for w in row) / sum(len(r) for r in weights)
    return loss, masked


def make_batch(seed, batch=6, tokens=9):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, tokens, generator=gen, dtype=torch.float64) * 3
    lp = old + 0.3 * torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    actor = old + 0.15 * torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    actor[0] = old[0] - 2.0  # rho = e^2 throughout: masked by every rule
    adv = torch.randn(batch, 1, generator=gen, dtype=torch.float64).expand(batch, tokens).clone()
    mask = torch.rand(batch, tokens, generator=gen) > 0.2
    mask[:, 0] = True
    return lp, old, actor, adv, mask


NAMES = ["mis_token", "mis_sequence", "icepop", "geo_mask"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("loss_agg", ["token_mean", "sequence_mean"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_loop(name, loss_agg, seed):
    cfg = PolicyLossConfig(**{**CFG.__dict__, "loss_agg": loss_agg})
    lp, old, actor, adv, mask = make_batch(seed)
    loss, metrics = POLICY_LOSSES.get(name)(lp, old, actor, adv, mask, cfg)
    expected, masked = loss_loop(
        name, lp.tolist(), old.tolist(), actor.tolist(), adv.tolist(), mask.tolist(), cfg
    )
    assert float(loss) == pytest.approx(expected, rel=1e-10, abs=1e-12)
    assert metrics["actor/is_masked_frac"] == pytest.approx(masked)
    assert 0 < masked < 1  # the batch exercises both sides of every rule


@pytest.mark.parametrize("name", NAMES)
def test_gradient_skips_masked_tokens_and_micro_batches_add_up(name):
    lp, old, actor, adv, mask = make_batch(3)
    lp = lp.clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES.get(name)(lp, old, actor, adv, mask, CFG)
    loss.backward()
    weights = weight_loop(name, old.tolist(), actor.tolist(), mask.tolist(), CFG)
    for b in range(lp.shape[0]):
        kept = [t for t in range(lp.shape[1]) if mask[b, t]]
        for w, t in zip(weights[b], kept):
            if w == 0.0:
                assert lp.grad[b, t] == 0
    assert lp.grad[~mask].abs().sum() == 0
    # two micro-batches with the whole batch's normalizer sum to the full loss
    normalizer = count_for(mask, CFG.loss_agg)
    parts = [
        POLICY_LOSSES.get(name)(
            lp[s], old[s], actor[s], adv[s], mask[s], CFG, normalizer=normalizer
        )[0]
        for s in (slice(0, 2), slice(2, None))
    ]
    assert float(sum(parts).detach()) == pytest.approx(float(loss.detach()), rel=1e-12)


def test_tis_and_masking_part_ways_on_a_high_ratio():
    """TIS keeps a token with rho above the cap at weight C; masked IS drops it."""
    old = torch.tensor([[-0.1, -1.0]], dtype=torch.float64)
    actor = torch.tensor([[-2.0, -1.0]], dtype=torch.float64)  # rho = e^1.9 ~ 6.7, then 1
    lp, adv, mask = (
        old.clone(),
        torch.ones(1, 2, dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.bool),
    )
    cfg = PolicyLossConfig(tis_cap=2.0, mis_cap=2.0)
    tis, _ = POLICY_LOSSES.get("ppo_clip")(lp, old, actor, adv, mask, cfg)
    mis, metrics = POLICY_LOSSES.get("mis_token")(lp, old, actor, adv, mask, cfg)
    assert float(tis) == pytest.approx(-(2.0 + 1.0) / 2)
    assert float(mis) == pytest.approx(-(0.0 + 1.0) / 2)
    assert metrics["actor/is_masked_frac"] == 0.5


def test_thresholds_come_from_algo_correction_and_are_checked():
    algo = AlgoConfig(loss="icepop", correction=CorrectionConfig(icepop_low=0.3, icepop_high=3.0))
    cfg = PolicyLossConfig.from_algo(algo)
    assert (cfg.icepop_low, cfg.icepop_high, cfg.mis_cap) == (0.3, 3.0, 2.0)
    with pytest.raises(RLInputError, match="geo_low"):
        PolicyLossConfig(geo_low=1.2, geo_high=1.1)
