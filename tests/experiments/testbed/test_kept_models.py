"""The study's starting models kept in models/ (docs/study.md, docs/testbed.md): each folder
holds the weights its training_info.json names, admitted by the study's rule, and they still
know the task: the lookups of held-out prompts are the model's argmax.

python -m pytest tests/experiments/testbed/test_kept_models.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ForCausalLM

from sparrow.experiments.testbed.data import VARIANTS, held_out_examples
from sparrow.experiments.testbed.evaluate import teacher_forced_accuracy
from sparrow.experiments.testbed.phases import kept_weights_sha256

MODELS = Path(__file__).resolve().parents[3] / "models"
ADMISSION = (0.3, 0.6)  # docs/study.md: the starting model's sampled graded reward


@pytest.mark.parametrize("variant", ["v2", "v3"])
def test_the_kept_model_is_the_admitted_one_and_knows_its_lookups(variant):
    folder = MODELS / f"testbed-{variant}-small"
    info = json.loads((folder / "training_info.json").read_text())
    assert kept_weights_sha256(folder) == info["model_safetensors_sha256"]
    assert info["args"]["variant"] == variant and info["args"]["model_size"] == "small"
    assert ADMISSION[0] <= info["held_out_sampled_accuracy"] <= ADMISSION[1]

    sizes = VARIANTS[variant].sizes()
    assert info["task_sizes"] == sizes
    examples = held_out_examples(count=2, seed=info["seed"], **sizes)
    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32)
    found = teacher_forced_accuracy(model, examples)
    # training_info measured 0.98-0.99 per hop on 64 prompts; an untrained model gets ~0
    assert found["argmax_by_role"]["lookup"] >= 0.95
