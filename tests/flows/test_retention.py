"""Checkpoint retention: old policy_update folders lose their tensors, the newest and every
N-th keep them, and the run's last policy still loads.

    python -m pytest tests/flows/test_retention.py -q
"""

from __future__ import annotations

import json


def test_old_policy_folders_are_pruned(flow_environment, small_overrides, tmp_path):
    from sparrow.flows.train import train_flow

    flow_environment.start()
    workdir = tmp_path / "work"
    summary = train_flow(
        small_overrides(
            workdir,
            "k",
            "pipeline.steps=3",
            "pipeline.keep_checkpoints=1",
            "pipeline.keep_every=2",
            "pipeline.eval_every=0",
        ),
        show_table=False,
    )
    assert summary["status"] == "finished"
    folder = workdir / "runs" / "k"
    kept = {
        step: (folder / f"step-{step}" / "policy_update" / "model.safetensors").exists()
        for step in (1, 2, 3)
    }
    assert kept == {1: False, 2: True, 3: True}
    marker = json.loads((folder / "step-1" / "policy_update" / "pruned.json").read_text())
    assert "model.safetensors" in marker["removed"] and "optimizer.pt" in marker["removed"]
    # the worker deleted the renamed tensors before the run closed
    assert not (folder / "step-1" / "policy_update" / ".pruned-tensors").exists()
    # the checkpoint at the end is its own copy (hard links), untouched by pruning
    assert (folder / "checkpoints" / "step-3" / "model.safetensors").exists()


def test_pruning_never_waits_for_a_background_save(tmp_path, monkeypatch):
    """Pruning runs right after policy_update starts its background save: it must not join
    it (the write overlaps the next rollout), and it leaves a state not yet written alone."""
    from types import SimpleNamespace

    import sparrow.runtime.ledger.retention as retention
    from sparrow.storage.run_rows import StageRecord

    done, writing = tmp_path / "step-1", tmp_path / "step-2"
    for folder in (done, writing):
        folder.mkdir()
        (folder / "model.safetensors").write_text("x")
    (done / "config.json").write_text("{}")  # step 2's save has not reached its config yet
    (done / "sharded_state").mkdir()  # a trainer group's optimizer shards go too
    (done / "sharded_state" / "__0_0.distcp").write_text("x")
    records = [
        StageRecord("r", s, "policy_update", 1.0, str(f)) for s, f in ((1, done), (2, writing))
    ]
    monkeypatch.setattr(retention, "stage_records", lambda store, run_id: records)

    def policy_state(folder, wait=True):
        assert not wait, "pruning joined a background save"
        return type(done)(folder)

    runtime = SimpleNamespace(
        store=None,
        run_id="r",
        policy_state=policy_state,
        cfg=SimpleNamespace(pipeline=SimpleNamespace(keep_checkpoints=1, keep_every=0)),
    )
    assert retention.prune_policy_folders(runtime, 3) == [done]
    assert not (done / "model.safetensors").exists() and not (done / "sharded_state").exists()
    assert (writing / "model.safetensors").exists()
    retention.wait_for_deletions()  # the tensors went to a worker thread, renamed at once
    assert not (done / retention.TRASH).exists()
    assert json.loads((done / retention.MARKER).read_text())["removed"] == [
        "model.safetensors",
        "sharded_state",
    ]


def test_a_trash_left_by_a_dead_process_goes_on_resume(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import sparrow.runtime.ledger.retention as retention
    from sparrow.storage.run_rows import StageRecord

    folder = tmp_path / "step-1"
    (folder / retention.TRASH).mkdir(parents=True)
    (folder / retention.TRASH / "optimizer.pt").write_text("x")
    (folder / "config.json").write_text("{}")
    (folder / retention.MARKER).write_text("{}")
    monkeypatch.setattr(
        retention,
        "stage_records",
        lambda store, run_id: [StageRecord("r", 1, "policy_update", 1.0, str(folder))],
    )
    runtime = SimpleNamespace(
        store=None, run_id="r", policy_state=lambda f, wait=True: type(folder)(f)
    )
    assert retention.repair_unsaved_policies(runtime) == []
    assert not (folder / retention.TRASH).exists() and (folder / "config.json").exists()
