"""The sparse vLLM backend's pure parts against the native engine, on CPU: the same keys in
vLLM's cache layout (blocks [num_blocks, 2, block_size, Hkv, D], other block ids) give the
same centroids, the same selected pages per KV head and the same decode output as the native
engine's PagedAttention with the same schedule."""

import pytest
import torch

from sparrow.engine.kv_cache import KVCache
from sparrow.engine.step_attention import PagedAttention, StepMetadata
from sparrow.sparse.schedule import Schedule
from sparrow.vllm.sparse_decode import (
    decode_attention,
    filled_pages,
    layer_sparsity,
    split_batch,
    update_centroids,
)

PAGE, HKV, HQ, DIM, LAYERS = 16, 2, 4, 8, 2
SCHEDULE = Schedule(
    "test",
    topk_pages=(2, 3),
    page_size=PAGE,
    bin_tokens=96,
    reserved_bos=1,
    reserved_eos=2,
    skip_layers=(0,),
)


def loc(*query_lens):
    return torch.tensor([0, *query_lens]).cumsum(0)


def test_split_batch_keeps_a_one_token_prompt_chunk_dense():
    # two decodes, a one-token last chunk of a prompt, a prefill of 5, a padding row
    split = split_batch(loc(1, 1, 1, 5, 0), torch.tensor([False, False, True, True, False]))
    assert (split.num_decodes, split.num_prefill_tokens) == (2, 6)
    assert split_batch(loc(1, 1, 1), None).num_decodes == 3
    assert split_batch(loc(4, 1), torch.tensor([True, False])).num_decodes == 0
    assert split_batch(loc(1, 1, 0, 0), torch.tensor([False] * 4)) == split_batch(loc(1, 1), None)


def test_filled_pages_lists_every_page_a_step_completes():
    # row 0: decode at position 31 (fills page 1); row 1: decode at 40 (none);
    # row 2: a chunk of positions 10..49 (fills pages 0, 1, 2); row 3: padding
    rows, pages = filled_pages(loc(1, 1, 40, 0), torch.tensor([32, 41, 50, 0]), PAGE)
    assert list(zip(rows.tolist(), pages.tolist())) == [(0, 1), (2, 0), (2, 1), (2, 2)]
    rows, pages = filled_pages(loc(16), torch.tensor([16]), PAGE)
    assert (rows.tolist(), pages.tolist()) == ([0], [0])
    rows, pages = filled_pages(loc(1, 1), torch.tensor([17, 15]), PAGE)
    assert rows.numel() == pages.numel() == 0


def test_layer_sparsity_follows_the_schedule_bins_and_dense_layers():
    assert layer_sparsity(SCHEDULE, 0, "cpu") is None
    assert layer_sparsity(None, 1, "cpu") is None
    sparsity = layer_sparsity(SCHEDULE, 1, "cpu")
    # position seq_len - 1: 95 is bin 0, 96 bin 1, far past the last bin stays in it
    assert sparsity.topk(torch.tensor([1, 96, 97, 10_000])).tolist() == [2, 2, 3, 3]
    assert [SCHEDULE.topk_for_position(p) for p in (0, 95, 96, 9999)] == [2, 2, 3, 3]


