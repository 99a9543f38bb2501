"""DistillSparse's LoRA step on the tiny model: only the LoRA moves (by value, against AdamW's
first step from the gradient), distillation lowers KL(dense || sparse) on a fixed batch, the
saved state resumes to the same adapter, the PPO term and the metrics."""

import dataclasses
from collections import defaultdict

import numpy as np
import pytest
import torch

from sparrow.config.schema import AlgoConfig, DistillConfig
from sparrow.model.builtin import resolve_model_path
from sparrow.model.loader import SafetensorsCheckpoint
from sparrow.sparse import get_preset
from sparrow.trainer.distill import SparseDistiller, record_advantages
from sparrow.trainer.lora import lora_parameters
from tests.trainer.distill_fixtures import measured_around_steps, sparse_rollouts

SCHEDULE = get_preset("tiny-0.80")


@pytest.fixture(scope="module")
def path():
    torch.set_num_threads(1)
    return resolve_model_path("builtin:tiny")


@pytest.fixture(scope="module")
def records(path):
    return sparse_rollouts(path, SCHEDULE)


def algo(**distill) -> AlgoConfig:
    settings = dict(enabled=True, lora_rank=4, lora_alpha=8, lr_scale=1000.0)
    settings.update(distill)
    return AlgoConfig(lr=1e-6, grad_clip=0.0, distill=DistillConfig(**settings))


def distiller(path, **distill) -> SparseDistiller:
    d = SparseDistiller(path, algo(**distill), "cpu", "float32", seed=0)
    d.set_base(SafetensorsCheckpoint(path))
    return d


def named(d):
    return {n: p.detach().clone() for n, p in d.model.named_parameters()}


def test_only_the_lora_moves_by_adams_first_step(path, records):
    d = distiller(path, loss="full_kl")
    probe = distiller(path, loss="full_kl")  # same seed: the same adapter
    before = named(d)
    # the gradient, from the probe's own forward and backward
    tokens = {"lora": [], "base": [], "position": []}
    total = sum(len(r.output_ids) for r in records)
    probe._micro_batch(records, SCHEDULE, None, total, defaultdict(float), tokens).backward()
    grads = {n: p.grad.clone() for n, p in probe.model.named_parameters() if p.grad is not None}
    assert grads and all(".lora_" in n for n in grads)
    assert all(p.grad is None for n, p in probe.model.named_parameters() if ".lora_" not in n)
    metrics = d.distill(records, SCHEDULE)
    after = named(d)
    lr = d.optimizer.param_groups[0]["lr"]
    eps = d.optimizer.param_groups[0]["eps"]
    for name, value in after.items():
        if ".lora_" not in name:
            assert torch.equal(value, before[name]), name  # the base is frozen, by value
            continue
        g = grads[name]
        # AdamW's first step (no decay): -lr * g / (|g| + eps)
        torch.testing.assert_close(
            value - before[name], -lr * g / (g.abs() + eps), rtol=1e-3, atol=1e-7
        )
    assert any(not torch.equal(after[n], before[n]) for n in after if ".lora_B" in n)
    assert metrics["distill/updates"] == 1.0 and metrics["distill/tokens"] == total


def test_distillation_lowers_kl_on_a_fixed_batch(path, records):
    d = distiller(path, loss="full_kl", measure=True)
    first, last = measured_around_steps(d, records, SCHEDULE)
    assert first["distill/full_kl"] > 0.01
    assert last["distill/full_kl"] < 0.5 * first["distill/full_kl"]
    assert last["distill/acceptance_mean_lora"] > first["distill/acceptance_mean_lora"]
    # without the LoRA nothing changed: the same tokens, the same base
    assert last["distill/acceptance_mean_base"] == pytest.approx(
        first["distill/acceptance_mean_base"], abs=1e-6
    )
    assert first["distill/acceptance_mean_lora"] == pytest.approx(
        first["distill/acceptance_mean_base"], abs=1e-6
    )  # a fresh LoRA is the base


def test_saved_state_resumes_to_the_same_adapter(path, records, tmp_path):
    a = distiller(path, loss="k3")
    a.distill(records, SCHEDULE)
    a.save(tmp_path / "one")
    b = SparseDistiller.load(tmp_path / "one", path, algo(loss="k3"), "cpu", "float32")
    b.set_base(SafetensorsCheckpoint(path))
    assert b.updates == 1
    a.distill(records, SCHEDULE)
    b.distill(records, SCHEDULE)
    for key, value in a.adapter().state.items():
        assert torch.equal(value, b.adapter().state[key]), key
    for pa, pb in zip(lora_parameters(a.model), lora_parameters(b.model)):
        for k, v in a.optimizer.state[pa].items():
            assert torch.equal(v, b.optimizer.state[pb][k])


