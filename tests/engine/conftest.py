"""Fixtures for the engine tests: loaded tiny models, a one-thread torch, and an independent
plain-loop block-sparse forward (fixture `brute_force`).

The engine tests run many tiny ops; with torch's default intra-op threads on a busy 2-core
machine they slow down tenfold, so each engine test module asks for `single_thread`.

BruteForceSparse is an AttentionFn for whole sequences that, at every position and KV head,
recomputes each full page's centroid from the keys seen so far, ranks the eligible pages
with sorted(), and attends over the chosen tokens one query head at a time. It shares no
code with sparrow.sparse.selection or the engine's attention paths.
"""

from __future__ import annotations

import math

import pytest
import torch

from sparrow.model import load_model, load_tokenizer


@pytest.fixture
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def qwen3_model(qwen3_checkpoint):
    return load_model(qwen3_checkpoint)


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_checkpoint):
    return load_tokenizer(qwen3_checkpoint)


@pytest.fixture
def brute_force():
    """brute_force(model, token_ids, prompt_len, schedule) -> (logits [T, V], picks)."""
    return brute_force_logits


class BruteForceSparse:
    def __init__(self, prompt_len: int, schedule):
        self.prompt_len = prompt_len
        self.schedule = schedule
        # (layer, position) -> per KV head, the sorted page indices read
        self.selected: dict[tuple[int, int], tuple[tuple[int, ...], ...]] = {}

    def pages(self, layer, t, q, k, head, group):
        s = self.schedule
        size = s.page_size
        n = t // size + 1
        if t < self.prompt_len or not s.is_sparse_layer(layer):
            return list(range(n))
        keys = k[: t + 1, head]
        centroids = [keys[p * size : (p + 1) * size].mean(0) for p in range((t + 1) // size)]
        q_mean = q[t, head * group : (head + 1) * group].mean(0)
        eligible = list(range(s.reserved_bos, n - s.reserved_eos))
        ranked = sorted(eligible, key=lambda p: (-float(q_mean @ centroids[p]), p))
        chosen = (set(range(n)) - set(eligible)) | set(ranked[: s.topk_for_position(t)])
        return sorted(chosen)

    def __call__(self, layer, q, k, v):
        length, q_heads, dim = q.shape
        kv_heads = k.shape[1]
        group = q_heads // kv_heads
        out = torch.zeros_like(q)
        for t in range(length):
            per_head = []
            for head in range(kv_heads):
                pages = self.pages(layer, t, q, k, head, group)
                per_head.append(tuple(pages))
                idx = [j for j in range(t + 1) if j // self.schedule.page_size in pages]
                keys, values = k[idx, head], v[idx, head]
                for qh in range(head * group, (head + 1) * group):
                    weights = torch.softmax(keys @ q[t, qh] / math.sqrt(dim), dim=0)
                    out[t, qh] = weights @ values
            if t >= self.prompt_len and self.schedule.is_sparse_layer(layer):
                self.selected[(layer, t)] = tuple(per_head)
        return out


def brute_force_logits(model, token_ids, prompt_len, schedule):
    """Logits [T, V] of a whole sequence under the plain-loop sparse forward, and its picks."""
    attention = BruteForceSparse(prompt_len, schedule)
    ids = torch.tensor(token_ids)
    with torch.no_grad():
        hidden = model(ids, torch.arange(len(token_ids)), attention)
        return model.compute_logits(hidden), attention.selected
