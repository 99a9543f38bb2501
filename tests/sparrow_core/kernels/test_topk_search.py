"""Both top-k searches (digits and value bins, kernels/topk_search.py) against the selection
reference on rows made to break them: ties, signed zeros, extreme and tiny ranges, +inf,
k = 0, k past the eligible pages, rows shorter than the reserved pages."""

import pytest
import torch

from sparrow_core.kernels.page_topk import page_topk, page_topk_reference, select_page_lists
from sparrow_core.kernels.runtime import KernelInputError, jit, tl
from sparrow_core.kernels.topk_search import _value_bin, _value_plan
from sparrow_core.sparse.selection import group_query_mean, select_pages

SEARCHES = [("radix", 4), ("radix", 1), ("radix", 8), ("value", 4), ("value", 1),
            ("value", 2), ("value", 8)]
PAGE = 4
TINY = 2.0 ** -149  # the smallest denormal


def row_of(kind, width, gen):
    """One row of scores of a kind that stresses the search."""
    pick = lambda values: torch.tensor(values)[torch.randint(len(values), (width,),
                                                             generator=gen)]
    if kind == "normal":
        return torch.randn(width, generator=gen)
    if kind == "three_values":
        return pick([-1.0, 0.5, 2.0])
    if kind == "all_equal":
        return torch.full((width,), 0.75)
    if kind == "signed_zeros":
        return pick([-0.0, 0.0, 0.0, -0.0, 1.0, -1.0])
    if kind == "extremes":
        return pick([1e-38, -1e-38, 1e38, -1e38, 3.4e38, -3.4e38, TINY, -TINY, 0.0])
    if kind == "ulps_apart":  # a range finer than any bin width in float
        return 1.0 + pick([0.0, 1.0, 2.0, 3.0]) * 2.0 ** -23
    if kind == "denormals":
        return pick([0.0, 1.0, 2.0, 3.0, 7.0]) * TINY
    if kind == "magnitudes":
        signs = pick([-1.0, 1.0])
        return signs * torch.exp2(-torch.randint(0, 140, (width,), generator=gen).float())
    if kind == "with_inf":
        row = torch.randn(width, generator=gen)
        row[torch.rand(width, generator=gen) < 0.3] = float("inf")
        return row
    raise ValueError(kind)


KINDS = ["normal", "three_values", "all_equal", "signed_zeros", "extremes", "ulps_apart",
         "denormals", "magnitudes", "with_inf"]


def assert_equals_reference(scores, num_tokens, topk, bos, eos, search, radix_bits):
    lists, counts, mask = page_topk(scores, num_tokens, topk, PAGE, bos, eos, want_mask=True,
                                    search=search, radix_bits=radix_bits)
    want_lists, want_counts, want_mask = page_topk_reference(scores, num_tokens, topk, PAGE,
                                                             bos, eos)
    assert torch.equal(counts, want_counts), (search, radix_bits, bos, eos)
    for b, h in torch.nonzero(~(mask == want_mask).all(dim=-1)).tolist():
        raise AssertionError(f"row {b},{h} ({search}, {radix_bits}, bos={bos}, eos={eos}): "
                             f"{torch.nonzero(mask[b, h]).flatten().tolist()} != "
                             f"{torch.nonzero(want_mask[b, h]).flatten().tolist()} "
                             f"scores {scores[b, h].tolist()} k={int(topk[b])}")
    listed = torch.arange(scores.shape[-1]) < counts.unsqueeze(-1)
    assert torch.equal(torch.where(listed, lists, -1), torch.where(listed, want_lists, -1))


