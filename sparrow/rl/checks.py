"""Input checks shared by the RL mathematics: one error type naming the tensor that is wrong.

Used by advantages.py, aggregate.py and losses.py; nothing here computes anything.
"""

from __future__ import annotations

import torch

from sparrow.errors import SparrowError


class RLInputError(SparrowError, ValueError):
    """A tensor or setting handed to an advantage estimator or policy loss is malformed."""


def check_same_2d(**tensors: torch.Tensor) -> tuple[int, int]:
    """Every tensor is 2-D [batch, tokens] with one common shape; returns that shape."""
    shape = None
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise RLInputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 2:
            raise RLInputError(
                f"{name} must be 2-D [batch, tokens], got shape {tuple(tensor.shape)}"
            )
        if shape is None:
            shape, first = tuple(tensor.shape), name
        elif tuple(tensor.shape) != shape:
            raise RLInputError(
                f"{name} has shape {tuple(tensor.shape)} but {first} has {shape}; "
                "all must be [batch, tokens]"
            )
    assert shape is not None
    return shape


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """A 0/1 or boolean mask as bool; any other value is an error (weights are not masks)."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point() or mask.dtype in (
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
    ):
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise RLInputError("mask must hold only 0 and 1 (or booleans)")
        return mask != 0
    raise RLInputError(f"mask has unsupported dtype {mask.dtype}")
