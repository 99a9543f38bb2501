"""The rollout's host path on the CPU, top-K as arrays against the former Python tuples:
seconds per stage and ratios.

    python benchmarks/sample_transfer.py                  # 16 samples x 32,768 tokens x top-20
    python benchmarks/sample_transfer.py --smoke          # 2,048 tokens, seconds

What happens to each generated token's top-K ids and logprobs between the sampler and the
rollout file, stage by stage, with the engine's own code for the new path: `append` (each
decode step's host rows, as StepOutputs.read returns them, appended to every sample, the
engine's _finish), `result` (Sequence.to_result), `transfer` (pickle and unpickle of the
results: what a Ray rollout actor's return costs on both ends), `records` (results into
RolloutRecords, sparrow/stages/rollout.py's to_records) and `write` (write_rollouts). The former path
(rows through `tolist`, a tuple per token, results holding nested tuples; the code as it was
before the top-K became arrays) is kept here as `legacy_*` and timed in the same run on the
same step rows; its records are checked equal to the new ones ("identical"). The rows are
made up: random ids over a Qwen3-size vocabulary, normal logprobs in float32 as the sampler's.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_rollout_shape_args, device_facts, write_json  # noqa: E402
from sparrow.data.rollouts import RolloutRecord, write_rollouts  # noqa: E402
from sparrow.engine.runner import StepOutputs  # noqa: E402
from sparrow.engine.sampler import SampleOutput  # noqa: E402
from sparrow.engine.sequence import Sequence  # noqa: E402
from sparrow.engine.validate import SamplingParams  # noqa: E402


def make_steps(seqs: int, tokens: int, topk: int, vocab: int) -> list[StepOutputs]:
    """One StepOutputs per decode step (the host copy the engine reads), made up."""
    gen = torch.Generator().manual_seed(0)
    return [
        StepOutputs(
            SampleOutput(
                torch.randint(0, vocab, (seqs,), generator=gen),
                torch.randn(seqs, generator=gen) - 2,
                torch.randint(0, vocab, (seqs, topk), generator=gen),
                torch.randn(seqs, topk, generator=gen) - 3,
            )
        )
        for _ in range(tokens)
    ]


def new_sequences(seqs: int, tokens: int, topk: int, prompt: int) -> list[Sequence]:
    params = SamplingParams(max_new_tokens=tokens, logprobs_topk=topk)
    return [
        Sequence(i, i // 2, i % 2, list(range(prompt)), prompt, params, i, frozenset())
        for i in range(seqs)
    ]


def append_new(steps, sequences, topk: int) -> None:
    for step in steps:  # the engine's _finish
        ids, logprobs, topk_ids, topk_logprobs = step.read()
        for i, seq in enumerate(sequences):
            seq.append(ids[i], logprobs[i], topk_ids[i, :topk], topk_logprobs[i, :topk], 1)


# the former path


@dataclass(frozen=True)
class LegacyResult:
    prompt_index: int
    sample_index: int
    output_ids: tuple
    logprobs: tuple
    topk_ids: tuple
    topk_logprobs: tuple
    pages_read: tuple
    finish_reason: str


def legacy_read(step: StepOutputs):
    rows = step._host.numpy()
    k = step.width
    return (
        rows[:, 0].astype(np.int64).tolist(),
        rows[:, 1].tolist(),
        rows[:, 2 : 2 + k].astype(np.int64).tolist(),
        rows[:, 2 + k :].tolist(),
    )


def append_legacy(steps, lists, topk: int) -> None:
    for step in steps:
        ids, logprobs, topk_ids, topk_logprobs = legacy_read(step)
        for i, seq in enumerate(lists):
            seq["ids"].append(ids[i])
            seq["logprobs"].append(logprobs[i])
            seq["topk_ids"].append(tuple(topk_ids[i][:topk]))
            seq["topk_logprobs"].append(tuple(topk_logprobs[i][:topk]))
            seq["pages"].append(1)


def legacy_results(lists) -> list[LegacyResult]:
    return [
        LegacyResult(
            i // 2,
            i % 2,
            tuple(s["ids"]),
            tuple(s["logprobs"]),
            tuple(s["topk_ids"]),
            tuple(s["topk_logprobs"]),
            tuple(s["pages"]),
            "length",
        )
        for i, s in enumerate(lists)
    ]


def to_records(results, prompt: int) -> list[RolloutRecord]:
    """sparrow/stages/rollout.py's to_records: the top-K as the result holds it."""
    return [
        RolloutRecord(
            r.prompt_index,
            r.sample_index,
            r.prompt_index,
            tuple(range(prompt)),
            tuple(r.output_ids),
            tuple(r.logprobs),
            r.topk_ids,
            r.topk_logprobs,
            tuple(r.pages_read),
            r.finish_reason,
            "",
        )
        for r in results
    ]


