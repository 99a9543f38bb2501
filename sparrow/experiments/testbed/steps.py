"""One training forward and backward of the testbed model, and its timing per curriculum shape.

    from sparrow.experiments.testbed.steps import batch_shape, forward_backward, to_device
    rows, forwards = batch_shape(stage, batch_tokens=32768, micro_tokens=32768)
    ids, mask = to_device(examples, device)
    loss = forward_backward(model, ids, mask, scale=1 / forwards)   # gradients accumulate

The loss is the mean cross entropy over the completion tokens (chain of thought, answer,
eos); the prompt is context only, as in the RL policy's loss.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from sparrow.data.synthetic import Example
from sparrow.experiments.testbed.data import Stage, encode, step_examples
from sparrow.experiments.testbed.evaluate import precision


def batch_shape(stage: Stage, batch_tokens: int, micro_tokens: int) -> tuple[int, int]:
    """(rows per forward, forwards per step): about batch_tokens a step, at most
    micro_tokens (but at least one row) a forward."""
    rows = max(1, micro_tokens // stage.length)
    return rows, max(1, round(batch_tokens / (rows * stage.length)))


def to_device(examples: list[Example], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = encode(examples)
    if device.type == "cuda":  # pinned, so the copy does not wait for the queued kernels
        ids, mask = ids.pin_memory(), mask.pin_memory()
    return ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)


def forward_backward(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Mean cross entropy over the completion tokens (detached), backpropagated times scale."""
    with precision(ids.device):
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    losses = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    target_mask = mask[:, 1:].flatten()
    loss = (losses * target_mask).sum() / target_mask.sum()
    (loss * scale).backward()
    return loss.detach()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_step_seconds(
    model: torch.nn.Module,
    stages: Sequence[Stage],
    batch_tokens: int,
    micro_tokens: int,
    seed: int,
    device: torch.device,
) -> dict[Stage, float]:
    """Seconds of one step per stage: a forward and backward timed after a first one that
    warms the kernels up; the weights are untouched and the gradients cleared."""
    seconds = {}
    for stage in stages:
        rows, forwards = batch_shape(stage, batch_tokens, micro_tokens)
        # step -1: a data stream that training never reads
        ids, mask = to_device(step_examples(stage, rows, seed, step=-1), device)
        for _ in range(2):
            sync(device)
            began = time.monotonic()
            forward_backward(model, ids, mask, 1.0)
            sync(device)
            seconds[stage] = (time.monotonic() - began) * forwards
        model.zero_grad(set_to_none=True)
    return seconds
