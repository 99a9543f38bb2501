"""PPO clip + TIS loss against explicit loops over batch and tokens, and its gradients."""

import math

import pytest
import torch

from sparrow.config.schema import AlgoConfig
from sparrow.rl import POLICY_LOSSES, PolicyLossConfig, RLInputError, count_for

LOSS = POLICY_LOSSES.get("ppo_clip")


def loop_reference(lp, old, actor, adv, mask, cfg):
    """Per-token terms and metrics with Python floats only."""
    rows, n_tokens, n_clip, n_trunc = [], 0, 0, 0
    w_sum = ratio_sum = kl_sum = 0.0
    for b in range(len(lp)):
        row = []
        for t in range(len(lp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(lp[b][t] - old[b][t])
            a = adv[b][t]
            clipped = min(max(ratio, 1 - cfg.eps_low), 1 + cfg.eps_high)
            w = 1.0
            if cfg.tis_cap >= 0:
                raw = math.exp(old[b][t] - actor[b][t])
                w = min(raw, cfg.tis_cap)
                n_trunc += raw >= cfg.tis_cap
            row.append(-w * min(ratio * a, clipped * a))
            n_tokens += 1
            n_clip += (a > 0 and ratio > 1 + cfg.eps_high) or (a < 0 and ratio < 1 - cfg.eps_low)
            w_sum += w
            ratio_sum += ratio
            kl_sum += ratio - 1 - math.log(ratio)
        rows.append(row)
    if cfg.loss_agg == "token_mean":
        loss = sum(sum(r) for r in rows) / n_tokens
    else:
        means = [sum(r) / len(r) for r in rows if r]
        loss = sum(means) / len(means)
    metrics = {
        "actor/clip_frac": n_clip / n_tokens,
        "actor/tis_truncated_frac": n_trunc / n_tokens,
        "actor/tis_weight_mean": w_sum / n_tokens,
        "actor/ratio_mean": ratio_sum / n_tokens,
        "actor/approx_kl": kl_sum / n_tokens,
    }
    return loss, metrics


def make_batch(seed, batch=4, tokens=7, spread=0.4):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, tokens, generator=gen, dtype=torch.float64) * 3
    lp = old + spread * torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    actor = old + 1.0 * torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    adv = torch.randn(batch, 1, generator=gen, dtype=torch.float64).expand(batch, tokens).clone()
    mask = torch.rand(batch, tokens, generator=gen) > 0.25
    mask[:, 0] = True
    return lp, old, actor, adv, mask


@pytest.mark.parametrize("loss_agg", ["token_mean", "sequence_mean"])
@pytest.mark.parametrize("tis_cap", [2.0, 1.2, -1.0])
def test_loss_and_metrics_match_loops(loss_agg, tis_cap):
    cfg = PolicyLossConfig(eps_low=0.2, eps_high=0.28, tis_cap=tis_cap, loss_agg=loss_agg)
    lp, old, actor, adv, mask = make_batch(seed=int(tis_cap * 10) + len(loss_agg))
    loss, metrics = LOSS(lp, old, actor, adv, mask, cfg)
    want_loss, want_metrics = loop_reference(
        lp.tolist(), old.tolist(), actor.tolist(), adv.tolist(), mask.tolist(), cfg
    )
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(want_loss, rel=1e-5)
    for key, value in want_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["actor/tokens"] == float(mask.sum())
    # the batch has both clipped and truncated tokens, so the comparisons above bite
    assert 0 < want_metrics["actor/clip_frac"] < 1
    if tis_cap > 0:
        assert 0 < want_metrics["actor/tis_truncated_frac"] < 1


def test_gradient_zero_where_clip_active_in_direction_of_advantage():
    # token: (log ratio, advantage); eps 0.2 / 0.28
    cases = [(0.5, 1.0), (-0.5, -1.0), (0.5, -1.0), (-0.5, 1.0), (0.1, 1.0), (-0.1, -1.0)]
    lp = torch.tensor([[c[0] for c in cases]], requires_grad=True)
    old = torch.zeros(1, len(cases))
    adv = torch.tensor([[c[1] for c in cases]])
    actor = old - math.log(1.5)  # raw TIS weight 1.5, under the cap: w = 1.5 everywhere
    cfg = PolicyLossConfig(tis_cap=2.0)
    loss, metrics = LOSS(lp, old, actor, adv, torch.ones_like(old, dtype=torch.bool), cfg)
    loss.backward()
    ratio = [math.exp(c[0]) for c in cases]
    # d/dlp of -w * ratio * A / N where the unclipped term is the minimum, else 0
    want = [0.0, 0.0] + [-1.5 * r * c[1] / len(cases) for r, c in zip(ratio[2:], cases[2:])]
    assert lp.grad[0].tolist() == pytest.approx(want, rel=1e-5, abs=1e-8)
    assert metrics["actor/clip_frac"] == pytest.approx(2 / 6)
    assert metrics["actor/clip_frac_high"] == pytest.approx(1 / 6)
    assert metrics["actor/clip_frac_low"] == pytest.approx(1 / 6)


def test_tis_weight_carries_no_gradient():
    lp, old, actor, adv, mask = make_batch(seed=3)
    lp.requires_grad_(True)
    old.requires_grad_(True)
    actor.requires_grad_(True)
    loss, _ = LOSS(lp, old, actor, adv, mask, PolicyLossConfig(tis_cap=1.5))
    loss.backward()
    assert old.grad is None and actor.grad is None
    assert lp.grad is not None and lp.grad.abs().sum() > 0


def test_negative_cap_equals_no_tis():
    lp, old, actor, adv, mask = make_batch(seed=5)
    off, off_metrics = LOSS(lp, old, actor, adv, mask, PolicyLossConfig(tis_cap=-1.0))
    # actor == old gives weight exactly 1 under any cap >= 1
    same, _ = LOSS(lp, old, old, adv, mask, PolicyLossConfig(tis_cap=2.0))
    with_tis, _ = LOSS(lp, old, actor, adv, mask, PolicyLossConfig(tis_cap=2.0))
    assert float(off) == pytest.approx(float(same), rel=1e-12)
    assert float(off) != pytest.approx(float(with_tis), rel=1e-3)
    assert off_metrics["actor/tis_weight_mean"] == 1.0
    assert off_metrics["actor/tis_truncated_frac"] == 0.0


def test_padding_off_the_mask_is_ignored_even_inf_and_nan():
    lp, old, actor, adv, mask = make_batch(seed=7)
    lp.requires_grad_(True)
    clean, _ = LOSS(lp, old, actor, adv, mask, PolicyLossConfig())
    pad = ~mask
    lp2 = torch.where(pad, torch.full_like(lp, -float("inf")), lp.detach()).requires_grad_(True)
    old2 = torch.where(pad, torch.full_like(old, -float("inf")), old)
    adv2 = torch.where(pad, torch.full_like(adv, float("nan")), adv)
    padded, metrics = LOSS(lp2, old2, actor, adv2, mask, PolicyLossConfig())
    padded.backward()
    assert float(padded.detach()) == pytest.approx(float(clean.detach()), rel=1e-12)
    assert bool(torch.isfinite(lp2.grad).all()) and lp2.grad[pad].abs().sum() == 0
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("loss_agg", ["token_mean", "sequence_mean"])
def test_micro_batches_sum_to_full_batch(loss_agg):
    lp, old, actor, adv, mask = make_batch(seed=11, batch=6)
    cfg = PolicyLossConfig(loss_agg=loss_agg)
    full, _ = LOSS(lp, old, actor, adv, mask, cfg)
    total = count_for(mask, loss_agg)
    parts = sum(
        LOSS(lp[s], old[s], actor[s], adv[s], mask[s], cfg, normalizer=total)[0]
        for s in (slice(0, 4), slice(4, 6))
    )
    assert float(parts) == pytest.approx(float(full), rel=1e-12)


def test_config_from_algo_and_its_checks():
    algo = AlgoConfig(eps_low=0.1, eps_high=0.3, tis_cap=-1.0, loss_agg="sequence_mean")
    cfg = PolicyLossConfig.from_algo(algo)
    assert (cfg.eps_low, cfg.eps_high, cfg.tis_cap, cfg.loss_agg) == (
        0.1,
        0.3,
        -1.0,
        "sequence_mean",
    )
    assert not cfg.tis_enabled and PolicyLossConfig().tis_enabled
    for bad, match in [
        ({"tis_cap": 0.0}, "tis_cap"),
        ({"eps_low": 1.0}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"loss_agg": "sum"}, "loss_agg"),
    ]:
        with pytest.raises(RLInputError, match=match):
            PolicyLossConfig(**bad)


def test_shape_mismatch_names_the_tensor():
    lp, old, actor, adv, mask = make_batch(seed=1)
    with pytest.raises(RLInputError, match="actor_logprobs"):
        LOSS(lp, old, actor[:, :3], adv, mask, PolicyLossConfig())
    with pytest.raises(RLInputError, match="PolicyLossConfig"):
        LOSS(lp, old, actor, adv, mask, AlgoConfig())


def test_bfloat16_logprobs_are_computed_in_float32():
    lp, old, actor, adv, mask = make_batch(seed=13)
    lp16 = lp.to(torch.bfloat16).requires_grad_(True)
    loss, _ = LOSS(lp16, old.float(), actor.float(), adv.float(), mask, PolicyLossConfig())
    loss.backward()
    want, _ = LOSS(lp16.detach().double(), old, actor, adv, mask, PolicyLossConfig())
    assert loss.dtype == torch.float32 and lp16.grad.dtype == torch.bfloat16
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-5)
