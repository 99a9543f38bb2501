"""Stage 1, rollout: the step's prompts, N samples each, from the Ray rollout actors.

    outcome = rollout_task(workdir, run_id, step)     # step-<n>/rollout/rollouts.parquet

Prompts: `data.prompts_per_step` rows of the training set for this step (the same rows on a
re-run). Sampling: `rollout.*`, with the schedule in force at this step (sparrow/runtime/ledger/schedules.py;
dense decode when schedule.sparse=false). Each prompt's request carries a seed derived from
(pipeline.seed, rollout.seed, step, prompt); the engine derives each sample's seed from
it and the sample index, so results do not depend on how prompts are sharded across actors.
Generation stops at the model's context: max_new_tokens is cut to what is left after the
prompt, and a prompt that leaves no room is PromptTooLongError naming its dataset row.
Outputs: rollouts.parquet (sparrow/data/rollouts.py) and schedule.json (the schedule
used, which aggregate_mismatch reads for its bins and pages read).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.datasets import PromptTooLongError, context_error  # noqa: F401 (re-export)
from sparrow.data.rollouts import RolloutRecord, write_rollouts
from sparrow.engine import SamplingParams
from sparrow.runtime.ledger.schedules import schedule_in_force
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import RunRuntime, lookup
from sparrow.sparse.io import schedule_to_dict

ROLLOUTS_FILE = "rollouts.parquet"
SCHEDULE_FILE = "schedule.json"


def request_seed(run_seed: int, rollout_seed: int, step: int, prompt_index: int) -> int:
    """A 63-bit seed per (run seed, rollout seed, step, prompt); the engine adds the sample."""
    entropy = [
        abs(run_seed),
        int(run_seed < 0),
        abs(rollout_seed),
        int(rollout_seed < 0),
        step,
        prompt_index,
    ]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)


def max_new_tokens_for(runtime: RunRuntime, row: Any, source: str) -> int:
    """rollout.max_new_tokens, cut to the room the context leaves after the prompt."""
    room = runtime.max_context - len(row.prompt_ids)
    if room < 1:
        raise context_error(source, row.row, len(row.prompt_ids), runtime.max_context)
    return min(runtime.cfg.rollout.max_new_tokens, room)


def sampling_params(
    runtime: RunRuntime,
    rows: Sequence[Any],
    step: int,
    greedy: bool = False,
    source: str = "",
    first_index: int = 0,
) -> list[SamplingParams]:
    """One request per prompt row; `source` names the dataset in errors (data.train if empty);
    first_index: the seed index of the first row (dynamic sampling's later draws)."""
    rollout = runtime.cfg.rollout
    source = source or runtime.cfg.data.train
    return [
        SamplingParams(
            temperature=0.0 if greedy else rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_new_tokens=max_new_tokens_for(runtime, row, source),
            seed=request_seed(runtime.cfg.pipeline.seed, rollout.seed, step, first_index + index),
            n=1 if greedy else rollout.samples_per_prompt,
            logprobs_topk=rollout.logprobs_topk,
        )
        for index, row in enumerate(rows)
    ]


def to_records(rows: Sequence[Any], results: Sequence[Sequence[Any]]) -> list[RolloutRecord]:
    return [
        RolloutRecord(
            prompt_index=p,
            sample_index=s.sample_index,
            dataset_row=row.row,
            prompt_ids=tuple(row.prompt_ids),
            output_ids=tuple(s.output_ids),
            actor_logprobs=tuple(s.logprobs),
            topk_ids=s.topk_ids,
            topk_logprobs=s.topk_logprobs,
            pages_read=tuple(s.pages_read),
            finish_reason=s.finish_reason,
            answer=row.answer,
            text=s.text or "",
            prompt_text=row.prompt,
            data_source=row.data_source,
            extra_info=row.extra_info,
        )
        for p, (row, samples) in enumerate(zip(rows, results))
        for s in samples
    ]


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
            from sparrow.stages.dynamic_draws import informative_rollouts

            rows, results, dynamic = informative_rollouts(runtime, step, rows, params)
        else:
            results = runtime.pool.generate([list(row.prompt_ids) for row in rows], params)
        elapsed = time.perf_counter() - clock
        memory = runtime.pool.memory() if runtime.pool_on_gpu else []
        engines = runtime.pool.rollout_stats()  # since the last rollout's: this one's wake too
    finally:
        runtime.after_rollout()
    released = runtime.pool.memory() if runtime.pool_on_gpu else []
    records = to_records(rows, results)
    write_rollouts(out / ROLLOUTS_FILE, records)
    (out / SCHEDULE_FILE).write_text(
        json.dumps(
            {
                "schedule": schedule_to_dict(schedule),
                "version": version,
                "sparse": cfg.schedule.sparse,
            },
            indent=2,
        )
    )
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
