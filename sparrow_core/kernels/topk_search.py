"""Device functions of page_topk.py's row selection: which eligible pages of one row are
the top k, found by narrowing a set of candidates pass by pass (no sort).

    taken, candidate, room, n_candidates = _topk_search(score, eligible, k, RADIX,
                                                        VALUE_PASSES)

Each pass puts the candidates (eligible pages neither taken nor dropped yet) into
BINS = 2^RADIX bins, histograms them and picks the bin holding the room-th largest:
candidates in higher bins are taken, those in lower bins dropped, the chosen bin's stay.
The search stops once the candidates can all be taken (n_candidates <= room) or are all
tied; page_topk.py then takes candidates in page order up to room (ties to the lower
page). Exact whenever the bin of a score is a monotone non-decreasing function of it: a
pass then never separates equal scores and keeps every larger score above every smaller.

Two bin functions:
- digits (search="radix", VALUE_PASSES = 0): RADIX bits of a 32-bit key ordered as the
  scores are (int32 bits, no 64-bit arithmetic), from the top; at most 32 / RADIX passes.
- value bins (search="value", VALUE_PASSES = 32 / RADIX): clamp((s * f - base) * scale,
  0, BINS - 1) truncated, which starts as BINS equal bins over the eligible [min, max]
  (base = min * f, scale = BINS / (max * f - min * f)); each later pass zooms into the
  chosen bin (base += chosen / scale, then scale *= BINS), with no reduction besides the
  histogram. Any base and positive finite scale give a monotone function (correctly
  rounded subtract, multiply and fused multiply-add are monotone, so are clamp and
  truncation), so rounding in base or scale only costs passes. The tie test (min == max)
  needs denormals kept: the sm_90 PTX of these functions has no .ftz op. f keeps the
  arithmetic finite: 0.5 when max - min overflows, 2^64 when it is below 2^-60 (every
  candidate is then below 2^-36 in magnitude: the scaling is exact), 1 otherwise. A pass
  that splits nothing (ties, or a zoom finer than the scores' precision) re-reads the
  candidates' own min and max: all equal ends the search, otherwise the bins start over on
  that range. After VALUE_PASSES passes, or on a range that is not finite (an eligible
  +inf), the search goes on by digits from the first digit where the candidates' keys
  differ, so it ends within 2 * 32 / RADIX passes whatever the scores. On score-like rows
  (2,045 eligible, k = 253; a numpy simulation of this rule) value bins take 3.3 passes on
  average where 4-bit digits take 4.8 (the slowest of 128 rows: 4-5 against 6); rows whose
  scores sit on a coarse grid, 4.1 vs 7.3. Yet on an H100 the value search measured slower
  (11.9 against 11.2 us at batch 16, 32K): the digit search stays the default.

Scores must be free of NaN; eligible scores may be any finite value or +inf. An eligible
-inf ranks below every finite score here, whereas sparse/selection.py ranks it after the
reserved_bos pages (it masks ineligible pages to -inf before a stable sort), so rows with
eligible -inf scores may differ from the reference; page_scores.py writes -inf only past a
row's page count, which is never eligible. The caller maps -0.0 to 0.0.
Tests: tests/sparrow_core/kernels/test_topk_search.py.
"""

from __future__ import annotations

from sparrow_core.kernels.runtime import jit, tl


@jit
def _order_key(score):
    """32-bit keys whose unsigned order is the scores' order (as int32 bits): flip the sign
    bit of a positive float, every bit of a negative one."""
    bits = score.to(tl.int32, bitcast=True)
    return bits ^ tl.where(bits < 0, -1, -2147483648)


@jit
def _first_digit(lo, hi, RADIX: tl.constexpr):
    """The shift of the highest RADIX-bit digit where the keys of lo < hi differ: every
    score between them shares the digits above it, so passes over those split nothing."""
    differ = _order_key(lo) ^ _order_key(hi)
    shift = 32 - RADIX
    # an arithmetic shift is nonzero exactly when a bit at or above shift is set
    while (shift > 0) & ((differ >> shift) == 0):
        shift -= RADIX
    return shift


