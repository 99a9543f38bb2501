"""Rollout file I/O on the CPU, columnar against the former per-object path: seconds and ratios.

    python benchmarks/rollout_io.py                       # 4 records x 32,768 tokens x top-20
    python benchmarks/rollout_io.py --seqs 16 --smoke     # small, seconds

What dense_score does outside the GPU forward, stage by stage: write_rollouts (the rollout
stage's side), read_rollouts, pad_batch, the actor's padded top-K (scoring._actor_topk) and
acceptance_lower_bound on the masked top-K. The former path (Parquet rows through
Table.to_pylist into tuples, tensors built from nested tuples; the code as it was before the
top-K fields became arrays) is kept here as `legacy_*` and timed in the same run on the same
records; its file, records and tensors are checked equal to the new ones ("identical").
Records are made up: random ids and top-K ids over a Qwen3-size vocabulary, normal logprobs
rounded to float32 as the engine's are.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_facts, write_json  # noqa: E402
from sparrow.data.rollouts import COLUMNS, RolloutRecord, _schema, read_rollouts, write_rollouts
from sparrow.mismatch.acceptance import acceptance_lower_bound  # noqa: E402
from sparrow.trainer.scoring import _actor_topk, pad_batch  # noqa: E402


def make_records(seqs: int, tokens: int, prompt: int, topk: int, vocab: int):
    """Records in the engine's form: tuples, nested tuples for the top-K."""
    rng = np.random.default_rng(0)
    records = []
    for i in range(seqs):
        ids = rng.integers(0, vocab, (tokens, topk)).tolist()
        logprobs = rng.normal(-3, 1, (tokens, topk)).astype(np.float32).tolist()
        records.append(
            RolloutRecord(
                i // 2,
                i % 2,
                i // 2,
                tuple(rng.integers(0, vocab, prompt).tolist()),
                tuple(rng.integers(0, vocab, tokens).tolist()),
                (-2.0,) * tokens,
                tuple(map(tuple, ids)),
                tuple(map(tuple, logprobs)),
                (1,) * tokens,
                "length",
                "",
            )
        )
    return records


# the former path


def legacy_write(path: Path, records) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [dataclasses.asdict(r) for r in records]
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), path)


def legacy_read(path: Path):
    import pyarrow.parquet as pq

    records = []
    for row in pq.read_table(path).select(list(COLUMNS)).to_pylist():
        for key in ("prompt_ids", "output_ids", "actor_logprobs", "pages_read"):
            row[key] = tuple(row[key])
        row["topk_ids"] = tuple(tuple(t) for t in row["topk_ids"])
        row["topk_logprobs"] = tuple(tuple(t) for t in row["topk_logprobs"])
        records.append(RolloutRecord(**row))
    return records


def legacy_pad_batch(records):
    width = max(r.total_length for r in records)
    gen_width = max(len(r.output_ids) for r in records)
    input_ids = torch.zeros(len(records), width, dtype=torch.long)
    attention_mask = torch.zeros(len(records), width, dtype=torch.long)
    gather = torch.zeros(len(records), gen_width, dtype=torch.long)
    targets = torch.zeros(len(records), gen_width, dtype=torch.long)
    mask = torch.zeros(len(records), gen_width, dtype=torch.bool)
    for row, r in enumerate(records):
        prompt, out = len(r.prompt_ids), len(r.output_ids)
        input_ids[row, : prompt + out] = torch.tensor(r.prompt_ids + r.output_ids)
        attention_mask[row, : prompt + out] = 1
        gather[row] = torch.clamp(torch.arange(gen_width) + prompt - 1, max=prompt + out - 1)
        targets[row, :out] = torch.tensor(r.output_ids, dtype=torch.long)
        mask[row, :out] = True
    return input_ids, attention_mask, gather, targets, mask


