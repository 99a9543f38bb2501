"""Shared inputs of the DistillSparse tests: the tiny model and a few sparse rollouts of it."""

from __future__ import annotations

import torch

from sparrow.data.rollouts import RolloutRecord


def sparse_rollouts(model_path, schedule, prompts=2, samples=2, new_tokens=40, seed=1):
    """RolloutRecords sampled by the engine under `schedule` from the synthetic task's prompts."""
    from sparrow.data.datasets import load_prompts
    from sparrow.engine import Engine, EngineConfig, SamplingParams
    from sparrow.model import load_model, load_tokenizer

    tokenizer = load_tokenizer(model_path)
    engine = Engine(
        load_model(model_path, dtype=torch.float32),
        tokenizer,
        EngineConfig(page_size=schedule.page_size),
        schedule,
    )
    rows = load_prompts(
        "builtin:synthetic", "prompt", "answer", tokenizer, 1024, split="train", seed=0
    ).batch(0, prompts)
    ids = [list(r.prompt_ids) for r in rows]
    results = engine.generate(
        ids,
        SamplingParams(
            n=samples, max_new_tokens=new_tokens, temperature=1.5, seed=seed, logprobs_topk=4
        ),
    )
    return [
        RolloutRecord(
            p,
            s.sample_index,
            0,
            tuple(ids[p]),
            tuple(s.output_ids),
            tuple(s.logprobs),
            s.topk_ids,
            s.topk_logprobs,
            tuple(s.pages_read),
            s.finish_reason,
            "",
        )
        for p, group in enumerate(results)
        for s in group
    ]


def measured_around_steps(distiller, records, schedule, steps: int = 8) -> tuple[dict, dict]:
    """The distiller's metrics on `records` before and after `steps` LoRA steps on them
    (the measurements themselves update nothing)."""
    first = distiller.distill(records, schedule, update=False)
    for _ in range(steps):
        distiller.distill(records, schedule)
    return first, distiller.distill(records, schedule, update=False)
