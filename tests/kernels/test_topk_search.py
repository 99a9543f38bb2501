"""The top-k search by digits (kernels/topk_search.py), at every digit width, against the
selection reference on rows made to break it: ties, signed zeros, extreme and tiny ranges,
+inf, k = 0, k past the eligible pages, rows shorter than the reserved pages."""

import pytest
import torch

from sparrow.kernels.page_topk import page_topk, page_topk_reference
from sparrow.kernels.runtime import KernelInputError

RADIX_BITS = [4, 1, 2, 8]
PAGE = 4
TINY = 2.0**-149  # the smallest denormal


def row_of(kind, width, gen):
    """One row of scores of a kind that stresses the search."""
    pick = lambda values: torch.tensor(values)[torch.randint(len(values), (width,), generator=gen)]
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
        return 1.0 + pick([0.0, 1.0, 2.0, 3.0]) * 2.0**-23
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


KINDS = [
    "normal",
    "three_values",
    "all_equal",
    "signed_zeros",
    "extremes",
    "ulps_apart",
    "denormals",
    "magnitudes",
    "with_inf",
]


def assert_equals_reference(scores, num_tokens, topk, bos, eos, radix_bits):
    lists, counts, mask = page_topk(
        scores, num_tokens, topk, PAGE, bos, eos, want_mask=True, radix_bits=radix_bits
    )
    want_lists, want_counts, want_mask = page_topk_reference(
        scores, num_tokens, topk, PAGE, bos, eos
    )
    assert torch.equal(counts, want_counts), (radix_bits, bos, eos)
    for b, h in torch.nonzero(~(mask == want_mask).all(dim=-1)).tolist():
        raise AssertionError(
            f"row {b},{h} (radix_bits={radix_bits}, bos={bos}, eos={eos}): "
            f"{torch.nonzero(mask[b, h]).flatten().tolist()} != "
            f"{torch.nonzero(want_mask[b, h]).flatten().tolist()} "
            f"scores {scores[b, h].tolist()} k={int(topk[b])}"
        )
    listed = torch.arange(scores.shape[-1]) < counts.unsqueeze(-1)
    assert torch.equal(torch.where(listed, lists, -1), torch.where(listed, want_lists, -1))


def edge_batch(width, gen):
    """Every kind of row, two KV heads, with page counts and budgets that cover k = 0,
    k >= eligible, and rows shorter than the reserved pages."""
    kinds = len(KINDS)
    scores = torch.stack(
        [torch.stack([row_of(kind, width, gen) for _ in range(2)]) for kind in KINDS]
    )
    n_pages = torch.randint(0, width + 1, (kinds,), generator=gen)
    n_pages[: kinds // 2] = width  # most kinds also at the full width
    n_pages[-1], n_pages[-2] = 1, 0
    topk = torch.randint(0, width + 1, (kinds,), generator=gen)
    topk[0], topk[1] = 0, width + 1
    topk[2:5] = torch.tensor([1, max(width // 3, 1), max(width - 4, 0)])
    short = torch.randint(0, PAGE, (kinds,), generator=gen)
    num_tokens = (n_pages * PAGE - short).clamp(min=0)
    return scores, num_tokens.int(), topk.int()


# every width by the default 4-bit digits; the other digit widths at two widths (the
# interpreter is slow)
EDGE_CASES = [(4, width) for width in (1, 2, 3, 4, 5, 7, 37, 64)]
EDGE_CASES += [(bits, width) for bits in RADIX_BITS if bits != 4 for width in (3, 37)]


@pytest.mark.parametrize("radix_bits,width", EDGE_CASES)
def test_search_equals_the_reference_on_edge_rows(interpreted, radix_bits, width):
    gen = torch.Generator().manual_seed(width)
    scores, num_tokens, topk = edge_batch(width, gen)
    for bos, eos in ((0, 1), (1, 2), (2, 3)):
        assert_equals_reference(scores, num_tokens, topk, bos, eos, radix_bits)


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
    bos, eos = (
        int(torch.randint(0, 3, (), generator=gen)),
        int(torch.randint(1, 4, (), generator=gen)),
    )
    for radix_bits in (4, RADIX_BITS[int(torch.randint(len(RADIX_BITS), (), generator=gen))]):
        assert_equals_reference(scores, num_tokens, topk, bos, eos, radix_bits)


def tie_rule(row, n, k, bos, eos, lower_first=True, extra=0):
    """The rule by hand, with ties to the lower page (or the higher one) and extra tied pages
    taken past k: the variants a broken tie step would compute."""
    eligible = list(range(bos, max(bos, n - eos)))
    always = [p for p in range(n) if p not in eligible]
    if len(eligible) <= k:
        return sorted(always + eligible)
    ranked = sorted(eligible, key=lambda p: (-float(row[p]), p if lower_first else -p))
    return sorted(always + ranked[: k + extra])


@pytest.mark.parametrize("radix_bits", [4, 1])
def test_tie_rows_tell_tie_orders_apart(interpreted, radix_bits):
    """Rows where the cut falls inside a run of ties: ties to the higher page, or one tied
    page too many or too few, would give other lists (checked here, so the rows can catch
    such a kernel), and the kernel gives the reference's."""
    width, bos, eos = 24, 1, 2
    scores = torch.tensor(
        [
            0.5,
            2.0,
            1.0,
            2.0,
            1.0,
            1.0,
            3.0,
            1.0,
            1.0,
            0.0,
            1.0,
            1.0,
            -1.0,
            1.0,
            2.0,
            1.0,
            0.25,
            1.0,
            1.0,
            1.0,
            2.0,
            5.0,
            1.0,
            1.0,
        ]
    )
    scores = torch.stack([scores, scores.flip(0), torch.ones(width)]).view(3, 1, width)
    num_tokens = torch.full((3,), width * PAGE, dtype=torch.int32)
    topk = torch.tensor([8, 9, 5], dtype=torch.int32)
    lists, counts, _ = page_topk(scores, num_tokens, topk, PAGE, bos, eos, radix_bits=radix_bits)
    for b in range(3):
        row, k = scores[b, 0], int(topk[b])
        want = tie_rule(row, width, k, bos, eos)
        for variant in (dict(lower_first=False), dict(extra=1), dict(extra=-1)):
            assert tie_rule(row, width, k, bos, eos, **variant) != want
        assert lists[b, 0, : counts[b, 0]].tolist() == want


def test_search_arguments_are_checked():
    scores, ints = torch.zeros(1, 1, 4), torch.zeros(1, dtype=torch.int32)
    with pytest.raises(KernelInputError, match="radix_bits must be"):
        page_topk(scores, ints, ints, PAGE, 1, 1, radix_bits=3)
