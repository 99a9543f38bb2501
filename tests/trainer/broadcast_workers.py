"""Processes for test_weight_broadcast.py (spawned children import this module by name).

Rank 0 sends a checkpoint's transformers-named weights through SyncGroup; the other ranks
hold an engine decoder loaded from another checkpoint of the same shape, receive into it
bucket by bucket, and save what they ended with.
"""

from __future__ import annotations

import torch


def one_member(rank, world_size, port, backend, source, target, bucket_bytes, out_dir):
    from sparrow.model import load_model
    from sparrow.model.loader import SafetensorsCheckpoint
    from sparrow.trainer.weight_broadcast import SyncGroup

    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    group = SyncGroup.connect("127.0.0.1", port, rank, world_size, backend)
    try:
        if rank == 0:
            checkpoint = SafetensorsCheckpoint(source)
            state = {name: checkpoint[name] for name in checkpoint}
            if "lm_head.weight" not in state:  # tied: transformers' state_dict repeats it
                state["lm_head.weight"] = state["model.embed_tokens.weight"]
            sent = group.send(state, torch.float32, bucket_bytes)
            torch.save({"sent": sent}, out_dir / "sender.pt")
            return
        device = "cuda" if backend == "nccl" else "cpu"
        decoder = load_model(target, dtype=torch.float32, device=device)
        buckets = []

        def consume(part):
            buckets.append(sorted(part))
            decoder.load_hf_state_dict(part, strict=False)

        group.receive(consume)
        state = {k: v.detach().cpu().clone() for k, v in decoder.state_dict().items()}
        torch.save({"state": state, "buckets": buckets}, out_dir / f"receiver{rank}.pt")
    finally:
        group.close()
