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
With compiled=True (trainer.compile_logprobs) the float32 log-softmax and its gathers run as one
torch.compile'd function per chunk, which reads the low-precision logits once instead of
writing and re-reading float32 copies. With gradients, each chunk is then a LinearLogprob
autograd function: the forward keeps only the chunk's log-normalizer, the backward recomputes
the logits with one matrix product and turns them into the logits' gradient in one compiled
elementwise pass (softmax minus the target's one-hot, scaled), then two matrix products give
the hidden states' and the weight's gradients. The compiler sees only gradient-free
functions; autograd sees one node per chunk.
Tests: `python -m pytest tests/trainer/test_logprobs.py -q`.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint


def _normalized_at(
    logits: torch.Tensor, targets: torch.Tensor, extra_ids: torch.Tensor | None, temperature: float
):
    """Float32 log-softmax of logits / temperature at targets [N] (and at extra_ids [N, K],
    else None), and the log-normalizer [N]."""
    logits = logits.float() / temperature
    normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)
    at_targets = (logits.gather(-1, targets[:, None]) - normalizer)[:, 0]
    if extra_ids is None:
        return at_targets, None, normalizer[:, 0]
    return at_targets, logits.gather(-1, extra_ids) - normalizer, normalizer[:, 0]


def _chunk_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """One chunk's logprobs at targets from hidden states (the checkpointed update path)."""
    return _normalized_at(torch.nn.functional.linear(hidden, weight), targets, None, temperature)[0]


@functools.cache
def _compiled_normalized_at():
    return torch.compile(_normalized_at, dynamic=True)


def _logits_grad(
    logits: torch.Tensor,
    normalizer: torch.Tensor,
    targets: torch.Tensor,
    upstream: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """d(sum upstream * logprob at targets) / d logits, in the logits' dtype: upstream / T x
    (one_hot(targets) - softmax(logits / T))."""
    probs = torch.exp(logits.float() / temperature - normalizer[:, None])
    columns = torch.arange(logits.shape[-1], device=logits.device)
    one_hot = (columns[None, :] == targets[:, None]).float()
    return ((one_hot - probs) * (upstream / temperature)[:, None]).to(logits.dtype)


@functools.cache
def _compiled_logits_grad():
    return torch.compile(_logits_grad, dynamic=True)


def _matmul_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype F.linear computes in here: autocast's where it is on, else the tensor's."""
    if torch.is_autocast_enabled(tensor.device.type):
        return torch.get_autocast_dtype(tensor.device.type)
    return tensor.dtype


class LinearLogprob(torch.autograd.Function):
    """log softmax(hidden @ weight.T / T)[n, targets[n]] for one chunk, keeping only the
    log-normalizer for the backward (module doc); compiled: the elementwise parts compiled."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, compiled):
        dtype = _matmul_dtype(hidden)
        with torch.autocast(hidden.device.type, enabled=False):
            logits = torch.nn.functional.linear(hidden.to(dtype), weight.to(dtype))
            normalized_at = _compiled_normalized_at() if compiled else _normalized_at
            at_targets, _, normalizer = normalized_at(logits, targets, None, temperature)
        ctx.save_for_backward(hidden, weight, targets, normalizer)
        ctx.temperature, ctx.compiled, ctx.dtype = temperature, compiled, dtype
        return at_targets

    @staticmethod
    def backward(ctx, upstream):
        hidden, weight, targets, normalizer = ctx.saved_tensors
        dtype, temperature = ctx.dtype, ctx.temperature
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            logits = torch.nn.functional.linear(h, w)
            grad_of = _compiled_logits_grad() if ctx.compiled else _logits_grad
            grad_logits = grad_of(logits, normalizer, targets, upstream.float(), temperature)
            del logits
            grad_hidden = grad_logits @ w if ctx.needs_input_grad[0] else None
            grad_weight = grad_logits.t() @ h if ctx.needs_input_grad[1] else None
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None,
            None,
            None,
        )


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
    extra_ids: torch.Tensor | None = None,
    compiled: bool = False,
):
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
            if compiled:
                outputs.append(
                    LinearLogprob.apply(hidden[rows], weight, targets[rows], temperature, True)
                )
            else:
                outputs.append(
                    checkpoint(
                        _chunk_logprobs,
                        hidden[rows],
                        weight,
                        targets[rows],
                        temperature,
                        use_reentrant=False,
                    )
                )
            if extra_ids is not None:
                with torch.no_grad():
                    extras.append(_at_ids(hidden[rows], weight, extra_ids[rows], temperature))
            continue
        normalized_at = _compiled_normalized_at() if compiled else _normalized_at
        at_targets, at_extra, _ = normalized_at(
            torch.nn.functional.linear(hidden[rows], weight),
            targets[rows],
            None if extra_ids is None else extra_ids[rows],
            temperature,
        )
        outputs.append(at_targets)
        if extra_ids is not None:
            extras.append(at_extra)
    # no rows: an empty result still tied to the graph, so a loss built on it can backward
    logprobs = torch.cat(outputs) if outputs else hidden.float().sum(-1)
    if extra_ids is None:
        return logprobs
    width = extra_ids.shape[-1]
    at_ids = torch.cat(extras) if extras else hidden.new_zeros((0, width), dtype=torch.float32)
    return logprobs, at_ids


def _at_ids(
    hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight).float() / temperature
    return logits.gather(-1, ids) - torch.logsumexp(logits, dim=-1, keepdim=True)
