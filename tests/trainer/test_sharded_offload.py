"""ShardedPolicyTrainer.offload / onload (trainer.offload_during_rollout with a trainer group) on 2
gloo ranks: every shard and moment goes through fresh memory, into one host buffer made once and
reused by the second round trip, and the updates after the round trips equal the ones without
them, bit for bit.

    python -m pytest tests/trainer/test_sharded_offload.py -q
"""

from __future__ import annotations

import dataclasses

import torch

from sparrow.config.schema import TrainerConfig
from tests.trainer.sharded_workers import offload_round_trip, run_ranks
from tests.trainer.test_policy_trainer import ALGO, make_records, with_actor_logprobs

REWARDS = (
    [0.0, 1.0, 1.0, 0.5, 0.2, 0.0],
    [1.0, 0.0, 0.0, 1.0, 0.5, 0.5],
    [0.3, 0.9, 0.0, 0.1, 1.0, 0.0],
)


def update_batch(checkpoint):
    from sparrow.trainer.policy_trainer import PolicyTrainer

    algo = dataclasses.replace(ALGO, grad_clip=0.05)
    system = TrainerConfig(micro_batch_tokens=1)
    records = make_records(prompts=3, group=2, seed=12)
    scores = PolicyTrainer(checkpoint, algo, device="cpu", seed=0, trainer_config=system).score(
        records
    )
    update_records = with_actor_logprobs(records, scores, [0.1 * (i % 3) for i in range(6)])
    return algo, system, update_records, [s.dense_logprobs for s in scores]


def check_cycles(got: dict) -> None:
    """Two round trips on rank 0: one host buffer, made once, held every shard both times."""
    cycles = got["cycles"]
    assert len(cycles) == 2
    assert [c["allocations"] for c in cycles] == [1, 1]
    assert cycles[0]["buffer"] == cycles[1]["buffer"]
    assert all(c["held"] for c in cycles)


def check_round_trip(got: dict, exact: bool) -> None:
    plain, offloaded = got["ends"]["plain"], got["ends"]["offloaded"]
    assert set(plain["weights"]) == set(offloaded["weights"])
    for name, tensor in plain["weights"].items():
        if exact:
            assert torch.equal(offloaded["weights"][name], tensor), name
        else:
            torch.testing.assert_close(offloaded["weights"][name], tensor, rtol=0, atol=1e-6)
    for index, state in plain["optimizer"]["state"].items():
        for key, value in state.items():
            if exact:
                assert torch.equal(offloaded["optimizer"]["state"][index][key], value)
    assert offloaded["optimizer"]["state"][0]["step"] == len(REWARDS)


def test_offload_round_trip_keeps_the_updates(qwen3_checkpoint, tmp_path):
    algo, system, update_records, old = update_batch(qwen3_checkpoint)
    run_ranks(
        2,
        qwen3_checkpoint,
        algo,
        system,
        update_records,
        REWARDS,
        old,
        2,
        tmp_path,
        body=offload_round_trip,
    )
    got = torch.load(tmp_path / "offload.pt", weights_only=False)
    pointers = got["pointers"]
    assert pointers["offloaded_devices"] == ["cpu"]
    # every shard and moment was copied out and back (a move in place would keep them)
    assert all(a != b for a, b in zip(pointers["before"], pointers["offloaded"]) if a)
    assert all(a != b for a, b in zip(pointers["offloaded"], pointers["onloaded"]) if a)
    check_cycles(got)
    # two more updates after the round trips: FSDP gathers from the restored shards
    check_round_trip(got, exact=True)


def test_a_shard_is_rebuilt_around_its_host_view_whatever_device_its_mesh_names(tmp_path):
    """On an NCCL rank the mesh names the GPU; building the host DTensor with
    DTensor.from_local copied each view back onto the GPU, so an offload freed nothing and
    left every shard there (the 2-GPU test saw ['cuda'])."""
    from tests.trainer.sharded_workers import wrap_host_views

    run_ranks(2, tmp_path, body=wrap_host_views)
    got = torch.load(tmp_path / "wrapped.pt", weights_only=False)
    assert got == {"same_storage": True, "device": "cpu", "shape": (4, 2), "placements": True}
