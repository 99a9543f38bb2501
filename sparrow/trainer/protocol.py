"""The trainer's interface: what the runtime asks of the policy's trainer, one process or many.

    trainer: Trainer = PolicyTrainer(model_path, cfg.algo, device, dtype, seed)
    trainer: Trainer = TrainerGroup.start(spec, num_workers)   # sparrow/runtime/trainer_group/
    scores = trainer.score(records); metrics = trainer.update(records, rewards, old, group_size)
    if trainer.sharded: ...        # weights spread over ranks: they broadcast to the engines
    isinstance(trainer, Trainer)   # the names are there (runtime_checkable)

Two implementations: PolicyTrainer (this package: one process, the whole model) and
TrainerGroup (FSDP ranks as Ray actors). The runtime (sparrow/runtime/run_runtime.py, the
stages) holds either as a Trainer and asks its capabilities instead of testing its class:
- sharded: the weights live on several ranks; weights reach the engines by the group's
  broadcast (sparrow/runtime/rollout/weight_sync.py), the DistillSparse distiller lives on
  the ranks, and there is no single state dict to share with a colocated engine;
- can_offload: offload() frees device memory (a trainer on CUDA);
- failed: why it stopped ("" while it works): a failed trainer is never handed to a stage.
tests/trainer/test_protocol.py checks both against this.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class Trainer(Protocol):
    """The policy's trainer (see the module doc)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def sharded(self) -> bool:
        """The weights live on several ranks."""
        ...

    @property
    def can_offload(self) -> bool:
        """offload() frees device memory for the rollout engines."""
        ...

    @property
    def failed(self) -> str:
        """Why the trainer stopped, "" while it works."""
        ...

    def score(self, records: Sequence[Any]) -> list[Any]:
        """Per sample: dense logprobs, acceptance and leftover actor mass per token."""
        ...

    def update(
        self,
        records: Sequence[Any],
        rewards: Sequence[float],
        old_logprobs: Sequence[Sequence[float]],
        group_size: int,
    ) -> dict[str, float]:
        """One policy update on a step's samples; its metrics."""
        ...

    def free_gradients(self) -> None: ...

    def offload(self) -> None: ...

    def onload(self) -> None: ...

    def save(self, folder: str | Path) -> Any: ...

    def save_in_background(self, folder: str | Path) -> Any: ...

    def wait_for_save(self) -> None: ...
