"""Stage 9, evaluate: accuracy and pass@k of the updated policy on the evaluation prompts.

    outcome = evaluate_task(workdir, run_id, step)    # .../evaluate/eval.json; eval/accuracy

Runs every `pipeline.eval_every` steps when `data.eval` is set (the flow decides), after
sync_weights, so the rollout actors hold the step's policy. The prompts are rows 0.. of the
evaluation set: `pipeline.eval_prompts` of them, or with 0 every row of a file (a community
layout file too) and data.prompts_per_step x rollout.samples_per_prompt rows of a built-in
task. Each is decoded densely (the policy's own accuracy, not the sparse actor's): greedily,
or with pipeline.eval_temperature > 0 `pipeline.eval_samples` samples at that temperature
(where greedy is already right, as on the GPU testbed, the sampled accuracy is what RL
moves). Every sample is scored by its data_source's reward (data.reward_by_source, else
data.reward) without data.format_reward. eval/accuracy is the mean reward (the fraction
correct for 0/1 rewards such as exact_match); eval/pass_at_<k> the unbiased pass@k for each k
of pipeline.eval_pass_k (sparrow/data/eval_scores.py); both again per data_source as
eval/<source>/accuracy and eval/<source>/pass_at_<k>, and as DuckDB's eval_results rows,
written in the transaction that records the stage (a resumed run skips a recorded
evaluation, and a re-run replaces its rows).

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

from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.eval_scores import (
    SourceScore,
    default_ks,
    metric_source,
    score,
    scores_by_source,
)
from sparrow.data.reward_routing import score_samples
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.rollout.in_flight import ensure_engine_version, settle_rollout
from sparrow.runtime.rollout.requests import sampling_params
from sparrow.runtime.run_runtime import RunRuntime, lookup
from sparrow.storage.eval_rows import replace_eval_results


def eval_rows(runtime: RunRuntime) -> list:
    """Rows 0.. of the evaluation set: pipeline.eval_prompts of them; with 0, every row of a
    file (a shipped one too), or prompts_per_step x samples_per_prompt rows of a synthetic
    task (endless)."""
    cfg = runtime.cfg
    count = cfg.pipeline.eval_prompts or len(runtime.eval_data)
    if not cfg.pipeline.eval_prompts and runtime.eval_data.endless:
        count = cfg.data.prompts_per_step * cfg.rollout.samples_per_prompt
    count = min(len(runtime.eval_data), count)
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


def generate(runtime: RunRuntime, rows: list, step: int) -> tuple[list[list[str]], bool]:
    """(each row's completions, whether a LoRA was taken out for them): decoded densely by the
    plain policy, one greedy or pipeline.eval_samples at pipeline.eval_temperature, seeded per
    (run, step, prompt) as rollout requests are."""
    pipeline = runtime.cfg.pipeline
    params = sampling_params(runtime, rows, step, greedy=True, source=runtime.cfg.data.eval)
    if pipeline.eval_temperature > 0:
        params = [
            dataclasses.replace(p, temperature=pipeline.eval_temperature, n=pipeline.eval_samples)
            for p in params
        ]
    runtime.pool.set_schedule(None)  # the next rollout sets the schedule in force again
    with dense_policy(runtime) as adapter_removed:
        results = runtime.pool.generate([list(row.prompt_ids) for row in rows], params)
    return [[sample.text or "" for sample in samples] for samples in results], adapter_removed


def score_rows(runtime: RunRuntime, rows: list, completions: list[list[str]]):
    """(each row's rewards, the reward batch): every sample by its data_source's reward, with
    no format bonus (evaluation counts answers, not form)."""
    data = runtime.cfg.data
    repeat = [(row, text) for row, texts in zip(rows, completions) for text in texts]
    batch = score_samples(
        data.reward,
        data.reward_by_source,
        [text for _, text in repeat],
        [row.answer for row, _ in repeat],
        [row.data_source for row, _ in repeat],
        [row.extra_info for row, _ in repeat],
        timeout_s=data.reward_timeout_s,
    )
    rewards, start = [], 0
    for texts in completions:
        rewards.append(batch.rewards[start : start + len(texts)])
        start += len(texts)
    return rewards, batch


def eval_metrics(overall: SourceScore, by_source: list[SourceScore], temperature: float) -> dict:
    """eval/accuracy and eval/pass_at_<k> over every prompt, the same per data_source under
    eval/<source>/ when the rows name their sources (MLflow refuses "@" in a name)."""
    metrics = {
        "eval/accuracy": overall.accuracy,
        "eval/prompts": float(overall.prompts),
        "eval/samples": float(overall.samples_per_prompt),
        "eval/temperature": float(temperature),
        **{f"eval/pass_at_{k}": value for k, value in overall.pass_at.items()},
    }
    for source in by_source if any(s.data_source for s in by_source) else ():
        prefix = f"eval/{metric_source(source.data_source)}"
        metrics[f"{prefix}/accuracy"] = source.accuracy
        metrics.update({f"{prefix}/pass_at_{k}": v for k, v in source.pass_at.items()})
    return metrics


def result_rows(scores: list[SourceScore]) -> list[dict]:
    """eval_results rows: one per (data_source, k)."""
    return [
        {
            "data_source": s.data_source,
            "k": k,
            "pass_at_k": value,
            "accuracy": s.accuracy,
            "prompts": s.prompts,
            "samples_per_prompt": s.samples_per_prompt,
        }
        for s in scores
        for k, value in s.pass_at.items()
    ]


def evaluate_step(runtime: RunRuntime, step: int, out: Path) -> StageWrite:
    pipeline = runtime.cfg.pipeline
    settle_rollout(runtime)  # one-step-off: the next step's rollout holds the engines
    if pipeline.max_staleness:
        ensure_engine_version(runtime, step)  # the policy after this step's update
    rows = eval_rows(runtime)
    completions, adapter_removed = generate(runtime, rows, step)
    rewards, batch = score_rows(runtime, rows, completions)
    ks = pipeline.eval_pass_k or default_ks(len(completions[0]))
    overall = score("", rewards, ks)
    by_source = scores_by_source([row.data_source for row in rows], rewards, ks)
    contract.write_json(
        contract.EVAL.under(out),
        {
            "step": step,
            "dataset": runtime.cfg.data.eval,
            "temperature": pipeline.eval_temperature,
            "accuracy": overall.accuracy,
            "pass_at": {str(k): v for k, v in overall.pass_at.items()},
            "sources": [dataclasses.asdict(s) for s in by_source],
            "adapter_removed": adapter_removed,
            "errors": batch.errors,
            "rows": [
                {
                    "row": row.row,
                    "data_source": row.data_source,
                    "prompt": row.prompt,
                    "answer": row.answer,
                    "completions": texts,
                    "rewards": row_rewards,
                }
                for row, texts, row_rewards in zip(rows, completions, rewards)
            ],
        },
    )
    rows_by_source = result_rows(by_source)
    return StageWrite(
        metrics=eval_metrics(overall, by_source, pipeline.eval_temperature),
        db=lambda conn: replace_eval_results(conn, runtime.run_id, step, rows_by_source),
    )


@task(name="evaluate", cache_policy=NONE, **INFRA_RETRIES)
def evaluate_task(workdir: str, run_id: str, step: int) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(runtime, "evaluate", step, lambda out: evaluate_step(runtime, step, out))
