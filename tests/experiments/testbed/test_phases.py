"""The noisy phase's start (by the plan's step or by the clock, whichever first) and the
start from a kept model (--init-from): a fake clock, a saved tiny Qwen3."""

from __future__ import annotations

import json

import pytest
from transformers import Qwen3Config, Qwen3ForCausalLM

from sparrow.experiments.testbed.phases import NoisePhase, StartError, load_start


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_plan_begins_the_phase_when_time_is_left():
    clock = Clock()
    phase = NoisePhase(clean_steps=8, noise_share=0.25, began=0.0, deadline=100.0, clock=clock)
    for step in range(8):
        clock.now = step  # far from the clean phase's 75 s
        assert not phase.noisy(step)
    assert phase.noisy(8) and phase.started_at == 8 and not phase.cut_by_time
    assert phase.record(10) == {
        "clean_steps_done": 8,
        "noise_steps_done": 2,
        "curriculum_cut_by_time": False,
    }


def test_the_clock_begins_the_phase_when_steps_run_slow():
    clock = Clock()
    phase = NoisePhase(clean_steps=1000, noise_share=0.25, began=10.0, deadline=110.0, clock=clock)
    clock.now = 84.9  # 74.9 s of the 75 s the clean phase may use
    assert not phase.noisy(40)
    clock.now = 85.0
    assert phase.noisy(41) and phase.started_at == 41 and phase.cut_by_time
    clock.now = 0.0  # once begun, it stays begun
    assert phase.noisy(42)
    assert phase.record(50)["noise_steps_done"] == 9


def test_no_noise_share_never_begins_it():
    clock = Clock()
    phase = NoisePhase(clean_steps=4, noise_share=0.0, began=0.0, deadline=1.0, clock=clock)
    clock.now = 5.0
    assert not any(phase.noisy(step) for step in range(10))
    assert phase.record(10) == {
        "clean_steps_done": 10,
        "noise_steps_done": 0,
        "curriculum_cut_by_time": False,
    }


SIZES = dict(layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=64)


@pytest.fixture()
def kept(tmp_path):
    config = Qwen3Config(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
    )
    Qwen3ForCausalLM(config).save_pretrained(tmp_path / "kept")
    (tmp_path / "kept" / "training_info.json").write_text(
        json.dumps({"model_safetensors_sha256": "abc"})
    )
    return tmp_path / "kept"


def test_a_kept_model_starts_the_run_and_names_its_source(kept):
    model, source = load_start(kept, SIZES)
    assert source == {"path": str(kept), "model_safetensors_sha256": "abc"}
    assert next(model.parameters()).dtype.is_floating_point
    assert str(next(model.parameters()).dtype) == "torch.float32"


def test_a_folder_without_weights_or_of_other_sizes_is_refused(kept, tmp_path):
    with pytest.raises(StartError, match="no model.safetensors"):
        load_start(tmp_path / "empty", SIZES)
    with pytest.raises(StartError, match=r"layers 3 \(the model has 2\).*head_dim 16"):
        load_start(kept, SIZES | {"layers": 3, "head_dim": 16})
