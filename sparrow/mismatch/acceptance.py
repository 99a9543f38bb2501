"""Mismatch between the sparse actor and the dense policy: acceptance rates, bins, statistics.

The acceptance rate of one token is alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q), with p the
dense policy and q the sparse actor at the same prefix (docs/method.md, "Acceptance"):

    from sparrow.mismatch import acceptance as mismatch
    alpha = mismatch.acceptance_from_logits(dense_logits, actor_logits)       # exact, [...]
    lower, leftover = mismatch.acceptance_lower_bound(dense_at_ids, actor_topk_logprobs)
    stats = mismatch.bin_statistics(positions, alpha)          # list[BinStats], one per bin
    mismatch.min_p5(stats), mismatch.bins_below(stats, 0.86)

Exact rates are computed in fp32 (fp64 for fp64 inputs) as 1 - 0.5 * sum |p - q|, which is
the same number but keeps identical distributions at exactly 1. Statistics and the Beta tail
fit use numpy/scipy (sparrow/mismatch/stats.py, mismatch_fit.py), re-exported here.
See docs/mismatch.md; `sparrow mismatch stats FILE.parquet` runs bin_statistics on a file.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from sparrow.mismatch.fit import TAIL_THRESHOLD, BetaFit, MismatchError, fit_beta_tail
from sparrow.mismatch.stats import (
    BIN_TOKENS,
    EXACT,
    BinFloor,
    BinStats,
    bin_index,
    bin_statistics,
    bins_below,
    min_p5,
    topk_bound_estimator,
)

__all__ = [
    "BIN_TOKENS",
    "BetaFit",
    "BinFloor",
    "BinStats",
    "EXACT",
    "MismatchError",
    "TAIL_THRESHOLD",
    "acceptance_from_logits",
    "acceptance_from_logprobs",
    "acceptance_lower_bound",
    "acceptance_lower_bound_from_dense",
    "bin_index",
    "bin_statistics",
    "bins_below",
    "fit_beta_tail",
    "min_p5",
    "topk_bound_estimator",
]

# rows per chunk are chosen so one fp32 temporary stays near 128 MiB at any vocabulary size
_CHUNK_ELEMENTS = 1 << 25


# acceptance rates (torch)


def _check_float(name: str, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise MismatchError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise MismatchError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
    if tensor.dim() < 1 or tensor.shape[-1] < 1:
        raise MismatchError(
            f"{name} needs a last (vocabulary) dimension, got {tuple(tensor.shape)}"
        )


def _check_pair(name_a: str, a: Any, name_b: str, b: Any) -> torch.dtype:
    """Checks two same-shape float tensors; returns the compute dtype (fp64 if either is)."""
    _check_float(name_a, a)
    _check_float(name_b, b)
    if a.shape != b.shape:
        raise MismatchError(
            f"{name_a} has shape {tuple(a.shape)} but {name_b} has {tuple(b.shape)}"
        )
    if a.device != b.device:
        raise MismatchError(f"{name_a} is on {a.device} but {name_b} is on {b.device}")
    return torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32


def _by_row_chunks(fn: Callable[..., torch.Tensor], *tensors: torch.Tensor) -> torch.Tensor:
    """fn over [rows, last] views of tensors sharing leading dims, in bounded-memory chunks.

    fn maps [r, ...] chunks to [r, *rest]; the result is [*leading dims, *rest].
    """
    lead = tensors[0].shape[:-1]
    flat = [t.reshape(-1, t.shape[-1]) for t in tensors]
    rows = flat[0].shape[0]
    step = max(1, _CHUNK_ELEMENTS // max(t.shape[-1] for t in flat))
    if rows <= step:
        out = fn(*flat)
    else:
        out = torch.cat([fn(*(t[i : i + step] for t in flat)) for i in range(0, rows, step)])
    return out.reshape((*lead, *out.shape[1:]))


def _exact(
    dense: torch.Tensor, actor: torch.Tensor, dtype: torch.dtype, scale: float
) -> torch.Tensor:
    def rows(dense_rows: torch.Tensor, actor_rows: torch.Tensor) -> torch.Tensor:
        dense_rows, actor_rows = dense_rows.to(dtype), actor_rows.to(dtype)
        if scale != 1.0:
            dense_rows, actor_rows = dense_rows * scale, actor_rows * scale
        p = torch.log_softmax(dense_rows, dim=-1).exp_()
        q = torch.log_softmax(actor_rows, dim=-1).exp_()
        return (1.0 - 0.5 * p.sub_(q).abs_().sum(dim=-1)).clamp_(0.0, 1.0)

    return _by_row_chunks(rows, dense, actor)


def acceptance_from_logprobs(
    dense_logprobs: torch.Tensor, actor_logprobs: torch.Tensor
) -> torch.Tensor:
    """Exact alpha from two full distributions given as logprobs [..., V]; returns [...].

    Each side is renormalised (log_softmax) first, so bf16 rounding of the logprobs cannot
    push the sum off 1. Result in [0, 1]; a row with no finite logprob gives NaN.
    """
    dtype = _check_pair("dense_logprobs", dense_logprobs, "actor_logprobs", actor_logprobs)
    return _exact(dense_logprobs, actor_logprobs, dtype, 1.0)


def acceptance_from_logits(
    dense_logits: torch.Tensor, actor_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Exact alpha from two sets of logits [..., V], both sampled at `temperature`; returns [...]."""
    if isinstance(temperature, bool) or not (
        isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0
    ):
        raise MismatchError(f"temperature must be a finite number > 0, got {temperature!r}")
    dtype = _check_pair("dense_logits", dense_logits, "actor_logits", actor_logits)
    return _exact(dense_logits, actor_logits, dtype, 1.0 / temperature)


