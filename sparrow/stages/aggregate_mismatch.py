"""Stage 4, aggregate_mismatch: per-token mismatch rows, per-bin statistics, threshold events.

    outcome = aggregate_mismatch_task(workdir, run_id, step, rollout_dir, scores_path)

Writes, for the step:
- tokens.parquet (RunLayout.token_file): one row per generated token with run_id, step,
  sample, prompt, position (total position: prompt length + index in the completion), bin
  (Schedule.bin_of: a position past the schedule's last bin is in the last bin), pages_read
  (pages the actor read for it), acceptance (against the step's dense policy), leftover_mass,
  actor_logprob, dense_logprob, role (the token's role on a chase task's reference path:
  lookup, local, benign, answer, unknown; NULL for other tasks; sparrow/data/token_roles.py),
  policy_version (the step whose update generated the token: a carried sample's tokens may
  differ, rollout.finish_fraction), sparse_acceptance and
  version_dense_logprob (against the dense policy of policy_version: the sparse mismatch
  alone; equal to acceptance and dense_logprob for a fresh sample; docs/async.md); DuckDB's
  token_mismatch view reads these files.
- bin_stats rows: sparrow.mismatch.acceptance.bin_statistics of sparse_acceptance (what the
  schedule controls: a stale sample's drift from the newer weights is not the schedule's)
  per length bin (bins of the schedule in force, schedule.json of the rollout stage), with the pages that schedule reads in the bin
  (pages_read; NULL when decoding densely), its name and version, the cluster-bootstrap
  bounds of every statistic over the step's trajectories (seeded by the step), the
  trajectories reaching the bin, `counted` (false below calibrate.min_bin_tokens /
  min_bin_samples) and the estimator (top<k>_lower_bound: rollout.logprobs_topk);
  bin_stats.json beside tokens.parquet.
- threshold_events: `below_target` for every counted bin whose schedule.target_statistic
  (p5 by default; sparrow/sparse/target.py) misses schedule.target, `recovered` for a bin
  that was below at the previous step and is counted and not below now; the event's p5
  column holds the bin's p5, its estimator column the estimator.
- sample_stats rows: per trajectory S = sum (1 - acceptance), the lowest acceptance, the
  log importance weight (sparrow/mismatch/sequence.py), its policy version and S over
  sparse_acceptance (sparse_mismatch_sum); S over the tokens whose role is lookup, and their
  count, where the rollouts carry token roles (chase tasks), else NULL.
- step metrics: mismatch/min_p5 (counted bins; left out when none counts), mismatch/p5_bin_<b>,
  mismatch/acceptance_mean, mismatch/sparse_acceptance_mean, mismatch/stale_frac (share of
  samples generated before the step's policy), mismatch/leftover_mass_mean, mismatch/bins_below,
  mismatch/bins_uncounted, mismatch/ess (the batch's normalised effective sample size),
  mismatch/sequence_mismatch_mean and _max (S over the step's trajectories).
Rows are replaced by (run_id, step) in the stage's transaction; MLflow gets the metrics, one
event per threshold crossing, and bin_stats.json.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.token_roles import ROLE_CODE, role_names
from sparrow.mismatch.acceptance import (
    BinFloor,
    BinStats,
    bin_statistics,
    min_p5,
    topk_bound_estimator,
)
from sparrow.mismatch.sequence import effective_sample_size, sequence_statistics
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import RunRuntime, lookup
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.target import DEFAULT_STATISTIC, get_statistic
from sparrow.storage import mismatch_rows


def token_table(run_id: str, step: int, records, scores, schedule: Schedule):
    """The per-token rows as a pyarrow table (columns of sparrow.storage.schema.TOKEN_COLUMNS)."""
    import pyarrow as pa

    columns: dict[str, list] = {
        k: []
        for k in (
            "sample",
            "prompt",
            "position",
            "bin",
            "pages_read",
            "acceptance",
            "leftover_mass",
            "actor_logprob",
            "dense_logprob",
            "sparse_acceptance",
            "version_dense_logprob",
        )
    }
    for i, record in enumerate(records):
        n, start = len(record.output_ids), len(record.prompt_ids)
        positions = list(range(start, start + n))
        columns["sample"] += [record.sample_index] * n
        columns["prompt"] += [record.prompt_index] * n
        columns["position"] += positions
        columns["bin"] += schedule.bin_of(np.arange(start, start + n)).tolist()
        columns["pages_read"] += list(record.pages_read)
        columns["acceptance"] += list(scores["acceptance"][i])
        columns["leftover_mass"] += list(scores["leftover_mass"][i])
        columns["actor_logprob"] += list(record.actor_logprobs)
        columns["dense_logprob"] += list(scores["dense_logprobs"][i])
        columns["sparse_acceptance"] += list(_version_scores(scores, "sparse_acceptance")[i])
        columns["version_dense_logprob"] += list(
            _version_scores(scores, "version_dense_logprobs")[i]
        )
    roles = [
        role
        for record in records
        for role in (
            role_names(record.token_roles)
            if len(record.token_roles)
            else [None] * len(record.output_ids)
        )
    ]
    # a file from before versions were recorded: every such run was synchronous
    columns["policy_version"] = [
        version for record in records for version in record.versions_of_tokens(step - 1)
    ]
    count = len(columns["sample"])
    ints = {"sample", "prompt", "position", "bin", "pages_read", "policy_version"}
    arrays = {
        "run_id": pa.array([run_id] * count, pa.string()),
        "step": pa.array([step] * count, pa.int32()),
    }
    for name, values in columns.items():
        arrays[name] = pa.array(values, pa.int32() if name in ints else pa.float64())
    arrays["role"] = pa.array(roles, pa.string())
    return pa.table(arrays)


def _version_scores(scores, name: str) -> list:
    """A version column of the scores (contract.VERSION_SCORE_COLUMNS), or, from a caller that
    has only the step's scores, the column it equals for fresh samples."""
    return scores[name] if name in scores else scores[contract.VERSION_SCORE_COLUMNS[name]]


