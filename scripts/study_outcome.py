"""After one seed of the pre-registered study (docs/study.md, "The study of 2026-11-27"): each
arm's per-step CSVs, its outcome on the fixed held-out set, and one summary JSON.

    python scripts/study_outcome.py --workdir /tmp/sw --study-id v2-s0 --variant v2 \
        --model /tmp/tb-v2 --out $OUT/v2-s0 [--prompts 128 --samples 4] [--skip-eval]

Per arm, from its own DuckDB file (read-only): `<arm>_steps.csv` (every step_metrics name as
a column), `<arm>_bins.csv.gz` (bin_stats rows; the three large tables are gzip-compressed),
`<arm>_roles.csv` (per step and token role: tokens, p5, p1, mean acceptance, share below 0.5;
from the token Parquet files),
`<arm>_tail.csv` (per step and length bin: tokens and p0.1, the 0.1th percentile of
acceptance, which bin_stats does not hold),
`<arm>_stages.csv.gz` (each stage's start, end and seconds per step: stage_runs),
`<arm>_samples.csv.gz` (sample_stats: one row per trajectory and step). The outcome
(the pre-registered one): the arm's last checkpoint (trainer weights; no LoRA in this study),
decoded densely at temperature 1 by the project's engine on the same `--prompts` held-out
prompts for every arm and seed (stream "study-outcome", seed 0), `--samples` each, mean
share_match reward; the starting model is scored the same way (arm "start"). summary.json
holds the outcomes, the gaps to dense, the steps done and where the CSVs are; the labels
and statistics of docs/study.md are computed from these files after all seeds ran.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import shutil
import tempfile
from pathlib import Path

from sparrow.experiments.study_analysis import set_gaps_to_dense
from sparrow.experiments.testbed.data import VARIANTS, derived_seed, held_out_examples
from sparrow.storage import query
from sparrow.storage.errors import StorageError

ROLE_SQL = """
SELECT step, role, count(*) AS tokens,
       quantile_cont(acceptance, 0.05) AS p5, quantile_cont(acceptance, 0.01) AS p1,
       avg(acceptance) AS mean, avg(CAST(acceptance < 0.5 AS DOUBLE)) AS share_below_half
FROM token_mismatch GROUP BY ALL ORDER BY ALL"""
# per step and length bin: p0.1 of the acceptance bin_stats reads (pre-registered; bin_stats
# stops at p1); the analysis takes the worst of the bins that bin_stats counts
TAIL_SQL = """
SELECT step, bin, count(*) AS tokens, quantile_cont(sparse_acceptance, 0.001) AS p0_1
FROM token_mismatch GROUP BY ALL ORDER BY ALL"""
# per trajectory: S, S over lookups, the sequence minimum, the log weight (sample_stats)
SAMPLE_SQL = "SELECT * FROM sample_stats ORDER BY step, prompt, sample"
# each stage's wall clock per step: where a step's time goes between the stages' own timers
STAGE_SQL = """
SELECT step, stage, started_at, finished_at, duration_s FROM stage_runs ORDER BY started_at"""


def write_csv(path: Path, rows: list[dict]) -> None:
    """The rows as CSV (an empty file for none); gzip-compressed, without a timestamp, when
    the name ends in .gz (the large tables: a seed's folder is kept in the repository)."""
    names = sorted({key for row in rows for key in row}, key=lambda k: (k != "step", k))
    with _open_for_writing(path) as handle:
        if rows:
            writer = csv.DictWriter(handle, fieldnames=names)
            writer.writeheader()
            writer.writerows(rows)


def _open_for_writing(path: Path):
    if path.suffix != ".gz":
        return path.open("w", newline="")
    raw = gzip.GzipFile(path, "wb", mtime=0)
    return io.TextIOWrapper(raw, newline="")


def step_rows(arm_dir: Path) -> list[dict]:
    """step_metrics as one row per step, one column per metric name."""
    by_step: dict[int, dict] = {}
    for row in rows_of(arm_dir, "SELECT step, name, value FROM step_metrics ORDER BY ALL"):
        by_step.setdefault(row["step"], {"step": row["step"]})[row["name"]] = row["value"]
    return list(by_step.values())


def rows_of(arm_dir: Path, sql: str) -> list[dict]:
    """The rows as dicts; none when the query fails (an arm that never reached a step)."""
    try:
        result = query(arm_dir, sql)
    except StorageError as err:
        print(f"{arm_dir.name}: {err}", flush=True)
        return []
    return [dict(zip(result.columns, row)) for row in result.rows]


def last_checkpoint(arm_dir: Path) -> Path | None:
    found = sorted(
        arm_dir.glob("runs/*/checkpoints/step-*"), key=lambda p: int(p.name.split("-")[1])
    )
    return found[-1] if found else None


def outcome(
    model_dir: Path, tokenizer_dir: Path, examples, samples: int, seed: int, device: str
) -> dict:
    """Sampled accuracy (chains whose hops and answer are right; share_match as answer_share) of
    dense samples at temperature 1 (evaluate.sampled_accuracy)
    from a checkpoint folder, given the tokenizer of the model it started from."""
    from sparrow.experiments.testbed.evaluate import sampled_accuracy

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for path in model_dir.iterdir():
            if path.is_file():
                (folder / path.name).symlink_to(path.resolve())
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if not (folder / name).exists():
                shutil.copy(tokenizer_dir / name, folder / name)
        return sampled_accuracy(folder, examples, samples, seed, device=device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--study-id", required=True)
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--model", type=Path, required=True, help="the starting testbed model")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--skip-eval", action="store_true")
    p.add_argument("--device", default="cuda", help="where the outcome decodes (cpu: a dry run)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = VARIANTS[args.variant].sizes()
    examples = held_out_examples(
        sizes["num_defs"], sizes["num_hops"], args.prompts, 0, "study-outcome",
        sizes["chains"], sizes["tags"],
    )  # fmt: skip
    seed = derived_seed("study-outcome")
    summary = {"study_id": args.study_id, "variant": args.variant, "arms": {}}
    if not args.skip_eval:
        summary["start"] = outcome(
            args.model, args.model, examples, args.samples, seed, args.device
        )
    arms_root = args.workdir / "studies" / args.study_id / "arms"
    for arm_dir in sorted(d for d in arms_root.iterdir() if d.is_dir()):
        arm, entry = arm_dir.name, {}
        steps = step_rows(arm_dir)
        write_csv(args.out / f"{arm}_steps.csv", steps)
        write_csv(args.out / f"{arm}_bins.csv.gz", rows_of(arm_dir, "SELECT * FROM bin_stats"))
        write_csv(args.out / f"{arm}_roles.csv", rows_of(arm_dir, ROLE_SQL))
        write_csv(args.out / f"{arm}_tail.csv", rows_of(arm_dir, TAIL_SQL))
        write_csv(args.out / f"{arm}_stages.csv.gz", rows_of(arm_dir, STAGE_SQL))
        write_csv(args.out / f"{arm}_samples.csv.gz", rows_of(arm_dir, SAMPLE_SQL))
        entry["steps_done"] = max((row["step"] for row in steps), default=0)
        checkpoint = last_checkpoint(arm_dir)
        entry["checkpoint"] = None if checkpoint is None else str(checkpoint)
        if checkpoint is not None and not args.skip_eval:
            entry["outcome"] = outcome(
                checkpoint, args.model, examples, args.samples, seed, args.device
            )
        summary["arms"][arm] = entry
        print(arm, json.dumps(entry), flush=True)
    set_gaps_to_dense(summary["arms"])
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
