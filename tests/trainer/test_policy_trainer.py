"""PolicyTrainer: the update moves the right logprobs, micro-batching changes nothing, and
a checkpoint resumes bit for bit.

    python -m pytest tests/trainer/test_policy_trainer.py -q
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from sparrow.config.schema import AlgoConfig, TrainerConfig
from sparrow.data.rollouts import RolloutRecord
from sparrow.model import load_model, load_tokenizer
from sparrow.model.attention import causal_attention
from sparrow.rl.checks import RLInputError
from sparrow.trainer.policy_trainer import PolicyTrainer

VOCAB = 384
ALGO = AlgoConfig(lr=1e-3, grad_clip=0.0, tis_cap=2.0)
SYSTEM = TrainerConfig(micro_batch_tokens=10_000)


def make_records(prompts=2, group=3, seed=0):
    rng = random.Random(seed)
    records = []
    for p in range(prompts):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(2, 6)))
        for s in range(group):
            out = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 8)))
            n = len(out)
            records.append(
                RolloutRecord(
                    p,
                    s,
                    p,
                    prompt,
                    out,
                    (-1.0,) * n,
                    ((0,),) * n,
                    ((-1.0,),) * n,
                    (1,) * n,
                    "stop",
                    "0",
                )
            )
    return records


def with_actor_logprobs(records, scores, shifts):
    """The records as if the actor had sampled them with the dense policy, shifted per record
    (so TIS weights differ between samples and no loss cancels to 0 by symmetry)."""
    return [
        dataclasses.replace(r, actor_logprobs=tuple(v + shift for v in s.dense_logprobs))
        for r, s, shift in zip(records, scores, shifts)
    ]


def rollout_step(trainer, records, rewards, group):
    scores = trainer.score(records)
    records = with_actor_logprobs(records, scores, [0.1 * (i % 3) for i in range(len(records))])
    return trainer.update(records, rewards, [s.dense_logprobs for s in scores], group)


def weights(trainer):
    return {k: v.clone() for k, v in trainer.state_dict_for_sync().items()}


def test_update_raises_positive_advantage_tokens(qwen3_checkpoint):
    trainer = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", dtype="auto", seed=0, trainer_config=SYSTEM
    )
    records = make_records(prompts=2, group=2, seed=1)
    rewards = [1.0, 0.0, 0.0, 1.0]  # advantages +, -, -, + (GRPO)
    before = [sum(s.dense_logprobs) for s in trainer.score(records)]
    metrics = rollout_step(trainer, records, rewards, group=2)
    after = [sum(s.dense_logprobs) for s in trainer.score(records)]
    for i, reward in enumerate(rewards):
        assert (after[i] > before[i]) == (reward == 1.0), (i, before[i], after[i])
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # first pass: p = p_old
    assert metrics["actor/tokens"] == sum(len(r.output_ids) for r in records)
    assert metrics["actor/lr"] == ALGO.lr and metrics["actor/grad_norm"] > 0
    assert trainer.step == 1 and trainer.optimizer_steps == 1


@pytest.mark.parametrize("loss_agg", ["token_mean", "sequence_mean"])
def test_micro_batches_sum_to_the_full_batch(qwen3_checkpoint, loss_agg):
    records = make_records(prompts=3, group=2, seed=2)
    rewards = [0.0, 1.0, 1.0, 0.5, 0.2, 0.0]
    results = []
    for budget in (10_000, 1):  # one micro-batch, then one sequence per micro-batch
        algo = dataclasses.replace(ALGO, loss_agg=loss_agg)
        system = dataclasses.replace(SYSTEM, micro_batch_tokens=budget)
        trainer = PolicyTrainer(qwen3_checkpoint, algo, device="cpu", seed=0, trainer_config=system)
        metrics = rollout_step(trainer, records, rewards, group=2)
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
        results.append((metrics, grads, weights(trainer)))
    (m_full, g_full, w_full), (m_micro, g_micro, w_micro) = results
    assert abs(m_full["actor/loss"]) > 1e-3
    assert m_micro["actor/loss"] == pytest.approx(m_full["actor/loss"], rel=1e-6)
    assert m_micro["actor/tis_weight_mean"] == pytest.approx(
        m_full["actor/tis_weight_mean"], rel=1e-6
    )
    for name in g_full:
        # float32 sums in another order: each entry's rounding is a few float32 steps of the
        # tensor's largest entry (13 measured), whatever that entry's own size; a micro-batch
        # lost or counted twice would be off by a sixth of the gradient
        scale = torch.finfo(torch.float32).eps * float(g_full[name].abs().max())
        torch.testing.assert_close(g_micro[name], g_full[name], rtol=1e-5, atol=64 * scale)
    # AdamW's first step is lr * g / (|g| + 1e-8): where |g| is near that eps, rounding of g
    # becomes a sizeable part of the step; elsewhere the step hardly depends on it
    for name in g_full:
        steady = g_full[name].abs() > 1e-5
        assert steady.float().mean() > 0.5
        torch.testing.assert_close(w_micro[name][steady], w_full[name][steady], rtol=0, atol=1e-6)


def test_grpo_reference_loss_by_hand(qwen3_checkpoint):
    """First pass, TIS off: ratio = 1, so the loss is -(sum of A_i n_i) / total tokens."""
    algo = dataclasses.replace(ALGO, tis_cap=-1.0)
    trainer = PolicyTrainer(qwen3_checkpoint, algo, device="cpu", trainer_config=SYSTEM)
    records = make_records(prompts=2, group=3, seed=3)
    rewards = [1.0, 0.0, 0.0, 0.3, 0.6, 0.9]
    metrics = rollout_step(trainer, records, rewards, group=3)
    lengths = np.array([len(r.output_ids) for r in records])
    grouped = np.array(rewards).reshape(2, 3)
    adv = (
        (grouped - grouped.mean(1, keepdims=True))
        / (grouped.std(1, ddof=1, keepdims=True) + algo.adv_eps)
    ).reshape(-1)
    assert metrics["actor/loss"] == pytest.approx(-(adv * lengths).sum() / lengths.sum(), rel=1e-5)


def test_mask_truncated_leaves_cut_samples_out_of_the_loss(qwen3_checkpoint):
    """As the reference above, with samples 1 and 4 cut at the length limit: their tokens
    leave the loss and its denominator; advantages still come from every reward."""
    algo = dataclasses.replace(ALGO, tis_cap=-1.0, mask_truncated=True)
    trainer = PolicyTrainer(qwen3_checkpoint, algo, device="cpu", trainer_config=SYSTEM)
    records = make_records(prompts=2, group=3, seed=3)
    records = [
        dataclasses.replace(r, finish_reason="length" if i in (1, 4) else "stop")
        for i, r in enumerate(records)
    ]
    rewards = [1.0, 0.0, 0.0, 0.3, 0.6, 0.9]
    metrics = rollout_step(trainer, records, rewards, group=3)
    grouped = np.array(rewards).reshape(2, 3)
    adv = (
        (grouped - grouped.mean(1, keepdims=True))
        / (grouped.std(1, ddof=1, keepdims=True) + algo.adv_eps)
    ).reshape(-1)
    numerator, tokens = 0.0, 0
    for i, record in enumerate(records):  # a plain loop over the kept samples
        if record.finish_reason != "length":
            numerator += adv[i] * len(record.output_ids)
            tokens += len(record.output_ids)
    assert metrics["actor/tokens"] == tokens
    assert metrics["actor/loss"] == pytest.approx(-numerator / tokens, rel=1e-5)


def test_gradient_clipping_reports_the_norm_before_clipping(qwen3_checkpoint):
    algo = dataclasses.replace(ALGO, grad_clip=1e-3)
    trainer = PolicyTrainer(qwen3_checkpoint, algo, device="cpu", trainer_config=SYSTEM)
    metrics = rollout_step(trainer, make_records(seed=4), [0, 1, 0, 1, 1, 0], group=3)
    clipped = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in trainer.model.parameters()])
    )
    assert metrics["actor/grad_norm"] > 1e-2
    assert float(clipped) == pytest.approx(1e-3, rel=1e-4)


def test_several_epochs_step_several_times(qwen3_checkpoint):
    algo = dataclasses.replace(ALGO, ppo_epochs=3)
    trainer = PolicyTrainer(qwen3_checkpoint, algo, device="cpu", trainer_config=SYSTEM)
    metrics = rollout_step(trainer, make_records(seed=5), [0, 1, 0, 1, 1, 0], group=3)
    assert trainer.optimizer_steps == 3 and trainer.step == 1
    # later passes see p_theta != p_old, so the mean ratio over passes moves off 1
    assert metrics["actor/approx_kl"] > 0


def test_save_load_resumes_exactly(qwen3_checkpoint, tmp_path):
    records = make_records(seed=6)
    steps = [[0, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0.5, 0]]
    straight = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", seed=7, trainer_config=SYSTEM)
    rollout_step(straight, records, steps[0], 3)
    straight.save(tmp_path / "ckpt")
    expected = rollout_step(straight, records, steps[1], 3)

    resumed = PolicyTrainer.load(
        tmp_path / "ckpt", ALGO, device="cpu", dtype="auto", trainer_config=SYSTEM
    )
    assert resumed.step == 1 and resumed.seed == 7
    got = rollout_step(resumed, records, steps[1], 3)
    assert got == expected
    want_w, got_w = weights(straight), weights(resumed)
    assert all(torch.equal(got_w[k], want_w[k]) for k in want_w)
    a, b = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in a)


def test_saved_folder_is_a_checkpoint_the_engine_loads(qwen3_checkpoint, tmp_path):
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", trainer_config=SYSTEM)
    rollout_step(trainer, make_records(seed=8), [0, 1, 0, 1, 1, 0], group=3)
    folder = trainer.save(tmp_path / "ckpt")
    ids = torch.tensor([5, 17, 200, 3, 99, 42])
    with torch.no_grad():
        want = trainer.model(input_ids=ids[None]).logits[0]
        decoder = load_model(folder)
        got = decoder.compute_logits(decoder(ids, torch.arange(6), causal_attention([6])))
        synced = load_model(qwen3_checkpoint)  # the old weights, then a weight sync
        synced.load_hf_state_dict(trainer.state_dict_for_sync())
        via_sync = synced.compute_logits(synced(ids, torch.arange(6), causal_attention([6])))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(via_sync, want, rtol=1e-4, atol=1e-4)
    assert load_tokenizer(folder).encode("ab") == load_tokenizer(qwen3_checkpoint).encode("ab")


def test_load_takes_lr_from_the_new_config(qwen3_checkpoint, tmp_path):
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", trainer_config=SYSTEM)
    trainer.save(tmp_path / "ckpt")
    slower = dataclasses.replace(ALGO, lr=1e-5)
    resumed = PolicyTrainer.load(tmp_path / "ckpt", slower, device="cpu", trainer_config=SYSTEM)
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [1e-5]


def test_bad_update_inputs_are_named(qwen3_checkpoint):
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", trainer_config=SYSTEM)
    records = make_records(prompts=2, group=2)
    old = [[0.0] * len(r.output_ids) for r in records]
    with pytest.raises(RLInputError, match="4 records, 3 rewards"):
        trainer.update(records, [0, 1, 0], old, 2)
    with pytest.raises(
        RLInputError,
        match=r"prompt 0 has samples \[0, 1\]; each prompt needs "
        r"group_size=3",
    ):
        trainer.update(records, [0, 1, 0, 1], old, 3)
    short = [o[:-1] for o in old]
    with pytest.raises(RLInputError, match=r"rollout \(0, 0\) has \d+ generated tokens but"):
        trainer.update(records, [0, 1, 0, 1], short, 2)
    with pytest.raises(RLInputError, match="no rollout records"):
        trainer.update([], [], [], 2)
    assert trainer.step == 0


def test_missing_model_directory(tmp_path):
    from sparrow.errors import SparrowError

    with pytest.raises(SparrowError, match=f"model directory {tmp_path / 'none'} does not exist"):
        PolicyTrainer(tmp_path / "none", ALGO, device="cpu", trainer_config=SYSTEM)


def test_nothing_generated_leaves_the_weights(qwen3_checkpoint):
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", trainer_config=SYSTEM)
    usual = rollout_step(trainer, make_records(seed=9), [0, 1, 0, 1, 1, 0], group=3)
    before = weights(trainer)
    empty = [
        dataclasses.replace(
            r, output_ids=(), actor_logprobs=(), topk_ids=(), topk_logprobs=(), pages_read=()
        )
        for r in make_records(seed=9)
    ]
    metrics = trainer.update(empty, [0, 1, 0, 1, 1, 0], [()] * 6, 3)
    assert set(metrics) == set(usual)  # the same keys every step, for the step tables
    assert metrics["actor/tokens"] == 0 and metrics["actor/loss"] == 0
    assert all(torch.equal(before[k], v) for k, v in weights(trainer).items())
    assert trainer.step == 2 and trainer.optimizer_steps == 1


@pytest.mark.parametrize("change", [dict(logits_chunk_tokens=3), dict(gradient_checkpointing=True)])
def test_trainer_memory_options_keep_the_update(qwen3_checkpoint, change):
    records = make_records(prompts=2, group=3, seed=7)
    rewards = [1.0, 0.0, 0.5, 0.0, 1.0, 0.2]
    results = []
    for system in (SYSTEM, dataclasses.replace(SYSTEM, **change)):
        trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", seed=0, trainer_config=system)
        weights_before = weights(trainer)
        metrics = rollout_step(trainer, records, rewards, group=3)
        results.append((metrics, weights(trainer)))
    (m_ref, w_ref), (m_new, w_new) = results
    assert abs(m_ref["actor/loss"]) > 1e-4
    assert m_new["actor/loss"] == pytest.approx(m_ref["actor/loss"], rel=1e-5, abs=1e-7)
    moved = 0
    for name in w_ref:
        # AdamW's first step is about lr = 1e-3 per entry; reordered float32 sums move a few
        # entries whose gradient is near AdamW's eps by a few 1e-6
        torch.testing.assert_close(w_new[name], w_ref[name], rtol=0, atol=1e-5)
        moved += int((w_ref[name] != weights_before[name]).sum())
    assert moved > 0


def test_gradient_checkpointing_wraps_every_layer_in_the_update(qwen3_checkpoint):
    """With trainer.gradient_checkpointing each decoder layer's forward in the update goes through
    the checkpoint function (whose backward recomputes it); scoring (no gradient) never does."""
    records = make_records(prompts=1, group=2, seed=8)
    system = dataclasses.replace(SYSTEM, gradient_checkpointing=True)
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", seed=0, trainer_config=system)
    layers = trainer.model.get_decoder().layers
    calls = [0]
    for layer in layers:
        checkpoint_fn = layer._gradient_checkpointing_func

        def counted(*args, _fn=checkpoint_fn, **kwargs):
            calls[0] += 1
            return _fn(*args, **kwargs)

        layer._gradient_checkpointing_func = counted
    scores = trainer.score(records)
    assert calls[0] == 0
    trainer.update(records, [1.0, 0.0], [s.dense_logprobs for s in scores], 2)
    assert calls[0] == len(layers)  # one micro-batch
    plain = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", seed=0, trainer_config=SYSTEM)
    assert not plain.model.training and not any(
        getattr(layer, "gradient_checkpointing", False)
        for layer in plain.model.get_decoder().layers
    )
