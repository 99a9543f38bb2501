"""Per-trajectory mismatch statistics and the batch's effective sample size.

    from sparrow.mismatch.sequence import sequence_statistics, effective_sample_size
    stats = sequence_statistics(acceptance, dense_logprobs, actor_logprobs, lookup=mask)
    stats.mismatch_sum, stats.min_acceptance, stats.log_weight
    ess = effective_sample_size([s.log_weight for s in batch])        # in (0, 1]

A per-bin quantile sees a per-token miss only once it is common in the bin; a task whose
answer needs every one of L serial lookups fails on one miss. The sequence-level statistic is
S = sum_t (1 - acceptance_t): the expected number of tokens where the sparse actor's draw
would not pass as the dense policy's (a coupling of the two samplers differs at a token with
probability 1 - acceptance), so S bounds the chance that the two decodes differ at all.
Beyond the paper. With the top-k lower bound of acceptance (train steps), S is an upper bound.
The sequence's importance weight is w = prod_t p_dense / q_actor, kept as its log; the
batch's effective sample size (sum w)^2 / sum w^2 over the sequences, divided by their
number, is 1 when every weight is equal and 1/n when one sequence holds all the weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparrow.mismatch.fit import MismatchError


@dataclass(frozen=True)
class SequenceStats:
    """One trajectory's statistics; lookup_* are None when token roles are unknown."""

    tokens: int
    # S = sum over tokens of (1 - acceptance)
    mismatch_sum: float
    # the lowest acceptance of the sequence (NaN for a sequence with no token)
    min_acceptance: float
    # sum over tokens of log p_dense - log q_actor
    log_weight: float
    lookup_tokens: int | None = None
    # S over the tokens whose role is lookup
    lookup_mismatch_sum: float | None = None


def sequence_statistics(acceptance, dense_logprobs, actor_logprobs, lookup=None) -> SequenceStats:
    """Statistics of one generated sequence from its per-token arrays (same length); lookup:
    a boolean mask of the tokens whose role is a lookup, or None."""
    alpha = np.asarray(acceptance, dtype=np.float64).reshape(-1)
    dense = np.asarray(dense_logprobs, dtype=np.float64).reshape(-1)
    actor = np.asarray(actor_logprobs, dtype=np.float64).reshape(-1)
    if not alpha.size == dense.size == actor.size:
        raise MismatchError(
            f"per-token arrays differ in length: acceptance {alpha.size}, "
            f"dense {dense.size}, actor {actor.size}"
        )
    lookup_tokens = lookup_sum = None
    if lookup is not None:
        mask = np.asarray(lookup, dtype=bool).reshape(-1)
        if mask.size != alpha.size:
            raise MismatchError(f"lookup mask has {mask.size} entries for {alpha.size} tokens")
        lookup_tokens, lookup_sum = int(mask.sum()), float((1.0 - alpha[mask]).sum())
    return SequenceStats(
        tokens=int(alpha.size),
        mismatch_sum=float((1.0 - alpha).sum()),
        min_acceptance=float(alpha.min()) if alpha.size else math.nan,
        log_weight=float((dense - actor).sum()),
        lookup_tokens=lookup_tokens,
        lookup_mismatch_sum=lookup_sum,
    )


def effective_sample_size(log_weights) -> float:
    """(sum w)^2 / (n sum w^2) of the sequence weights w = exp(log_weights); NaN for none."""
    logs = np.asarray(log_weights, dtype=np.float64).reshape(-1)
    if not logs.size:
        return math.nan
    if not np.isfinite(logs).all():
        raise MismatchError("log weights must be finite")
    weights = np.exp(logs - logs.max())  # the ratio is scale-free: avoid overflow
    return float(weights.sum() ** 2 / (logs.size * (weights**2).sum()))
