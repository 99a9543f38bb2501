"""The rollout stage's dynamic sampling on a stand-in pool: draws until the batch holds
prompts_per_step groups whose rewards differ, each draw from its own rows and seeds.

python -m pytest tests/runtime/rollout/test_dynamic_draws.py -q
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from sparrow.config import SparrowConfig
from sparrow.data.datasets import load_prompts
from sparrow.runtime.rollout.dynamic_draws import informative_rollouts
from sparrow.runtime.rollout.requests import sampling_params


class ByteEncoder:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class Pool:
    """Answers "7" on every sample of a prompt whose text ends in an even digit (an
    uninformative group: all right), else "7" and "8" in turn (informative)."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params):
        self.calls.append(([bytes(p).decode() for p in prompts], [p.seed for p in params]))
        out = []
        for prompt, param in zip(prompts, params):
            even = int(bytes(prompt).decode()[-1]) % 2 == 0
            texts = ["7"] * param.n if even else ["7", "8"] * (param.n // 2)
            out.append([sample(i, t) for i, t in enumerate(texts)])
        return out


def sample(index, text):
    return SimpleNamespace(
        sample_index=index,
        output_ids=(1,),
        logprobs=(0.0,),
        topk_ids=((1,),),
        topk_logprobs=((0.0,),),
        pages_read=(1,),
        finish_reason="stop",
        text=text,
    )


def test_draws_until_enough_groups_differ(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(f'{{"prompt": "q{i}", "answer": "7"}}\n' for i in range(40)))
    cfg = SparrowConfig()
    cfg = dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, prompts_per_step=4),
        rollout=dataclasses.replace(cfg.rollout, samples_per_prompt=2, max_new_tokens=8),
        algo=dataclasses.replace(cfg.algo, dynamic_sampling=True, dynamic_sampling_max_draws=6),
    )
    data = load_prompts(str(path), "prompt", "answer", ByteEncoder(), 16, seed=1)
    runtime = SimpleNamespace(cfg=cfg, train_data=data, pool=Pool(), max_context=64)
    rows = data.batch(2, 4)
    rows_out, results, metrics = informative_rollouts(
        runtime, 3, rows, sampling_params(runtime, rows, 3)
    )
    # a plain loop over the same draws: odd-numbered prompts are the informative ones
    expected, draws = [], 0
    for d in range(6):
        if len(expected) >= 4:
            break
        draws += 1
        for row in data.batch(2, 4, draw=d):
            if int(row.prompt[-1]) % 2 and len(expected) < 4:
                expected.append(row.prompt)
    assert [r.prompt for r in rows_out] == expected
    assert metrics["dynamic/draws"] == draws == len(runtime.pool.calls)
    assert draws > 1, "the step's own batch alone should not have been enough"
    assert metrics["dynamic/informative_frac"] == 1.0
    assert all(len(samples) == 2 for samples in results)
    seeds = [seed for _, call_seeds in runtime.pool.calls for seed in call_seeds]
    assert len(set(seeds)) == len(seeds)  # every request of every draw seeded apart
    drawn = [prompt for prompts, _ in runtime.pool.calls for prompt in prompts]
    assert drawn[:4] == [r.prompt for r in rows]  # draw 0 is the step's own batch