def version_of(record, step: int) -> int:
    """The policy version that generated `record` (step - 1 for a file that predates it)."""
    return step - 1 if record.policy_version is None else int(record.policy_version)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class StepBins:
    """One step's per-bin statistics with the schedule they were measured under."""

    run_id: str
    step: int
    stats: list[BinStats]
    pages_read: dict[int, int | None]  # bin -> pages per step under the schedule (None: dense)
    schedule_name: str
    schedule_version: int
    target: float
    # schedule.target_statistic: the BinStats field compared with the target
    statistic: str = DEFAULT_STATISTIC
    # the acceptance estimator the statistics come from (sparrow/mismatch/stats.py)
    estimator: str | None = None

    @property
    def p5(self) -> dict[int, float]:
        return {s.bin: s.p5 for s in self.stats}

    @property
    def below(self) -> list[int]:
        statistic = get_statistic(self.statistic)
        return sorted(
            s.bin
            for s in self.stats
            if s.counted and statistic.misses(getattr(s, statistic.column), self.target)
        )

    def rows(self) -> list[dict]:
        """bin_stats rows (NaN as None) without the run's keys."""
        return [
            {
                **{k: _finite(v) if isinstance(v, float) else v for k, v in s.as_dict().items()},
                "pages_read": self.pages_read[s.bin],
                "schedule_name": self.schedule_name,
                "schedule_version": self.schedule_version,
                "estimator": self.estimator,
            }
            for s in self.stats
        ]

    def as_json(self) -> str:
        return json.dumps(self.rows(), indent=2)

    def write_rows(self, conn) -> None:
        """Replace the step's bin_stats and threshold_events rows."""
        run_id, step, p5, below = self.run_id, self.step, self.p5, self.below
        mismatch_rows.replace_bin_stats(conn, run_id, step, self.rows())
        previous = mismatch_rows.below_target_bins(conn, run_id, step - 1)
        counted = {s.bin for s in self.stats if s.counted}
        events = [(b, "below_target") for b in below]
        events += [(b, "recovered") for b in sorted(previous) if b in counted and b not in below]
        mismatch_rows.replace_threshold_events(
            conn,
            run_id,
            step,
            [(b, kind, p5[b], self.target) for b, kind in events],
            self.estimator,
        )


def sample_rows(records, scores, estimator: str, step: int) -> list[dict]:
    """sample_stats rows, one per trajectory (lookup_* None where a record carries no roles)."""
    rows = []
    for i, record in enumerate(records):
        lookup = None
        if len(record.token_roles):
            lookup = np.asarray(record.token_roles) == ROLE_CODE["lookup"]
        stats = sequence_statistics(
            scores["acceptance"][i], scores["dense_logprobs"][i], record.actor_logprobs, lookup
        )
        rows.append(
            {
                "prompt": record.prompt_index,
                "sample": record.sample_index,
                **{k: _finite(v) if isinstance(v, float) else v for k, v in asdict(stats).items()},
                "estimator": estimator,
                "policy_version": version_of(record, step),
                "sparse_mismatch_sum": float(
                    np.sum(1.0 - np.asarray(_version_scores(scores, "sparse_acceptance")[i]))
                ),
            }
        )
    return rows


