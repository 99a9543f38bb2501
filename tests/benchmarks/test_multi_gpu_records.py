"""benchmarks/multi_gpu.py turns engine results into rollout records (its --smoke run, 2 CPU
ranks, is too slow for the suite; this holds the part that broke on the GPU: a renamed field)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import multi_gpu  # noqa: E402

from sparrow_core.engine.sequence import SampleResult  # noqa: E402


def test_records_of_carries_every_field_of_a_sample():
    sample = SampleResult(prompt_index=0, sample_index=1, output_ids=(5, 6),
                          logprobs=(-0.5, -1.5), topk_ids=((5, 7), (6, 8)),
                          topk_logprobs=((-0.5, -2.0), (-1.5, -1.6)), pages_read=(3, 4),
                          finish_reason="length")
    records = multi_gpu.records_of([[1, 2, 3]], [[sample]])
    assert len(records) == 1
    record = records[0]
    assert record.prompt_ids == (1, 2, 3)
    assert record.output_ids == (5, 6)
    assert record.pages_read == (3, 4)
    assert record.finish_reason == "length"
