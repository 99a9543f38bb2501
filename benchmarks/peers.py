"""FlashInfer as the peer of benchmarks (a): dense paged decode and sparse attention alone,
over the very cache pages our kernels read.

    from benchmarks.peers import flashinfer_cases
    row.update(flashinfer_cases(layer, lists, counts, ours_sparse_out))

Our cache is head-major ([P, Hkv, page, D]), which is FlashInfer's "HND" layout, so its
dense decode reads our k_pages / v_pages directly. Our sparse selection is per (sequence, KV
head); FlashInfer's page lists are per request, so the sparse-attention-only case runs one
request per (sequence, KV head): the cache viewed as [P * Hkv, 1, page, D] (physical page p
of head h is entry p * Hkv + h), that head's query group as the request's query heads. Each
output is compared with ours, so a mis-wired peer shows as a large difference, not as a
fast figure. Without FlashInfer the cases report why they were skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import time_graph

WORKSPACE_BYTES = 128 << 20


def _timed(fn: Callable[[], Any]) -> tuple[float, bool]:
    """Median microseconds, as a CUDA-graph replay when the call can be captured."""
    try:
        return time_graph(fn), True
    except Exception:  # a call that cannot be captured is timed launch by launch
        torch.cuda.synchronize()
        return time_graph(fn, graph=False), False


def _wrapper(flashinfer, device, tensor_cores: bool):
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, kv_layout="HND", use_tensor_cores=tensor_cores
    )


def _plan(wrapper, indptr, indices, last_len, hq, hkv, dim, page, dtype) -> None:
    wrapper.plan(
        indptr, indices, last_len, hq, hkv, dim, page, q_data_type=dtype, kv_data_type=dtype
    )


def _dense(flashinfer, layer, tensor_cores):
    q, kp, vp, tables, lengths = (
        layer[n] for n in ("q", "k_pages", "v_pages", "tables", "lengths")
    )
    batch, width = tables.shape
    hq, hkv, page, dim = q.shape[1], kp.shape[1], kp.shape[2], kp.shape[3]
    n_pages = (lengths + page - 1) // page
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = n_pages.cumsum(0)
    keep = torch.arange(width, device=q.device) < n_pages[:, None]
    indices = tables[keep].int()
    last_len = (lengths - (n_pages - 1) * page).int()
    wrapper = _wrapper(flashinfer, q.device, tensor_cores)
    _plan(wrapper, indptr, indices, last_len, hq, hkv, dim, page, q.dtype)
    return lambda: wrapper.run(q, (kp, vp))


def _sparse(flashinfer, layer, lists, counts, tensor_cores):
    q, kp, vp, tables, lengths = (
        layer[n] for n in ("q", "k_pages", "v_pages", "tables", "lengths")
    )
    batch, hq, dim = q.shape
    hkv, page = kp.shape[1], kp.shape[2]
    group = hq // hkv
    rows = batch * hkv
    entry = torch.arange(lists.shape[-1], device=q.device)
    listed = entry < counts.unsqueeze(-1)  # [B, Hkv, L]
    # entries past a row's count hold anything: clamp before the gather, drop after
    logical = lists.long().clamp(0, tables.shape[1] - 1)
    physical = tables.long().gather(1, logical.flatten(1)).view_as(lists)
    head = torch.arange(hkv, device=q.device).view(1, hkv, 1)
    indices = (physical * hkv + head)[listed].int()
    indptr = torch.zeros(rows + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = counts.flatten().cumsum(0)
    # every row's last listed page is its sequence's last page (a reserved page)
    last_logical = lists.gather(-1, (counts - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
    last_len = (lengths.view(batch, 1) - last_logical * page).clamp(1, page).flatten().int()
    k_rows = kp.view(-1, 1, page, dim)
    v_rows = vp.view(-1, 1, page, dim)
    q_rows = q.view(rows, group, dim)
    wrapper = _wrapper(flashinfer, q.device, tensor_cores)
    _plan(wrapper, indptr, indices, last_len, group, 1, dim, page, q.dtype)
    return lambda: wrapper.run(q_rows, (k_rows, v_rows)).view(batch, hq, dim)


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max())


def flashinfer_cases(
    layer: dict,
    lists: torch.Tensor,
    counts: torch.Tensor,
    ours_dense: torch.Tensor,
    ours_sparse: torch.Tensor,
) -> dict[str, Any]:
    """FlashInfer dense decode and sparse attention alone (CUDA cores and tensor cores),
    each timed and compared with our output on the same pages."""
    try:
        import flashinfer
    except Exception as error:  # not installed on this machine
        return {"flashinfer": f"not importable: {type(error).__name__}: {error}"[:200]}
    result: dict[str, Any] = {"flashinfer": getattr(flashinfer, "__version__", "?")}
    for tensor_cores in (False, True):
        tag = "tc" if tensor_cores else "cuda_cores"
        for name, build, ours in (
            ("dense", lambda: _dense(flashinfer, layer, tensor_cores), ours_dense),
            (
                "sparse_attention_only",
                lambda: _sparse(flashinfer, layer, lists, counts, tensor_cores),
                ours_sparse,
            ),
        ):
            key = f"flashinfer_{name}_{tag}"
            try:
                fn = build()
                result[f"{key}_max_abs_diff_vs_ours"] = _max_diff(fn(), ours)
                result[f"{key}_us"], result[f"{key}_graphed"] = _timed(fn)
            except Exception as error:  # one failing variant must not hide the others
                result[f"{key}_error"] = f"{type(error).__name__}: {error}"[:300]
    return result
