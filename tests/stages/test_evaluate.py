"""evaluate decodes with the plain policy: with DistillSparse the engines hold merge(policy,
LoRA), and a LoRA left in during evaluation would credit the policy with the sparse actor's
adapter. A fake pool answers correctly only without the adapter, so a leak fails the test."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from types import SimpleNamespace

from sparrow.config import load_config
from sparrow.data.datasets import PromptRow
from sparrow.stages.evaluate import evaluate_step


@dataclass(frozen=True)
class Spec:
    weights_path: str = ""
    adapter_path: str = ""


class FakePool:
    """Holds what an ActorPool records of its weights; generate answers "7" with the plain
    policy and "LORA" with an adapter merged in."""

    def __init__(self, weights: str, adapter: str):
        self.spec = Spec(weights, adapter)
        self.loads: list[tuple[str, str]] = []

    def load_weights(self, path: str, adapter_path: str = "") -> list:
        self.spec = replace(self.spec, weights_path=path, adapter_path=adapter_path)
        self.loads.append((path, adapter_path))
        return [path]

    def set_schedule(self, schedule) -> None:
        pass

    def generate(self, prompts, params):
        text = "LORA" if self.spec.adapter_path else "7"
        return [[SimpleNamespace(text=text)] for _ in prompts]


def _runtime(tmp_path, adapter: str):
    cfg = load_config(["data.eval=builtin:synthetic", "data.prompts_per_step=1"])
    rows = [PromptRow(row=i, prompt="p", prompt_ids=(1, 2), answer="7") for i in range(3)]
    return SimpleNamespace(
        cfg=cfg,
        eval_data=_Rows(rows),
        pool=FakePool(str(tmp_path / "policy"), adapter),
        max_context=64,
        policy_state=lambda folder: tmp_path / "state",
        rollout_in_flight=None,  # no one-step-off rollout holds the engines
    )


class _Rows:
    def __init__(self, rows):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, index: int):
        return self.rows[index]


def test_evaluation_takes_the_lora_out_and_puts_it_back(tmp_path):
    runtime = _runtime(tmp_path, adapter=str(tmp_path / "lora"))
    write = evaluate_step(runtime, 1, tmp_path)
    assert write.metrics["eval/accuracy"] == 1.0  # "LORA" would score 0
    state = str(tmp_path / "state")
    assert runtime.pool.loads == [(state, ""), (state, str(tmp_path / "lora"))]
    assert runtime.pool.spec.adapter_path == str(tmp_path / "lora")  # the next rollout's
    assert json.loads((tmp_path / "eval.json").read_text())["adapter_removed"] is True


def test_without_distill_the_weights_stay(tmp_path):
    runtime = _runtime(tmp_path, adapter="")
    assert evaluate_step(runtime, 1, tmp_path).metrics["eval/accuracy"] == 1.0
    assert runtime.pool.loads == []
    assert json.loads((tmp_path / "eval.json").read_text())["adapter_removed"] is False
