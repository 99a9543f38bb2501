"""Two GPUs of one host (marked multigpu: `python -m pytest -m multigpu tests/rl/
test_multigpu.py -q`): the NCCL weight broadcast delivers the sender's exact weights, and an
update of ShardedPolicyTrainer on 2 NCCL ranks equals one GPU's PolicyTrainer; offloading the
ranks' shards frees their GPU memory and the updates after the round trip are unchanged.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.multiprocessing as mp

from sparrow.config.schema import TrainerConfig
from sparrow.model import load_model
from sparrow.trainer.policy_trainer import PolicyTrainer
from tests.trainer.broadcast_workers import one_member
from tests.trainer.multigpu_workers import update_rank
from tests.trainer.sharded_workers import free_port, offload_round_trip
from tests.trainer.test_policy_trainer import ALGO, make_records, weights, with_actor_logprobs

pytestmark = pytest.mark.multigpu


def test_two_gpus_are_there():
    assert torch.cuda.device_count() >= 2, "the multigpu tests need 2 CUDA GPUs"


def test_nccl_broadcast_gives_the_sender_weights(
    qwen3_checkpoint, qwen3_sharded_checkpoint, tmp_path
):
    assert torch.cuda.device_count() >= 2
    want = load_model(qwen3_checkpoint).state_dict()
    mp.spawn(
        one_member,
        args=(
            2,
            free_port(),
            "nccl",
            qwen3_checkpoint,
            qwen3_sharded_checkpoint,
            64 << 10,
            tmp_path,
        ),
        nprocs=2,
        join=True,
    )
    got = torch.load(tmp_path / "receiver1.pt")
    assert len(got["buckets"]) > 3
    for name, tensor in want.items():
        assert torch.equal(got["state"][name], tensor), name


def test_two_nccl_ranks_update_like_one_gpu(qwen3_checkpoint, tmp_path):
    assert torch.cuda.device_count() >= 2
    algo = dataclasses.replace(ALGO, grad_clip=0.05)
    system = TrainerConfig(micro_batch_tokens=1)
    records = make_records(prompts=3, group=2, seed=12)
    rewards = [0.0, 1.0, 1.0, 0.5, 0.2, 0.0]
    single = PolicyTrainer(
        qwen3_checkpoint, algo, device="cuda", dtype="float32", seed=0, trainer_config=system
    )
    scores = single.score(records)
    update_records = with_actor_logprobs(records, scores, [0.1 * (i % 3) for i in range(6)])
    old = [s.dense_logprobs for s in scores]
    mp.spawn(
        update_rank,
        args=(
            2,
            free_port(),
            qwen3_checkpoint,
            algo,
            system,
            update_records,
            rewards,
            old,
            2,
            tmp_path,
        ),
        nprocs=2,
        join=True,
    )
    expected = single.update(update_records, rewards, old, 2)
    got = torch.load(tmp_path / "nccl_rank0.pt", weights_only=False)
    for key, value in expected.items():
        assert got["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    want = {k: v.cpu() for k, v in weights(single).items()}
    for name, tensor in got["weights"].items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=2e-5)


def test_nccl_ranks_offload_their_shards_and_update_alike(qwen3_checkpoint, tmp_path):
    from tests.trainer.test_sharded_offload import (
        REWARDS,
        check_cycles,
        check_round_trip,
        update_batch,
    )

    assert torch.cuda.device_count() >= 2
    algo, system, update_records, old = update_batch(qwen3_checkpoint)
    mp.spawn(
        offload_round_trip,
        args=(
            2,
            free_port(),
            qwen3_checkpoint,
            algo,
            system,
            update_records,
            REWARDS,
            old,
            2,
            tmp_path,
            "nccl",
        ),
        nprocs=2,
        join=True,
    )
    got = torch.load(tmp_path / "offload.pt", weights_only=False)
    assert got["pointers"]["offloaded_devices"] == ["cpu"]
    memory = got["memory"]
    assert memory["before"] - memory["offloaded"] >= 0.9 * memory["shard_bytes"]
    check_cycles(got)  # the page-locked buffer made once, reused by the second offload
    check_round_trip(got, exact=False)