@jit
def _value_plan(lo, hi, passes, VALUE_PASSES: tl.constexpr, RADIX: tl.constexpr):
    """Bins over candidates with scores in [lo, hi]: (value bins?, shift, f, base, scale).
    shift < 0 ends the search (all tied); with digits it is the next digit to split."""
    spread = hi - lo
    tiny = (spread > 0.0) & (spread < 8.673617379884035e-19)
    f = tl.where(spread == float("inf"), 0.5, tl.where(tiny, 18446744073709551616.0, 1.0))
    width = hi * f - lo * f
    by_value = (width > 0.0) & (width < float("inf")) & (passes < VALUE_PASSES)
    scale = (1 << RADIX) / tl.where(by_value, width, 1.0)
    shift = tl.zeros([], tl.int32) + (32 - RADIX)
    if lo == hi:
        shift = -1
    elif by_value == 0:
        shift = _first_digit(lo, hi, RADIX)
    return by_value, shift, f, lo * f, scale


@jit
def _value_bin(score, f, base, scale, BINS: tl.constexpr):
    """Bins of finite scores, monotone for any base and positive finite scale. Clamped at
    both ends: a base rounded past a candidate's score, or a level rounded up to BINS, must
    not leave the histogram's range."""
    level = (score * f - base) * scale
    return tl.minimum(tl.maximum(level, 0.0), BINS - 1).to(tl.int32)


@jit
def _min_max(lo0, hi0, lo1, hi1):
    return tl.minimum(lo0, lo1), tl.maximum(hi0, hi1)


@jit
def _max_min_max(a0, b0, c0, a1, b1, c1):
    return tl.maximum(a0, a1), tl.minimum(b0, b1), tl.maximum(c0, c1)


@jit
def _score_range(score, candidate):
    """The candidates' min and max score in one reduction: one round of barriers, not two."""
    return tl.reduce((tl.where(candidate, score, float("inf")),
                      tl.where(candidate, score, float("-inf"))), 0, _min_max)


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
        (tl.where(reach, bins, -1), tl.where(reach, at_least, n_candidates),
         tl.where(reach, 0, at_least)), 0, _max_min_max)
    return chosen, above, from_chosen - above


@jit
def _topk_search(score, eligible, n_eligible, k, RADIX: tl.constexpr,
                 VALUE_PASSES: tl.constexpr):
    """(taken, candidate, room, n_candidates) for one row: see the module docstring.
    Every pass keeps room <= n_candidates and room + taken pages = k, so with more than k
    eligible pages exactly k are chosen."""
    BINS: tl.constexpr = 1 << RADIX
    key = _order_key(score)
    taken = eligible & (key != key)
    candidate = eligible
    room = k
    n_candidates = n_eligible
    passes = tl.zeros([], tl.int32)
    if VALUE_PASSES > 0:
        lo, hi = _score_range(score, eligible)
        by_value, shift, f, base, scale = _value_plan(lo, hi, passes, VALUE_PASSES, RADIX)
    else:  # digits only: no range needed
        lo = tl.zeros([], tl.float32)
        hi, f, base, scale = lo, lo, lo, lo
        by_value, shift = lo != lo, passes + (32 - RADIX)
    while (room > 0) & (n_candidates > room) & (shift >= 0):
        if by_value:
            # non-candidates at lo keep the arithmetic finite; the histogram skips them
            bin_index = _value_bin(tl.where(candidate, score, lo), f, base, scale, BINS)
        else:
            bin_index = (key >> shift) & (BINS - 1)
            shift -= RADIX
        hist = tl.histogram(bin_index, BINS, mask=candidate)
        chosen, above, inside = _choose_bin(hist, n_candidates, room, BINS)
        taken = taken | (candidate & (bin_index > chosen))
        candidate = candidate & (bin_index == chosen)
        room -= above
        if VALUE_PASSES > 0:
            if by_value:
                passes += 1
                base = base + chosen.to(tl.float32) / scale
                scale = scale * BINS
                if (inside == n_candidates) | (passes == VALUE_PASSES):
                    # split nothing (ties, or zoomed past the scores' precision), or out of
                    # value passes: the candidates' own range decides what comes next
                    lo, hi = _score_range(score, candidate)
                    by_value, shift, f, base, scale = _value_plan(lo, hi, passes,
                                                                  VALUE_PASSES, RADIX)
        n_candidates = inside
    return taken, candidate, room, n_candidates