def timed(fn):
    clock = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - clock


def one_round(steps, args, folder: Path) -> tuple[dict[str, float], bool]:
    seconds: dict[str, float] = {}
    sequences = new_sequences(args.seqs, args.tokens, args.topk, args.prompt)
    _, seconds["append_new"] = timed(lambda: append_new(steps, sequences, args.topk))
    new, seconds["result_new"] = timed(lambda: [s.to_result() for s in sequences])
    lists = [
        {"ids": [], "logprobs": [], "topk_ids": [], "topk_logprobs": [], "pages": []}
        for _ in range(args.seqs)
    ]
    _, seconds["append_old"] = timed(lambda: append_legacy(steps, lists, args.topk))
    old, seconds["result_old"] = timed(lambda: legacy_results(lists))
    new, seconds["transfer_new"] = timed(lambda: pickle.loads(pickle.dumps(new, protocol=5)))
    old, seconds["transfer_old"] = timed(lambda: pickle.loads(pickle.dumps(old, protocol=5)))
    new_records, seconds["records_new"] = timed(lambda: to_records(new, args.prompt))
    old_records, seconds["records_old"] = timed(lambda: to_records(old, args.prompt))
    _, seconds["write_new"] = timed(lambda: write_rollouts(folder / "new.parquet", new_records))
    _, seconds["write_old"] = timed(lambda: write_rollouts(folder / "old.parquet", old_records))
    import pyarrow.parquet as pq

    same = new_records == old_records and pq.read_table(folder / "new.parquet").equals(
        pq.read_table(folder / "old.parquet")
    )
    return seconds, same


STAGES = ("append", "result", "transfer", "records", "write")


def run(args) -> dict:
    steps, make_s = timed(lambda: make_steps(args.seqs, args.tokens, args.topk, args.vocab))
    rounds, identical = [], True
    with tempfile.TemporaryDirectory() as folder:
        # a short untimed round first: pyarrow's first write pays its imports and set-up
        one_round(steps[:8], argparse.Namespace(**{**vars(args), "tokens": 8}), Path(folder))
        for _ in range(args.reps):
            seconds, same = one_round(steps, args, Path(folder))
            rounds.append(seconds)
            identical = identical and same
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    old = sum(median[f"{s}_old"] for s in STAGES)
    new = sum(median[f"{s}_new"] for s in STAGES)
    return {
        "shape": {
            "seqs": args.seqs,
            "tokens": args.tokens,
            "prompt": args.prompt,
            "topk": args.topk,
            "vocab": args.vocab,
        },
        "reps": args.reps,
        "make_steps_s": make_s,
        "identical": identical,
        "median_s": median,
        "speedup": {s: median[f"{s}_old"] / median[f"{s}_new"] for s in STAGES},
        "total": {"old_s": old, "new_s": new, "speedup": old / new},
        "threads": torch.get_num_threads(),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_shape_args(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.reps = 2048, 1
    result = {"benchmark": "sample_transfer", "facts": device_facts(), **run(args)}
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
