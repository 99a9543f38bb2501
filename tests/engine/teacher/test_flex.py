"""The FlexAttention teacher-forced path on CPU (eager FlexAttention, forward only): its
bitmap and BlockMask describe exactly the pages selected, and its output and selections
equal the float32 reference path's. GPU twins: test_teacher_forced_gpu.py."""

import pytest
import torch

from sparrow.engine.teacher.flex import BLOCK, HAS_FLEX, PageBitmap, selection_rows
from sparrow.engine.teacher.forced import TeacherForcedAttention, teacher_forced_logits
from sparrow.model import load_model
from sparrow.sparse.schedule import Schedule

pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.skipif(not HAS_FLEX, reason="torch without FlexAttention"),
]

SCHEDULE = Schedule(
    "t", (3, 5, 8), page_size=4, bin_tokens=100, reserved_bos=1, reserved_eos=2, skip_layers=(0,)
)


def random_pages(length, kv_heads, page_size, prompt_len, seed):
    """A valid selection: pages before each position's own, its own page always, prompt dense."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-length // page_size)
    position = torch.arange(length)
    present = torch.arange(width) < (position // page_size + 1).view(-1, 1, 1)
    pages = (torch.rand(length, kv_heads, width, generator=gen) < 0.3) & present
    pages[position, :, position // page_size] = True
    pages[:prompt_len] = present[:prompt_len]
    return pages


def token_level(pages, page_size, length):
    """[Hkv, T, T] bool: position t reads key j."""
    tokens = pages.repeat_interleave(page_size, -1)[..., :length]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return (tokens & causal.unsqueeze(1)).transpose(0, 1)


def listed(counts, indices, heads, q_blocks, kv_blocks):
    out = torch.zeros(heads, q_blocks, kv_blocks, dtype=torch.bool)
    for h in range(heads):
        for b in range(q_blocks):
            out[h, b, indices[0, h, b, : counts[0, h, b]].long()] = True
    return out


@pytest.mark.parametrize(
    "page_size,length,prompt_len", [(16, 700, 300), (4, 389, 1), (16, 128, 64), (32, 1000, 600)]
)
def test_bitmap_and_block_mask_describe_the_pages(page_size, length, prompt_len):
    kv_heads, group = 2, 3
    pages = random_pages(length, kv_heads, page_size, prompt_len, seed=length)
    bitmap = PageBitmap(length, kv_heads, page_size, torch.device("cpu"))
    for first in range(0, length, 256):
        last = min(first + 256, length)
        bitmap.add(first, last, pages[first:last, :, : (last - 1) // page_size + 1])
    # the bits are the pages
    unpacked = (bitmap.bits[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1
    unpacked = unpacked.flatten(2).bool()[:, :length, : pages.shape[-1]]
    assert torch.equal(unpacked, pages.transpose(0, 1))
    assert not bitmap.bits[:, length:].any()
    # per (KV head, query block, KV block): listed iff some token is read; full iff all are
    blocks = -(-length // BLOCK)
    padded = torch.zeros(kv_heads, blocks * BLOCK, blocks * BLOCK, dtype=torch.bool)
    padded[:, :length, :length] = token_level(pages, page_size, length)
    tiles = padded.view(kv_heads, blocks, BLOCK, blocks, BLOCK).transpose(2, 3)
    read = tiles.flatten(3).any(-1)
    valid = torch.zeros_like(padded)
    valid[:, :length, :length] = True
    whole = (tiles | ~valid.view_as(tiles.transpose(2, 3)).transpose(2, 3)).flatten(3).all(-1)
    whole &= (torch.arange(blocks) + 1) * BLOCK <= length  # a KV block past T is never full
    assert torch.equal(bitmap.any, read)
    assert torch.equal(bitmap.full, whole & read)
    assert (bitmap.any & ~bitmap.full).any()
    assert bitmap.full.any() == (prompt_len >= 2 * BLOCK)  # a dense prompt has whole blocks
    mask = bitmap.block_mask(group)
    heads = kv_heads * group
    partial = listed(mask.kv_num_blocks, mask.kv_indices, heads, blocks, blocks)
    full = listed(mask.full_kv_num_blocks, mask.full_kv_indices, heads, blocks, blocks)
    assert torch.equal(partial, (read & ~whole).repeat_interleave(group, 0))
    assert torch.equal(full, (whole & read).repeat_interleave(group, 0))


@pytest.mark.parametrize("group", [2, 3])
def test_flex_equals_reference_outputs_and_selections(group):
    gen = torch.Generator().manual_seed(group)
    lens, prompts = [300, 77, 260], [20, 77, 130]  # one sequence all prompt (dense)
    total = sum(lens)
    q = torch.randn(total, 2 * group, 16, generator=gen)
    k, v = torch.randn(total, 2, 16, generator=gen), torch.randn(total, 2, 16, generator=gen)
    picks = {}

    def attention(backend):
        hook = lambda layer, index, pages: picks.__setitem__((backend, layer, index), pages)
        return TeacherForcedAttention(
            lens, prompts, SCHEDULE, query_chunk=50, backend=backend, on_selection=hook
        )

    reference, flex = attention("reference"), attention("flex")
    for layer in (0, 1):  # layer 0 is dense (skip_layers)
        torch.testing.assert_close(
            flex(layer, q, k, v), reference(layer, q, k, v), atol=1e-5, rtol=1e-5
        )
    assert sorted(k[1:] for k in picks if k[0] == "flex") == [(1, 0), (1, 2)]
    for (backend, layer, index), pages in picks.items():
        if backend == "flex":
            assert torch.equal(pages, picks[("reference", layer, index)])
    # the sparse layer really is sparse: the output differs from the dense layer's
    assert (flex(1, q, k, v) - flex(0, q, k, v)).abs().max() > 1e-2


def test_model_replay_equal_on_both_paths(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    gen = torch.Generator().manual_seed(3)
    sequences = [torch.randint(0, 384, (n,), generator=gen) for n in (150, 61)]
    schedule = Schedule(
        "tight",
        (2, 3, 5),
        page_size=4,
        bin_tokens=40,
        reserved_bos=1,
        reserved_eos=1,
        skip_layers=(),
    )
    with torch.no_grad():
        want = teacher_forced_logits(model, sequences, [10, 30], schedule, backend="reference")
        got = teacher_forced_logits(model, sequences, [10, 30], schedule, backend="flex")
        dense = teacher_forced_logits(model, sequences)
    for a, b, d in zip(got, want, dense):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        assert (a - d).abs().max() > 1e-2


def test_selection_rows_are_whole_blocks_within_the_budget():
    assert selection_rows(8, 32768, 16) == 1024  # [1024, 8, 2048] float32 = 64 MiB
    assert selection_rows(8, 300, 16) % BLOCK == 0
    assert selection_rows(8, 10**7, 16) == BLOCK
