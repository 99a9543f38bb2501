"""Token sampling for the rollout engine: temperature, top-k, top-p, per-request seeds.

    out = sample(logits, [params_a, params_b], [generator_a, None])
    out.token_ids, out.logprobs, out.topk_ids, out.topk_logprobs

Each row of the batch uses its own SamplingParams and its own torch.Generator (None: torch's
global generator on the logits' device), so a seeded request draws the same tokens whatever
else shares the batch. The draw is an exponential race (argmax of p / E, E ~ Exp(1) drawn
from the row's generator), which picks token x with probability exactly p(x).

What the logprobs mean (the acceptance rate compares them with the dense policy):
- sampled rows (temperature > 0): the distribution actually sampled from, i.e. softmax of
  logits / temperature, truncated by top-k (ties with the k-th logit are kept) and then by
  top-p (the smallest set of most likely tokens whose mass reaches top_p), renormalised.
  Truncated tokens have logprob -inf.
- greedy rows (temperature 0): the argmax token, and logprobs under the untruncated
  temperature-1 distribution (top-k and top-p do not apply).
- topk_ids / topk_logprobs hold K = max logprobs_topk over the batch (capped at the vocabulary)
  columns, most likely first. A row asking for fewer gets the next-ranked tokens in the extra
  columns: read row i as [:params[i].logprobs_topk]. Columns past a truncated row's kept set
  hold -inf logprobs.
Tests: `python -m pytest tests/sparrow_core/engine/test_sampler.py -q`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from sparrow_core.errors import SparrowError


class SamplingError(SparrowError, ValueError):
    """Invalid sampling parameters or sampler inputs; the message names the field."""


@dataclass(frozen=True)
class SamplingParams:
    # 0 means greedy
    temperature: float = 1.0
    # nucleus mass kept; 1.0 keeps everything
    top_p: float = 1.0
    # keep the k most likely tokens; 0 keeps all
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    # None: the engine derives a seed from its own
    seed: int | None = None
    # samples per prompt
    n: int = 1
    # top tokens and logprobs recorded per generated token
    logprobs_topk: int = 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("top_k", "logprobs_topk"):
            if getattr(self, name) < 0:
                raise SamplingError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_new_tokens", "n"):
            if getattr(self, name) < 1:
                raise SamplingError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(t < 0 for t in self.stop_token_ids):
            raise SamplingError(f"stop_token_ids must be >= 0, got {list(self.stop_token_ids)}")
        if self.seed is not None and (isinstance(self.seed, bool) or self.seed < 0):
            raise SamplingError(f"seed must be None or an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class SampleOutput(NamedTuple):
    token_ids: Tensor  # [B] int64
    logprobs: Tensor  # [B] float32, of the sampled token under the sampled distribution
    topk_ids: Tensor  # [B, K] int64
    topk_logprobs: Tensor  # [B, K] float32


def truncation_mask(scaled: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Tokens kept [B, V] by top-k (ties kept; 0 keeps all) then top-p, per row.

    scaled: logits / temperature [B, V]; top_k [B] int64; top_p [B] float32.
    """
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kth_logit = sorted_logits.gather(-1, (k - 1)[:, None])
    keep_sorted = sorted_logits >= kth_logit
    # top-p over the top-k distribution: keep while the mass before a token is below top_p
    probs = torch.softmax(sorted_logits.masked_fill(~keep_sorted, -math.inf), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    within_p = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    keep_sorted &= within_p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def sample(
    logits: Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> SampleOutput:
    """One token per row of logits [B, V] (float32); see the module docstring."""
    _check_inputs(logits, params, generators)
    batch, vocab = logits.shape
    device = logits.device
    greedy = torch.tensor([p.greedy for p in params], device=device)
    temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params],
                               dtype=logits.dtype, device=device)
    scaled = logits / temperature[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params if not p.greedy):
        keep = truncation_mask(
            scaled,
            torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=device),
        )
        keep |= greedy[:, None]
        scaled = scaled.masked_fill(~keep, -math.inf)
    # else nothing is truncated: no vocabulary sort
    logprobs = torch.log_softmax(scaled, dim=-1)
    # draw: argmax of p / E with E ~ Exp(1) from each row's own generator; rows on the
    # global generator (None) draw together
    noise = torch.ones_like(logprobs)
    shared = [row for row, (p, g) in enumerate(zip(params, generators))
              if not p.greedy and g is None]
    if len(shared) == batch:
        noise.exponential_()
    elif shared:
        noise[torch.tensor(shared, device=device)] = torch.empty(
            len(shared), vocab, dtype=noise.dtype, device=device).exponential_()
    for row, (p, generator) in enumerate(zip(params, generators)):
        if not p.greedy and generator is not None:
            noise[row].exponential_(generator=generator)
    # an exact 0 draw would make 0 / 0 for a truncated token
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    drawn = (logprobs.exp() / noise).argmax(dim=-1)
    token_ids = torch.where(greedy, logits.argmax(dim=-1), drawn)
    chosen = logprobs.gather(-1, token_ids[:, None])[:, 0]
    k = min(max(p.logprobs_topk for p in params), vocab)
    topk_logprobs, topk_ids = logprobs.topk(k, dim=-1)
    return SampleOutput(token_ids, chosen, topk_ids, topk_logprobs)


def _check_inputs(logits: Tensor, params: Sequence, generators: Sequence) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise SamplingError(
            f"logits must be a float32 [batch, vocab] tensor, got {logits.dtype} "
            f"{tuple(logits.shape)}"
        )
    if not len(params) == len(generators) == logits.shape[0]:
        raise SamplingError(
            f"logits have {logits.shape[0]} rows but {len(params)} SamplingParams and "
            f"{len(generators)} generators were given"
        )
    if logits.shape[0] == 0 or logits.shape[1] == 0:
        raise SamplingError(f"logits must not be empty, got shape {tuple(logits.shape)}")
