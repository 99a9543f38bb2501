"""Dense scoring of rollouts: each generated token's dense logprob and its acceptance rate.

    from sparrow_core.rl.scoring import score_rollouts
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

Temperature: the engine's logprobs describe the distribution it sampled from, softmax(logits /
T) (sparrow_core/engine/sampler.py), so the dense side is scored at the same T: the acceptance
then compares like with like, and the PPO ratio is taken between the policies actually sampled.
T = 0 (greedy) is scored at T = 1, as the engine reports greedy logprobs at T = 1. top-k and
top-p truncation are not applied on the dense side: truncation the actor applied shows up as
lower acceptance, which is mismatch the update has to live with too.
Tests: `python -m pytest tests/sparrow_core/rl/test_scoring.py -q`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from sparrow_core.data.rollouts import RolloutRecord
from sparrow_core.mismatch import acceptance_lower_bound
from sparrow_core.rl.checks import RLInputError
from sparrow_core.rl.logprobs import chunked_logprobs


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
    if isinstance(micro_batch_tokens, bool) or not isinstance(micro_batch_tokens, int) \
            or micro_batch_tokens < 1:
        raise RLInputError(
            f"micro_batch_tokens must be an integer >= 1, got {micro_batch_tokens!r}")
    order = sorted(range(len(records)), key=lambda i: (records[i].total_length,
                                                      records[i].prompt_index,
                                                      records[i].sample_index, i))
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
        if not r.prompt_ids:
            raise RLInputError(f"rollout ({r.prompt_index}, {r.sample_index}) has an empty prompt")
    width = max(r.total_length for r in records)
    gen_width = max(len(r.output_ids) for r in records)
    input_ids = torch.zeros(len(records), width, dtype=torch.long)
    attention_mask = torch.zeros(len(records), width, dtype=torch.long)
    gather = torch.zeros(len(records), gen_width, dtype=torch.long)
    targets = torch.zeros(len(records), gen_width, dtype=torch.long)
    mask = torch.zeros(len(records), gen_width, dtype=torch.bool)
    for row, r in enumerate(records):
        prompt, out = len(r.prompt_ids), len(r.output_ids)
        input_ids[row, :prompt + out] = torch.tensor(r.prompt_ids + r.output_ids)
        attention_mask[row, :prompt + out] = 1
        # padding columns read the last real position; they are masked out anyway
        gather[row] = torch.clamp(torch.arange(gen_width) + prompt - 1, max=prompt + out - 1)
        targets[row, :out] = torch.tensor(r.output_ids, dtype=torch.long)
        mask[row, :out] = True
    return PaddedBatch(*(t.to(device) for t in (input_ids, attention_mask, gather, targets, mask)))


def output_hidden(model: torch.nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """Final hidden states [N, H] at the positions that predict generated tokens, in
    (row, token) order of batch.mask (padding columns dropped)."""
    kwargs = {}
    if bool(batch.attention_mask.all()):
        # no padding: no mask lets SDPA take its causal (flash) path
        kwargs["attention_mask"] = None
    else:
        kwargs["attention_mask"] = batch.attention_mask
    hidden = model.get_decoder()(input_ids=batch.input_ids, use_cache=False,
                                 **kwargs).last_hidden_state
    index = batch.gather_positions[..., None].expand(-1, -1, hidden.shape[-1])
    return hidden.gather(1, index)[batch.mask]


def token_logprobs(model: torch.nn.Module, batch: PaddedBatch, temperature: float,
                   chunk_tokens: int, extra_ids: torch.Tensor | None = None):
    """chunked_logprobs of the generated tokens [N] (and at extra_ids [N, K]) in
    batch.mask order; [chunk_tokens, vocab] logits at most at any moment."""
    hidden = output_hidden(model, batch)
    weight = model.get_output_embeddings().weight
    return chunked_logprobs(hidden, weight, batch.targets[batch.mask],
                            effective_temperature(temperature), chunk_tokens, extra_ids)


def output_logits(model: torch.nn.Module, batch: PaddedBatch, temperature: float) -> torch.Tensor:
    """fp32 logits / temperature [b, L, V] at the positions that predict generated tokens
    (the whole batch's logits at once: for small vocabularies and tests)."""
    hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                 use_cache=False).last_hidden_state
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
    k = max((len(t) for r in records for t in r.topk_ids), default=0)
    ids = torch.zeros(len(records), width, k, dtype=torch.long)
    logprobs = torch.full((len(records), width, k), -math.inf, dtype=torch.float32)
    for row, r in enumerate(records):
        widths = {len(t) for t in r.topk_ids} | {len(t) for t in r.topk_logprobs}
        if len(widths) > 1:
            raise RLInputError(f"rollout ({r.prompt_index}, {r.sample_index}): top-K lists differ "
                               f"in length across tokens ({sorted(widths)})")
        if r.output_ids and widths != {0}:
            n, kr = len(r.output_ids), widths.pop()
            ids[row, :n, :kr] = torch.tensor(r.topk_ids, dtype=torch.long)
            logprobs[row, :n, :kr] = torch.tensor(r.topk_logprobs, dtype=torch.float32)
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < vocab):
        raise RLInputError(f"actor top-K ids must lie in [0, {vocab}) (the dense model's "
                           f"vocabulary), got [{int(ids.min())}, {int(ids.max())}]")
    return ids, logprobs


@torch.no_grad()
def score_rollouts(model: torch.nn.Module, records: Sequence[RolloutRecord],
                   micro_batch_tokens: int, temperature: float = 1.0,
                   chunk_tokens: int = 4096) -> list[TokenScores]:
    """TokenScores per record, in the order given (see the module doc)."""
    effective_temperature(temperature)
    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    scores: list[TokenScores | None] = [None] * len(records)
    for indices in micro_batches(records, micro_batch_tokens):
        chunk = [records[i] for i in indices]
        if all(not r.output_ids for r in chunk):
            for i in indices:
                scores[i] = TokenScores((), (), ())
            continue
        batch = pad_batch(chunk, device)
        topk_ids, topk_logprobs = _actor_topk(chunk, batch.mask.shape[1], vocab)
        mask = batch.mask.cpu()
        dense, at_ids = token_logprobs(model, batch, temperature, chunk_tokens,
                                       topk_ids[mask].to(device))
        lower, leftover = acceptance_lower_bound(at_ids.cpu(), topk_logprobs[mask])
        dense, lower, leftover = dense.cpu().tolist(), lower.tolist(), leftover.tolist()
        start = 0
        for i in indices:
            n = len(records[i].output_ids)
            span = slice(start, start + n)
            scores[i] = TokenScores(tuple(dense[span]), tuple(lower[span]), tuple(leftover[span]))
            start += n
    return scores  # type: ignore[return-value]
