"""benchmarks/score_host.py times every part on a small shape, and what it times is the
stage's own work: the scores written and read back are the fixed forward's, one per token."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import score_host  # noqa: E402

from sparrow.runtime.ledger.contract import read_scores  # noqa: E402


def test_every_part_is_timed(tmp_path):
    out = tmp_path / "sh.json"
    result = score_host.main(
        [
            "--seqs",
            "4",
            "--tokens",
            "40",
            "--topk",
            "5",
            "--reps",
            "1",
            "--vocab",
            "1000",
            "--out",
            str(out),
        ]
    )
    assert set(result["median_s"]) == set(score_host.PARTS)
    assert all(seconds > 0 for seconds in result["median_s"].values())
    assert out.is_file()


def test_the_scores_are_the_forwards_one_per_generated_token(tmp_path):
    args = argparse.Namespace(
        seqs=3, tokens=50, prompt=7, topk=4, vocab=500, micro_batch_tokens=64
    )  # several micro-batches
    records = score_host.make_records(args)
    score_host.one_round(records, args, tmp_path)
    scores = read_scores(tmp_path / "scores.parquet", records)
    assert [len(row) for row in scores["dense_logprobs"]] == [50, 50, 50]
    assert {value for row in scores["dense_logprobs"] for value in row} == {-1.5}
    assert all(0 <= value <= 1 for row in scores["acceptance"] for value in row)
