"""The arithmetic of a sparsity schedule: length bin of a position, pages read per step.

    from sparrow.schedule_math import bin_of, pages_read
    bin_of(41_000, bin_tokens=2000, num_bins=20)          # 19: past the last bin is the last bin
    pages_read(157, reserved_bos=1, reserved_eos=2)       # 160 pages per sparse step
    pages_read(157, 1, 2, num_pages=90)                   # 90: no more than k eligible is dense

sparrow.sparse.schedule.Schedule owns these rules and delegates here; this module imports
nothing, so that every layer (mismatch, kernels, sparse, engine, tasks) can share one copy.
Both functions take ints, numpy arrays or torch tensors and check nothing: callers that take
user input check it first (Schedule, sparrow.mismatch.acceptance.bin_index).
"""

from __future__ import annotations

import numbers
from typing import Any


def bin_of(position: Any, bin_tokens: int, num_bins: int | None = None) -> Any:
    """Length bin of total positions: position // bin_tokens, clamped to num_bins - 1 if given.

    The method's last bin covers everything from its start on (docs/method.md: 20 bins, the
    last from 38K tokens); num_bins=None leaves the bins open-ended (a table with no schedule).
    """
    bins = position // bin_tokens
    if num_bins is None:
        return bins
    if isinstance(bins, numbers.Integral):
        return min(bins, num_bins - 1)
    return bins.clip(max=num_bins - 1)  # numpy arrays and torch tensors alike


def pages_read(topk: Any, reserved_bos: int, reserved_eos: int, num_pages: Any = None) -> Any:
    """Pages one sparse step reads per KV head: top-k plus the reserved pages, at most num_pages.

    num_pages is the cache's page count n; with no more than k eligible pages the step reads
    all n (a dense step), hence min(n, top-k + reserved_bos + reserved_eos).
    """
    pages = topk + reserved_bos + reserved_eos
    if num_pages is None:
        return pages
    if isinstance(pages, numbers.Integral) and isinstance(num_pages, numbers.Integral):
        return min(num_pages, pages)
    # elementwise min(n, pages) for numpy arrays and torch tensors, broadcasting like minimum
    return pages + (num_pages - pages).clip(max=0)
