"""Partial rollouts (rollout.finish_fraction < 1, docs/async.md) in the synchronous flow.

Two steps at test size on the embedded model, 4 prompts x 2 samples, the batch closing once
half its groups finished. The embedded model never stops on its own, so the length spread
comes from the context: prompts of 66 to 90 tokens in a 96-token context leave budgets of 30
down to 6 tokens. Step 1 closes early and writes its unfinished groups to carried.parquet;
step 2 resumes them from their tokens under its weights, beside that many fewer new prompts.
Checked: the carried samples finish in the next step with their prefix, behavior logprobs and
per-token versions [old..., new...] kept (in the rollout file and in DuckDB); no sample is
lost or repeated over the run; a run failed in step 2's rollout, after step 1's early close,
resumes in a new run to the same end as the uninterrupted run.

Run: `python -m pytest tests/flows/test_partial_rollouts.py -q` (slow: three flow runs).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from safetensors.torch import load_file

from sparrow.data.rollouts import read_rollouts
from sparrow.engine.sequence import OPEN
from sparrow.flows.train import train_flow
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from sparrow.storage import query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

STEPS, PROMPTS, SAMPLES = 2, 4, 2
TIMING = ("time/", "rollout/tokens_per_s")


def partial_overrides(small_overrides, workdir: Path, *extra: str) -> list[str]:
    data = workdir.parent / "spread.jsonl"
    if not data.exists():  # 16 rows of 11 to 15 lines of 6 characters (one token each)
        rows = [{"prompt": "ab=cd\n" * (11 + r % 5), "answer": "x"} for r in range(16)]
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return small_overrides(
        workdir,
        "pr",
        f"pipeline.steps={STEPS}",
        f"data.prompts_per_step={PROMPTS}",
        f"data.train={data}",
        "data.eval=''",
        "data.chat_template=none",
        "model.max_context=96",
        "rollout.max_new_tokens=32",
        "rollout.finish_fraction=0.5",
        *extra,
    )


def rollout_file(workdir: Path, step: int, name: str = "rollouts.parquet") -> list:
    return read_rollouts(workdir / "runs" / "pr" / f"step-{step}" / "rollout" / name)


def metrics_of(workdir: Path) -> dict[tuple[int, str], float]:
    return {
        (r["step"], r["name"]): r["value"]
        for r in query(workdir, "SELECT step, name, value FROM step_metrics").as_dicts()
        if not r["name"].startswith(TIMING)
    }


@pytest.fixture(scope="module")
def partial(tmp_path_factory, flow_environment, small_overrides):
    flow_environment.start()
    workdir = tmp_path_factory.mktemp("partial") / "work"
    summary = train_flow(partial_overrides(small_overrides, workdir), show_table=False)
    assert summary["status"] == "finished"
    return workdir


def test_carried_samples_finish_in_the_next_step_with_their_versions(partial):
    carried_steps = 0
    for step in range(1, STEPS):
        carried = {
            (r.dataset_row, r.sample_index): r
            for r in rollout_file(partial, step, "carried.parquet")
        }
        batch = rollout_file(partial, step)
        # the batch is whole groups that all finished, half of the step's groups at least
        groups = Counter(r.prompt_index for r in batch)
        assert set(groups.values()) == {SAMPLES} and len(groups) >= PROMPTS // 2
        assert all(r.finish_reason in ("stop", "length") for r in batch)
        assert any(r.finish_reason == OPEN for r in carried.values()) == bool(carried)
        carried_steps += bool(carried)
        after = {(r.dataset_row, r.sample_index): r for r in rollout_file(partial, step + 1)}
        # every carried group completes in the next step (a sample is carried once at most)
        assert set(carried) <= set(after)
        for key, before in carried.items():
            done, n = after[key], len(before.output_ids)
            assert tuple(done.output_ids[:n]) == tuple(before.output_ids)
            assert tuple(done.actor_logprobs[:n]) == tuple(before.actor_logprobs)
            if before.finish_reason != OPEN:  # finished before the close: kept as it was
                assert done.output_ids == before.output_ids and not len(done.token_versions)
                continue
            assert len(done.output_ids) > n and done.policy_version == step - 1
            want = [step - 1] * n + [step] * (len(done.output_ids) - n)
            assert list(done.token_versions) == want
        # the step's rollout held PROMPTS groups: the carried ones and fewer new prompts
        rows = {r.dataset_row for r in after.values()} | {
            r.dataset_row for r in rollout_file(partial, step + 1, "carried.parquet")
        }
        assert len(rows) == PROMPTS
    assert carried_steps >= 1, "no step closed early: the test needs a length spread"


def test_no_sample_is_lost_or_repeated_over_the_run(partial):
    seen = Counter(
        (r.dataset_row, r.sample_index)
        for s in range(1, STEPS + 1)
        for r in rollout_file(partial, s)
    )
    left = Counter(
        (r.dataset_row, r.sample_index) for r in rollout_file(partial, STEPS, "carried.parquet")
    )
    assert set(seen.values()) == {1} and not set(seen) & set(left)
    metrics = metrics_of(partial)
    taken = sum(PROMPTS - metrics[(s, "rollout/carried_in_groups")] for s in range(1, STEPS + 1))
    assert len({row for row, _ in seen | left}) == taken
    assert sum(metrics[(s, "rollout/samples")] for s in range(1, STEPS + 1)) == len(seen)


def test_duckdb_has_each_token_of_its_own_version(partial):
    versions = query(
        partial,
        "SELECT step, prompt, sample, list(policy_version ORDER BY position) AS v "
        "FROM token_mismatch GROUP BY ALL",
    ).as_dicts()
    for step in range(1, STEPS + 1):
        for record in rollout_file(partial, step):
            [row] = [
                v["v"]
                for v in versions
                if (v["step"], v["prompt"], v["sample"])
                == (step, record.prompt_index, record.sample_index)
            ]
            assert row == record.versions_of_tokens(step - 1)
    assert any(len(set(v["v"])) == 2 for v in versions)


def test_a_failure_after_the_early_close_resumes_to_the_same_end(
    partial, tmp_path, small_overrides
):
    workdir = tmp_path / "work"
    with pytest.raises(StageFailedOnPurpose):  # step 1's carried.parquet is recorded by then
        overrides = partial_overrides(small_overrides, workdir, "pipeline.fail_at=rollout@2")
        train_flow(overrides, show_table=False)
    summary = train_flow(partial_overrides(small_overrides, workdir), show_table=False)
    assert summary["status"] == "finished" and summary["resumed"]
    for step in range(1, STEPS + 1):
        for name in ("rollouts.parquet", "carried.parquet"):
            assert rollout_file(workdir, step, name) == rollout_file(partial, step, name)
    assert metrics_of(workdir) == metrics_of(partial)
    final = f"runs/pr/step-{STEPS}/policy_update/model.safetensors"
    want, got = load_file(str(partial / final)), load_file(str(workdir / final))
    assert want.keys() == got.keys() and all(bool((want[k] == got[k]).all()) for k in want)
