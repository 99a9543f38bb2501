"""vLLM's outputs as SampleResults, on CPU with objects of vLLM's shape (vllm not needed).

The fakes below build each position's logprobs dict the way vLLM 0.23 does
(vllm/logprobs.py append_logprobs_for_next_position): the sampled token first with its rank
(1 + the number of tokens more likely), then the top-k with ranks 1..k, so a sampled token
inside the top-k is one entry and one outside it is an extra entry.
Run: `python -m pytest tests/vllm/test_outputs.py -q`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from sparrow.engine import Engine, EngineConfig, SamplingParams
from sparrow.model import load_model
from sparrow.model.builtin import resolve_model_path
from sparrow.sparse import Schedule
from sparrow.vllm.outputs import (
    VllmOutputError,
    dense_pages_read,
    pages_read,
    ranked_topk,
    sampling_kwargs,
    to_sample_result,
)


@dataclass
class Logprob:  # vLLM's vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # the fields of vLLM's vllm.outputs.CompletionOutput read here
    index: int
    token_ids: list[int]
    logprobs: Any
    finish_reason: str | None
    text: str = ""


class FlatPositions:
    """A sequence of positions like vLLM's FlatLogprobs: flat lists, a dict per index."""

    def __init__(self, positions: list[dict[int, Logprob]]):
        self.ids = [t for p in positions for t in p]
        self.entries = [e for p in positions for e in p.values()]
        self.bounds, start = [], 0
        for p in positions:
            self.bounds.append((start, start + len(p)))
            start += len(p)

    def __len__(self) -> int:
        return len(self.bounds)

    def __iter__(self):
        for start, end in self.bounds:
            yield {self.ids[i]: self.entries[i] for i in range(start, end)}


class FlatLogprobs:
    """vLLM's FlatLogprobs as flat_logprobs=True fills it: per position the sampled token's
    entry, then the top-k by rank (the sampled token again when it is among them), in flat
    lists with each position's [start, end); read as a sequence, a dict per position."""

    def __init__(self):
        self.start_indices, self.end_indices = [], []
        self.token_ids, self.logprobs, self.ranks = [], [], []

    def append(self, logprobs: list[float], sampled: int, k: int) -> FlatLogprobs:
        self.start_indices.append(len(self.token_ids))
        order = sorted(range(len(logprobs)), key=lambda t: -logprobs[t])[:k]
        rank = 1 + sum(lp > logprobs[sampled] for lp in logprobs)
        for token, r in [(sampled, rank)] + [(t, i + 1) for i, t in enumerate(order)]:
            self.token_ids.append(token)
            self.logprobs.append(logprobs[token])
            self.ranks.append(r)
        self.end_indices.append(len(self.token_ids))
        return self

    def __len__(self) -> int:
        return len(self.start_indices)

    def __iter__(self):
        for start, end in zip(self.start_indices, self.end_indices):
            yield {
                self.token_ids[i]: Logprob(self.logprobs[i], self.ranks[i])
                for i in range(start, end)
            }


def vllm_position(logprobs: list[float], sampled: int, k: int) -> dict[int, Logprob]:
    rank = 1 + sum(lp > logprobs[sampled] for lp in logprobs)
    position = {sampled: Logprob(logprobs[sampled], rank)}
    order = sorted(range(len(logprobs)), key=lambda t: -logprobs[t])[:k]
    position.update({t: Logprob(logprobs[t], r + 1) for r, t in enumerate(order)})
    return position


def test_ranked_topk_sampled_inside_and_outside():
    logprobs = [math.log(p) for p in (0.05, 0.4, 0.3, 0.15, 0.1)]
    inside = vllm_position(logprobs, sampled=2, k=3)  # rank 2: one entry, three in all
    assert len(inside) == 3
    assert ranked_topk(inside, 2, 3) == [(1, logprobs[1]), (2, logprobs[2]), (3, logprobs[3])]
    outside = vllm_position(logprobs, sampled=0, k=3)  # rank 5: the extra fourth entry
    assert len(outside) == 4
    assert ranked_topk(outside, 0, 3) == [(1, logprobs[1]), (2, logprobs[2]), (3, logprobs[3])]
    # the sampled token at rank 1 is first whatever the dict's order
    assert ranked_topk(vllm_position(logprobs, 1, 2), 1, 2) == [(1, logprobs[1]), (2, logprobs[2])]


