"""Stage 9, evaluate: greedy accuracy of the updated policy on the evaluation prompts.

    outcome = evaluate_task(workdir, run_id, step)    # .../evaluate/eval.json; eval/accuracy

Runs every `pipeline.eval_every` steps when `data.eval` is set (the flow decides), after
sync_weights, so the rollout actors hold the step's policy. The prompts are the first
data.prompts_per_step x rollout.samples_per_prompt rows of the evaluation set (fewer if it is
smaller): the same number of sequences as a rollout step. Each is decoded densely (the
policy's own accuracy, not the sparse actor's): greedily, or with pipeline.eval_temperature > 0
one sample at that temperature (where greedy is already right, as on the GPU testbed, the
sampled accuracy is what RL moves); scored by data.reward, eval/accuracy is the mean reward
(the fraction correct for 0/1 rewards such as exact_match).

With DistillSparse the engines hold merge(policy, LoRA) after sync_weights: the LoRA belongs
to the sparse actor only, so the stage loads the plain policy (its policy_update folder) into
the engines for the evaluation and puts the merged weights back after it (eval.json's
"adapter_removed" says whether it did). Evaluating on the merged weights credited the
policy with the LoRA's work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.reward_runner import score_completions
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.rollout.in_flight import ensure_engine_version, settle_rollout
from sparrow.runtime.rollout.requests import sampling_params
from sparrow.runtime.run_runtime import RunRuntime, lookup


def eval_rows(runtime: RunRuntime) -> list:
    cfg = runtime.cfg
    count = min(len(runtime.eval_data), cfg.data.prompts_per_step * cfg.rollout.samples_per_prompt)
    return [runtime.eval_data.row(i) for i in range(count)]


@contextmanager
def dense_policy(runtime: RunRuntime) -> Iterator[bool]:
    """The engines hold the plain policy inside the block; True when a LoRA was taken out
    (and is merged back on the way out)."""
    pool = runtime.pool
    adapter = pool.spec.adapter_path
    if not adapter:
        yield False
        return
    policy = str(runtime.policy_state(pool.spec.weights_path))
    pool.load_weights(policy)
    try:
        yield True
    finally:
        pool.load_weights(policy, adapter)


def evaluate_step(runtime: RunRuntime, step: int, out: Path) -> StageWrite:
    settle_rollout(runtime)  # one-step-off: the next step's rollout holds the engines
    if runtime.cfg.pipeline.max_staleness:
        ensure_engine_version(runtime, step)  # the policy after this step's update
    rows = eval_rows(runtime)
    params = sampling_params(runtime, rows, step, greedy=True, source=runtime.cfg.data.eval)
    temperature = runtime.cfg.pipeline.eval_temperature
    if temperature > 0:  # one sample a prompt, seeded per (run, step, prompt) as rollouts are
        params = [dataclasses.replace(p, temperature=temperature) for p in params]
    runtime.pool.set_schedule(None)  # the next rollout sets the schedule in force again
    with dense_policy(runtime) as adapter_removed:
        results = runtime.pool.generate([list(row.prompt_ids) for row in rows], params)
    texts = [samples[0].text or "" for samples in results]
    data = runtime.cfg.data
    batch = score_completions(
        data.reward, texts, [row.answer for row in rows], timeout_s=data.reward_timeout_s
    )
    accuracy = float(np.mean(batch.rewards))
    contract.write_json(
        contract.EVAL.under(out),
        {
            "step": step,
            "dataset": data.eval,
            "temperature": temperature,
            "accuracy": accuracy,
            "adapter_removed": adapter_removed,
            "errors": batch.errors,
            "rows": [
                {
                    "row": row.row,
                    "prompt": row.prompt,
                    "answer": row.answer,
                    "completion": text,
                    "reward": reward,
                }
                for row, text, reward in zip(rows, texts, batch.rewards)
            ],
        },
    )
    return StageWrite(
        metrics={
            "eval/accuracy": accuracy,
            "eval/prompts": float(len(rows)),
            "eval/temperature": float(temperature),
        }
    )


@task(name="evaluate", cache_policy=NONE, **INFRA_RETRIES)
def evaluate_task(workdir: str, run_id: str, step: int) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(runtime, "evaluate", step, lambda out: evaluate_step(runtime, step, out))
