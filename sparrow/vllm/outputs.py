"""Requests to vLLM and its outputs back, as the project's types; no vllm import (CPU-tested).

    kwargs = sampling_kwargs(params, seed, stop_ids)      # vllm.SamplingParams(**kwargs), n=1
    result = to_sample_result(request_output.outputs[0], prompt_index, sample_index,
                              prompt_len, page_size=16, topk=20, text=None)

One vLLM request per sample (n=1) with that sample's own seed, the native engine's
(engine/validate.py sample_seed), so a sample does not depend on its batch or actor; the
draws themselves are vLLM's, so a seeded sample's tokens differ from the native engine's.
vLLM's per-token logprobs are asked for flat (flat_logprobs=True: vLLM's FlatLogprobs, flat
lists of ids, logprobs and ranks with each position's range; no dict per token, which vLLM
documents as much less GC work): each position holds the sampled token first, then the top-k
by rank 1..k, so the rows are read as [tokens, 1 + k] arrays. The per-position form, one dict
per generated token (token id -> Logprob(logprob, rank, decoded_token), the sampled token's
entry the extra one exactly when it is not in the top-k), is read too.
With logprobs_mode="processed_logprobs" (engine.py) the logprobs are those of the
distribution sampled from (temperature, then top-k and top-p; truncated tokens -inf), and of
the untruncated temperature-1 distribution for greedy requests: the native sampler's meaning.
Pages read, the native engine's count: the token at generated index j came from the step
whose input sat at position p = prompt_len + j - 1 with n = ceil((prompt_len + j) / page_size)
pages cached; j = 0 (prefill) and dense decode read all n, a sparse schedule's step
min(n, top-k of p's bin + reserved pages) (Schedule.pages_read).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sparrow.engine.sequence import FINISH_REASONS, SampleResult
from sparrow.engine.validate import SamplingParams
from sparrow.errors import SparrowError
from sparrow.sparse.schedule import Schedule


class VllmOutputError(SparrowError):
    """A vLLM output that cannot be a SampleResult (no logprobs, an aborted request)."""


def sampling_kwargs(params: SamplingParams, seed: int, stop_ids: Iterable[int]) -> dict[str, Any]:
    """vllm.SamplingParams keywords for one sample of a request. Stops are the project's
    (the request's stop ids plus the model's eos unless ignore_eos), so vLLM's own eos is off;
    ids come back undecoded (the engine decodes text with the project's tokenizer)."""
    greedy = params.greedy
    return dict(
        n=1,
        temperature=float(params.temperature),
        top_p=1.0 if greedy else float(params.top_p),
        top_k=0 if greedy else int(params.top_k),
        max_tokens=int(params.max_new_tokens),
        seed=int(seed),
        logprobs=int(params.logprobs_topk),
        flat_logprobs=True,
        stop_token_ids=sorted(int(t) for t in stop_ids),
        ignore_eos=True,
        detokenize=False,
    )


def dense_pages_read(prompt_len: int, count: int, page_size: int) -> tuple[int, ...]:
    """Pages read per KV head for each of `count` tokens generated after a prompt, all dense."""
    return tuple(-(-(prompt_len + j) // page_size) for j in range(count))


def pages_read(
    prompt_len: int, count: int, page_size: int, schedule: Schedule | None = None
) -> tuple[int, ...]:
    """Pages read per KV head in sparse layers for each of `count` generated tokens: dense
    without a schedule (pass None for one that keeps every layer dense), else the schedule's."""
    dense = dense_pages_read(prompt_len, count, page_size)
    if schedule is None:
        return dense
    return dense[:1] + tuple(
        schedule.pages_read(prompt_len + j - 1, num_pages=dense[j]) for j in range(1, count)
    )


def ranked_topk(position: Mapping[int, Any], sampled: int, k: int) -> list[tuple[int, float]]:
    """(id, logprob) of one position's top-k, most likely first, from vLLM's dict."""
    entries = list(position.items())
    if len(entries) > k:  # the sampled token is outside the top-k: its entry is the extra one
        entries = [(token, entry) for token, entry in entries if token != sampled]
    entries.sort(key=lambda item: (_rank(item[1]), -item[1].logprob))
    return [(int(token), float(entry.logprob)) for token, entry in entries[:k]]


def _rank(entry: Any) -> float:
    return math.inf if entry.rank is None else entry.rank


def to_sample_result(
    completion: Any,
    prompt_index: int,
    sample_index: int,
    prompt_len: int,
    page_size: int,
    topk: int,
    text: str | None = None,
    schedule: Schedule | None = None,
) -> SampleResult:
    """A CompletionOutput (token_ids, logprobs, finish_reason) as a SampleResult."""
    ids = tuple(int(t) for t in completion.token_ids)
    positions: Sequence[Mapping[int, Any]] | None = completion.logprobs
    where = f"prompt {prompt_index} sample {sample_index}"
    if positions is None:
        raise VllmOutputError(f"vLLM returned no logprobs for {where} (requested with logprobs=k)")
    if len(positions) != len(ids):
        raise VllmOutputError(
            f"vLLM returned {len(positions)} logprob positions for {len(ids)} tokens ({where})"
        )
    rows = _flat_rows(positions, ids, topk, where)
    if rows is None:
        rows = _dict_rows(positions, ids, topk, where)
    logprobs, topk_ids, topk_logprobs = rows
    reason = completion.finish_reason
    if reason not in FINISH_REASONS:
        raise VllmOutputError(
            f"vLLM finished {where} with finish_reason {reason!r}; the "
            f"rollout takes {' or '.join(FINISH_REASONS)} (an abort is a fault)"
        )
    return SampleResult(
        prompt_index,
        sample_index,
        ids,
        tuple(logprobs),
        topk_ids,
        topk_logprobs,
        pages_read(prompt_len, len(ids), page_size, schedule),
        reason,
        text,
    )


def _sampled_missing(where: str, j: int, token: int) -> VllmOutputError:
    return VllmOutputError(
        f"vLLM's logprobs at token {j} of {where} lack the sampled token {token}"
    )


def _flat_rows(positions: Any, ids: Sequence[int], topk: int, where: str):
    """(sampled logprobs, top-k ids [n, k], top-k logprobs [n, k]) from vLLM's FlatLogprobs,
    without a Python object per entry; None for the per-position form, or when a position
    does not hold exactly the sampled token and k others (then the dicts are read)."""
    if not hasattr(positions, "start_indices"):
        return None
    width = topk + 1
    starts = np.asarray(positions.start_indices, np.int64)
    ends = np.asarray(positions.end_indices, np.int64)
    if not (
        np.array_equal(starts, np.arange(len(ids)) * width) and np.array_equal(ends, starts + width)
    ):
        return None
    flat_ids = np.asarray(positions.token_ids, np.int64).reshape(len(ids), width)
    flat_logprobs = np.asarray(positions.logprobs, np.float64).reshape(len(ids), width)
    wrong = np.flatnonzero(flat_ids[:, 0] != np.asarray(ids, np.int64))
    if len(wrong):
        raise _sampled_missing(where, int(wrong[0]), ids[int(wrong[0])])
    return flat_logprobs[:, 0].tolist(), flat_ids[:, 1:], flat_logprobs[:, 1:]


def _dict_rows(positions: Sequence[Mapping[int, Any]], ids: Sequence[int], topk: int, where: str):
    """The same from one dict per position (vLLM's default form, or FlatLogprobs iterated)."""
    logprobs, topk_ids, topk_logprobs = [], [], []
    for j, (token, position) in enumerate(zip(ids, positions)):
        if token not in position:
            raise _sampled_missing(where, j, token)
        logprobs.append(float(position[token].logprob))
        ranked = ranked_topk(position, token, topk)
        topk_ids.append(tuple(t for t, _ in ranked))
        topk_logprobs.append(tuple(lp for _, lp in ranked))
    return logprobs, tuple(topk_ids), tuple(topk_logprobs)