def acceptance_lower_bound(
    dense_logprobs_at_ids: torch.Tensor, actor_topk_logprobs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower_bound, leftover_mass) from the actor's top-k: both [...] from inputs [..., K].

    lower_bound = sum over the k ids of min(p, q); leftover_mass = 1 - sum over the k ids of q,
    clipped to [0, 1]. The exact alpha lies in [lower_bound, lower_bound + leftover_mass], and
    equals lower_bound when the k ids cover the whole vocabulary.
    """
    dtype = _check_pair(
        "dense_logprobs_at_ids", dense_logprobs_at_ids, "actor_topk_logprobs", actor_topk_logprobs
    )
    p = dense_logprobs_at_ids.to(dtype).exp()
    q = actor_topk_logprobs.to(dtype).exp()
    lower = torch.minimum(p, q).sum(dim=-1).clamp_(0.0, 1.0)
    leftover = (1.0 - q.sum(dim=-1)).clamp_(0.0, 1.0)
    return lower, leftover


def acceptance_lower_bound_from_dense(
    dense_logprobs: torch.Tensor, actor_topk_ids: torch.Tensor, actor_topk_logprobs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """acceptance_lower_bound after gathering the full dense logprobs [..., V] at the actor's ids.

    The dense logprobs are renormalised (log_softmax) before the gather; ids are [..., K]
    integers in [0, V) with the same leading dims as dense_logprobs.
    """
    _check_float("dense_logprobs", dense_logprobs)
    _check_float("actor_topk_logprobs", actor_topk_logprobs)
    if not isinstance(actor_topk_ids, torch.Tensor) or actor_topk_ids.is_floating_point():
        raise MismatchError("actor_topk_ids must be an integer torch.Tensor")
    if actor_topk_ids.shape != actor_topk_logprobs.shape:
        raise MismatchError(
            f"actor_topk_ids has shape {tuple(actor_topk_ids.shape)} but actor_topk_logprobs "
            f"has {tuple(actor_topk_logprobs.shape)}"
        )
    if actor_topk_ids.shape[:-1] != dense_logprobs.shape[:-1]:
        raise MismatchError(
            f"actor_topk_ids has shape {tuple(actor_topk_ids.shape)}; its leading dims must match "
            f"dense_logprobs {tuple(dense_logprobs.shape)}"
        )
    if actor_topk_ids.device != dense_logprobs.device:
        raise MismatchError(
            f"actor_topk_ids is on {actor_topk_ids.device} but dense_logprobs is on {dense_logprobs.device}"
        )
    vocab = dense_logprobs.shape[-1]
    if actor_topk_ids.numel() and (actor_topk_ids.min() < 0 or actor_topk_ids.max() >= vocab):
        raise MismatchError(
            f"actor_topk_ids must lie in [0, {vocab}), got [{int(actor_topk_ids.min())}, "
            f"{int(actor_topk_ids.max())}]"
        )
    wide = torch.float64 in (dense_logprobs.dtype, actor_topk_logprobs.dtype)
    dtype = torch.float64 if wide else torch.float32

    def rows(dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        dense = dense.to(dtype)
        return dense.gather(-1, ids.long()) - torch.logsumexp(dense, dim=-1, keepdim=True)

    at_ids = _by_row_chunks(rows, dense_logprobs, actor_topk_ids)
    return acceptance_lower_bound(at_ids, actor_topk_logprobs.to(dtype))