def sample_metrics(rows: list[dict]) -> dict[str, float]:
    """The batch's effective sample size and S over its trajectories."""
    if not rows:
        return {}
    sums = [r["mismatch_sum"] for r in rows]
    return {
        "mismatch/ess": effective_sample_size([r["log_weight"] for r in rows]),
        "mismatch/sequence_mismatch_mean": float(np.mean(sums)),
        "mismatch/sequence_mismatch_max": float(np.max(sums)),
    }


def aggregate_step(
    runtime: RunRuntime, step: int, rollout_dir: str, scores_path: str, out: Path
) -> StageWrite:
    import pyarrow.parquet as pq

    used = contract.read_rollout_schedule(rollout_dir)
    schedule = used.schedule
    records = contract.read_rollouts(rollout_dir)
    scores = contract.read_scores(scores_path, records)
    table = token_table(runtime.run_id, step, records, scores, schedule)
    pq.write_table(table, contract.TOKENS.under(out))
    acceptance = table.column("acceptance").to_numpy()
    # the controller's statistic: the sparse mismatch alone, against the dense policy of the
    # version that generated each sample (the same as acceptance in a synchronous run)
    sparse_acceptance = table.column("sparse_acceptance").to_numpy()
    cfg = runtime.cfg
    # one trajectory per (prompt, sample): the bootstrap resamples these
    prompt, sample = table.column("prompt").to_numpy(), table.column("sample").to_numpy()
    trajectory = prompt.astype(np.int64) * (int(sample.max(initial=0)) + 1) + sample
    stats = bin_statistics(
        table.column("position").to_numpy(),
        sparse_acceptance,
        bin_tokens=schedule.bin_tokens,
        num_bins=schedule.num_bins,
        samples=trajectory,
        floor=BinFloor(cfg.calibrate.min_bin_tokens, cfg.calibrate.min_bin_samples),
        seed=step,
    )
    estimator = topk_bound_estimator(cfg.rollout.logprobs_topk)
    samples = sample_rows(records, scores, estimator, step)
    bins = StepBins(
        runtime.run_id,
        step,
        stats,
        {
            s.bin: schedule.pages_for_topk(schedule.topk_pages[s.bin]) if used.sparse else None
            for s in stats
        },
        schedule.name,
        used.version,
        cfg.schedule.target,
        cfg.schedule.target_statistic,
        estimator,
    )
    contract.BIN_STATS.under(out).write_text(bins.as_json())
    metrics = {f"mismatch/p5_bin_{b}": p5 for b, p5 in bins.p5.items()}
    metrics.update(
        {
            "mismatch/min_p5": min_p5(stats),
            "mismatch/acceptance_mean": float(acceptance.mean()),
            "mismatch/sparse_acceptance_mean": float(sparse_acceptance.mean()),
            "mismatch/stale_frac": float(
                np.mean([version_of(r, step) < step - 1 for r in records]) if records else 0.0
            ),
            "mismatch/leftover_mass_mean": float(np.mean(table.column("leftover_mass").to_numpy())),
            "mismatch/bins_below": float(len(bins.below)),
            "mismatch/bins_uncounted": float(sum(not s.counted for s in stats)),
            **sample_metrics(samples),
        }
    )
    metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}  # no counted bin: no min

    def write_rows(conn) -> None:
        bins.write_rows(conn)
        mismatch_rows.replace_sample_stats(conn, runtime.run_id, step, samples)

    def log_events(final: Path) -> None:
        if runtime.tracker is None:
            return
        for b in bins.below:
            runtime.tracker.log_threshold_event(step, b, bins.p5[b], bins.target)
        runtime.tracker.log_artifact(
            contract.BIN_STATS.under(final), subdir=f"bin_stats/step-{step}"
        )

    return StageWrite(metrics=metrics, db=write_rows, after_commit=log_events)


@task(name="aggregate_mismatch", cache_policy=NONE, **INFRA_RETRIES)
def aggregate_mismatch_task(
    workdir: str, run_id: str, step: int, rollout_dir: str, scores_path: str
) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(
        runtime,
        "aggregate_mismatch",
        step,
        lambda out: aggregate_step(runtime, step, rollout_dir, scores_path, out),
    )
