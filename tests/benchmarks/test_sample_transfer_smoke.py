"""benchmarks/sample_transfer.py runs its stages on a small shape and the two paths agree:
the records (and their Parquet files) made from array top-K equal those from tuples."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sample_transfer  # noqa: E402


def test_both_paths_give_the_same_records_and_every_stage_is_timed(tmp_path):
    out = tmp_path / "st.json"
    result = sample_transfer.main(
        ["--seqs", "4", "--tokens", "40", "--topk", "5", "--reps", "1", "--out", str(out)]
    )
    assert result["identical"] is True
    assert set(result["speedup"]) == set(sample_transfer.STAGES)
    assert all(
        result["median_s"][f"{s}_{w}"] >= 0 for s in sample_transfer.STAGES for w in ("old", "new")
    )
    assert out.is_file()


def test_the_new_path_keeps_every_row_of_every_sample():
    """The rows appended per step come back per sample in order (the growing buffer doubles
    past its first 16 rows here)."""
    steps = sample_transfer.make_steps(3, 40, 4, 1000)
    sequences = sample_transfer.new_sequences(3, 40, 4, 2)
    sample_transfer.append_new(steps, sequences, 4)
    for i, seq in enumerate(sequences):
        result = seq.to_result()
        want = [sample_transfer.legacy_read(step)[2][i] for step in steps]
        assert result.topk_ids.tolist() == want and result.topk_ids.shape == (40, 4)
