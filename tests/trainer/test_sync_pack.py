"""rl/sync_pack.py on 2 gloo ranks: rank 0's flat buffer holds the gathered full weights in
the engines' dtype (tied tensors once), merged with an adapter when given one; the bucket
plan over it cuts where plan_buckets cuts.

    python -m pytest tests/trainer/test_sync_pack.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from sparrow.trainer.lora import merged_for_engine
from sparrow.trainer.weight_broadcast import plan_buckets, plan_packed
from tests.stages.test_distill_sync import random_adapter
from tests.trainer.sharded_workers import pack_rank, run_ranks
from tests.trainer.test_policy_trainer import ALGO


def _view(buffer: torch.Tensor, place: tuple) -> torch.Tensor:
    offset, shape = place
    return buffer[offset : offset + torch.Size(shape).numel()].view(shape)


@pytest.mark.slow  # 2 spawned ranks per case
@pytest.mark.parametrize("fixture", ["qwen3_checkpoint", "qwen2_checkpoint"])
def test_rank0_packs_the_full_weights_once(fixture, request, tmp_path):
    checkpoint = request.getfixturevalue(fixture)  # qwen3: tied embeddings; qwen2: untied
    adapter = random_adapter(checkpoint)
    run_ranks(2, checkpoint, ALGO, adapter, tmp_path, body=pack_rank)
    got = torch.load(tmp_path / "packs.pt", weights_only=False)
    full = got["full"]  # get_model_state_dict's: a tied lm_head is a gathered copy of its own
    tied = json.loads((checkpoint / "config.json").read_text())["tie_word_embeddings"]
    assert tied == (fixture == "qwen3_checkpoint")
    unique = {name: t for name, t in full.items() if not (tied and name == "lm_head.weight")}
    buffer, layout = got["packs"]["fp32"]
    assert buffer.numel() == sum(t.numel() for t in unique.values())  # tied packed once
    for name, tensor in unique.items():
        assert torch.equal(_view(buffer, layout[name]), tensor), name
    if tied:
        assert layout["lm_head.weight"] == layout["model.embed_tokens.weight"]
    bf16, layout16 = got["packs"]["bf16"]
    assert bf16.dtype == torch.bfloat16 and layout16 == layout
    for name, tensor in unique.items():
        assert torch.equal(_view(bf16, layout[name]), tensor.to(torch.bfloat16)), name
    merged, _ = got["packs"]["merged"]
    want = merged_for_engine(unique, adapter, torch.float32)
    changed = 0
    for name, tensor in want.items():
        torch.testing.assert_close(_view(merged, layout[name]), tensor, rtol=0, atol=1e-6, msg=name)
        changed += not torch.equal(tensor, unique[name])
    assert changed == len(adapter.modules) > 0


def test_packed_buckets_cut_where_state_buckets_cut():
    embed = torch.zeros(4, 3)
    state = {
        "a": torch.zeros(5),
        "embed": embed,
        "b": torch.zeros(2),
        "c": torch.zeros(20),
        "lm_head": embed,
    }
    layout = {
        "a": (0, (5,)),
        "embed": (5, (4, 3)),
        "b": (17, (2,)),
        "c": (19, (20,)),
        "lm_head": (5, (4, 3)),
    }
    for bucket_bytes in (8 * 4, 14 * 4, 1 << 20):
        packed = plan_packed(layout, bucket_bytes, element_size=4)
        # the same entries per bucket (an alias's place in its bucket's list may differ)
        assert [(sorted(entries), numel) for _, (entries, numel) in packed] == [
            (sorted(entries), numel) for entries, numel in plan_buckets(state, bucket_bytes, 4)
        ]
        starts = [start for start, _ in packed]
        sizes = [numel for _, (_, numel) in packed]
        assert starts == [sum(sizes[:i]) for i in range(len(sizes))]  # contiguous slices
        assert sum(sizes) == 39
    with pytest.raises(ValueError, match="gap"):
        plan_packed({"a": (0, (5,)), "b": (6, (2,))}, 64, 4)
