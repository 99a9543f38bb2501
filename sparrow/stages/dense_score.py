"""Stage 3, dense_score: the dense policy re-reads every sample.

    outcome = dense_score_task(workdir, run_id, step, rollouts_path)  # .../dense_score/scores.parquet

The trainer (the transformers model of the policy as it was when the step began, SDPA
attention) gives each generated token its dense logprob, the PPO "old" logprob, and its
acceptance rate against the actor's top-K with the leftover actor mass
(PolicyTrainer.score). scores.parquet (sparrow/runtime/ledger/contract.py) has one row per sample, in the rollout file's order:
prompt_index, sample_index, and the lists dense_logprobs, acceptance, leftover_mass (float64,
so the update reads back exactly what was computed). Step metrics: time/dense_forward_s (the
scoring), time/dense_read_s (reading the rollout file), dense/tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.rollouts import read_rollouts
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import RunRuntime, lookup, peak_memory


def score_step(runtime: RunRuntime, step: int, rollouts_path: str, out: Path) -> StageWrite:
    clock = time.perf_counter()
    records = read_rollouts(rollouts_path)
    read_seconds = time.perf_counter() - clock
    trainer = runtime.trainer_before(step)
    with peak_memory() as peak:
        clock = time.perf_counter()
        scores = trainer.score(records)
        seconds = time.perf_counter() - clock
    contract.write_scores(contract.SCORES.under(out), records, scores)
    tokens = sum(len(r.output_ids) for r in records)
    return StageWrite(
        metrics={
            "dense/tokens": float(tokens),
            "time/dense_forward_s": seconds,
            "time/dense_read_s": read_seconds,
            **peak("memory/score_peak_gib"),
        }
    )


@task(name="dense_score", cache_policy=NONE, **INFRA_RETRIES)
def dense_score_task(workdir: str, run_id: str, step: int, rollouts_path: str) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(
        runtime, "dense_score", step, lambda out: score_step(runtime, step, rollouts_path, out)
    )
