"""Dense scoring of rollouts: each generated token's dense logprob and its acceptance rate.

    from sparrow.trainer.scoring import score_rollouts
    scores = score_rollouts(hf_model, records, micro_batch_tokens=8192, temperature=1.0)
    scores[i].dense_logprobs   # log p_dense(sampled token), the PPO "old" logprob
    scores[i].acceptance       # lower bound of sum_x min(p_dense, q_actor) from the actor's top-K
    scores[i].leftover_mass    # 1 - the actor's top-K mass: the exact rate is at most this higher

The dense policy is a transformers causal LM (SDPA attention) of the same checkpoint as the
rollout engine. Records are packed into right-padded micro-batches whose padded size
(sequences x longest sequence) stays within micro_batch_tokens (a longer sequence goes alone);
packing depends only on the records' lengths and (prompt_index, sample_index), so the trainer's
update re-forms the very same micro-batches and its first-pass ratio is 1 up to rounding.
Logits are taken only at the positions that predict generated tokens, a chunk of tokens at a
time (rl/logprobs.py: never [tokens, vocab] for a whole batch), the softmax in fp32. A
micro-batch without padding runs without an attention mask, so SDPA takes its causal path.
A record's actor top-K may be [n, K] arrays (the engine's and read_rollouts') or nested tuples:
either becomes one padded [b, L, K] array per micro-batch, with no Python loop over tokens.

Temperature: the engine's logprobs describe the distribution it sampled from, softmax(logits /
T) (sparrow/engine/sampler.py), so the dense side is scored at the same T: the acceptance
then compares like with like, and the PPO ratio is taken between the policies actually sampled.
T = 0 (greedy) is scored at T = 1, as the engine reports greedy logprobs at T = 1. top-k and
top-p truncation are not applied on the dense side: truncation the actor applied shows up as
lower acceptance, which is mismatch the update has to live with too.
Tests: `python -m pytest tests/trainer/test_scoring.py -q`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from sparrow.data.rollouts import RolloutRecord
from sparrow.mismatch.acceptance import acceptance_lower_bound
from sparrow.rl.checks import RLInputError
from sparrow.token_arrays import token_matrix
from sparrow.trainer.logprobs import chunked_logprobs


@dataclass(frozen=True)
class TokenScores:
    """Per generated token of one rollout record (all three the same length)."""

    dense_logprobs: tuple[float, ...]
    acceptance: tuple[float, ...]
    leftover_mass: tuple[float, ...]

    def __post_init__(self) -> None:
        lengths = {len(self.dense_logprobs), len(self.acceptance), len(self.leftover_mass)}
        if len(lengths) != 1:
            raise RLInputError(f"TokenScores fields disagree in length: {sorted(lengths)}")


class PaddedBatch(NamedTuple):
    """One micro-batch, right-padded: sequences [b, T] and generated-token views [b, L]."""

    input_ids: torch.Tensor  # [b, T] prompt + output ids, 0 past each end
    attention_mask: torch.Tensor  # [b, T] 1 on real tokens
    gather_positions: torch.Tensor  # [b, L] position whose logits predict generated token j
    targets: torch.Tensor  # [b, L] generated ids (0 as padding)
    mask: torch.Tensor  # [b, L] bool, True on generated tokens


def effective_temperature(temperature: float) -> float:
    if not math.isfinite(temperature) or temperature < 0:
        raise RLInputError(f"temperature must be finite and >= 0, got {temperature}")
    return 1.0 if temperature == 0 else float(temperature)


def micro_batches(records: Sequence[RolloutRecord], micro_batch_tokens: int) -> list[list[int]]:
    """Indices of `records` in micro-batches: shortest first, padded size within the budget."""
    if (
        isinstance(micro_batch_tokens, bool)
        or not isinstance(micro_batch_tokens, int)
        or micro_batch_tokens < 1
    ):
        raise RLInputError(
            f"micro_batch_tokens must be an integer >= 1, got {micro_batch_tokens!r}"
        )
    order = sorted(
        range(len(records)),
        key=lambda i: (
            records[i].total_length,
            records[i].prompt_index,
            records[i].sample_index,
            i,
        ),
    )
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # ascending lengths: record i is the longest of the batch it joins
        if current and (len(current) + 1) * records[i].total_length > micro_batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def pad_batch(records: Sequence[RolloutRecord], device: torch.device | str) -> PaddedBatch:
    """Right-pad the records' prompt + output ids into one batch (see PaddedBatch)."""
    for r in records:
        if len(r.prompt_ids) == 0:
            raise RLInputError(f"rollout ({r.prompt_index}, {r.sample_index}) has an empty prompt")
    prompts = np.array([len(r.prompt_ids) for r in records], dtype=np.int64)[:, None]
    outs = np.array([len(r.output_ids) for r in records], dtype=np.int64)[:, None]
    ends = prompts + outs
    input_ids = np.zeros((len(records), int(ends.max())), dtype=np.int64)
    targets = np.zeros((len(records), int(outs.max())), dtype=np.int64)
    for row, r in enumerate(records):
        prompt, end = int(prompts[row, 0]), int(ends[row, 0])
        input_ids[row, :prompt] = r.prompt_ids
        input_ids[row, prompt:end] = r.output_ids
        targets[row, : end - prompt] = r.output_ids
    attention_mask = (np.arange(input_ids.shape[1]) < ends).astype(np.int64)
    steps = np.arange(targets.shape[1])
    # padding columns read the last real position; they are masked out anyway
    gather = np.minimum(steps + prompts - 1, ends - 1)
    mask = steps < outs
    return PaddedBatch(
        *(
            torch.from_numpy(t).to(device)
            for t in (input_ids, attention_mask, gather, targets, mask)
        )
    )


