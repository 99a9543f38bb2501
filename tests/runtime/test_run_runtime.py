"""RunRuntime.before_rollout gives the engines the GPU: the cached DistillSparse distiller's
base weights are freed (algo.distill.release_during_rollout), and kept when that is off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sparrow.config import load_config
from sparrow.runtime.run_runtime import CachedDistiller, RunRuntime
from sparrow.storage import Store


class Distiller:
    def __init__(self):
        self.released = 0

    def release_base(self):
        self.released += 1


@pytest.mark.parametrize("release", [True, False])
def test_before_rollout_frees_the_distillers_base(tmp_path, release):
    cfg = load_config(
        [
            f"pipeline.workdir={tmp_path}",
            f"algo.distill.release_during_rollout={str(release).lower()}",
        ]
    )
    runtime = RunRuntime(
        cfg,
        "r1",
        Store.open_writer(tmp_path),
        tmp_path,
        None,
        None,
        pool=SimpleNamespace(wake=lambda: None),
    )
    times = runtime.before_rollout()  # no distiller yet: nothing to free
    assert set(times) == {"release_s", "engine_wake_s"} and min(times.values()) >= 0
    distiller = Distiller()
    runtime.distiller = CachedDistiller(1, distiller)
    runtime.before_rollout()
    assert distiller.released == int(release)


class Group:
    """Stands in for a TrainerGroup held by the runtime."""

    def __init__(self, failed=""):
        self.failed, self.onloads = failed, 0

    def onload(self):
        self.onloads += 1


def test_a_stopped_trainer_group_is_not_handed_to_the_next_stage(tmp_path, qwen3_checkpoint):
    from sparrow.trainer.policy_trainer import PolicyTrainer

    cfg = load_config([f"pipeline.workdir={tmp_path}"])
    runtime = RunRuntime(cfg, "r1", Store.open_writer(tmp_path), qwen3_checkpoint, None, None)
    live = Group()
    runtime.set_trainer(live, 0)
    assert runtime.trainer_before(1) is live and live.onloads == 1
    runtime.set_trainer(Group("the trainer group was stopped after score failed on rank 1"), 0)
    fresh = runtime.trainer_before(1)  # from the last saved policy: here the initial model
    assert isinstance(fresh, PolicyTrainer) and runtime.trainer_after(0) is fresh