def test_to_sample_result_reads_ids_logprobs_topk_and_pages():
    vocab = [
        [math.log(p) for p in row]
        for row in ((0.1, 0.6, 0.2, 0.1), (0.5, 0.1, 0.3, 0.1), (0.25, 0.25, 0.4, 0.1))
    ]
    sampled = [1, 3, 2]
    positions = [vllm_position(row, t, 2) for row, t in zip(vocab, sampled)]
    for container in (positions, FlatPositions(positions)):
        out = to_sample_result(
            CompletionOutput(0, sampled, container, "length"),
            4,
            1,
            prompt_len=7,
            page_size=4,
            topk=2,
            text="abc",
        )
        assert out.output_ids == (1, 3, 2)
        assert out.logprobs == pytest.approx([math.log(0.6), math.log(0.1), math.log(0.4)])
        assert out.topk_ids.tolist() == [[1, 2], [0, 2], [2, 0]]
        assert out.topk_logprobs[1] == pytest.approx([math.log(0.5), math.log(0.3)])
        assert out.pages_read == (2, 2, 3)  # 7, 8 then 9 tokens in pages of 4
        assert (out.prompt_index, out.sample_index, out.finish_reason, out.text) == (
            4,
            1,
            "length",
            "abc",
        )


def test_flat_logprobs_read_as_arrays_equal_the_dicts():
    """vLLM's flat form (flat_logprobs=True, read without a dict per token) gives the same
    result as its per-position dicts, sampled token inside and outside the top-k; a position
    with another count of entries falls back to the dicts; a wrong sampled id is named."""
    rng = random.Random(0)
    rows = [[math.log(rng.random() + 1e-3) for _ in range(7)] for _ in range(12)]
    sampled = [rng.randrange(7) for _ in rows]
    flat = FlatLogprobs()
    for row, token in zip(rows, sampled):
        flat.append(row, token, 3)
    dicts = [vllm_position(row, t, 3) for row, t in zip(rows, sampled)]
    want = to_sample_result(CompletionOutput(0, sampled, dicts, "length"), 0, 0, 5, 4, 3)
    got = to_sample_result(CompletionOutput(0, sampled, flat, "length"), 0, 0, 5, 4, 3)
    assert got == want and got.topk_ids.shape == (12, 3)
    short = FlatLogprobs()  # a vocabulary smaller than k: 2 + 1 entries per position
    for row, token in zip(rows, sampled):
        short.append(row[:2], min(token, 1), 3)
    ids = [min(t, 1) for t in sampled]
    got = to_sample_result(CompletionOutput(0, ids, short, "length"), 0, 0, 5, 4, 3)
    assert got.topk_ids.shape == (12, 2)
    with pytest.raises(VllmOutputError, match="token 4 .* lack the sampled token"):
        wrong = list(sampled)
        wrong[4] = (wrong[4] + 1) % 7
        to_sample_result(CompletionOutput(0, wrong, flat, "length"), 0, 0, 5, 4, 3)


def test_dense_pages_read_counts_every_page():
    assert dense_pages_read(4, 3, 4) == (1, 2, 2)
    assert dense_pages_read(16, 2, 16) == (1, 2)
    assert dense_pages_read(1, 0, 16) == ()


