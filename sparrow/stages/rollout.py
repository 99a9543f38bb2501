"""Stage 1, rollout: the step's prompts, N samples each, from the Ray rollout actors.

    outcome = rollout_task(workdir, run_id, step)     # step-<n>/rollout/rollouts.parquet

Prompts: `data.prompts_per_step` rows of the training set for this step (the same rows on a
re-run). Sampling: `rollout.*`, with the schedule in force at this step
(sparrow/runtime/ledger/schedules.py; dense decode when schedule.sparse=false); the requests,
their seeds and the cut to the model's context are sparrow/runtime/rollout/requests.py's (a
prompt that leaves no room is PromptTooLongError naming its dataset row). Outputs
(sparrow/runtime/ledger/contract.py): rollouts.parquet (sparrow/data/rollouts.py) and
schedule.json (the schedule used, which aggregate_mismatch reads for its bins and pages read).
Each record holds its tokens' roles on the reference path when the task has one
(pointer_chase_long, multi_chase: sparrow/data/token_roles.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.rollouts import write_rollouts
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.schedules import schedule_in_force
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.rollout.records import to_records
from sparrow.runtime.rollout.requests import sampling_params
from sparrow.runtime.run_runtime import RunRuntime, lookup


def generate_rollouts(runtime: RunRuntime, step: int, out: Path) -> StageWrite:
    cfg = runtime.cfg
    schedule, version = schedule_in_force(
        runtime.store, runtime.run_id, runtime.schedule_name, runtime.schedule_start_version, step
    )
    runtime.pool.set_schedule(schedule if cfg.schedule.sparse else None)
    rows = runtime.train_data.batch(step - 1, cfg.data.prompts_per_step)
    params = sampling_params(runtime, rows, step)
    handover = runtime.before_rollout()
    clock = time.perf_counter()
    dynamic: dict[str, float] = {}
    try:
        if cfg.algo.dynamic_sampling:  # DAPO: groups whose rewards differ
            from sparrow.runtime.rollout.dynamic_draws import informative_rollouts

            rows, results, dynamic = informative_rollouts(runtime, step, rows, params)
        else:
            results = runtime.pool.generate([list(row.prompt_ids) for row in rows], params)
        elapsed = time.perf_counter() - clock
        memory = runtime.pool.memory() if runtime.pool_on_gpu else []
        engines = runtime.pool.rollout_stats()  # since the last rollout's: this one's wake too
    finally:
        runtime.after_rollout()
    released = runtime.pool.memory() if runtime.pool_on_gpu else []
    records = to_records(rows, results, runtime.tokenizer, policy_version=step - 1)
    write_rollouts(contract.ROLLOUTS.under(out), records)
    contract.write_rollout_schedule(out, schedule, version, cfg.schedule.sparse)
    lengths = np.array([len(r.output_ids) for r in records], dtype=np.float64)
    pages_read = np.concatenate([np.asarray(r.pages_read, dtype=np.float64) for r in records])
    return StageWrite(
        metrics={
            "response/length_mean": float(lengths.mean()),
            "response/length_max": float(lengths.max()),
            "response/truncated_frac": float(
                np.mean([r.finish_reason == "length" for r in records])
            ),
            # the cost model's L_in (the study report prices each step's rollout with it)
            "rollout/prompt_tokens_mean": float(np.mean([len(r.prompt_ids) for r in records])),
            "rollout/samples": float(len(records)),
            "rollout/tokens": float(lengths.sum()),
            "rollout/tokens_per_s": float(lengths.sum() / max(elapsed, 1e-9)),
            "time/rollout_generate_s": float(elapsed),
            # the hand-over before generate, and its two parts: the trainer's release (offload) and
            # the engines' wake
            "time/rollout_wake_s": float(handover["release_s"] + handover["engine_wake_s"]),
            "time/rollout_release_s": float(handover["release_s"]),
            "time/rollout_engine_wake_s": float(handover["engine_wake_s"]),
            # CUDA graph captures (the slowest engine's) and the engines whose wake replayed the
            # graphs kept through their sleep (rollout.keep_graphs)
            "time/rollout_capture_s": max(
                (float(e.get("capture_s", 0.0)) for e in engines), default=0.0
            ),
            "rollout/graphs_kept": float(sum(e.get("graphs_kept", 0) for e in engines)),
            **({"memory/rollout_peak_gib": max(m["peak_gib"] for m in memory)} if memory else {}),
            **(
                {"memory/engine_after_release_gib": max(m["reserved_gib"] for m in released)}
                if released
                else {}
            ),
            "schedule/pages_read_mean": float(pages_read.mean()),
            "schedule/version": float(version),
            **dynamic,
        }
    )


@task(name="rollout", cache_policy=NONE, **INFRA_RETRIES)
def rollout_task(workdir: str, run_id: str, step: int) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(runtime, "rollout", step, lambda out: generate_rollouts(runtime, step, out))
