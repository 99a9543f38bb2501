"""The schedule's shared arithmetic (sparrow/schedule_math.py) against plain loops.

Run: `python -m pytest tests/test_schedule_math.py -q`.
"""

from __future__ import annotations

import numpy as np
import torch

from sparrow.schedule_math import bin_of, pages_read


def test_bin_of_clamps_to_the_last_bin_for_ints_arrays_and_tensors():
    positions = [0, 63, 64, 200, 255, 256, 10_000]
    want_open = [p // 64 for p in positions]
    want_clamped = [min(p // 64, 3) for p in positions]
    assert [bin_of(p, 64) for p in positions] == want_open
    assert [bin_of(p, 64, 4) for p in positions] == want_clamped == [0, 0, 1, 3, 3, 3, 3]
    assert bin_of(np.array(positions), 64, 4).tolist() == want_clamped
    assert bin_of(torch.tensor(positions), 64, 4).tolist() == want_clamped
    assert bin_of(np.array(positions), 64).tolist() == want_open


def test_pages_read_is_topk_plus_reserved_capped_at_the_cache():
    assert pages_read(5, 1, 2) == 8
    counts, topk = [1, 3, 8, 9, 40], [5, 5, 5, 7, 7]
    want = [min(n, k + 3) for n, k in zip(counts, topk)]
    assert want == [1, 3, 8, 9, 10]
    assert [pages_read(k, 1, 2, n) for n, k in zip(counts, topk)] == want
    assert pages_read(np.array(topk), 1, 2, np.array(counts)).tolist() == want
    both = pages_read(torch.tensor(topk), 1, 2, torch.tensor(counts))
    assert both.tolist() == want
    assert torch.equal(both, torch.minimum(torch.tensor(counts), torch.tensor(topk) + 3))
    # an int k against a batch of caches, and a batch of k against one cache
    assert pages_read(5, 1, 2, torch.tensor(counts)).tolist() == [min(n, 8) for n in counts]
    assert pages_read(torch.tensor(topk), 1, 2, 9).tolist() == [8, 8, 8, 9, 9]