def test_sparse_pages_read_is_the_native_engines_count():
    """A sparse schedule's pages read per generated token, as the native engine reports them
    (top-k per bin plus reserved pages from the first decode step on, all pages before)."""
    torch.manual_seed(0)
    model = load_model(resolve_model_path("builtin:tiny"))
    schedule = Schedule(
        "tiny-sparse",
        topk_pages=(1, 2),
        page_size=4,
        bin_tokens=12,
        reserved_bos=1,
        reserved_eos=1,
        skip_layers=(0,),
    )
    engine = Engine(
        model,
        None,
        EngineConfig(max_batch_size=4, num_pages=64, page_size=4, ignore_eos=True),
        schedule,
    )
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    params = SamplingParams(temperature=0.0, max_new_tokens=20, logprobs_topk=1)
    for prompt, (native,) in zip(prompts, engine.generate(prompts, params)):
        got = pages_read(len(prompt), len(native.output_ids), 4, schedule)
        assert got == native.pages_read
        assert got != dense_pages_read(len(prompt), len(native.output_ids), 4)
    assert pages_read(5, 3, 4, None) == dense_pages_read(5, 3, 4)


@pytest.mark.parametrize("reason", [None, "abort"])
def test_unfinished_or_aborted_sample_is_an_error(reason):
    position = vllm_position([0.0, -1.0], 0, 1)
    with pytest.raises(VllmOutputError, match="finish_reason"):
        to_sample_result(CompletionOutput(0, [0], [position], reason), 0, 0, 3, 16, 1)


def test_missing_or_short_logprobs_are_errors():
    with pytest.raises(VllmOutputError, match="no logprobs"):
        to_sample_result(CompletionOutput(0, [0], None, "stop"), 0, 0, 3, 16, 1)
    with pytest.raises(VllmOutputError, match="1 logprob positions for 2 tokens"):
        to_sample_result(
            CompletionOutput(0, [0, 1], [{0: Logprob(0.0, 1)}], "stop"), 0, 0, 3, 16, 1
        )
    with pytest.raises(VllmOutputError, match="lack the sampled token 1"):
        to_sample_result(CompletionOutput(0, [1], [{0: Logprob(0.0, 1)}], "stop"), 0, 0, 3, 16, 1)


def test_sampling_kwargs_one_sample_own_stops_and_greedy_untruncated():
    sampled = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        max_new_tokens=12,
        n=4,
        seed=3,
        logprobs_topk=20,
        stop_token_ids=(9,),
    )
    kwargs = sampling_kwargs(sampled, seed=123, stop_ids={9, 1})
    assert kwargs == dict(
        n=1,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        max_tokens=12,
        seed=123,
        logprobs=20,
        flat_logprobs=True,
        stop_token_ids=[1, 9],
        ignore_eos=True,
        detokenize=False,
    )
    greedy = sampling_kwargs(SamplingParams(temperature=0.0, top_p=0.5, top_k=3), 7, ())
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"]) == (0.0, 1.0, 0)


def test_native_results_survive_the_round_trip_through_vllm_shapes():
    """The native engine's dense samples, written as vLLM would write them, read back equal:
    pages read included (the native engine's own count with no schedule)."""
    torch.manual_seed(0)
    model = load_model(resolve_model_path("builtin:tiny"))
    engine = Engine(model, None, EngineConfig(max_batch_size=4, num_pages=64, page_size=4))
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    params = SamplingParams(temperature=1.0, max_new_tokens=10, n=2, seed=5, logprobs_topk=3)
    for p, samples in enumerate(engine.generate(prompts, params)):
        for native in samples:
            positions = []
            for token, logprob, ids, lps in zip(
                native.output_ids,
                native.logprobs,
                native.topk_ids.tolist(),
                native.topk_logprobs.tolist(),
            ):
                rank = ids.index(token) + 1 if token in ids else len(ids) + 1
                position = {token: Logprob(logprob, rank)}
                position.update({t: Logprob(lp, r + 1) for r, (t, lp) in enumerate(zip(ids, lps))})
                positions.append(position)
            completion = CompletionOutput(
                native.sample_index, list(native.output_ids), positions, native.finish_reason
            )
            back = to_sample_result(
                completion, p, native.sample_index, len(prompts[p]), page_size=4, topk=3
            )
            assert back == native
