"""Projection fusion: several nn.Linear children sharing one weight tensor.

`FusableProjections.fuse_projections()` (called for the whole model by
Decoder.fuse_projections) stacks each group's output rows (q/k/v, gate/up) into one weight
tensor, and the nn.Linear parameters become views into it, so one GEMM serves each group
while names, state_dict and in-place loads stay those of transformers. Under autograd the
views run as separate Linears (gradients land on the named parameters); a cast or move
re-fuses (`_apply`). Tests: `python -m pytest tests/model/test_fused_projections.py -q`.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from sparrow.errors import SparrowError
from sparrow.model import stream
from sparrow.model.stream import Normed

# the projection groups that fuse_projections() stacks into one weight each
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


class FusionError(SparrowError, ValueError):
    """Projections that cannot share one weight tensor; the message names them."""


class FusedRows:
    """One weight (and bias) tensor holding the output rows of several nn.Linear, in order.

    The Linears keep their Parameter objects; only `.data` is re-pointed at row slices of the
    fused tensor, so optimizers, state_dict() and in-place copies by name all reach it.
    """

    def __init__(self, names: tuple[str, ...], linears: tuple[nn.Linear, ...]):
        _check_fusable(names, linears)
        self.linears = linears
        self.rows = tuple(linear.out_features for linear in linears)
        # a normal tensor even inside inference_mode: the views may later join autograd
        with torch.no_grad(), torch.inference_mode(False):
            self.weight = torch.cat([linear.weight.detach() for linear in linears])
            has_bias = linears[0].bias is not None
            self.bias = (
                torch.cat([linear.bias.detach() for linear in linears]) if has_bias else None
            )
        start = 0
        for linear, rows in zip(linears, self.rows):
            linear.weight.data = self.weight[start : start + rows]
            if has_bias:
                linear.bias.data = self.bias[start : start + rows]
            start += rows

    def serves(self, linears: tuple[nn.Module, ...]) -> bool:
        """Whether these are still the fused Linears, each parameter still its slice."""
        if any(now is not then for now, then in zip(linears, self.linears)):
            return False
        start = 0
        for linear, rows in zip(linears, self.rows):
            if not (
                _is_slice(linear.weight, self.weight, start, rows)
                and (self.bias is None or _is_slice(linear.bias, self.bias, start, rows))
            ):
                return False
            start += rows
        return True


def _is_slice(param: Tensor, fused: Tensor, start: int, rows: int) -> bool:
    offset = start * fused.stride(0) * fused.element_size()
    return (
        param.data_ptr() == fused.data_ptr() + offset
        and param.shape[0] == rows
        and param.dtype == fused.dtype
        and param.device == fused.device
    )


def _check_fusable(names: tuple[str, ...], linears: tuple[nn.Module, ...]) -> None:
    for name, linear in zip(names, linears):
        if type(linear) is not nn.Linear:
            raise FusionError(
                f"{name} is a {type(linear).__name__}, not a plain nn.Linear: fuse "
                "projections before wrapping them (LoRA adapters and the like)"
            )
    kinds = {
        name: (
            str(linear.weight.dtype),
            str(linear.weight.device),
            linear.in_features,
            linear.bias is not None,
        )
        for name, linear in zip(names, linears)
    }
    if len(set(kinds.values())) > 1:
        shown = "; ".join(f"{name} {kind}" for name, kind in kinds.items())
        raise FusionError(
            f"cannot fuse {', '.join(names)}: they differ in (dtype, device, inputs, bias): {shown}"
        )


class FusableProjections(nn.Module):
    """A module whose groups of nn.Linear children (FUSED_GROUPS) can share one weight each."""

    # each group: child names whose output rows are stacked, in this order
    FUSED_GROUPS: tuple[tuple[str, ...], ...] = ()

    def __init__(self):
        super().__init__()
        self._fused: dict[tuple[str, ...], FusedRows] = {}

    def fuse_projections(self) -> None:
        """Fuse every group (idempotent; a group whose sharing was broken is fused anew)."""
        for names in self.FUSED_GROUPS:
            linears = tuple(getattr(self, name) for name in names)
            current = self._fused.get(names)
            if current is None or not current.serves(linears):
                self._fused[names] = FusedRows(names, linears)

    @property
    def projections_fused(self) -> bool:
        """Whether every group is fused and its Linears still view the fused tensors."""
        return all(
            names in self._fused
            and self._fused[names].serves(tuple(getattr(self, name) for name in names))
            for names in self.FUSED_GROUPS
        )

    def fused_linear(self, names: tuple[str, ...], x: Tensor | Normed) -> Tensor | None:
        """x (or norm(x)) through the group's fused weight [.., sum of rows], or None: run
        them one by one (not fused; autograd must reach the named parameters; sharing was
        broken)."""
        fused = self._fused.get(names)
        if fused is None:
            return None
        linears = tuple(getattr(self, name) for name in names)
        if not fused.serves(linears):
            warnings.warn(
                f"{'/'.join(names)} no longer view their fused weight (a parameter "
                "or module was replaced); running them unfused until "
                "fuse_projections() is called again",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        if torch.is_grad_enabled() and any(
            p.requires_grad for linear in linears for p in linear.parameters()
        ):
            return None
        return stream.linear(x, fused.weight, fused.bias)

    def _apply(self, fn, recurse=True):
        # .to() / .half() / to_empty() give every parameter its own new tensor: fuse again
        result = super()._apply(fn, recurse)
        if self._fused:
            self.fuse_projections()
        return result
