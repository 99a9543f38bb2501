"""The dense_score stage's host work on the CPU, beside the model's forward: seconds per part.

    python benchmarks/score_host.py                  # 16 samples x 32,768 tokens x top-20
    python benchmarks/score_host.py --smoke          # 2,048 tokens, seconds

What the stage does besides the forward (sparrow/stages/dense_score.py; its file is sparrow/runtime/ledger/contract.py's), with the project's code on
made-up rollouts: `read` (read_rollouts of the rollout file), `score_host` (score_rollouts with
the forward replaced by precomputed outputs: padding, the actor's top-K into tensors, the
acceptance bound over [tokens, K], the per-token results back into tuples), `write`
(write_scores) and `read_scores` (as policy_update and aggregate_mismatch read them). The
forward itself (the dense model on the GPU) is not here: benchmarks/trainer.py times it.
The baseline in the same run is the rollout file's write (write_rollouts, the rollout stage's
last act), against which each part is a ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_rollout_shape_args, device_facts, write_json  # noqa: E402
from sparrow.data.rollouts import RolloutRecord, read_rollouts, write_rollouts  # noqa: E402
from sparrow.runtime.ledger.contract import read_scores, write_scores  # noqa: E402
from sparrow.trainer.scoring import score_rollouts  # noqa: E402

PARTS = ("write_rollouts", "read", "score_host", "write", "read_scores")


def make_records(args) -> list[RolloutRecord]:
    rng = np.random.default_rng(0)
    shape = (args.tokens, args.topk)
    return [
        RolloutRecord(
            i // 8,
            i % 8,
            i // 8,
            rng.integers(0, args.vocab, args.prompt).tolist(),
            rng.integers(0, args.vocab, args.tokens).tolist(),
            (rng.standard_normal(args.tokens) - 2).astype(np.float32),
            rng.integers(0, args.vocab, shape).astype(np.int32),
            (rng.standard_normal(shape) - 3).astype(np.float32),
            rng.integers(0, 64, args.tokens).astype(np.int32),
            "length",
            "",
        )
        for i in range(args.seqs)
    ]


class Vocabulary(torch.nn.Module):
    """Stands in for the model: score_rollouts asks it only for its vocabulary size."""

    def __init__(self, vocab: int):
        super().__init__()
        self.head = torch.nn.Linear(1, vocab, bias=False, device="meta")
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the device score_rollouts reads

    def get_output_embeddings(self):
        return self.head

    def parameters(self, recurse: bool = True):
        yield self.anchor


def fixed_forward(topk: int):
    """The forward's outputs (dense logprob per token, dense logprobs at the top-K ids)."""

    def forward(batch, extra_ids):
        tokens = int(batch.mask.sum())
        return torch.full((tokens,), -1.5), torch.full((tokens, topk), -3.0)

    return forward


def one_round(records, args, folder: Path) -> dict[str, float]:
    seconds = {}

    def timed(name, fn):
        clock = time.perf_counter()
        result = fn()
        seconds[name] = time.perf_counter() - clock
        return result

    rollouts, scores_file = folder / "rollouts.parquet", folder / "scores.parquet"
    timed("write_rollouts", lambda: write_rollouts(rollouts, records))
    read = timed("read", lambda: read_rollouts(rollouts))
    scores = timed(
        "score_host",
        lambda: score_rollouts(
            Vocabulary(args.vocab), read, args.micro_batch_tokens, forward=fixed_forward(args.topk)
        ),
    )
    timed("write", lambda: write_scores(scores_file, read, scores))
    back = timed("read_scores", lambda: read_scores(scores_file, read))
    assert len(back["dense_logprobs"]) == len(records) == len(scores)
    return seconds


def run(args) -> dict:
    records = make_records(args)
    with tempfile.TemporaryDirectory() as folder:
        small = argparse.Namespace(**{**vars(args), "tokens": 8})
        one_round(make_records(small), small, Path(folder))  # pyarrow's first-use set-up
        rounds = [one_round(records, args, Path(folder)) for _ in range(args.reps)]
    median = {part: statistics.median(r[part] for r in rounds) for part in PARTS}
    tokens = args.seqs * args.tokens
    stage = sum(median[p] for p in PARTS[1:])
    return {
        "shape": {
            "seqs": args.seqs,
            "tokens": args.tokens,
            "prompt": args.prompt,
            "topk": args.topk,
            "vocab": args.vocab,
            "micro_batch_tokens": args.micro_batch_tokens,
        },
        "reps": args.reps,
        "median_s": median,
        "dense_score_host_s": stage,
        "over_write_rollouts": {p: median[p] / median["write_rollouts"] for p in PARTS[1:]},
        "tokens_per_s": {p: tokens / median[p] for p in PARTS},
        "threads": torch.get_num_threads(),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_shape_args(parser)
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=8192,
        help="trainer.micro_batch_tokens (its default)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.reps = 2048, 1
    result = {"benchmark": "score_host", "facts": device_facts(), **run(args)}
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
