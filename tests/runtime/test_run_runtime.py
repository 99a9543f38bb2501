"""RunRuntime.before_rollout gives the engines the GPU: the cached DistillSparse distiller's
base weights are freed (algo.distill.release_during_rollout), and kept when that is off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.run_runtime import DISTILL_CACHE, RunRuntime
from sparrow_core.config import load_config
from storage import Store


class Distiller:
    def __init__(self):
        self.released = 0

    def release_base(self):
        self.released += 1


@pytest.mark.parametrize("release", [True, False])
def test_before_rollout_frees_the_distillers_base(tmp_path, release):
    cfg = load_config([f"pipeline.workdir={tmp_path}",
                       f"algo.distill.release_during_rollout={str(release).lower()}"])
    runtime = RunRuntime(cfg, "r1", Store.open_writer(tmp_path), tmp_path, None, None,
                         pool=SimpleNamespace(wake=lambda: None))
    times = runtime.before_rollout()  # no distiller yet: nothing to free
    assert set(times) == {"release_s", "engine_wake_s"} and min(times.values()) >= 0
    distiller = Distiller()
    setattr(runtime, DISTILL_CACHE, (1, distiller))
    runtime.before_rollout()
    assert distiller.released == int(release)
