"""Device functions of page_topk.py's row selection: which eligible pages of one row are
the top k, found by narrowing a set of candidates pass by pass (no sort).

    taken, candidate, room, n_candidates = _topk_search(score, eligible, n_eligible, k,
                                                        RADIX)

Each pass puts the candidates (eligible pages neither taken nor dropped yet) into
BINS = 2^RADIX bins, histograms them and picks the bin holding the room-th largest:
candidates in higher bins are taken, those in lower bins dropped, the chosen bin's stay.
The bin of a score is a RADIX-bit digit of a 32-bit key ordered as the scores are (int32
bits, no 64-bit arithmetic), from the top digit down, so at most 32 / RADIX passes. The
search stops once the candidates can all be taken (n_candidates <= room) or every digit is
spent (the candidates are then tied); page_topk.py takes candidates in page order up to
room (ties to the lower page). Exact because the bin of a score is a monotone
non-decreasing function of it: a pass never separates equal scores and keeps every larger
score above every smaller.

Binning the candidates' score range into equal bins instead of by digits (fewer passes on
score-like rows in a simulation) measured slower on an H100, so digits are the only search.

Scores must be free of NaN; eligible scores may be any finite value or +inf. An eligible
-inf ranks below every finite score here, whereas sparse/selection.py ranks it after the
reserved_bos pages (it masks ineligible pages to -inf before a stable sort), so rows with
eligible -inf scores may differ from the reference; page_scores.py writes -inf only past a
row's page count, which is never eligible. The caller maps -0.0 to 0.0.
Tests: tests/kernels/test_topk_search.py.
"""

from __future__ import annotations

from sparrow.kernels.runtime import jit, tl


@jit
def _order_key(score):
    """32-bit keys whose unsigned order is the scores' order (as int32 bits): flip the sign
    bit of a positive float, every bit of a negative one."""
    bits = score.to(tl.int32, bitcast=True)
    return bits ^ tl.where(bits < 0, -1, -2147483648)


@jit
def _max_min_max(a0, b0, c0, a1, b1, c1):
    return tl.maximum(a0, a1), tl.minimum(b0, b1), tl.maximum(c0, c1)


@jit
def _choose_bin(hist, n_candidates, room, BINS: tl.constexpr):
    """The bin holding the room-th largest candidate (room >= 1): (bin, candidates above
    it, candidates in it), in one reduction over the bins. The candidates in bin d or above
    fall as d grows: the chosen bin is the last to reach room and has the fewest of those
    that do; the candidates above it are the most of those that do not."""
    bins = tl.arange(0, BINS)
    at_least = n_candidates - tl.cumsum(hist, axis=0) + hist
    reach = at_least >= room
    chosen, from_chosen, above = tl.reduce(
        (
            tl.where(reach, bins, -1),
            tl.where(reach, at_least, n_candidates),
            tl.where(reach, 0, at_least),
        ),
        0,
        _max_min_max,
    )
    return chosen, above, from_chosen - above


@jit
def _topk_search(score, eligible, n_eligible, k, RADIX: tl.constexpr):
    """(taken, candidate, room, n_candidates) for one row: see the module docstring.
    Every pass keeps room <= n_candidates and room + taken pages = k, so with more than k
    eligible pages exactly k are chosen."""
    BINS: tl.constexpr = 1 << RADIX
    key = _order_key(score)
    taken = eligible & (key != key)
    candidate = eligible
    room = k
    n_candidates = n_eligible
    shift = tl.zeros([], tl.int32) + (32 - RADIX)
    while (room > 0) & (n_candidates > room) & (shift >= 0):
        bin_index = (key >> shift) & (BINS - 1)
        shift -= RADIX
        hist = tl.histogram(bin_index, BINS, mask=candidate)
        chosen, above, inside = _choose_bin(hist, n_candidates, room, BINS)
        taken = taken | (candidate & (bin_index > chosen))
        candidate = candidate & (bin_index == chosen)
        room -= above
        n_candidates = inside
    return taken, candidate, room, n_candidates
