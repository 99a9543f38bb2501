"""benchmarks/async_pipeline.py: the figures it reads from a run's stage and metric rows, each
mode's settings, and its --smoke run (the real flow, synchronous and one-step-off, tiny model).

    python -m pytest tests/benchmarks/test_async_pipeline.py -q     (the smoke run: ~1 minute)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import async_pipeline  # noqa: E402


def _stage(step: int, stage: str, start: float, seconds: float) -> dict:
    return {
        "step": step,
        "stage": stage,
        "started_at": f"2026-11-29T10:00:{start:06.3f}",
        "finished_at": f"2026-11-29T10:00:{start + seconds:06.3f}",
        "duration_s": seconds,
    }


def test_a_step_is_the_gap_between_step_ends_not_the_sum_of_its_stages():
    # one-step-off: each step's rollout was generated during the step before, so its stage
    # takes ~0 s; the steps end 4 s apart, while the stages of a step sum to 3.5 s
    stages = []
    for step, end in ((1, 10.0), (2, 14.0), (3, 18.0), (4, 22.0)):
        stages += [
            _stage(step, "rollout", end - 4.0, 0.1),
            _stage(step, "dense_score", end - 3.5, 1.0),
            _stage(step, "policy_update", end - 2.5, 2.0),
            _stage(step, "sync_weights", end - 0.4, 0.4),
        ]
    metrics = [{"step": s, "name": "rollout/policy_version", "value": s - 2} for s in (2, 3, 4)]
    metrics += [{"step": s, "name": "time/rollout_generate_s", "value": 3.0} for s in (1, 2, 3, 4)]
    metrics += [{"step": s, "name": "rollout/tokens", "value": 600.0} for s in (1, 2, 3, 4)]
    got = async_pipeline.pipeline_figures(stages, metrics)
    assert got["timed_steps"] == [3, 4]
    assert got["step_s"] == pytest.approx(4.0)
    assert got["steps_per_hour"] == pytest.approx(900.0)
    assert got["trainer_busy"] == pytest.approx(3.0 / 4.0)  # sync_weights apart
    assert got["engine_busy"] == pytest.approx(3.0 / 4.0)
    assert got["sync_s"] == pytest.approx(0.4)
    assert got["staleness"] == pytest.approx(1.0)
    assert got["rollout_tokens_per_s"] == pytest.approx(200.0)
    assert got["tokens_per_step"] == pytest.approx(600.0)


def test_a_run_without_a_timed_step_is_one_error():
    stages = [_stage(1, "rollout", 0.0, 1.0), _stage(2, "rollout", 2.0, 1.0)]
    with pytest.raises(ValueError, match="no step from 3 on"):
        async_pipeline.pipeline_figures(stages, [])


def test_each_mode_places_engines_and_ranks_as_docs_async_says():
    sync4 = async_pipeline.mode_overrides("sync", 4)
    assert "trainer.num_workers=4" in sync4 and "rollout.placement=colocated" in sync4
    assert "pipeline.max_staleness=0" in sync4
    async4 = async_pipeline.mode_overrides("async", 4)
    assert "trainer.num_workers=2" in async4 and "rollout.num_actors=2" in async4
    assert "rollout.placement=separate" in async4 and "pipeline.max_staleness=1" in async4
    assert "pipeline.keep_checkpoints=2" in async4  # a resume goes two updates back
    one = async_pipeline.mode_overrides("async", 1)
    assert "trainer.num_workers=0" in one and "pipeline.max_staleness=1" in one
    # one GPU: the same KV budget in both modes, room left for the trainer beside it
    sync1 = async_pipeline.mode_overrides("sync", 1)
    assert (
        "rollout.gpu_memory_utilization=0.45" in one
        and "rollout.gpu_memory_utilization=0.45" in sync1
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "3"], "--gpus 3"),
        (["--modes", "sync,eager"], "eager"),
        (["--steps", "2"], "--steps 2"),
    ],
)
def test_bad_arguments_are_one_error_that_names_them(argv, message, capsys):
    with pytest.raises(SystemExit):
        async_pipeline.parse_args(argv)
    assert message in capsys.readouterr().err


def test_merge_joins_modes_measured_apart(tmp_path):
    def part(mode: str, steps_per_hour: float) -> Path:
        path = tmp_path / f"{mode}.json"
        row = {"mode": mode, "arms": {"sparse": {"steps_per_hour": steps_per_hour}}}
        head = dict(gpus=4, new_tokens=8, batch=4, eos=False, layers=2)
        path.write_text(json.dumps({**head, "facts": {}, "modes": {mode: row}}))
        return path

    merged = async_pipeline.merge([str(part("sync", 10.0)), str(part("async", 16.0))])
    assert set(merged["modes"]) == {"sync", "async"}
    assert merged["speedup"] == {"sparse": pytest.approx(1.6)}


@pytest.mark.slow
def test_each_mode_is_written_as_it_finishes_so_a_cut_call_keeps_it(tmp_path, monkeypatch):
    def row(args, mode, path):
        if mode == "async":
            raise SystemExit("cut by the call's time limit")
        return {"mode": mode, "overrides": [], "arms": {"dense": {"steps_per_hour": 100.0}}}

    monkeypatch.setattr(async_pipeline, "mode_row", row)
    monkeypatch.setattr(async_pipeline.rl_step, "model_path", lambda args: "unused")
    out = tmp_path / "a.json"
    with pytest.raises(SystemExit, match="cut"):
        async_pipeline.main(["--gpus", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert list(report["modes"]) == ["sync"] and report["speedup"] == {}


def test_smoke_run_measures_both_modes_and_their_staleness(run_flow_smoke):
    report = json.loads(run_flow_smoke("async_pipeline.py", 900).read_text())
    assert report["batch"] == 4 and report["gpus"] == 1
    sync, pipelined = (report["modes"][m]["arms"]["sparse"] for m in ("sync", "async"))
    for figures in (sync, pipelined):
        assert figures["timed_steps"] == [3]
        assert figures["tokens_per_step"] == 4 * 16  # eos off: every sample to the cutoff
        assert figures["step_s"] > 0 and 0 < figures["trainer_busy"] < 1
    # step 3's samples: generated by the weights it trains (sync), one update older (async)
    assert sync["staleness"] == 0 and pipelined["staleness"] == 1
    assert report["speedup"]["sparse"] > 0
