"""The stage contract: every file a stage writes, where it lies, and how a later stage reads it.

    from sparrow.runtime.ledger import contract
    contract.ROLLOUTS.name                      # "rollouts.parquet"
    contract.ROLLOUTS.at(layout, step)          # <run>/step-<n>/rollout/rollouts.parquet
    contract.ROLLOUTS.under(outcome.output_dir) # the same file, from a stage's folder
    records = contract.read_rollouts(rollout_dir)
    used = contract.read_rollout_schedule(rollout_dir)   # .schedule, .version, .sparse

A stage writes its files into the scratch folder run_stage gives it (renamed into
`<workdir>/runs/<run_id>/step-<n>/<stage>/`) under the names below, and every reader of
another stage's files goes through the readers here: no stage module imports another
(tests/runtime/ledger/test_contract.py). FILES lists every step file with what it holds;
docs/pipeline.md describes the stages. The calibrate flow's files, under
`<workdir>/calibrations/<calibration_id>/`, are calibration_files.py's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparrow.data.rollouts import RolloutRecord
from sparrow.data.rollouts import read_rollouts as read_rollout_file
from sparrow.runtime.ledger.stage import StageInputError
from sparrow.sparse.io import schedule_from_dict, schedule_to_dict
from sparrow.sparse.schedule import Schedule
from sparrow.storage import RunLayout


@dataclass(frozen=True)
class StageFile:
    """One file a stage writes into its folder."""

    stage: str
    name: str
    holds: str

    def under(self, stage_dir: str | Path) -> Path:
        return Path(stage_dir) / self.name

    def at(self, layout: RunLayout, step: int) -> Path:
        return layout.stage_dir(step, self.stage) / self.name


ROLLOUTS = StageFile(
    "rollout", "rollouts.parquet", "one row per sample: ids, actor logprobs, top-K, pages read"
)
ROLLOUT_SCHEDULE = StageFile(
    "rollout", "schedule.json", "the schedule the rollout decoded with, its version, sparse or not"
)
ROLLOUT_LAUNCH = StageFile(
    "rollout",
    "launch.json",
    "the policy version that generated the samples, when generation started, whether in flight",
)
CARRIED = StageFile(
    "rollout",
    "carried.parquet",
    "the groups an early close left unfinished, which the next step resumes (finish_fraction)",
)
REWARDS = StageFile("reward", "rewards.parquet", "one row per sample: prompt, sample, reward")
REWARD_SUMMARY = StageFile(
    "reward", "summary.json", "the reward function, its errors and timeouts, the first traceback"
)
SCORES = StageFile(
    "dense_score",
    "scores.parquet",
    "one row per sample: dense logprobs, acceptance, leftover actor mass per token; the same "
    "against the dense policy of the sample's own version (version_dense_logprobs, "
    "sparse_acceptance: docs/async.md)",
)
TOKENS = StageFile(
    "aggregate_mismatch", "tokens.parquet", "one row per generated token (DuckDB token_mismatch)"
)
BIN_STATS = StageFile("aggregate_mismatch", "bin_stats.json", "per-bin statistics of the step")
DECISION = StageFile(
    "reoptimize_schedule", "decision.json", "the controller's decision, measurements, changes"
)
NEW_SCHEDULE = StageFile(
    "reoptimize_schedule", "schedule.yaml", "a changed schedule (the next version), when any"
)
POLICY_POINTER = StageFile(
    "policy_update", "state.json", "where a background save writes the policy (policy_state/)"
)
CHEAPER = StageFile(
    "distill_lora", "cheaper.json", "the LoRA's per-bin statistic under a cheaper schedule"
)
SYNCED = StageFile("sync_weights", "synced.json", "the weights each rollout actor loaded, and how")
CHECKPOINT = StageFile("checkpoint", "checkpoint.json", "the checkpoint folder and its files")
EVAL = StageFile("evaluate", "eval.json", "greedy (or sampled) accuracy and every completion")
FILES = (
    ROLLOUTS,
    ROLLOUT_SCHEDULE,
    ROLLOUT_LAUNCH,
    CARRIED,
    REWARDS,
    REWARD_SUMMARY,
    SCORES,
    TOKENS,
    BIN_STATS,
    DECISION,
    NEW_SCHEDULE,
    POLICY_POINTER,
    CHEAPER,
    SYNCED,
    CHECKPOINT,
    EVAL,
)
# the folder, beside a step's stage folders, that a background policy save writes into
POLICY_STATE_DIR = "policy_state"
SCORE_COLUMNS = ("dense_logprobs", "acceptance", "leftover_mass")
# against the dense policy of the version that generated the sample (the step's own for a
# fresh sample): column -> the SCORE_COLUMNS column it equals where the sample is fresh, and
# in a file written before these columns
VERSION_SCORE_COLUMNS = {
    "version_dense_logprobs": "dense_logprobs",
    "sparse_acceptance": "acceptance",
}


def write_json(path: Path, data: Any, indent: int = 2) -> Path:
    path.write_text(json.dumps(data, indent=indent))
    return path


# rollout


def read_rollouts(rollout_dir: str | Path) -> list[RolloutRecord]:
    return read_rollout_file(ROLLOUTS.under(rollout_dir))


@dataclass(frozen=True)
class UsedSchedule:
    """schedule.json of a rollout stage: what the step decoded with."""

    schedule: Schedule
    version: int
    sparse: bool


def write_rollout_schedule(out: Path, schedule: Schedule, version: int, sparse: bool) -> Path:
    data = {"schedule": schedule_to_dict(schedule), "version": version, "sparse": sparse}
    return write_json(ROLLOUT_SCHEDULE.under(out), data)


def read_rollout_schedule(rollout_dir: str | Path) -> UsedSchedule:
    path = ROLLOUT_SCHEDULE.under(rollout_dir)
    used = json.loads(path.read_text())
    schedule = schedule_from_dict(used["schedule"], source=str(path))
    return UsedSchedule(schedule, int(used["version"]), bool(used.get("sparse", True)))


# reward


def write_rewards(
    path: Path, prompt_index: list[int], sample_index: list[int], rewards: list[float]
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "prompt_index": pa.array(prompt_index, pa.int32()),
            "sample_index": pa.array(sample_index, pa.int32()),
            "reward": pa.array(rewards, pa.float64()),
        }
    )
    pq.write_table(table, path)


def read_rewards(path: str | Path, records: Sequence[Any] | None = None) -> list[float]:
    """The rewards in rollout order; checked against the rollout records when given."""
    import pyarrow.parquet as pq

    rewards = [
        float(v) for v in pq.read_table(path, columns=["reward"]).column("reward").to_pylist()
    ]
    if records is not None and len(rewards) != len(records):
        raise StageInputError(f"{path} has {len(rewards)} rewards for {len(records)} rollouts")
    return rewards


# dense_score


def write_scores(
    path: Path,
    records: Sequence[Any],
    scores: Sequence[Any],
    version_scores: Sequence[Any] | None = None,
) -> None:
    """`scores` against the step's dense policy; `version_scores` against the dense policy of
    each sample's own version (None: every sample is fresh, the same scores)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    floats = pa.list_(pa.float64())
    columns = {
        "prompt_index": pa.array([r.prompt_index for r in records], pa.int32()),
        "sample_index": pa.array([r.sample_index for r in records], pa.int32()),
    }
    for name in SCORE_COLUMNS:
        columns[name] = pa.array([getattr(s, name) for s in scores], floats)
    version_scores = scores if version_scores is None else version_scores
    for name, same in VERSION_SCORE_COLUMNS.items():
        columns[name] = pa.array([getattr(s, same) for s in version_scores], floats)
    pq.write_table(pa.table(columns), path)


