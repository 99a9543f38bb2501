"""`sparrow export`: a run's policy as a clean bf16 Hugging Face folder that transformers
loads with the trainer's logits.

python -m pytest tests/trainer/test_export.py -q
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from sparrow.cli.main import main
from sparrow.config.schema import AlgoConfig
from sparrow.model.builtin import resolve_model_path
from sparrow.trainer.policy_trainer import PolicyTrainer

RUN = "run-export"


@pytest.fixture(scope="module")
def run_with_policy(tmp_path_factory):
    """A workdir whose run saved the tiny model's trainer at step 2 (optimizer state and all)."""
    workdir = tmp_path_factory.mktemp("work")
    trainer = PolicyTrainer(resolve_model_path("builtin:tiny"), AlgoConfig(), device="cpu")
    with torch.no_grad():  # weights no bf16 holds exactly, so the export must round them
        for parameter in trainer.model.parameters():
            parameter.add_(torch.randn_like(parameter) * 1e-3)
    trainer.save(workdir / "runs" / RUN / "step-2" / "policy_update")
    return workdir, trainer


def test_the_export_loads_in_transformers_with_the_trainers_logits(run_with_policy, tmp_path):
    workdir, trainer = run_with_policy
    out = tmp_path / "exported"
    assert main(["export", RUN, str(out), "--step", "2", "--workdir", str(workdir)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert not names & {"optimizer.pt", "rng_state.pt", "trainer_state.json", "sharded_state"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"

    exported = AutoModelForCausalLM.from_pretrained(out)
    assert {p.dtype for p in exported.parameters()} == {torch.bfloat16}
    ids = torch.tensor([[4, 9, 17, 3, 22, 30, 2, 11]])
    rounded = copy.deepcopy(trainer.model).float()
    with torch.no_grad():
        for parameter in rounded.parameters():  # the trainer's weights as bf16 holds them
            parameter.copy_(parameter.to(torch.bfloat16).float())
        want = rounded(ids).logits
        got = exported.float()(ids).logits
        trainer_logits = trainer.model.float()(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # same weights, same logits
    # against the fp32 trainer: only bf16's rounding of the weights apart (8 bits of mantissa:
    # 0.6% of the largest logit measured)
    apart = float((got - trainer_logits).abs().max() / trainer_logits.abs().max())
    assert 0 < apart < 0.02


def test_errors_name_what_is_there(run_with_policy, tmp_path, capsys):
    workdir, _ = run_with_policy
    assert main(["export", RUN, str(tmp_path / "a"), "--step", "5", "--workdir", str(workdir)]) == 2
    assert "no policy weights for step 5; steps with weights: 2" in capsys.readouterr().err
    assert main(["export", "nope", str(tmp_path / "b"), "--workdir", str(workdir)]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["export", RUN, str(tmp_path / "full"), "--workdir", str(workdir)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
