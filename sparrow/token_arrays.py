"""Per-token top-K rows as [tokens, K] numpy arrays, and equality that ignores the form.

    ids = token_matrix(rows, np.int32)       # nested sequences or an array -> [n, K] array
    same_values(((1, 2),), np.array([[1, 2]]))   # True
    rows = TokenRows(np.int32); rows.append(step_ids[i, :k]); rows.array()   # [n, K], grown

The engine's SampleResult and the rollout files' RolloutRecord hold the actor's top-K ids
and logprobs in this form: one array per sample instead of a Python object per entry, so a
result crosses Ray (pickle), a file and the scorer's tensors as a buffer copy.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

TOPK_ID_DTYPE, TOPK_LOGPROB_DTYPE = np.int32, np.float32


def token_matrix(rows: Any, dtype: Any) -> np.ndarray:
    """The per-token top-K rows as an [n, K] array: an array as it is, nested sequences
    converted without a Python object per entry; ValueError when widths differ across
    tokens."""
    if isinstance(rows, np.ndarray):
        return rows
    n = len(rows)
    if n == 0:
        return np.zeros((0, 0), dtype)
    widths = set(map(len, rows))
    if len(widths) > 1:
        raise ValueError(f"top-K lists differ in length across tokens ({sorted(widths)})")
    k = widths.pop()
    return np.fromiter(chain.from_iterable(rows), dtype, count=n * k).reshape(n, k)


class TokenRows:
    """A sample's top-K rows as they arrive, one per decode step, in one growing buffer (a
    row copied in per token, the buffer doubled when full): no Python object kept per token
    and one copy out at the end. The width is the first row's."""

    def __init__(self, dtype: Any):
        self._dtype = dtype
        self._buffer: np.ndarray | None = None
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, row: Any) -> None:
        if self._buffer is None:
            self._buffer = np.empty((16, len(row)), self._dtype)
        elif self._count == len(self._buffer):
            grown = np.empty((2 * len(self._buffer), self._buffer.shape[1]), self._dtype)
            grown[: self._count] = self._buffer
            self._buffer = grown
        self._buffer[self._count] = row
        self._count += 1

    def array(self, width: int = 0) -> np.ndarray:
        """The rows so far as an [n, K] array of their own (`width` is K with no rows)."""
        if self._buffer is None:
            return np.zeros((0, width), self._dtype)
        return self._buffer[: self._count].copy()


def same_values(a: Any, b: Any) -> bool:
    """Equal values whatever the form (tuples, nested tuples or arrays)."""
    if not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
        return a == b
    try:
        a, b = np.asarray(a), np.asarray(b)
    except ValueError:  # ragged nested tuples against an array
        return False
    if a.size == 0 or b.size == 0:
        # no tokens: () and a [0, K] array are the same; K of no tokens is not data
        return a.size == b.size and len(a) == len(b)
    return a.shape == b.shape and bool(np.array_equal(a, b))
