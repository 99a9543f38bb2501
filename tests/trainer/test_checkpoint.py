"""Trainer checkpoint folders: layout, write-then-rename, refusals and named read errors.

python -m pytest tests/trainer/test_checkpoint.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from sparrow.trainer.checkpoint import (
    TrainerCheckpointError,
    read_checkpoint_state,
    restore_rng_state,
    save_checkpoint,
)


@pytest.fixture()
def model_and_optimizer(qwen3_checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(qwen3_checkpoint, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    return model, optimizer


def test_layout_and_round_trip(model_and_optimizer, qwen3_checkpoint, tmp_path):
    model, optimizer = model_and_optimizer
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    folder = save_checkpoint(tmp_path / "ck", model, optimizer, qwen3_checkpoint, {"step": 4})
    names = {p.name for p in folder.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "optimizer.pt",
        "rng_state.pt",
        "trainer_state.json",
    } <= names
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no scratch folder left behind
    state = read_checkpoint_state(folder)
    assert state.meta["step"] == 4 and state.meta["format_version"] == 1
    saved = optimizer.state_dict()["state"]
    assert all(
        torch.equal(state.optimizer["state"][i]["exp_avg"], saved[i]["exp_avg"]) for i in saved
    )
    torch.rand(5)  # move the generator on, then restore it
    restore_rng_state(state.rng)
    assert torch.equal(torch.rand(3), expected_draw)


def test_refuses_a_non_empty_folder(model_and_optimizer, qwen3_checkpoint, tmp_path):
    model, optimizer = model_and_optimizer
    (tmp_path / "ck").mkdir()
    save_checkpoint(tmp_path / "ck", model, optimizer, qwen3_checkpoint, {"step": 1})  # empty: ok
    with pytest.raises(TrainerCheckpointError, match=f"{tmp_path / 'ck'} already exists"):
        save_checkpoint(tmp_path / "ck", model, optimizer, qwen3_checkpoint, {"step": 2})
    assert json.loads((tmp_path / "ck" / "trainer_state.json").read_text())["step"] == 1


def test_read_errors_name_the_folder_and_file(model_and_optimizer, qwen3_checkpoint, tmp_path):
    with pytest.raises(TrainerCheckpointError, match="does not exist"):
        read_checkpoint_state(tmp_path / "none")
    with pytest.raises(TrainerCheckpointError, match=r"has no trainer_state.json"):
        read_checkpoint_state(qwen3_checkpoint)  # a model folder, not a trainer checkpoint
    model, optimizer = model_and_optimizer
    folder = save_checkpoint(tmp_path / "ck", model, optimizer, qwen3_checkpoint, {"step": 1})
    (folder / "optimizer.pt").write_bytes(b"garbage")
    with pytest.raises(TrainerCheckpointError, match=f"{folder} is unreadable"):
        read_checkpoint_state(folder)
    (folder / "optimizer.pt").unlink()
    with pytest.raises(TrainerCheckpointError, match="has neither optimizer.pt nor sharded_state/"):
        read_checkpoint_state(folder)
    (folder / "sharded_state").mkdir()  # a trainer group's: its shards load with the model
    assert read_checkpoint_state(folder).optimizer is None
    folder2 = save_checkpoint(tmp_path / "ck2", model, optimizer, qwen3_checkpoint, {"step": 1})
    (folder2 / "trainer_state.json").write_text(json.dumps({"format_version": 99, "step": 1}))
    with pytest.raises(TrainerCheckpointError, match="format_version 99"):
        read_checkpoint_state(folder2)