def read_scores(
    path: str | Path, records: Sequence[Any] | None = None
) -> dict[str, list[list[float]]]:
    """Column name -> per-sample lists (SCORE_COLUMNS and VERSION_SCORE_COLUMNS; a file from
    before the latter gives the former's values); checked against the rollout records when
    given."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    scores = {name: table.column(name).to_pylist() for name in SCORE_COLUMNS}
    for name, same in VERSION_SCORE_COLUMNS.items():
        scores[name] = (
            table.column(name).to_pylist() if name in table.column_names else scores[same]
        )
    if records is not None:
        if len(records) != table.num_rows:
            raise StageInputError(f"{path} has {table.num_rows} rows for {len(records)} rollouts")
        for record, values in zip(records, scores["dense_logprobs"]):
            if len(values) != len(record.output_ids):
                raise StageInputError(
                    f"{path}: sample ({record.prompt_index}, {record.sample_index}) has "
                    f"{len(values)} scores for {len(record.output_ids)} generated tokens"
                )
    return scores


# policy_update


def write_policy_pointer(out: Path, state_dir: Path) -> Path:
    return write_json(POLICY_POINTER.under(out), {"state_dir": str(state_dir)}, indent=0)


def policy_state_dir(layout: RunLayout, step: int) -> Path:
    return layout.step_dir(step) / POLICY_STATE_DIR


def pointed_policy(policy_dir: str | Path) -> Path | None:
    """The folder a policy_update folder's state.json names, None when it has none."""
    pointer = POLICY_POINTER.under(policy_dir)
    if not pointer.is_file():
        return None
    return Path(json.loads(pointer.read_text())["state_dir"])


# distill_lora


def write_cheaper(
    out: Path, step: int, statistic: str, schedule_topk, cheaper_topk, values: dict[str, float]
) -> Path:
    data = {
        "step": step,
        "statistic": statistic,
        "schedule_topk": list(schedule_topk),
        "cheaper_topk": list(cheaper_topk),
        "values": values,
    }
    return write_json(CHEAPER.under(out), data)


def read_cheaper(distill_dir: str | Path) -> dict | None:
    """A distill_lora folder's cheaper.json, None when the step measured none."""
    path = CHEAPER.under(distill_dir)
    return json.loads(path.read_text()) if path.is_file() else None
