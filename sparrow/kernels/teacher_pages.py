"""Teacher-forced page selection as bits: every position of a chunk of one sequence, per KV
head, its decode step's pages, packed 32 pages to an int32 word.

    bits = select_page_bits(scores, first, prompt_len, topk, page_size, reserved_bos,
                            reserved_eos, words)          # [Hkv, R, words] int32
    select_page_bits(..., out=all_bits[:, start + first:start + last])   # into a packed batch
    mask = unpack_page_bits(bits, pages)                  # [R, Hkv, pages] bool

scores [R, Hkv, W] float32 are q_mean . centroid for positions first .. first + R - 1 (W at
least the last position's page count; None when every row is a prompt row); topk [R] the k of
each position's bin. Position t has n = t // page_size + 1 pages: a prompt position
(t < prompt_len) reads all n (prefill is dense); a later one reads, as its decode step did,
pages 0..reserved_bos-1, the last reserved_eos, and the top-k of the pages between (ties to the
lower page; every page when no more than k are eligible). Page p of a row is bit p % 32 of
word p // 32; bits at or past n are 0, and every word of a row up to `words` is written.

One program per (position, KV head) holds the row's scores in registers and finds its top k
with page_topk.py's digit search (topk_search.py: histograms of 4-bit digits, no sort), so
it picks exactly the pages of sparse/selection.py's select_from_scores, the decode rule,
then packs the row into words with one shift-and-sum per word. Off GPU the launcher runs
`page_bits_reference` (select_from_scores and `pack_page_bits`).
Tests: `python -m pytest tests/kernels/test_teacher_attention.py -q`.
"""

from __future__ import annotations

import torch

from sparrow.kernels.runtime import check, check_integer, jit, next_power_of_2, tl, use_kernel
from sparrow.kernels.topk_search import _topk_search
from sparrow.sparse.selection import select_from_scores

WORD = 32  # pages per int32 word