def test_ppo_term_joins_the_loss(path, records):
    rewards = [float(i % 2) for i in range(len(records))]
    advantages = record_advantages(records, rewards, 2, algo())
    assert len(advantages) == len(records) and abs(sum(advantages)) < 1e-5
    with_ppo = distiller(path, ppo_coef=1.0).distill(records, SCHEDULE, advantages, update=False)
    plain = distiller(path).distill(records, SCHEDULE, update=False)
    assert "distill/ppo_loss" in with_ppo and "distill/ppo_loss" not in plain
    assert with_ppo["distill/loss"] == pytest.approx(
        plain["distill/loss"] + with_ppo["distill/ppo_loss"], rel=1e-5, abs=1e-7
    )
    with pytest.raises(ValueError, match="advantages"):
        distiller(path, ppo_coef=1.0).distill(records, SCHEDULE)


def test_k3_value_is_the_sampled_estimate(path, records):
    """distill/k3 is the token mean of r - log r - 1 with r = p_dense / q_sparse."""
    d = distiller(path, loss="k3", measure=False)
    metrics = d.distill(records, SCHEDULE, update=False)
    assert metrics["distill/kl_loss"] == pytest.approx(metrics["distill/k3"])
    assert metrics["distill/k3"] >= 0 and "distill/p5_base" not in metrics
    assert 0 <= metrics["distill/min_bin_p5_lora"] <= 1 and 0 <= metrics["distill/p5_lora"] <= 1
    assert dataclasses.asdict(d.settings)["loss"] == "k3"


def test_released_base_is_rebuilt_exactly_by_set_base(path, records):
    """release_base frees every base weight while the engines roll out; set_base from the
    same policy gives back the same state, bit for bit, and the same metrics."""
    d = distiller(path, loss="full_kl")
    d.distill(records, SCHEDULE)  # an adapter and AdamW moments that are not fresh
    before = named(d)
    moments = {k: {n: t.clone() for n, t in v.items()} for k, v in d.optimizer.state.items()}
    want = d.distill(records, SCHEDULE, update=False)
    d.release_base()
    assert d.base_released
    for name, param in d.model.named_parameters():
        if ".lora_" in name:
            assert torch.equal(param.detach(), before[name]), name
        else:
            assert param.numel() == 0, name
    with pytest.raises(RuntimeError, match="set_base"):
        d.distill(records, SCHEDULE)
    d.set_base(SafetensorsCheckpoint(path))
    assert not d.base_released
    after = named(d)
    assert after.keys() == before.keys()
    for name, value in after.items():
        assert value.dtype == before[name].dtype and torch.equal(value, before[name]), name
    for param, state in d.optimizer.state.items():
        for key, value in state.items():
            assert torch.equal(value, moments[param][key]), key
    assert d.distill(records, SCHEDULE, update=False) == want


def test_cheaper_schedule_is_measured_with_the_lora(path, records):
    from sparrow.control.controller import one_notch_cheaper

    d = distiller(path, loss="full_kl")
    d.distill(records, SCHEDULE)
    same = d.distill(records, SCHEDULE, update=False, cheaper=SCHEDULE)
    # the same schedule: the same forward, so the same numbers as "lora"
    for stat in ("acceptance_mean", "p5", "min_bin_p5"):
        assert same[f"distill/{stat}_cheaper"] == same[f"distill/{stat}_lora"], stat
    cheaper = one_notch_cheaper(SCHEDULE, (1, 2, 3, 4, 6, 8, 12, 16))
    assert cheaper.topk_pages != SCHEDULE.topk_pages
    metrics = d.distill(records, SCHEDULE, update=False, cheaper=cheaper)
    assert metrics["distill/acceptance_mean_cheaper"] != metrics["distill/acceptance_mean_lora"]
    assert metrics["distill/acceptance_mean_lora"] == same["distill/acceptance_mean_lora"]
    assert [s.bin for s in d.bin_stats["cheaper"]] == [s.bin for s in d.bin_stats["lora"]]
    assert min(s.p5 for s in d.bin_stats["cheaper"]) == metrics["distill/min_bin_p5_cheaper"]


def test_token_acceptance_is_the_distill_steps_own_measure_per_token(path, records):
    d = distiller(path, loss="full_kl", measure=True)
    fresh = d.token_acceptance(records, SCHEDULE)
    total = sum(len(r.output_ids) for r in records)
    assert all(len(v) == total for v in fresh.values())
    np.testing.assert_allclose(fresh["lora"], fresh["base"], atol=1e-6)  # a fresh LoRA: the base
    for _ in range(4):
        d.distill(records, SCHEDULE)
    metrics = d.distill(records, SCHEDULE, update=False)
    after = d.token_acceptance(records, SCHEDULE)
    for which in ("lora", "base"):
        assert after[which].mean() == pytest.approx(
            metrics[f"distill/acceptance_mean_{which}"], abs=1e-6
        )
        assert np.percentile(after[which], 5) == pytest.approx(
            metrics[f"distill/p5_{which}"], abs=1e-6
        )
    np.testing.assert_allclose(after["base"], fresh["base"], atol=1e-6)  # the base is frozen
    assert after["lora"].mean() > fresh["lora"].mean()
    # whose token and where: record i's tokens in order, at the positions after its prompt
    first = records[0]
    mine = after["record"] == 0
    assert mine.sum() == len(first.output_ids)
    assert after["position"][mine].tolist() == list(
        range(len(first.prompt_ids), len(first.prompt_ids) + len(first.output_ids))
    )
    assert all(p.grad is None for p in d.model.parameters())  # measured without gradients
