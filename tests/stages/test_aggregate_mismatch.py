"""aggregate_mismatch's pieces: per-token rows from records and scores, bin rows and
threshold events (below_target, recovered) replaced by key on a re-run.

Run: `python -m pytest tests/stages/test_aggregate_mismatch.py -q`.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from sparrow.data.rollouts import RolloutRecord
from sparrow.mismatch.acceptance import BinFloor, bin_statistics
from sparrow.sparse import Schedule
from sparrow.stages.aggregate_mismatch import StepBins, sample_metrics, sample_rows, token_table
from sparrow.storage import Store, query


def record(prompt: int, sample: int, prompt_len: int, out_len: int) -> RolloutRecord:
    return RolloutRecord(
        prompt_index=prompt,
        sample_index=sample,
        dataset_row=7,
        prompt_ids=(1,) * prompt_len,
        output_ids=tuple(range(out_len)),
        actor_logprobs=tuple(-0.1 * i for i in range(out_len)),
        topk_ids=((0,),) * out_len,
        topk_logprobs=((0.0,),) * out_len,
        pages_read=tuple(3 + i for i in range(out_len)),
        finish_reason="stop",
        answer="1",
    )


def test_token_rows_carry_total_positions_and_bins():
    records = [record(0, 0, 5, 3), record(1, 1, 9, 2)]
    scores = {
        "acceptance": [[0.9, 0.8, 0.7], [0.6, 0.5]],
        "leftover_mass": [[0.01, 0.02, 0.03], [0.04, 0.05]],
        "dense_logprobs": [[-1.0, -2.0, -3.0], [-4.0, -5.0]],
    }
    schedule = Schedule("s", topk_pages=(1, 2, 3), page_size=2, bin_tokens=6)
    table = token_table("r", 4, records, scores, schedule).to_pydict()
    assert table["position"] == [5, 6, 7, 9, 10]
    assert table["bin"] == [0, 1, 1, 1, 1]
    assert table["prompt"] == [0, 0, 0, 1, 1] and table["sample"] == [0, 0, 0, 1, 1]
    assert table["pages_read"] == [3, 4, 5, 3, 4]
    assert table["actor_logprob"] == pytest.approx([0.0, -0.1, -0.2, 0.0, -0.1])
    assert table["dense_logprob"] == [-1.0, -2.0, -3.0, -4.0, -5.0]
    assert set(table["run_id"]) == {"r"} and set(table["step"]) == {4}
    assert table["role"] == [None] * 5  # no roles: not a chase task
    assert table["policy_version"] == [3] * 5  # no version recorded: synchronous, step - 1


def test_token_rows_carry_the_policy_version_of_their_sample():
    import dataclasses

    records = [
        dataclasses.replace(record(0, 0, 2, 3), policy_version=1),
        dataclasses.replace(record(0, 1, 2, 2), policy_version=2),
    ]
    scores = {
        key: [[0.5] * 3, [0.5] * 2] for key in ("acceptance", "leftover_mass", "dense_logprobs")
    }
    schedule = Schedule("s", topk_pages=(1,), page_size=2, bin_tokens=6)
    table = token_table("r", 3, records, scores, schedule).to_pydict()
    assert table["policy_version"] == [1, 1, 1, 2, 2]


def test_token_rows_carry_the_roles_of_their_records():
    import dataclasses

    records = [dataclasses.replace(record(0, 0, 2, 3), token_roles=(2, 1, 0)), record(0, 1, 2, 1)]
    scores = {key: [[0.5] * 3, [0.5]] for key in ("acceptance", "leftover_mass", "dense_logprobs")}
    schedule = Schedule("s", topk_pages=(1,), page_size=2, bin_tokens=6)
    table = token_table("r", 1, records, scores, schedule).to_pydict()
    assert table["role"] == ["local", "lookup", "unknown", None]


def test_positions_past_the_last_bin_are_in_the_last_bin():
    # docs/method.md: the last bin covers everything from its start on; two bins of 4 tokens
    records = [record(0, 0, 3, 9)]
    scores = {
        "acceptance": [[0.9] * 9],
        "leftover_mass": [[0.0] * 9],
        "dense_logprobs": [[-1.0] * 9],
    }
    schedule = Schedule("s", topk_pages=(1, 2), page_size=2, bin_tokens=4)
    table = token_table("r", 1, records, scores, schedule).to_pydict()
    assert table["position"] == list(range(3, 12))
    assert table["bin"] == [0, 1, 1, 1, 1, 1, 1, 1, 1]


def bins_for(step: int, low_bin_acceptance: float) -> StepBins:
    rng = np.random.default_rng(step)
    positions = np.arange(300)
    acceptance = np.where(
        positions < 100,
        rng.uniform(0.95, 1.0, 300),
        np.where(positions < 200, low_bin_acceptance, 0.99),
    )
    stats = bin_statistics(positions, acceptance, bin_tokens=100)
    return StepBins("r", step, stats, {0: 4, 1: 5, 2: 6}, "s", 1, target=0.86)


def test_events_below_then_recovered_and_rows_replaced(tmp_path):
    store = Store.open_writer(tmp_path)
    try:
        for step, low in ((1, 0.5), (2, 0.95), (2, 0.95), (3, 0.95)):
            with store.connect() as conn:
                bins_for(step, low).write_rows(conn)
    finally:
        store.close()
    events = query(tmp_path, "SELECT step, bin, kind FROM threshold_events ORDER BY step").rows
    assert events == [(1, 1, "below_target"), (2, 1, "recovered")]
    stats = query(
        tmp_path, "SELECT step, bin, n, p5, pages_read FROM bin_stats WHERE step = 1 ORDER BY bin"
    ).rows
    assert [(s[1], s[2], s[4]) for s in stats] == [(0, 100, 4), (1, 100, 5), (2, 100, 6)]
    assert stats[1][3] == pytest.approx(0.5)
    assert query(tmp_path, "SELECT count(*) FROM bin_stats").rows == [(9,)]


def test_bin_rows_hold_min_and_share_below_half_of_their_tokens(tmp_path):
    rng = np.random.default_rng(1)
    positions = np.arange(300)
    acceptance = np.where(
        positions < 100, rng.uniform(0.95, 1.0, 300), np.where(positions < 200, 0.5, 0.99)
    )
    acceptance[150:160] = 0.3  # ten tokens of bin 1 below 0.5
    bins = StepBins(
        "r",
        1,
        bin_statistics(positions, acceptance, bin_tokens=100),
        {0: 4, 1: 5, 2: 6},
        "s",
        1,
        target=0.86,
    )
    with Store.open_writer(tmp_path) as store, store.connect() as conn:
        bins.write_rows(conn)
    rows = query(tmp_path, "SELECT bin, min, share_below_half FROM bin_stats ORDER BY bin").rows
    for b, lowest, share in rows:
        values = [float(v) for p, v in zip(positions, acceptance) if p // 100 == b]
        assert lowest == min(values)
        assert share == sum(v < 0.5 for v in values) / len(values)
    assert rows[1][1:] == (pytest.approx(0.3), pytest.approx(0.1))


def test_threshold_events_follow_the_target_statistic():
    rng = np.random.default_rng(2)
    positions = np.arange(200)
    # bin 0: p5 high but one very low token; bin 1: uniformly middling
    acceptance = np.where(positions < 100, 0.99, 0.9) - rng.uniform(0, 0.001, 200)
    acceptance[10] = 0.1
    stats = bin_statistics(positions, acceptance, bin_tokens=100)
    on = {
        name: StepBins("r", 1, stats, {0: 4, 1: 5}, "s", 1, target=target, statistic=name)
        for name, target in (("p5", 0.95), ("min", 0.5), ("share_below_half", 0.005))
    }
    assert on["p5"].below == [1]  # the default reads p5, as before
    assert on["min"].below == [0]  # the lone 0.1 token
    assert on["share_below_half"].below == [0]  # 1 % of bin 0 lies below 0.5, above 0.5 %
    assert StepBins("r", 1, stats, {0: 4, 1: 5}, "s", 1, target=0.95).below == [1]


def test_bins_below_the_floor_raise_no_event_and_rows_carry_bounds(tmp_path):
    # bin 1 is low but thin (3 trajectories): marked, bounded, and no below_target event
    positions = np.concatenate([np.arange(0, 100), np.arange(100, 200)])
    samples = np.concatenate([np.arange(100) % 10, np.arange(100) % 3])
    acceptance = np.where(positions < 100, 0.99, 0.5)
    stats = bin_statistics(
        positions, acceptance, bin_tokens=100, samples=samples, floor=BinFloor(50, 8)
    )
    bins = StepBins("r", 1, stats, {0: 4, 1: 5}, "s", 1, 0.86, estimator="top20_lower_bound")
    assert bins.below == []
    with Store.open_writer(tmp_path) as store, store.connect() as conn:
        bins.write_rows(conn)
    rows = query(
        tmp_path,
        "SELECT bin, samples, counted, p5_lo, p5_hi, estimator FROM bin_stats ORDER BY bin",
    ).rows
    assert [r[:3] for r in rows] == [(0, 10, True), (1, 3, False)]
    assert all(r[3] <= r[4] for r in rows) and {r[5] for r in rows} == {"top20_lower_bound"}
    assert query(tmp_path, "SELECT count(*) FROM threshold_events").rows == [(0,)]


def test_sample_rows_and_the_batch_ess():
    records = [record(0, 0, 5, 3), record(0, 1, 5, 2)]
    scores = {
        "acceptance": [[1.0, 0.5, 0.9], [0.8, 0.8]],
        "dense_logprobs": [[0.0, -0.2, -0.2], [-1.0, -1.0]],
    }
    rows = sample_rows(records, scores, "top20_lower_bound", step=3)
    assert [(r["prompt"], r["sample"], r["tokens"]) for r in rows] == [(0, 0, 3), (0, 1, 2)]
    # records without a recorded version come from a synchronous step: version step - 1
    assert [r["policy_version"] for r in rows] == [2, 2]
    assert rows[0]["mismatch_sum"] == pytest.approx(0.6) and rows[0]["min_acceptance"] == 0.5
    # actor logprobs of record(): 0, -0.1, -0.2 and 0, -0.1
    assert rows[0]["log_weight"] == pytest.approx(-0.1) and rows[1]["log_weight"] == pytest.approx(
        -1.9
    )
    assert rows[0]["lookup_mismatch_sum"] is None
    weights = np.exp([-0.1, -1.9])
    metrics = sample_metrics(rows)
    assert metrics["mismatch/ess"] == pytest.approx(weights.sum() ** 2 / (2 * (weights**2).sum()))
    assert metrics["mismatch/sequence_mismatch_max"] == pytest.approx(0.6)


def test_sample_rows_sum_the_mismatch_of_lookup_tokens_where_roles_are_known():
    import dataclasses

    from sparrow.data.token_roles import ROLE_CODE

    lookup, local = ROLE_CODE["lookup"], ROLE_CODE["local"]
    records = [
        dataclasses.replace(record(0, 0, 5, 4), token_roles=(local, lookup, local, lookup)),
        dataclasses.replace(record(0, 1, 5, 2), token_roles=(local, local)),
        record(0, 2, 5, 2),  # no roles (another task): NULL, not 0
    ]
    scores = {
        "acceptance": [[0.9, 0.25, 0.5, 0.75], [0.1, 0.2], [0.5, 0.5]],
        "dense_logprobs": [[0.0] * 4, [0.0] * 2, [0.0] * 2],
    }
    rows = sample_rows(records, scores, "exact", step=1)
    assert rows[0]["lookup_tokens"] == 2
    assert rows[0]["lookup_mismatch_sum"] == pytest.approx(0.75 + 0.25)
    assert rows[0]["mismatch_sum"] == pytest.approx(0.1 + 0.75 + 0.5 + 0.25)
    assert (rows[1]["lookup_tokens"], rows[1]["lookup_mismatch_sum"]) == (0, 0.0)
    assert (rows[2]["lookup_tokens"], rows[2]["lookup_mismatch_sum"]) == (None, None)


def test_stale_samples_give_the_controller_their_sparse_acceptance(tmp_path):
    """bin_stats (the controller's statistic) come from the acceptance against each sample's
    own version; the token rows keep both; sample_stats sum both; a plain loop checks each."""
    import dataclasses
    from types import SimpleNamespace

    from sparrow.config import load_config
    from sparrow.data.rollouts import write_rollouts
    from sparrow.runtime.ledger import contract
    from sparrow.stages.aggregate_mismatch import aggregate_step
    from sparrow.trainer.scoring import TokenScores

    # step 3: samples of version 2 are fresh, of version 1 stale
    records = [
        dataclasses.replace(record(p, s, 4, 6), policy_version=1 + (p + s) % 2)
        for p in range(3)
        for s in range(2)
    ]
    rng = np.random.default_rng(0)
    current = [rng.uniform(0.2, 1.0, 6) for _ in records]
    own = [
        c if r.policy_version == 2 else np.minimum(1.0, c + 0.3) for r, c in zip(records, current)
    ]
    rollout_dir, out = tmp_path / "rollout", tmp_path / "out"
    out.mkdir()
    write_rollouts(contract.ROLLOUTS.under(rollout_dir), records)
    schedule = Schedule("s", topk_pages=(1, 2), page_size=2, bin_tokens=6)
    contract.write_rollout_schedule(rollout_dir, schedule, 1, True)
    step_scores = [TokenScores((-1.0,) * 6, tuple(c), (0.0,) * 6) for c in current]
    version_scores = [TokenScores((-2.0,) * 6, tuple(o), (0.0,) * 6) for o in own]
    contract.write_scores(tmp_path / "scores.parquet", records, step_scores, version_scores)
    cfg = load_config(["calibrate.min_bin_tokens=1", "calibrate.min_bin_samples=1"])
    runtime = SimpleNamespace(run_id="r", cfg=cfg, tracker=None)
    written = aggregate_step(runtime, 3, str(rollout_dir), str(tmp_path / "scores.parquet"), out)
    table = pq.read_table(contract.TOKENS.under(out)).to_pydict()
    assert table["acceptance"] == pytest.approx(np.concatenate(current).tolist())
    assert table["sparse_acceptance"] == pytest.approx(np.concatenate(own).tolist())
    assert table["policy_version"] == [r.policy_version for r in records for _ in range(6)]
    assert set(table["version_dense_logprob"]) == {-2.0} and set(table["dense_logprob"]) == {-1.0}
    # per bin, the p5 of the sparse acceptance, by a plain loop over the tokens
    by_bin: dict[int, list[float]] = {}
    for position, value in zip(table["position"], table["sparse_acceptance"]):
        by_bin.setdefault(schedule.bin_of(position), []).append(value)
    metrics = written.metrics
    for b, values in by_bin.items():
        assert metrics[f"mismatch/p5_bin_{b}"] == pytest.approx(np.percentile(values, 5))
    assert metrics["mismatch/stale_frac"] == pytest.approx(3 / 6)
    assert metrics["mismatch/sparse_acceptance_mean"] == pytest.approx(np.mean(np.concatenate(own)))
    assert metrics["mismatch/acceptance_mean"] == pytest.approx(np.mean(np.concatenate(current)))
    with Store.open_writer(tmp_path / "db") as store, store.connect() as conn:
        written.db(conn)
    rows = query(
        tmp_path / "db",
        "SELECT policy_version, mismatch_sum, sparse_mismatch_sum FROM sample_stats "
        "ORDER BY prompt, sample",
    ).rows
    for (version, total, sparse), r, c, o in zip(rows, records, current, own):
        assert version == r.policy_version
        assert total == pytest.approx(sum(1 - v for v in c))
        assert sparse == pytest.approx(sum(1 - v for v in o))