def legacy_actor_topk(records, width: int, vocab: int):
    k = max((len(t) for r in records for t in r.topk_ids), default=0)
    ids = torch.zeros(len(records), width, k, dtype=torch.long)
    logprobs = torch.full((len(records), width, k), -math.inf, dtype=torch.float32)
    for row, r in enumerate(records):
        widths = {len(t) for t in r.topk_ids} | {len(t) for t in r.topk_logprobs}
        assert len(widths) == 1
        if r.output_ids and widths != {0}:
            n, kr = len(r.output_ids), widths.pop()
            ids[row, :n, :kr] = torch.tensor(r.topk_ids, dtype=torch.long)
            logprobs[row, :n, :kr] = torch.tensor(r.topk_logprobs, dtype=torch.float32)
    assert 0 <= int(ids.min()) and int(ids.max()) < vocab
    return ids, logprobs


# timing


def timed(fn):
    clock = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - clock


def one_round(records, folder: Path, vocab: int) -> tuple[dict[str, float], bool]:
    """Seconds of each stage, former and new, and whether their outputs agree."""
    seconds: dict[str, float] = {}
    _, seconds["write_old"] = timed(lambda: legacy_write(folder / "old.parquet", records))
    _, seconds["write_new"] = timed(lambda: write_rollouts(folder / "new.parquet", records))
    old, seconds["read_old"] = timed(lambda: legacy_read(folder / "new.parquet"))
    new, seconds["read_new"] = timed(lambda: read_rollouts(folder / "new.parquet"))
    old_batch, seconds["pad_old"] = timed(lambda: legacy_pad_batch(old))
    new_batch, seconds["pad_new"] = timed(lambda: pad_batch(new, "cpu"))
    width = new_batch.mask.shape[1]
    old_topk, seconds["topk_old"] = timed(lambda: legacy_actor_topk(old, width, vocab))
    new_topk, seconds["topk_new"] = timed(lambda: _actor_topk(new, width, vocab))
    mask = new_batch.mask
    dense_at_ids = torch.randn(int(mask.sum()), new_topk[1].shape[-1])
    _, seconds["acceptance"] = timed(
        lambda: acceptance_lower_bound(dense_at_ids, new_topk[1][mask])
    )
    import pyarrow.parquet as pq

    same = (
        old == new == records
        and pq.read_table(folder / "old.parquet").equals(pq.read_table(folder / "new.parquet"))
        and all(torch.equal(a, b) for a, b in zip(old_batch, new_batch))
        and all(torch.equal(a, b) for a, b in zip(old_topk, new_topk))
    )
    return seconds, same


def run(args) -> dict:
    records, make_s = timed(
        lambda: make_records(args.seqs, args.tokens, args.prompt, args.topk, args.vocab)
    )
    rounds, identical = [], True
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.reps):
            seconds, same = one_round(records, Path(folder), args.vocab)
            rounds.append(seconds)
            identical = identical and same
        file_mib = os.path.getsize(Path(folder) / "new.parquet") / 2**20
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    result = {
        "shape": {
            "seqs": args.seqs,
            "tokens": args.tokens,
            "prompt": args.prompt,
            "topk": args.topk,
            "vocab": args.vocab,
        },
        "reps": args.reps,
        "make_records_s": make_s,
        "file_mib": file_mib,
        "identical": identical,
        "median_s": median,
        "threads": torch.get_num_threads(),
    }
    stages = ("write", "read", "pad", "topk")
    result["speedup"] = {s: median[f"{s}_old"] / median[f"{s}_new"] for s in stages}
    dense_side = ("read", "pad", "topk")
    old = sum(median[f"{s}_old"] for s in dense_side)
    new = sum(median[f"{s}_new"] for s in dense_side)
    result["dense_score_io"] = {"old_s": old, "new_s": new, "speedup": old / new}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--prompt", type=int, default=160)
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="1,024 tokens, one repetition")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.reps = 1024, 1
    write_json(args.out, {"facts": device_facts(), **run(args)})


if __name__ == "__main__":
    main()