class Caches:
    """One set of keys and values held both ways: the native cache and vLLM's blocks."""

    def __init__(self, lengths, seed=0):
        gen = torch.Generator().manual_seed(seed)
        pages = sum(-(-n // PAGE) for n in lengths)
        shape = (LAYERS, pages + 1, HKV, PAGE, DIM)
        self.native = KVCache(
            torch.zeros(shape), torch.zeros(shape), torch.zeros(LAYERS, pages + 1, HKV, DIM)
        )
        self.blocks = torch.zeros(LAYERS, pages + 3, 2, PAGE, HKV, DIM)  # vLLM's layout
        self.centroids = torch.zeros(LAYERS, pages + 3, HKV, DIM)
        order = torch.randperm(pages, generator=gen)
        self.tables, self.block_tables, start = [], [], 0
        for n in lengths:
            count = -(-n // PAGE)
            native = list(range(1 + start, 1 + start + count))  # page 0 left free
            self.tables.append(native)
            self.block_tables.append([3 + int(order[start + i]) for i in range(count)])
            start += count
        self.lengths = list(lengths)
        self.gen = gen

    def kv(self, tokens):
        return (
            torch.randn(tokens, HKV, DIM, generator=self.gen),
            torch.randn(tokens, HKV, DIM, generator=self.gen),
        )

    def write(self, layer, row, positions, k, v):
        """Both caches take k, v at these positions of a row; vLLM's centroids follow the
        filled pages of that step (as the backend computes them)."""
        native_slots = torch.tensor(
            [self.tables[row][p // PAGE] * PAGE + p % PAGE for p in positions]
        )
        self.native.write(layer, native_slots, k, v)
        filled = [self.tables[row][p // PAGE] for p in positions if p % PAGE == PAGE - 1]
        self.native.update_centroids(layer, torch.tensor(filled, dtype=torch.long))
        for i, p in enumerate(positions):
            block = self.block_tables[row][p // PAGE]
            self.blocks[layer, block, 0, p % PAGE] = k[i]
            self.blocks[layer, block, 1, p % PAGE] = v[i]
        end = positions[-1] + 1
        rows, pages = filled_pages(loc(len(positions)), torch.tensor([end]), PAGE)
        block_table = torch.tensor([self.block_tables[row]])
        key_cache = self.blocks[layer].unbind(1)[0]
        update_centroids(key_cache, self.centroids[layer], block_table[rows, pages])

    def padded(self, tables):
        width = max(len(t) for t in tables)
        return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def fill(caches, chunk=37):
    """Prefill every row but its last token, in chunks (vLLM's chunked prefill)."""
    for layer in range(LAYERS):
        for row, n in enumerate(caches.lengths):
            for start in range(0, n - 1, chunk):
                positions = list(range(start, min(start + chunk, n - 1)))
                caches.write(layer, row, positions, *caches.kv(len(positions)))


@pytest.mark.parametrize("lengths", [(200, 33, 160), (240, 17, 96, 47)])
def test_decode_step_matches_the_native_engine(lengths):
    caches = Caches(lengths)
    fill(caches)
    batch = len(lengths)
    q = torch.randn(batch, HQ, DIM, generator=caches.gen)
    num_tokens = torch.tensor(lengths)
    positions = num_tokens - 1
    slots = torch.tensor(
        [caches.tables[b][int(p) // PAGE] * PAGE + int(p) % PAGE for b, p in enumerate(positions)]
    )
    filled = torch.tensor(
        [
            caches.tables[b][int(p) // PAGE]
            for b, p in enumerate(positions)
            if int(p) % PAGE == PAGE - 1
        ],
        dtype=torch.long,
    )
    topk = torch.tensor([SCHEDULE.topk_for_position(int(p)) for p in positions])
    meta = StepMetadata(
        slots, filled, page_tables=caches.padded(caches.tables), num_tokens=num_tokens, topk=topk
    )
    native_masks = {}
    attention = PagedAttention(
        caches.native,
        meta,
        SCHEDULE,
        on_selection=lambda layer, mask: native_masks.update({layer: mask}),
    )
    block_table = caches.padded(caches.block_tables)
    for layer in range(LAYERS):
        k, v = caches.kv(batch)
        want = attention(layer, q, k, v)
        for b in range(batch):  # vLLM writes the decode token, then the backend's centroids
            caches.write(layer, b, [int(positions[b])], k[b : b + 1], v[b : b + 1])
        key_cache, value_cache = caches.blocks[layer].unbind(1)
        masks = []
        got = decode_attention(
            q,
            key_cache,
            value_cache,
            caches.centroids[layer],
            block_table,
            num_tokens,
            layer_sparsity(SCHEDULE, layer, "cpu"),
            masks,
        )
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        if layer in SCHEDULE.skip_layers:
            assert not masks and layer not in native_masks
            continue
        assert torch.equal(masks[0], native_masks[layer])
        read = masks[0].sum(dim=-1)  # pages read per KV head: the schedule's count
        pages = -(-num_tokens // PAGE)
        assert read.tolist() == [
            [SCHEDULE.pages_read(int(p), int(n))] * HKV for p, n in zip(positions, pages)
        ]
        assert (read < pages.view(-1, 1)).any()  # some row really is sparse
        for b in range(batch):  # every full page's centroid equals the native one
            full = int(num_tokens[b]) // PAGE
            native_pages = torch.tensor(caches.tables[b][:full])
            blocks = torch.tensor(caches.block_tables[b][:full])
            torch.testing.assert_close(
                caches.centroids[layer][blocks], caches.native.centroids[layer][native_pages]
            )
