"""DistillSparse's loss terms: the sparse actor against the dense policy, per generated token.

    terms = token_terms(sparse_hidden, dense_hidden, lm_head_weight, targets, 1.0, 4096)
    terms.sparse_logprobs   # log q_sparse(sampled token), carries the gradient
    terms.dense_logprobs    # log p_dense(sampled token), a constant
    terms.full_kl           # KL(p_dense || q_sparse) over the vocabulary, carries the gradient
    k3(terms.dense_logprobs, terms.sparse_logprobs)    # r - log r - 1, r = p_dense / q_sparse
    acceptance(hidden_a, hidden_b, weight, 1.0, 4096)  # exact sum_x min(p, q) per token

The reference's loss is the sampled-token k3 estimate: with the tokens drawn by the sparse
actor, E_q[r - log r - 1] = KL(q_sparse || p_dense). full_kl is the exact KL(p_dense ||
q_sparse) that the method writes (docs/method.md, DistillSparse), available here because the stage holds both
full distributions; both vanish exactly when the two distributions agree. Logits exist one
chunk of tokens at a time ([chunk_tokens, vocab]); with gradients each chunk is checkpointed
(recomputed in the backward), as in rl/logprobs.py. Softmax in fp32. The log ratio is clamped
to [-20, 20] before exp, as in losses.py.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from sparrow.mismatch.acceptance import acceptance_from_logits

LOG_RATIO_LIMIT = 20.0
# names of the distill losses (algo.distill.loss)
DISTILL_LOSSES = ("k3", "full_kl")


class TokenTerms(NamedTuple):
    sparse_logprobs: torch.Tensor  # [N]
    dense_logprobs: torch.Tensor  # [N]
    full_kl: torch.Tensor  # [N]


def _chunk_terms(
    sparse_hidden: torch.Tensor,
    dense_hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """[n, 3]: log q(target), log p(target), KL(p || q) for one chunk of tokens."""
    log_q = torch.log_softmax(
        torch.nn.functional.linear(sparse_hidden, weight).float() / temperature, dim=-1
    )
    with torch.no_grad():
        log_p = torch.log_softmax(
            torch.nn.functional.linear(dense_hidden, weight).float() / temperature, dim=-1
        )
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    index = targets[:, None]
    return torch.stack([log_q.gather(-1, index)[:, 0], log_p.gather(-1, index)[:, 0], kl], -1)


def token_terms(
    sparse_hidden: torch.Tensor,
    dense_hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
) -> TokenTerms:
    """TokenTerms of N tokens from their predicting hidden states [N, H] (module doc)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    if not sparse_hidden.shape == dense_hidden.shape or sparse_hidden.shape[0] != targets.shape[0]:
        raise ValueError(
            f"hidden states {tuple(sparse_hidden.shape)} and "
            f"{tuple(dense_hidden.shape)} and targets {tuple(targets.shape)} disagree"
        )
    grad = torch.is_grad_enabled() and sparse_hidden.requires_grad
    parts = []
    for start in range(0, targets.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        args = (
            sparse_hidden[rows],
            dense_hidden[rows].detach(),
            weight,
            targets[rows],
            temperature,
        )
        parts.append(
            checkpoint(_chunk_terms, *args, use_reentrant=False) if grad else _chunk_terms(*args)
        )
    if not parts:
        empty = sparse_hidden.float().sum(-1)  # tied to the graph: a loss on it can backward
        return TokenTerms(empty, empty.detach(), empty)
    stacked = torch.cat(parts)
    return TokenTerms(stacked[:, 0], stacked[:, 1].detach(), stacked[:, 2])


def k3(dense_logprobs: torch.Tensor, sparse_logprobs: torch.Tensor) -> torch.Tensor:
    """Per token r - log r - 1 with r = p_dense / q_sparse (>= 0; 0 where they agree)."""
    log_ratio = (dense_logprobs.detach() - sparse_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(log_ratio) - log_ratio - 1


def distill_token_loss(terms: TokenTerms, loss: str) -> torch.Tensor:
    """The per-token divergence algo.distill.loss names."""
    if loss == "k3":
        return k3(terms.dense_logprobs, terms.sparse_logprobs)
    if loss == "full_kl":
        return terms.full_kl
    raise ValueError(f"distill loss {loss!r} is unknown; valid: {', '.join(DISTILL_LOSSES)}")


@torch.no_grad()
def acceptance(
    hidden_a: torch.Tensor,
    hidden_b: torch.Tensor,
    weight: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
) -> torch.Tensor:
    """Exact acceptance sum_x min(p_a, p_b) per token [N], float32."""
    out = [
        acceptance_from_logits(
            torch.nn.functional.linear(hidden_a[rows], weight).float(),
            torch.nn.functional.linear(hidden_b[rows], weight).float(),
            temperature,
        )
        for rows in (slice(s, s + chunk_tokens) for s in range(0, hidden_a.shape[0], chunk_tokens))
    ]
    return torch.cat(out) if out else hidden_a.new_zeros(0, dtype=torch.float32)
