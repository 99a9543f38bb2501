"""Page allocation, reference counts, forking a prompt's pages, and the cache's storage."""

import numpy as np
import pytest
import torch

from sparrow.engine.block_manager import BlockManager, OutOfPages
from sparrow.engine.config import EngineError
from sparrow.engine.kv_cache import KVCache, bytes_per_page, pages_for_budget, pages_for_room
from sparrow.engine.sequence import Sequence
from sparrow.model.config import ModelArch


class Params:
    max_new_tokens = 8


def make_seq(seq_id, num_tokens):
    return Sequence(seq_id, 0, 0, list(range(num_tokens)), num_tokens, Params(), None, frozenset())


def test_prompt_pages_fork_and_release():
    manager = BlockManager(num_pages=10, page_size=4)
    leader = make_seq(1, 10)  # pages: 2 full + 1 partial
    manager.allocate_prompt(leader)
    assert len(leader.page_table) == 3 and manager.num_free == 7
    child = make_seq(2, 10)
    src, dst = manager.fork(leader, child)
    assert child.page_table[:2] == leader.page_table[:2]
    assert src == leader.page_table[2] and dst == child.page_table[2] and dst != src
    assert [manager.refcount(p) for p in leader.page_table] == [2, 2, 1]
    assert manager.num_free == 6
    manager.release(leader)
    # the shared full pages stay held by the child, the leader's partial page is free
    assert manager.num_free == 7
    assert [manager.refcount(p) for p in child.page_table] == [1, 1, 1]
    manager.release(child)
    assert manager.num_free == 10


def test_fork_of_a_page_aligned_prompt_copies_nothing():
    manager = BlockManager(num_pages=4, page_size=4)
    leader, child = make_seq(1, 8), make_seq(2, 8)
    manager.allocate_prompt(leader)
    assert manager.fork(leader, child) is None
    assert child.page_table == leader.page_table and manager.num_free == 2


def test_append_slot_allocates_exactly_at_page_starts():
    manager = BlockManager(num_pages=5, page_size=4)
    seq = make_seq(1, 3)
    manager.allocate_prompt(seq)
    pages = []
    for _ in range(10):
        seq.token_ids.append(0)  # the decode input is the last token, at num_tokens - 1
        manager.append_slot(seq)
        pages.append(len(seq.page_table))
        assert manager.slot(seq, seq.num_tokens - 1) // 4 == seq.page_table[-1]
    # tokens 4..13 cached: a new page at token 4, 8, 12
    assert pages == [1, 2, 2, 2, 2, 3, 3, 3, 3, 4]


def test_out_of_pages_and_double_free():
    manager = BlockManager(num_pages=2, page_size=4)
    with pytest.raises(OutOfPages, match="prefill needs 3 pages, 2 are free"):
        manager.allocate_prompt(make_seq(1, 9))
    page = manager.allocate()
    manager.free(page)
    with pytest.raises(ValueError, match="already free"):
        manager.free(page)


ARCH = ModelArch(
    family="qwen3",
    vocab_size=32,
    hidden_size=16,
    num_layers=3,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=32,
)


def test_cache_write_centroids_and_copy():
    cache = KVCache.allocate(ARCH, num_pages=4, page_size=4, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(6, 2, 8, generator=gen)
    v = torch.randn(6, 2, 8, generator=gen)
    slots = torch.tensor([8, 9, 10, 11, 4, 5])  # page 2 full, page 1 half
    cache.write(1, slots, k, v)
    # head-major: cache.k[layer, page, head, offset]
    assert cache.k.shape == (3, 4, 2, 4, 8)
    assert torch.equal(cache.k[1, 2], k[:4].transpose(0, 1))
    assert torch.equal(cache.v[1, 1, :, :2], v[4:].transpose(0, 1))
    assert torch.equal(cache.k[1, 1, 1, 1], k[5, 1]) and cache.v[1, 1, :, 2:].abs().sum() == 0
    assert cache.k[0].abs().sum() == 0 and cache.k[2].abs().sum() == 0
    cache.update_centroids(1, torch.tensor([2]))
    np.testing.assert_allclose(cache.centroids[1, 2].numpy(), k[:4].numpy().mean(0), rtol=1e-6)
    assert cache.centroids[1, 1].abs().sum() == 0  # a partial page gets no centroid
    cache.copy_pages([(2, 3)])
    assert torch.equal(cache.k[:, 3], cache.k[:, 2])
    assert torch.equal(cache.centroids[:, 3], cache.centroids[:, 2])


def test_cache_sizing_by_hand():
    # per layer: 2 heads * 8 dims * (2 * 4 tokens * 2 bytes + 2 bytes of bf16 centroid) = 288;
    # 3 layers
    assert bytes_per_page(ARCH, 4, torch.bfloat16) == 864
    assert bytes_per_page(ARCH, 4, torch.float32) == 3 * 2 * 8 * (2 * 4 * 4 + 4)
    assert pages_for_budget(ARCH, 4, torch.bfloat16, mib=864 * 10 / 2**20) == 10
    with pytest.raises(EngineError, match="holds no KV page.*864 bytes"):
        pages_for_budget(ARCH, 4, torch.bfloat16, mib=800 / 2**20)


def test_append_slot_ahead_and_a_position_without_a_page():
    manager = BlockManager(num_pages=6, page_size=4)
    seq = make_seq(1, 4)  # positions 0..3: one full page
    manager.allocate_prompt(seq)
    manager.append_slot(seq)  # the input token (position 3) already has its page
    assert len(seq.page_table) == 1
    with pytest.raises(ValueError, match="holds 1 pages, none for position 4"):
        manager.slot(seq, 4)
    manager.append_slot(seq, ahead=1)  # the step after: position 4 starts page 1
    assert len(seq.page_table) == 2 and manager.slot(seq, 4) == seq.page_table[1] * 4


def test_a_cache_sized_from_free_memory_keeps_its_size_while_it_fits():
    per_page = 1000
    assert pages_for_room(100_000, per_page) == 98  # first wake: 98% of the 100 that fit
    assert pages_for_room(99_500, per_page, before=98) == 98  # a small swing: the same shape
    assert pages_for_room(102_000, per_page, before=98) == 98  # 102 fit, under 5% more
    assert pages_for_room(97_000, per_page, before=98) == 95  # 97 fit: it shrinks
    assert pages_for_room(103_000, per_page, before=98) == 100  # 103 fit: grown by 5%
    assert pages_for_room(1_500, per_page) == 1  # at least one page
