"""SyncGroup (gloo, CPU): engines' weights equal the sender's after a bucketed broadcast.

python -m pytest tests/trainer/test_weight_broadcast.py -q
"""

from __future__ import annotations

import torch
import torch.multiprocessing as mp

from sparrow.model import load_model
from sparrow.trainer.weight_broadcast import plan_buckets
from tests.trainer.broadcast_workers import one_member
from tests.trainer.sharded_workers import free_port


def test_plan_buckets_fill_to_size_and_send_tied_tensors_once():
    embed = torch.zeros(4, 3)
    state = {
        "a": torch.zeros(5),
        "embed": embed,
        "b": torch.zeros(2),
        "c": torch.zeros(20),
        "lm_head": embed,
    }
    buckets = plan_buckets(state, bucket_bytes=8 * 4, element_size=4)
    # 5 then 12 would pass 8 elements: a alone; embed (12) alone; b; c (20) alone
    assert [[e[0] for e in entries] for entries, _ in buckets] == [
        ["a"],
        ["embed", "lm_head"],
        ["b"],
        ["c"],
    ]
    assert [numel for _, numel in buckets] == [5, 12, 2, 20]
    assert buckets[1][0][1][1:] == (0, (4, 3))  # the alias reads the embedding's place
    one = plan_buckets(state, bucket_bytes=1 << 20, element_size=4)
    assert len(one) == 1 and one[0][1] == 5 + 12 + 2 + 20


def test_two_engines_receive_the_senders_weights(
    qwen3_checkpoint, qwen3_sharded_checkpoint, tmp_path
):
    before = load_model(qwen3_sharded_checkpoint).state_dict()
    want = load_model(qwen3_checkpoint).state_dict()
    assert any(not torch.equal(before[k], want[k]) for k in want)  # the sync has work to do
    bucket_bytes = 64 << 10  # a few dozen buckets for the tiny model
    mp.spawn(
        one_member,
        args=(
            3,
            free_port(),
            "gloo",
            qwen3_checkpoint,
            qwen3_sharded_checkpoint,
            bucket_bytes,
            tmp_path,
        ),
        nprocs=3,
        join=True,
    )
    sent = torch.load(tmp_path / "sender.pt")["sent"]
    unique = sum(t.numel() * 4 for t in want.values())  # the decoder holds tied weights once
    assert sent == unique
    for rank in (1, 2):
        got = torch.load(tmp_path / f"receiver{rank}.pt")
        assert len(got["buckets"]) > 3
        assert set(got["state"]) == set(want)
        for name, tensor in want.items():
            assert torch.equal(got["state"][name], tensor), (rank, name)
