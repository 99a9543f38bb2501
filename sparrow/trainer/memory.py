"""The trainer's out-of-memory as one error that names what to change.

    class PolicyTrainer:
        @names_out_of_memory("dense scoring")
        def score(self, records): ...

A CUDA out-of-memory deep in a forward or backward is a page of traceback that names a
kernel, not a setting. The trainer's entry points turn it into TrainerMemoryError: the stage,
the device's figures (what this process holds, what is free) and the settings that lower the
need (trainer.micro_batch_tokens, trainer.gradient_checkpointing, rollout.release_memory,
trainer.num_workers). The failed call's frames are let go and the process's cached blocks
given back before the error is raised, so the engines and the next stage on the same GPU get
their memory back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from sparrow.cuda_memory import return_cached_blocks
from sparrow.errors import SparrowError

GIB = 1 << 30


class TrainerMemoryError(SparrowError, RuntimeError):
    """The trainer ran out of device memory; the message names the settings to change."""


def names_out_of_memory(stage: str, checkpointing: bool = False) -> Callable:
    """Wrap a trainer method (self has .trainer_config and .device): torch.OutOfMemoryError
    becomes TrainerMemoryError about `stage` (`checkpointing`: trainer.gradient_checkpointing applies)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except torch.OutOfMemoryError as err:
                said = ". ".join(str(err).split(". ")[:2])
            # outside the except block: the failed call's frames (and their tensors) are gone,
            # so their blocks can go back to the device before its figures are read
            return_cached_blocks()
            raise TrainerMemoryError(
                memory_message(stage, self.trainer_config, self.device, said, checkpointing)
            )

        return call

    return wrap


def memory_message(
    stage: str,
    trainer_config: Any,
    device: torch.device,
    said: str,
    checkpointing: bool = False,
) -> str:
    """The error's text, with the device's figures as they are now (a CUDA device)."""
    figures = ""
    if device.type == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(device)
        held = torch.cuda.memory_reserved(device)
        figures = (
            f" (after it, this process holds {held / GIB:.1f} GiB and {free / GIB:.1f} "
            f"of the device's {total / GIB:.1f} GiB are free)"
        )
    fixes = [f"lower trainer.micro_batch_tokens (now {trainer_config.micro_batch_tokens})"]
    if checkpointing and not trainer_config.gradient_checkpointing:
        fixes.append(
            "set trainer.gradient_checkpointing=true (the backward recomputes each "
            "layer instead of keeping its activations)"
        )
    fixes.append(
        "keep rollout.release_memory=true (colocated engines free their KV caches "
        "for scoring and the update)"
    )
    fixes.append("or spread the trainer over more GPUs (trainer.num_workers)")
    return (
        f"{stage} ran out of GPU memory on {device}{figures}: {said}. To fit: "
        + "; ".join(fixes)
        + "."
    )
