"""Token logprobs from final hidden states, a chunk of tokens at a time.

    lp = chunked_logprobs(hidden, lm_head.weight, targets, temperature=1.0, chunk_tokens=4096)
    lp, at_ids = chunked_logprobs(hidden, weight, targets, 1.0, 4096, extra_ids=topk_ids)

hidden [N, H] (the positions that predict each target), weight [V, H], targets [N]; returns
log softmax(hidden @ weight.T / T)[n, targets[n]] as float32 [N], and with extra_ids [N, K]
the logprobs at those ids too ([N, K], computed without gradient: the acceptance bound needs
them, the loss does not). Only [chunk_tokens, V] logits exist at any moment: at the real
vocabulary (151,936) the whole batch's float32 logits would be 16 x 32K x 151,936 x 4 bytes,
about 320 GB. With gradients, each chunk is checkpointed: its logits are recomputed in the
backward instead of kept, so the update holds one chunk of logits in the backward too.
The matrix product runs in the ambient autocast dtype (bf16 on GPU); the softmax in float32.
Tests: `python -m pytest tests/sparrow_core/rl/test_logprobs.py -q`.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight).float() / temperature
    return logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                     temperature: float, chunk_tokens: int,
                     extra_ids: torch.Tensor | None = None):
    """Logprobs of `targets` (and of `extra_ids` if given) chunk by chunk (module doc)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"hidden has {hidden.shape[0]} rows but targets {targets.shape[0]}")
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    outputs, extras = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        if grad:
            outputs.append(checkpoint(_chunk_logprobs, hidden[rows], weight, targets[rows],
                                      temperature, use_reentrant=False))
            if extra_ids is not None:
                with torch.no_grad():
                    extras.append(_at_ids(hidden[rows], weight, extra_ids[rows], temperature))
            continue
        logits = torch.nn.functional.linear(hidden[rows], weight).float() / temperature
        normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)
        outputs.append((logits.gather(-1, targets[rows, None]) - normalizer)[:, 0])
        if extra_ids is not None:
            extras.append(logits.gather(-1, extra_ids[rows]) - normalizer)
        del logits
    # no rows: an empty result still tied to the graph, so a loss built on it can backward
    logprobs = torch.cat(outputs) if outputs else hidden.float().sum(-1)
    if extra_ids is None:
        return logprobs
    width = extra_ids.shape[-1]
    at_ids = torch.cat(extras) if extras else hidden.new_zeros((0, width), dtype=torch.float32)
    return logprobs, at_ids


def _at_ids(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,
            temperature: float) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight).float() / temperature
    return logits.gather(-1, ids) - torch.logsumexp(logits, dim=-1, keepdim=True)