@jit
def _page_bits_kernel(
    score_ptr,
    topk_ptr,
    bits_ptr,
    s_sr,
    s_sh,
    s_br,
    s_bh,
    width,
    words,
    first,
    prompt_len,
    PAGE: tl.constexpr,
    BOS: tl.constexpr,
    EOS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    HAS_SCORES: tl.constexpr,
    RADIX: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    t = first + r
    n_pages = t // PAGE + 1
    p = tl.arange(0, BLOCK_W)
    present = p < n_pages
    eligible = (p >= BOS) & (p < n_pages - EOS)
    n_eligible = tl.maximum(tl.minimum(n_pages - EOS, BLOCK_W) - BOS, 0)
    # a prompt row takes every eligible page: k at least the row's width does that
    k = tl.where(t < prompt_len, BLOCK_W, tl.load(topk_ptr + r).to(tl.int32))
    if HAS_SCORES:
        score = tl.load(score_ptr + r * s_sr + h * s_sh + p, mask=present & (p < width), other=0.0)
        score = tl.where(score == 0.0, 0.0, score)  # -0.0 ties with 0.0, as in a float compare
    else:
        score = tl.zeros([BLOCK_W], tl.float32)
    taken, candidate, room, n_candidates = _topk_search(score, eligible, n_eligible, k, RADIX)
    if n_candidates > room:  # tied candidates at the cut: the lower pages first
        candidate = candidate & (tl.cumsum(candidate.to(tl.int32), axis=0) <= room)
    selected = present & ((eligible == 0) | taken | candidate)
    # pack: bit j of a word is page 32 * word + j; distinct powers of two sum as an OR
    # (bit 31 wraps to the sign, which is the bit pattern wanted)
    grid = tl.reshape(selected.to(tl.int32), (BLOCK_W // 32, 32))
    packed = tl.sum(grid << tl.arange(0, 32)[None, :], axis=1)
    w = tl.arange(0, BLOCK_W // 32)
    tl.store(bits_ptr + r * s_br + h * s_bh + w, packed, mask=w < words)


# references


def pack_page_bits(mask: torch.Tensor, words: int) -> torch.Tensor:
    """[R, Hkv, P] bool -> [Hkv, R, words] int32 (page p: bit p % 32 of word p // 32)."""
    rows, heads, width = mask.shape
    check(width <= words * WORD, f"{width} pages do not fit {words} words")
    padded = torch.zeros(rows, heads, words * WORD, dtype=torch.int64, device=mask.device)
    padded[..., :width] = mask
    weights = torch.ones(WORD, dtype=torch.int64, device=mask.device) << torch.arange(
        WORD, device=mask.device
    )
    value = (padded.view(rows, heads, words, WORD) * weights).sum(-1)
    # unsigned 32-bit value -> the int32 of the same bits
    value = torch.where(value >= 2**31, value - 2**32, value)
    return value.to(torch.int32).transpose(0, 1).contiguous()


def unpack_page_bits(bits: torch.Tensor, pages: int) -> torch.Tensor:
    """[Hkv, R, words] int32 -> [R, Hkv, pages] bool."""
    shifts = torch.arange(WORD, device=bits.device, dtype=torch.int32)
    flat = ((bits.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)
    return flat[..., :pages].transpose(0, 1)


def page_bits_reference(
    scores,
    first,
    prompt_len,
    topk,
    page_size,
    reserved_bos,
    reserved_eos,
    words,
    rows=None,
    kv_heads=None,
):
    """The selection by select_from_scores (a stable sort), packed."""
    if scores is None:
        width = (first + rows - 1) // page_size + 1
        scores = torch.zeros(rows, kv_heads, width, device=topk.device)
    rows, heads, width = scores.shape
    position = torch.arange(first, first + rows, device=scores.device)
    num_pages = position // page_size + 1
    mask = select_from_scores(scores, num_pages, topk.to(scores.device), reserved_bos, reserved_eos)
    present = torch.arange(width, device=scores.device) < num_pages.view(-1, 1, 1)
    mask = torch.where((position < prompt_len).view(-1, 1, 1), present, mask)
    return pack_page_bits(mask, words)


# launcher


def select_page_bits(
    scores: torch.Tensor | None,
    first: int,
    prompt_len: int,
    topk: torch.Tensor,
    page_size: int,
    reserved_bos: int,
    reserved_eos: int,
    words: int,
    out: torch.Tensor | None = None,
    kv_heads: int | None = None,
    radix_bits: int = 4,
) -> torch.Tensor:
    """Bits [Hkv, R, words] of rows first .. first + R - 1 (see the module docstring), into
    `out` when given (a view of that shape, last dim contiguous); kv_heads only without
    scores."""
    rows = topk.shape[0]
    check(topk.dim() == 1, f"topk must be [R], got {tuple(topk.shape)}")
    check_integer("topk", topk)
    check(
        first >= 0 and page_size >= 1 and reserved_bos >= 0 and reserved_eos >= 1,
        f"need first >= 0, page_size >= 1, reserved_bos >= 0, reserved_eos >= 1, got "
        f"{first}, {page_size}, {reserved_bos}, {reserved_eos}",
    )
    need = (first + rows - 1) // page_size + 1 if rows else 0
    check(
        words * WORD >= need,
        f"{words} words hold fewer than the {need} pages of row {first + rows - 1}",
    )
    if scores is None:
        check(
            kv_heads is not None and first + rows <= prompt_len,
            "without scores every row must be a prompt row, and kv_heads is needed",
        )
        heads = kv_heads
    else:
        check(
            scores.dim() == 3 and scores.dtype == torch.float32 and scores.shape[0] == rows,
            f"scores must be [{rows}, Hkv, W] float32, got {tuple(scores.shape)} {scores.dtype}",
        )
        check(
            scores.shape[2] >= need, f"scores hold {scores.shape[2]} pages, the last row has {need}"
        )
        check(scores.stride(-1) == 1, "scores must be contiguous in their last dimension")
        heads = scores.shape[1]
    if out is None:
        out = torch.empty(heads, rows, words, dtype=torch.int32, device=topk.device)
    check(
        tuple(out.shape) == (heads, rows, words)
        and out.dtype == torch.int32
        and out.stride(-1) == 1,
        f"out must be [{heads}, {rows}, {words}] int32 with a "
        f"contiguous last dim, got {tuple(out.shape)} {out.dtype}",
    )
    tensors = [t for t in (scores, topk, out) if t is not None]
    if not use_kernel(*tensors):
        out.copy_(
            page_bits_reference(
                scores,
                first,
                prompt_len,
                topk,
                page_size,
                reserved_bos,
                reserved_eos,
                words,
                rows,
                heads,
            )
        )
        return out
    if rows and heads:
        block_w = next_power_of_2(max(WORD, words * WORD))
        dummy = scores if scores is not None else out
        _page_bits_kernel[(rows, heads)](
            dummy,
            topk,
            out,
            scores.stride(0) if scores is not None else 0,
            scores.stride(1) if scores is not None else 0,
            out.stride(1),
            out.stride(0),
            scores.shape[2] if scores is not None else 0,
            words,
            first,
            prompt_len,
            PAGE=page_size,
            BOS=reserved_bos,
            EOS=reserved_eos,
            BLOCK_W=block_w,
            HAS_SCORES=scores is not None,
            RADIX=radix_bits,
            num_warps=4 if block_w <= 1024 else 8,
        )
    return out
