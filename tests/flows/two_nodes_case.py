"""The train flow on two Ray nodes of one machine: a trainer group with a rank on each node
(gloo), an engine on each, the second node's rank and engine killed in step 2 and the run
carried to the end; it ends equal to an uninterrupted run on the same nodes, and nothing of
either node is left running.

    python -m pytest tests/flows/two_nodes_case.py -q     (slow: two `ray start`s, two runs)

tests/flows/test_two_nodes.py runs this file in a pytest process of its own (it says why).

The nodes are `ray start --head` and `ray start --address=<head>` with 2 CPUs each
(tests/flows/ray_nodes.py); the flow joins them with `ray.address=<head>` and places its ranks
with `ray.placement_strategy=strict_spread`: one bundle per node, rank i and engine i in
bundle i. The loss: SIGKILL to the second node's actor processes (its rank and its engine),
its raylet left alive, as when a node's workers die (out of memory, a crash) but the node
stays. The pool replaces the engine in the same bundle; the dead rank stops the group at its
next call (dense_score), the stage's retry starts a new group from step 1's policy folder on
the same two bundles. A killed raylet (the whole node lost) is not recovered from here: see
docs/multi_gpu.md "Two nodes on one machine".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from sparrow.flows.train import train_flow
from sparrow.runtime.rollout.actors import ActorPool
from tests.flows.ray_nodes import RayNodes, ray_env

pytestmark = pytest.mark.slow

# metrics that measure wall-clock time, and so differ between two runs of one input
VARYING = ("time/", "rollout/tokens_per_s")


@pytest.fixture
def nodes(flow_environment, monkeypatch):
    flow_environment.start(ray=False)  # the flow joins the two nodes, not a local Ray
    import ray

    ray.shutdown()  # a Ray an earlier test of this process left connected (start_ray refuses it)
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        monkeypatch.delenv(key)
    for key, value in ray_env().items():
        if key.startswith("RAY_"):
            monkeypatch.setenv(key, value)
    # Ray's sockets live under the temp dir, and a socket path has at most 107 bytes
    root = Path(tempfile.mkdtemp(prefix="sparrow-ray-", dir="/tmp"))
    cluster = RayNodes(root)
    try:
        cluster.start()
        yield cluster
    finally:
        import ray

        ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        flow_environment.stop()


def _node_ids(nodes: RayNodes, synced: dict) -> dict[str, str]:
    """{node: its Ray node id}, from the live processes synced.json names: each process's node
    by the raylet that started it, checked against the node id the process recorded."""
    ids: dict[str, set[str]] = {}
    for entry in synced["ranks"] + synced["actors"]:
        ids.setdefault(nodes.node_of(entry["pid"]), set()).add(entry["node_id"])
    assert all(len(v) == 1 for v in ids.values()), ids
    named = {node: next(iter(v)) for node, v in ids.items()}
    assert len(set(named.values())) == len(named), named
    return named


def _placed(synced: dict, node_ids: dict[str, str]) -> dict[str, list[str]]:
    """{"ranks": [node of rank 0, node of rank 1], "actors": [node of each actor]}."""
    name = {node_id: node for node, node_id in node_ids.items()}
    return {
        kind: [name.get(e["node_id"], "") for e in synced[kind]] for kind in ("ranks", "actors")
    }


def _rows(workdir: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(workdir / "sparrow.duckdb"), read_only=True) as conn:
        return conn.execute(sql).fetchall()


def test_two_nodes_lose_the_second_nodes_actors_and_end_equal(
    nodes, small_overrides, tmp_path, monkeypatch
):
    args = (
        "trainer.num_workers=2",
        "rollout.num_actors=2",
        "ray.placement_strategy=strict_spread",
        f"ray.address={nodes.address}",
        "pipeline.eval_every=0",
    )
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    summary = train_flow(small_overrides(reference, "two", *args), show_table=False)
    assert summary["status"] == "finished"

    seen: dict = {}
    generate = ActorPool.generate

    def lose_second_node_then_generate(pool, prompts, params):
        synced_1 = killed / "runs" / "two" / "step-1" / "sync_weights" / "synced.json"
        if synced_1.is_file() and not seen:  # step 2's rollout: step 1 ran on both nodes
            synced = json.loads(synced_1.read_text())
            seen["pool"], seen["node_ids"] = pool, _node_ids(nodes, synced)
            seen["step1"] = _placed(synced, seen["node_ids"])
            seen["killed"] = [
                e["pid"]
                for e in synced["ranks"] + synced["actors"]
                if nodes.node_of(e["pid"]) == "second"
            ]
            for pid in seen["killed"]:
                os.kill(pid, signal.SIGKILL)
        return generate(pool, prompts, params)

    monkeypatch.setattr(ActorPool, "generate", lose_second_node_then_generate)
    summary = train_flow(small_overrides(killed, "two", *args), show_table=False)
    assert summary["status"] == "finished"

    # step 1: a rank and an engine on each node; its rank and engine on the second were killed
    def on_both_nodes(placed: dict[str, list[str]]) -> bool:
        # rank i and engine i share bundle i, so a node
        return sorted(placed["ranks"]) == ["head", "second"] and placed["actors"] == placed["ranks"]

    assert on_both_nodes(seen["step1"]), seen["step1"]
    assert len(seen["killed"]) == 2
    # step 2: replacements on the second node (the same bundle), every party on a node of ours
    step2 = json.loads((killed / "runs/two/step-2/sync_weights/synced.json").read_text())
    pids = {e["pid"] for e in step2["ranks"] + step2["actors"]}
    assert not pids & set(seen["killed"])
    # the flow stopped its ranks and engines at its end (ray.kill: their processes exit soon
    # after, not at once; a second or more on loaded cores)
    deadline = time.monotonic() + 30
    while nodes.running(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert nodes.running(pids) == []
    assert on_both_nodes(_placed(step2, seen["node_ids"]))
    assert seen["pool"].replaced == 1  # the engine, within step 2's rollout
    # the rank: step 2's dense_score failed on the stopped group and its retry ran it
    assert summary["stages_run"]["dense_score"] == 3

    # the same run as the uninterrupted one: each stage once, the same metrics and weights
    stages = "SELECT step, stage, count(*) FROM stage_runs GROUP BY ALL ORDER BY ALL"
    assert _rows(killed, stages) == _rows(reference, stages)
    metrics = "SELECT step, name, value FROM step_metrics ORDER BY ALL"
    want = [r for r in _rows(reference, metrics) if not r[1].startswith(VARYING)]
    assert [r for r in _rows(killed, metrics) if not r[1].startswith(VARYING)] == want
    bins = "SELECT * EXCLUDE (run_id) FROM bin_stats ORDER BY ALL"
    assert _rows(killed, bins) == _rows(reference, bins)
    final = "runs/two/step-2/policy_update/model.safetensors"
    want_w, got_w = load_file(str(reference / final)), load_file(str(killed / final))
    assert want_w.keys() == got_w.keys()
    assert all(bool((want_w[k] == got_w[k]).all()) for k in want_w)

    # nothing of either node left: GCS, raylets, agents, workers
    import ray

    ray.shutdown()
    nodes.stop()
    assert nodes.running() == []