def edge_batch(width, gen):
    """Every kind of row, two KV heads, with page counts and budgets that cover k = 0,
    k >= eligible, and rows shorter than the reserved pages."""
    kinds = len(KINDS)
    scores = torch.stack([torch.stack([row_of(kind, width, gen) for _ in range(2)])
                          for kind in KINDS])
    n_pages = torch.randint(0, width + 1, (kinds,), generator=gen)
    n_pages[:kinds // 2] = width  # most kinds also at the full width
    n_pages[-1], n_pages[-2] = 1, 0
    topk = torch.randint(0, width + 1, (kinds,), generator=gen)
    topk[0], topk[1] = 0, width + 1
    topk[2:5] = torch.tensor([1, max(width // 3, 1), max(width - 4, 0)])
    short = torch.randint(0, PAGE, (kinds,), generator=gen)
    num_tokens = (n_pages * PAGE - short).clamp(min=0)
    return scores, num_tokens.int(), topk.int()


# every width by the default digits and bins; the other digit widths at two widths (the
# interpreter is slow)
EDGE_CASES = [(search, 4, width) for width in (1, 2, 3, 4, 5, 7, 37, 64)
              for search in ("radix", "value")]
EDGE_CASES += [(search, bits, width) for search, bits in SEARCHES if bits != 4
               for width in (3, 37)]
# the interpreter computes in numpy, which warns where the kernel meets an overflowing
# range on purpose (it then scales by 0.5 or falls back to digits)
NUMPY_OVERFLOW = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@NUMPY_OVERFLOW
@pytest.mark.parametrize("search,radix_bits,width", EDGE_CASES)
def test_search_equals_the_reference_on_edge_rows(interpreted, search, radix_bits, width):
    gen = torch.Generator().manual_seed(width)
    scores, num_tokens, topk = edge_batch(width, gen)
    for bos, eos in ((0, 1), (1, 2), (2, 3)):
        assert_equals_reference(scores, num_tokens, topk, bos, eos, search, radix_bits)


@NUMPY_OVERFLOW
@pytest.mark.parametrize("seed", range(60))
def test_search_equals_the_reference_on_random_rows(interpreted, seed):
    """Random widths, reserved counts, budgets and rows mixing every kind of value."""
    gen = torch.Generator().manual_seed(100 + seed)
    width = int(torch.randint(1, 48, (), generator=gen))
    batch = int(torch.randint(1, 4, (), generator=gen))
    parts = torch.stack([row_of(kind, batch * 2 * width, gen) for kind in KINDS])
    choice = torch.randint(len(KINDS), (batch * 2 * width,), generator=gen)
    scores = parts.gather(0, choice.unsqueeze(0)).view(batch, 2, width)
    num_tokens = torch.randint(0, width * PAGE + 1, (batch,), generator=gen).int()
    topk = torch.randint(0, width + 2, (batch,), generator=gen).int()
    bos, eos = int(torch.randint(0, 3, (), generator=gen)), int(
        torch.randint(1, 4, (), generator=gen))
    for search, radix_bits in (("radix", 4), ("value", 4),
                               SEARCHES[int(torch.randint(len(SEARCHES), (), generator=gen))]):
        assert_equals_reference(scores, num_tokens, topk, bos, eos, search, radix_bits)


def tie_rule(row, n, k, bos, eos, lower_first=True, extra=0):
    """The rule by hand, with ties to the lower page (or the higher one) and extra tied pages
    taken past k: the variants a broken tie step would compute."""
    eligible = list(range(bos, max(bos, n - eos)))
    always = [p for p in range(n) if p not in eligible]
    if len(eligible) <= k:
        return sorted(always + eligible)
    ranked = sorted(eligible, key=lambda p: (-float(row[p]), p if lower_first else -p))
    return sorted(always + ranked[:k + extra])


@pytest.mark.parametrize("search,radix_bits", [("radix", 4), ("value", 4), ("value", 1)])
def test_tie_rows_tell_tie_orders_apart(interpreted, search, radix_bits):
    """Rows where the cut falls inside a run of ties: ties to the higher page, or one tied
    page too many or too few, would give other lists (checked here, so the rows can catch
    such a kernel), and the kernel gives the reference's."""
    width, bos, eos = 24, 1, 2
    scores = torch.tensor([0.5, 2.0, 1.0, 2.0, 1.0, 1.0, 3.0, 1.0, 1.0, 0.0, 1.0, 1.0,
                           -1.0, 1.0, 2.0, 1.0, 0.25, 1.0, 1.0, 1.0, 2.0, 5.0, 1.0, 1.0])
    scores = torch.stack([scores, scores.flip(0), torch.ones(width)]).view(3, 1, width)
    num_tokens = torch.full((3,), width * PAGE, dtype=torch.int32)
    topk = torch.tensor([8, 9, 5], dtype=torch.int32)
    lists, counts, _ = page_topk(scores, num_tokens, topk, PAGE, bos, eos, search=search,
                                 radix_bits=radix_bits)
    for b in range(3):
        row, k = scores[b, 0], int(topk[b])
        want = tie_rule(row, width, k, bos, eos)
        for variant in (dict(lower_first=False), dict(extra=1), dict(extra=-1)):
            assert tie_rule(row, width, k, bos, eos, **variant) != want
        assert lists[b, 0, :counts[b, 0]].tolist() == want


def test_page_lists_by_value_equal_the_selection_reference(interpreted):
    gen = torch.Generator().manual_seed(8)
    pages, hkv, hq, dim, width = 50, 2, 4, 16, 12
    centroids = torch.randn(pages, hkv, dim, generator=gen)
    q = torch.randn(3, hq, dim, generator=gen)
    tables = torch.randint(0, pages, (3, width), generator=gen, dtype=torch.int32)
    num_tokens = torch.tensor([48, 33, 6], dtype=torch.int32)
    topk = torch.tensor([4, 2, 1], dtype=torch.int32)
    n_pages = (num_tokens.long() + PAGE - 1) // PAGE
    want = select_pages(group_query_mean(q, hkv), centroids[tables.long()], n_pages,
                        topk.long(), 1, 2)
    _, _, mask = select_page_lists(q, centroids, tables, num_tokens, topk, PAGE, 1, 2,
                                   want_mask=True, search="value")
    assert torch.equal(mask, want)


@jit
def _plan_kernel(lo_ptr, hi_ptr, passes_ptr, out_ptr, VALUE_PASSES: tl.constexpr,
                 RADIX: tl.constexpr):
    i = tl.program_id(0)
    by_value, shift, f, base, scale = _value_plan(tl.load(lo_ptr + i), tl.load(hi_ptr + i),
                                                  tl.load(passes_ptr + i), VALUE_PASSES, RADIX)
    tl.store(out_ptr + 5 * i, by_value.to(tl.float32))
    tl.store(out_ptr + 5 * i + 1, shift.to(tl.float32))
    tl.store(out_ptr + 5 * i + 2, f)
    tl.store(out_ptr + 5 * i + 3, base)
    tl.store(out_ptr + 5 * i + 4, scale)


@jit
def _bin_kernel(score_ptr, out_ptr, f, base, scale, n, BINS: tl.constexpr,
                BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    score = tl.load(score_ptr + i, mask=i < n, other=0.0)
    tl.store(out_ptr + i, _value_bin(score, f, base, scale, BINS), mask=i < n)


def plans(lo, hi, passes):
    """_value_plan's (by_value, shift, f, base, scale) for each range, as float32 rows."""
    out = torch.empty(len(lo), 5)
    _plan_kernel[(len(lo),)](torch.tensor(lo), torch.tensor(hi),
                             torch.tensor(passes, dtype=torch.int32), out, VALUE_PASSES=8,
                             RADIX=4)
    return out


@NUMPY_OVERFLOW
def test_value_plan_on_tied_overflowing_tiny_and_infinite_ranges(interpreted):
    """(by value?, shift, f) for a range: a plain range; one whose width overflows (halved);
    denormal ones (scaled by 2^64); a tie (ends: shift -1); an eligible +inf, and ranges out
    of value passes (digits from the first digit where the keys of lo and hi differ)."""
    cases = [  # lo, hi, passes -> by_value, shift, f
        (-1.0, 2.0, 0, 1, 28, 1.0), (-3.4e38, 3.4e38, 0, 1, 28, 0.5),
        (0.0, TINY, 0, 1, 28, 2.0 ** 64), (TINY, 3 * TINY, 0, 1, 28, 2.0 ** 64),
        (0.5, 0.5, 0, 0, -1, 1.0), (1.0, float("inf"), 0, 0, 28, 1.0),
        (1.0, 1.0 + 2.0 ** -23, 8, 0, 0, 1.0), (1.0, 1.5, 8, 0, 20, 1.0),
        (-2.0, -1.0, 8, 0, 28, 1.0), (1.0, 1.5, 7, 1, 28, 1.0)]
    if not interpreted:
        pytest.skip("device functions run only in triton's interpreter on CPU")
    lo, hi, passes, *_ = zip(*cases)
    out = plans(list(lo), list(hi), list(passes))
    for case, row in zip(cases, out.tolist()):
        assert row[:2] == [float(case[3]), float(case[4])], case
        if case[3]:
            assert row[2] == case[5] and 0.0 < row[4] < float("inf"), case


@NUMPY_OVERFLOW
@pytest.mark.parametrize("lo,hi", [(-3.4e38, 3.4e38), (-1.0, 2.0), (0.0, 3 * TINY),
                                   (1.0, 1.0 + 3 * 2.0 ** -23), (-1e-38, 1e38)])
def test_value_bins_are_monotone_and_split_their_range(interpreted, lo, hi):
    """The exactness of the value search rests on this: bins never decrease as the score
    grows and stay in [0, BINS), for the plan's base and scale and for a base or scale
    knocked off by rounding; on the plan's own range, lo and hi land in the first and
    last bin (so every pass splits)."""
    grid = [-3.4e38, -1e38, -2.0, -1.0, -TINY, 0.0, TINY, 2 * TINY, 3 * TINY, 1e-38, 0.5,
            1.0, 1.0 + 2.0 ** -23, 1.0 + 3 * 2.0 ** -23, 2.0, 1e38, 3.4e38]
    if not interpreted:
        pytest.skip("device functions run only in triton's interpreter on CPU")
    scores = torch.tensor(sorted({v for v in grid if lo <= v <= hi} | {lo, hi}))
    by_value, _, f, base, scale = plans([lo], [hi], [0])[0].tolist()
    assert by_value == 1.0
    for nudge_base, nudge_scale in ((0.0, 1.0), (0.3, 1.0), (-0.3, 1.0), (0.0, 3.0)):
        # a base moved by a fraction of the range, a scale 3x too fine
        moved = base + nudge_base * (hi * f - lo * f)
        bins = torch.empty(len(scores), dtype=torch.int32)
        _bin_kernel[(1,)](scores, bins, f, moved, scale * nudge_scale, len(scores), BINS=16,
                          BLOCK=32)
        assert bins.min() >= 0 and bins.max() <= 15, bins
        assert (bins[1:] >= bins[:-1]).all(), bins
        if (nudge_base, nudge_scale) == (0.0, 1.0):
            assert int(bins[0]) == 0 and int(bins[-1]) == 15, bins


def test_search_arguments_are_checked():
    scores, ints = torch.zeros(1, 1, 4), torch.zeros(1, dtype=torch.int32)
    with pytest.raises(KernelInputError, match="search must be one of"):
        page_topk(scores, ints, ints, PAGE, 1, 1, search="sort")
    with pytest.raises(KernelInputError, match="radix_bits must be"):
        page_topk(scores, ints, ints, PAGE, 1, 1, radix_bits=3)
