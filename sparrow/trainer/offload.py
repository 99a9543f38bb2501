"""offload() / onload(): a trainer's state off its GPU while the rollout engines run, through
one page-locked host buffer allocated once (rl/host_stash.py).

    class PolicyTrainer(HostOffload): ...
    trainer.offload()      # weights, masters, AdamW moments into the stash; GPU memory freed
    trainer.onload()       # back, the copies queued on the current stream

PolicyTrainer moves its whole state (hf_model.move_state); ShardedPolicyTrainer its rank's
shards through FSDP2 (sharded_offload.py). With trainer.offload_during_rollout on a GPU, the
buffer is page-locked when the trainer is built (step 1, beside the compilation), so the
offload before step 2's rollout is already the steady state: copies, no allocation.
Tests: tests/trainer/test_host_stash.py, test_sharded_offload.py; on a GPU
test_policy_trainer_gpu.py and test_multigpu.py.
"""

from __future__ import annotations

import torch

from sparrow.trainer.host_stash import HostStash


class HostOffload:
    """The offload half of a trainer: needs .device, .trainer_config, .optimizer, .offloaded,
    ._stash (None at first), free_gradients(), _offload_tensors() and _move_state()."""

    def _offloads(self) -> bool:
        """Whether offload() moves anything (one process: only off a GPU)."""
        return self.device.type == "cuda"

    def offload(self) -> None:
        """The state to host memory so the rollout engines can have the GPU; onload() brings
        it back unchanged."""
        if self.offloaded or not self._offloads():
            return
        self._to_host()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _to_host(self) -> None:
        """offload()'s move, on any device (the CPU tests call it)."""
        self.free_gradients()
        self._move_state(torch.device("cpu"), self._host_stash())
        self.offloaded = True

    def onload(self) -> None:
        """The state back on the device; the copies are queued, not waited for."""
        if not self.offloaded:
            return
        self._move_state(self.device, None)
        self.offloaded = False

    def _host_stash(self) -> HostStash:
        if self._stash is None:
            self._stash = HostStash(pin=self.device.type == "cuda")
        return self._stash

    def _reserve_host(self) -> None:
        """With trainer.offload_during_rollout on a GPU, page-lock the offload's buffer now.
        AdamW's two moments per trained parameter do not exist before its first step and
        are counted in."""
        if not (self.trainer_config.offload_during_rollout and self.device.type == "cuda"):
            return
        # every parameter the optimizer steps: fp32 master copies take their gradients by
        # assignment and do not require grad themselves, yet get their moments at the first step
        trained = [p for g in self.optimizer.param_groups for p in g["params"]]
        # a parameter whose state holds no moments yet (absent, or an empty entry) gets two
        missing = [p for p in trained if "exp_avg" not in self.optimizer.state.get(p, {})]
        moments = 2 * HostStash.bytes_for(missing)
        self._host_stash().reserve(HostStash.bytes_for(self._offload_tensors()) + moments)

    def offload_stats(self) -> dict[str, float]:
        """The stash's buffers made, their bytes and the seconds spent page-locking them."""
        stash = self._stash
        return {
            "allocations": float(stash.allocations if stash else 0),
            "bytes": float(stash.buffer.numel() if stash and stash.buffer is not None else 0),
            "pin_s": stash.pin_seconds if stash else 0.0,
        }