def output_hidden(model: torch.nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """Final hidden states [N, H] at the positions that predict generated tokens, in
    (row, token) order of batch.mask (padding columns dropped)."""
    kwargs = {}
    if bool(batch.attention_mask.all()):
        # no padding: no mask lets SDPA take its causal (flash) path
        kwargs["attention_mask"] = None
    else:
        kwargs["attention_mask"] = batch.attention_mask
    hidden = model.get_decoder()(
        input_ids=batch.input_ids, use_cache=False, **kwargs
    ).last_hidden_state
    index = batch.gather_positions[..., None].expand(-1, -1, hidden.shape[-1])
    return hidden.gather(1, index)[batch.mask]


def token_logprobs(
    model: torch.nn.Module,
    batch: PaddedBatch,
    temperature: float,
    chunk_tokens: int,
    extra_ids: torch.Tensor | None = None,
    compiled: bool = False,
):
    """chunked_logprobs of the generated tokens [N] (and at extra_ids [N, K]) in
    batch.mask order; [chunk_tokens, vocab] logits at most at any moment; compiled: the
    no-gradient log-softmax compiled (trainer.compile_logprobs)."""
    hidden = output_hidden(model, batch)
    weight = model.get_output_embeddings().weight
    return chunked_logprobs(
        hidden,
        weight,
        batch.targets[batch.mask],
        effective_temperature(temperature),
        chunk_tokens,
        extra_ids,
        compiled=compiled,
    )


def output_logits(model: torch.nn.Module, batch: PaddedBatch, temperature: float) -> torch.Tensor:
    """fp32 logits / temperature [b, L, V] at the positions that predict generated tokens
    (the whole batch's logits at once: for small vocabularies and tests)."""
    hidden = model.get_decoder()(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    ).last_hidden_state
    index = batch.gather_positions[..., None].expand(-1, -1, hidden.shape[-1])
    picked = hidden.gather(1, index)
    logits = model.get_output_embeddings()(picked).float()
    return logits / effective_temperature(temperature)


def logprobs_of(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits) at ids ([b, L] or [b, L, K]) without materialising the softmax."""
    normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)
    if ids.dim() == logits.dim() - 1:
        return (logits.gather(-1, ids[..., None]) - normalizer)[..., 0]
    return logits.gather(-1, ids) - normalizer


def _actor_topk(records: Sequence[RolloutRecord], width: int, vocab: int):
    """Padded actor top-K ids and logprobs [b, L, K]; padding has q = 0 (logprob -inf)."""
    matrices = [_topk_matrices(r) for r in records]
    k = max((ids.shape[1] for ids, _ in matrices if len(ids)), default=0)
    ids = np.zeros((len(records), width, k), dtype=np.int64)
    logprobs = np.full((len(records), width, k), -np.inf, dtype=np.float32)
    for row, (record_ids, record_logprobs) in enumerate(matrices):
        n, kr = record_ids.shape
        ids[row, :n, :kr] = record_ids
        logprobs[row, :n, :kr] = record_logprobs
    if ids.size and not (0 <= ids.min() and ids.max() < vocab):
        raise RLInputError(
            f"actor top-K ids must lie in [0, {vocab}) (the dense model's "
            f"vocabulary), got [{int(ids.min())}, {int(ids.max())}]"
        )
    return torch.from_numpy(ids), torch.from_numpy(logprobs)


def _topk_matrices(r: RolloutRecord) -> tuple[np.ndarray, np.ndarray]:
    """The record's top-K ids and logprobs as [n, K] arrays of one width."""
    try:
        ids = token_matrix(r.topk_ids, np.int64)
        logprobs = token_matrix(r.topk_logprobs, np.float32)
    except ValueError:
        ids = logprobs = None
    if ids is None or (len(ids) and ids.shape[1] != logprobs.shape[1]):
        widths = {len(t) for t in r.topk_ids} | {len(t) for t in r.topk_logprobs}
        raise RLInputError(
            f"rollout ({r.prompt_index}, {r.sample_index}): top-K lists differ "
            f"in length across tokens ({sorted(widths)})"
        )
    return ids, logprobs


@torch.no_grad()
def score_rollouts(
    model: torch.nn.Module,
    records: Sequence[RolloutRecord],
    micro_batch_tokens: int,
    temperature: float = 1.0,
    chunk_tokens: int = 4096,
    forward=None,
) -> list[TokenScores]:
    """TokenScores per record, in the order given (see the module doc). `forward(batch,
    extra_ids)` replaces token_logprobs(model, ...) (rl/sharded.py: the FSDP root's forward)."""
    effective_temperature(temperature)
    if forward is None:

        def forward(batch, extra_ids):
            return token_logprobs(model, batch, temperature, chunk_tokens, extra_ids)

    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    scores: list[TokenScores | None] = [None] * len(records)
    for indices in micro_batches(records, micro_batch_tokens):
        chunk = [records[i] for i in indices]
        if all(len(r.output_ids) == 0 for r in chunk):
            for i in indices:
                scores[i] = TokenScores((), (), ())
            continue
        batch = pad_batch(chunk, device)
        topk_ids, topk_logprobs = _actor_topk(chunk, batch.mask.shape[1], vocab)
        mask = batch.mask.cpu()
        dense, at_ids = forward(batch, topk_ids[mask].to(device))
        # on the model's device: [tokens, K] exps are the costly part on a CPU
        lower, leftover = acceptance_lower_bound(at_ids, topk_logprobs[mask].to(device))
        dense, lower, leftover = (t.cpu().tolist() for t in (dense, lower, leftover))
        start = 0
        for i in indices:
            n = len(records[i].output_ids)
            span = slice(start, start + n)
            scores[i] = TokenScores(tuple(dense[span]), tuple(lower[span]), tuple(leftover[span]))
            start += n
    return scores  # type: ignore[return-value]
