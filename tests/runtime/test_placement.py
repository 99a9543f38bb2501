"""Where trainer ranks and engines go without GPUs (sparrow/runtime/placement.py), on the
session's one-node local Ray: "pack" reserves nothing; a spread reserves one bundle per rank
holding its own and its engines' CPU shares; a strict spread over more ranks than nodes is a
PlacementError, not a wait forever. The two-node run is tests/flows/test_two_nodes.py.

    python -m pytest tests/runtime/test_placement.py -q
"""

from __future__ import annotations

import pytest

from sparrow.runtime import placement as placement_module
from sparrow.runtime.placement import PlacementError, plan_placement

pytestmark = pytest.mark.slow  # a local Ray


def _bundle(options: dict) -> int:
    return options["scheduling_strategy"].placement_group_bundle_index


def test_pack_on_cpus_reserves_nothing(flow_environment):
    flow_environment.start_ray()
    plan = plan_placement(2, "colocated", 0, use_gpu=False)
    assert plan.group is None and len(plan.engines) == 1
    assert plan.trainer == [{"num_cpus": plan.trainer[0]["num_cpus"]}] * 2


def test_spread_puts_each_rank_with_its_engines_in_a_bundle(flow_environment):
    import ray

    flow_environment.start_ray()
    cpus = ray.cluster_resources()["CPU"]
    plan = plan_placement(2, "colocated", 3, use_gpu=False, strategy="spread")
    try:
        share = cpus / 5  # 2 ranks + 3 engines
        assert [_bundle(o) for o in plan.trainer] == [0, 1]
        assert [_bundle(o) for o in plan.engines] == [0, 1, 0]
        assert all(o["num_cpus"] == pytest.approx(share) for o in plan.trainer + plan.engines)
        specs = plan.group.bundle_specs
        assert [s["CPU"] for s in specs] == pytest.approx([3 * share, 2 * share])
    finally:
        plan.release()  # the bundles hold every CPU of the cluster
    assert plan.group is None
    default = plan_placement(2, "colocated", 0, use_gpu=False, strategy="spread")
    try:  # one engine per rank when rollout.num_actors is 0
        assert [_bundle(o) for o in default.engines] == [0, 1]
    finally:
        default.release()


def test_strict_spread_over_too_few_nodes_is_refused(flow_environment, monkeypatch):
    flow_environment.start_ray()
    monkeypatch.setattr(placement_module, "PLACEMENT_TIMEOUT_S", 2.0)
    with pytest.raises(PlacementError, match="strict_spread.*1 nodes"):
        plan_placement(2, "colocated", 0, use_gpu=False, strategy="strict_spread")
