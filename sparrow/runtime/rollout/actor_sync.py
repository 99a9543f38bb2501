"""The weight-sync side of a rollout actor (sparrow/runtime/rollout/actors.py's RolloutWorker inherits
it): weights copied from a colocated trainer's CUDA IPC buffer, or received from the trainer
group's broadcast; each call says how long it took and how much of that was the engine's copy.

    worker.copy_shared(message, path)        # {"mode": "ipc" or "folder", "seconds", "load_s"}
    worker.join_sync(host, port, rank, world_size, "nccl"); worker.receive_weights(path)

The class expects `self.engine` (an engine with update_weights), `self.weights_path` and
`self.load_weights(path, adapter_path)` from the worker. Driven by sparrow/runtime/rollout/weight_sync.py
(a trainer group) and sparrow/stages/sync_weights.py (one process, load_shared).
Tests: tests/runtime/trainer_group/test_group.py (gloo).
"""

from __future__ import annotations

import time
from typing import Any


class SyncedWorker:
    """Weight-sync methods of a rollout actor (see the module doc)."""

    def load_shared(self, message: dict[str, Any], path: str, adapter_path: str = "") -> str:
        """Copy weights from a colocated trainer's CUDA IPC buffer (weight_share.py; the LoRA
        already merged in it); an actor on another GPU reads the folder instead (and merges
        adapter_path). Returns how: "ipc" or "folder"."""
        return self.copy_shared(message, path, adapter_path)["mode"]

    def copy_shared(
        self, message: dict[str, Any], path: str, adapter_path: str = ""
    ) -> dict[str, Any]:
        """load_shared, timed: {"mode", "seconds", "load_s" (the copy into the engine)}."""
        from sparrow.engine import weight_share

        clock = time.perf_counter()
        if not weight_share.same_device(message):
            self.load_weights(path, adapter_path)
            seconds = time.perf_counter() - clock
            return {"mode": "folder", "seconds": seconds, "load_s": seconds}
        tensors = weight_share.open_message(message)
        loading = time.perf_counter()
        self.engine.update_weights(tensors)
        del tensors
        weight_share.release_opened()  # synchronizes: the copy is done
        loaded = time.perf_counter()
        self.weights_path = path
        return {"mode": "ipc", "seconds": loaded - clock, "load_s": loaded - loading}

    def device_uuid(self) -> str:
        from sparrow.engine.weight_share import device_uuid

        return device_uuid()

    def join_sync(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        """Join the trainer's weight-sync group (rl/weight_broadcast.py) as `rank`."""
        from sparrow.trainer.weight_broadcast import SyncGroup

        if getattr(self, "sync_group", None) is not None:
            self.sync_group.close()
        self.sync_group = SyncGroup.connect(host, port, rank, world_size, backend)

    def receive_weights(self, path: str) -> dict[str, Any]:
        """The trainer's broadcast, bucket by bucket into the engine; `path` is the folder
        the same weights are saved in (what a replacement actor would load). Returns
        {"tensors", "seconds", "load_s" (in the engine's copies; the rest is the transfer)}."""
        clock = time.perf_counter()
        loading = [0.0]

        def load(part: dict) -> None:
            started = time.perf_counter()
            self.engine.update_weights(part, strict=False)
            loading[0] += time.perf_counter() - started

        count = self.sync_group.receive(load)
        _synchronize()  # the seconds count the last bucket's copy, not only its launch
        self.weights_path = path
        return {"tensors": count, "seconds": time.perf_counter() - clock, "load_s": loading[0]}


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
