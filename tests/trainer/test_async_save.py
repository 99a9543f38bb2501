"""A checkpoint written in the background equals one written by save(), and loads back.

python -m pytest tests/trainer/test_async_save.py -q
"""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from sparrow.config.schema import AlgoConfig
from sparrow.trainer.checkpoint import read_checkpoint_state
from sparrow.trainer.policy_trainer import PolicyTrainer

ALGO = AlgoConfig(lr=1e-3)


def test_background_save_equals_save(qwen3_checkpoint, tmp_path):
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", seed=0)
    # give the optimizer moments: one step on a made-up loss
    loss = sum((p.float() ** 2).sum() for p in trainer.model.parameters())
    loss.backward()
    trainer.optimizer.step()
    trainer.save(tmp_path / "sync")
    future = trainer.save_in_background(tmp_path / "background")
    assert future.result() == tmp_path / "background"
    trainer.wait_for_save()
    want, got = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("sync", "background"))
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    state_want, state_got = (read_checkpoint_state(tmp_path / n) for n in ("sync", "background"))
    assert state_want.meta == state_got.meta
    moments = [
        (a, b)
        for a, b in zip(
            state_want.optimizer["state"].values(), state_got.optimizer["state"].values()
        )
    ]
    assert moments and all(torch.equal(a["exp_avg_sq"], b["exp_avg_sq"]) for a, b in moments)
    # the background folder is a checkpoint the trainer resumes from
    resumed = PolicyTrainer.load(tmp_path / "background", ALGO, device="cpu")
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def test_a_second_save_waits_for_the_first(qwen3_checkpoint, tmp_path):
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", seed=0)
    first = trainer.save_in_background(tmp_path / "a")
    second = trainer.save_in_background(tmp_path / "b")
    assert first.done()
    second.result()
    assert (tmp_path / "a" / "optimizer.pt").is_file() and (
        tmp_path / "b" / "config.json"
    ).is_file()
