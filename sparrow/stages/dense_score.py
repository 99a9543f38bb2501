"""Stage 3, dense_score: the dense policy re-reads every sample.

    outcome = dense_score_task(workdir, run_id, step, rollouts_path)  # .../dense_score/scores.parquet

The trainer (the transformers model of the policy as it was when the step began, SDPA
attention) gives each generated token its dense logprob, the PPO "old" logprob, and its
acceptance rate against the actor's top-K with the leftover actor mass
(PolicyTrainer.score). scores.parquet (sparrow/runtime/ledger/contract.py) has one row per sample, in the rollout file's order:
prompt_index, sample_index, and the lists dense_logprobs, acceptance, leftover_mass (float64,
so the update reads back exactly what was computed), and version_dense_logprobs,
sparse_acceptance: the same against the dense policy of the version that generated the sample
(sparrow/trainer/version_scores.py, read from that version's policy folder; with a trainer
group, by its rank 0), which for a fresh sample (version step - 1, every sample of a
synchronous run) are the same numbers.
Step metrics: time/dense_forward_s (the scoring), time/dense_read_s (reading the rollout
file), dense/tokens, dense/stale_samples (samples of an older version) and, when there are
any, time/dense_version_s (scoring them against their own version).
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
    clock = time.perf_counter()
    version_scores, stale = scores_of_versions(runtime, trainer, step, records, scores)
    version_seconds = {"time/dense_version_s": time.perf_counter() - clock} if stale else {}
    contract.write_scores(contract.SCORES.under(out), records, scores, version_scores)
    tokens = sum(len(r.output_ids) for r in records)
    return StageWrite(
        metrics={
            "dense/tokens": float(tokens),
            "dense/stale_samples": float(stale),
            "time/dense_forward_s": seconds,
            "time/dense_read_s": read_seconds,
            **version_seconds,
            **peak("memory/score_peak_gib"),
        }
    )


def scores_of_versions(runtime: RunRuntime, trainer, step: int, records, scores):
    """(scores against each sample's own version, number of stale samples): a stale sample
    is scored again against the dense policy of the version that generated it."""
    import torch

    from sparrow.trainer.version_scores import (
        score_with_checkpoint,
        stale_versions,
        tokens_of_version,
    )

    stale = stale_versions(records, current_version=step - 1)
    version_scores = list(scores)
    for version, indices in stale.items():
        # the policy after update `version` (0: the initial model), waiting for its save
        folder = runtime.policy_folder_before(version + 1)
        samples = [records[i] for i in indices]
        if trainer.sharded:  # on rank 0's device: the flow's process holds none of the group's
            again = trainer.score_checkpoint(folder, samples)
        else:
            again = score_with_checkpoint(
                folder,
                samples,
                torch.device(trainer.device),
                getattr(trainer, "dtype", torch.float32),
                getattr(trainer, "temperature", 1.0),
                runtime.cfg.trainer.micro_batch_tokens,
                runtime.cfg.trainer.logits_chunk_tokens,
            )
        for i, score in zip(indices, again):
            version_scores[i] = tokens_of_version(version_scores[i], score, records[i], version)
    return version_scores, len({i for indices in stale.values() for i in indices})


@task(name="dense_score", cache_policy=NONE, **INFRA_RETRIES)
def dense_score_task(workdir: str, run_id: str, step: int, rollouts_path: str) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(
        runtime, "dense_score", step, lambda out: score_step(runtime, step, rollouts_path, out)
    )
