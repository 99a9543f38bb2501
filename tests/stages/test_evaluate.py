"""evaluate decodes with the plain policy: with DistillSparse the engines hold merge(policy,
LoRA), and a LoRA left in during evaluation would credit the policy with the sparse actor's
adapter. A fake pool answers correctly only without the adapter, so a leak fails the test."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from sparrow.config import load_config
from sparrow.data.datasets import PromptRow
from sparrow.stages.evaluate import eval_rows, evaluate_step


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
    def __init__(self, rows, endless: bool = False):
        self.rows = rows
        self.endless = endless

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


class ScriptedPool:
    """Answers sample j of the prompt whose first id is i with script[i][j], as many samples
    as each request asks; records the requests and the schedule set."""

    def __init__(self, script: dict[int, list[str]]):
        self.script = script
        self.spec = Spec()
        self.schedule = "sparse"

    def set_schedule(self, schedule) -> None:
        self.schedule = schedule

    def generate(self, prompts, params):
        self.params = params
        return [
            [SimpleNamespace(text=self.script[p[0]][j]) for j in range(request.n)]
            for p, request in zip(prompts, params)
        ]


def test_samples_per_prompt_give_accuracy_and_pass_at_k_per_data_source(tmp_path):
    from sparrow.storage import Store
    from sparrow.storage.eval_rows import eval_results

    cfg = load_config(
        [
            "data.eval=/data/eval.parquet",
            "pipeline.eval_samples=4",
            "pipeline.eval_temperature=0.7",
        ]
    )
    sources = ["openai/gsm8k", "aime@2024", "openai/gsm8k"]
    rows = [
        PromptRow(row=i, prompt="p", prompt_ids=(i, 9), answer="7", data_source=source)
        for i, source in enumerate(sources)
    ]
    pool = ScriptedPool({0: ["7", "7", "x", "x"], 1: ["x"] * 4, 2: ["x", "7", "x", "x"]})
    runtime = SimpleNamespace(
        cfg=cfg,
        eval_data=_Rows(rows),
        pool=pool,
        max_context=64,
        run_id="r1",
        rollout_in_flight=None,  # no one-step-off rollout holds the engines
    )
    write = evaluate_step(runtime, 3, tmp_path)
    assert pool.schedule is None  # dense
    assert [(p.n, p.temperature) for p in pool.params] == [(4, 0.7)] * 3
    m = write.metrics
    # gsm8k: 2 of 4 and 1 of 4 right; pass@2 = mean(1 - C(2,2)/C(4,2), 1 - C(3,2)/C(4,2))
    assert m["eval/openai/gsm8k/accuracy"] == pytest.approx(3 / 8)
    assert m["eval/openai/gsm8k/pass_at_1"] == pytest.approx(3 / 8)
    assert m["eval/openai/gsm8k/pass_at_2"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert m["eval/openai/gsm8k/pass_at_4"] == 1.0
    assert m["eval/aime_2024/accuracy"] == 0.0 and m["eval/aime_2024/pass_at_4"] == 0.0
    assert m["eval/accuracy"] == pytest.approx(3 / 12)
    assert m["eval/pass_at_2"] == pytest.approx((5 / 6 + 1 / 2) / 3)
    assert (m["eval/prompts"], m["eval/samples"]) == (3.0, 4.0)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["rows"][0]["completions"] == ["7", "7", "x", "x"]
    assert saved["rows"][0]["rewards"] == [1.0, 1.0, 0.0, 0.0]
    # the rows the stage's transaction writes
    with Store.open_writer(tmp_path / "work") as store:
        with store.connect() as conn:
            write.db(conn)
        stored = eval_results(store, "r1")
    assert [(r["data_source"], r["k"]) for r in stored] == [
        ("aime@2024", 1),
        ("aime@2024", 2),
        ("aime@2024", 4),
        ("openai/gsm8k", 1),
        ("openai/gsm8k", 2),
        ("openai/gsm8k", 4),
    ]
    gsm_pass2 = stored[4]
    assert gsm_pass2["step"] == 3 and gsm_pass2["pass_at_k"] == pytest.approx(2 / 3)
    assert (gsm_pass2["prompts"], gsm_pass2["samples_per_prompt"]) == (2, 4)


def test_a_file_is_evaluated_whole_and_eval_prompts_caps_it():
    rows = [PromptRow(row=i, prompt="p", prompt_ids=(1,), answer="7") for i in range(20)]
    cfg = load_config(["data.eval=/data/eval.jsonl", "data.prompts_per_step=1"])
    runtime = SimpleNamespace(cfg=cfg, eval_data=_Rows(rows))
    assert len(eval_rows(runtime)) == 20
    runtime.cfg = load_config(["data.eval=/data/eval.jsonl", "pipeline.eval_prompts=5"])
    assert [r.row for r in eval_rows(runtime)] == [0, 1, 2, 3, 4]
    runtime.cfg = load_config(["data.eval=builtin:synthetic", "data.prompts_per_step=1"])
    runtime.eval_data = _Rows(rows, endless=True)
    assert len(eval_rows(runtime)) == 8  # 1 prompt x 8 samples_per_prompt rows
