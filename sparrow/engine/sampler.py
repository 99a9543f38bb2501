"""Token sampling for the rollout engine: temperature, top-k, top-p, counter-based seeded draws.

    batch = SamplingBatch.build([params_a, params_b], seeds=[seed_a, seed_b], device=device)
    out = sample(logits, batch, counters)    # counters (host): tokens each row has generated
    out.token_ids, out.logprobs, out.topk_ids, out.topk_logprobs

Draws. Each row has a 64-bit seed and a draw counter (its number of generated tokens); the
noise of token v in that row is a pure function of (seed, counter, v): a seeded request
draws the same tokens whatever else shares the batch and whatever its row, and the batch's
noise is a few tensor ops (no generator, no launch per row). The hash works on 32-bit lanes
in int64 (products stay below 2**63, results are masked), so CPU and CUDA give the same bits:
- scramble32(x) = multiply by 0x3504F333, mask, xorshift 15, multiply by 0x5DB3D743, mask,
  xorshift 16; mix32(x) = scramble32(x ^ (x >> 16)). Both are bijections of 32-bit values
  (odd multipliers below 2**31, the leading fraction bits of sqrt 2 and sqrt 3, so that no
  int64 product overflows);
- seed key = mix32(mix32(seed_high ^ SEED_SALT) ^ seed_low), once per row (host);
- row key = mix32(seed key ^ mix32(counter)), once per row and step (host, numpy);
- token key = mix32(mix32(v ^ TOKEN_SALT)), once per vocabulary and device;
- bits[row, v] = scramble32(row key ^ token key[v]) (the keys are mixed already);
  u = (bits + 0.5) / 2**32, strictly inside (0, 1) (float64, exact), E = -log(u) ~ Exp(1).
The token is argmax over v of p(v) / E(v), the exponential race, which picks v with
probability p(v). The hash is the project's own, built for speed and equal bits on every
device, not for cryptographic strength. On a GPU the draw is one fused Triton pass over the
logprobs (kernels/race_draw.py, equal to its PyTorch form token for token); elsewhere it is
about fifteen elementwise passes over [B, V] (nine int64).

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
SamplingParams and SamplingError live in validate.py and are importable from here.
Tests: `python -m pytest tests/engine/test_sampler.py -q`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

# the request parameters live with the request checks; imported here, where callers look
from sparrow.engine.validate import SamplingError, SamplingParams  # noqa: F401
from sparrow.kernels.race_draw import MASK32, log_uniform, mix32, race_draw
from sparrow.kernels.race_draw import noise_bits as token_noise_bits

SEED_SALT = 0x1E3779B9
SEED_LIMIT = 2**63  # seeds are non-negative int64


class SampleOutput(NamedTuple):
    token_ids: Tensor  # [B] int64
    logprobs: Tensor  # [B] float32, of the sampled token under the sampled distribution
    topk_ids: Tensor  # [B, K] int64
    topk_logprobs: Tensor  # [B, K] float32


# the counter-based hash (see the module docstring); the per-row part runs on the host in
# numpy (a few microseconds, no device launches), the per-token part on the device, in one
# fused pass where a kernel can run (kernels/race_draw.py, which holds the token-side hash)


def seed_keys(seeds) -> np.ndarray:
    """[B] int64 seeds -> [B] 32-bit keys (both halves of the seed count)."""
    seeds = np.asarray(seeds, dtype=np.int64)
    high = (seeds >> 32) & MASK32
    return mix32(mix32(high ^ SEED_SALT) ^ (seeds & MASK32))


def row_keys(seed_key, counters) -> np.ndarray:
    """The key of each row's draw number `counters` [B] (below 2**32)."""
    counters = np.asarray(counters, dtype=np.int64)
    return mix32(np.asarray(seed_key, dtype=np.int64) ^ mix32(counters & MASK32))


def noise_bits(row_key, vocab: int, device: torch.device | str = "cpu") -> Tensor:
    """[B, vocab] 32-bit values scramble32(row key ^ token key) on `device`: the same bits on
    every device."""
    keys = _to_device(np.asarray(row_key, dtype=np.int64), torch.device(device))
    return token_noise_bits(keys, vocab)


def exponential_from_bits(bits: Tensor) -> Tensor:
    """float64 E = -log u ~ Exp(1), strictly positive."""
    return log_uniform(bits).neg_()


def _to_device(array: np.ndarray, device: torch.device) -> Tensor:
    """A small host array on the device without waiting for it (pinned, non_blocking)."""
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


# per-row inputs


@dataclass(frozen=True)
class SamplingBatch:
    """The per-row sampling inputs as tensors on one device; the engine builds one per batch
    composition and reuses it while the running set stays the same."""

    params: tuple[SamplingParams, ...]
    seeds: tuple[int, ...]
    seed_key: np.ndarray  # [B] int64 on the host: 32-bit keys of the seeds
    greedy: Tensor  # [B] bool
    temperature: Tensor  # [B] float32, 1 on greedy rows
    top_k: Tensor | None  # [B] int64; None when no sampled row truncates
    top_p: Tensor | None  # [B] float32
    topk_width: int  # K: the most logprobs_topk asked for (capped at the vocabulary later)
    greedy_rows: int  # how many rows are greedy (host side: no device read per step)

    def __post_init__(self) -> None:
        rows = len(self.params)
        if rows == 0:
            raise SamplingError("a SamplingBatch needs at least one row")
        for name in ("seeds", "seed_key", "greedy", "temperature", "top_k", "top_p"):
            value = getattr(self, name)
            if value is not None and len(value) != rows:
                raise SamplingError(f"SamplingBatch.{name} must have {rows} rows, got {len(value)}")

    def __len__(self) -> int:
        return len(self.params)

    @property
    def device(self) -> torch.device:
        return self.greedy.device

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        seeds: Sequence[int] | None = None,
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        """seeds None: each row's params.seed, or a draw from torch's global generator."""
        params = tuple(params)
        if seeds is None:
            drawn = torch.randint(0, SEED_LIMIT - 1, (len(params),)).tolist()
            seeds = [p.seed if p.seed is not None else d for p, d in zip(params, drawn)]
        seeds = list(seeds)
        if len(seeds) != len(params):
            raise SamplingError(f"got {len(seeds)} seeds for {len(params)} SamplingParams")
        bad = [
            s
            for s in seeds
            if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s < SEED_LIMIT
        ]
        if bad:
            raise SamplingError(f"seeds must be integers in [0, 2**63), got {bad[:3]}")
        truncates = any(p.top_k > 0 or p.top_p < 1.0 for p in params if not p.greedy)
        as_tensor = lambda values, dtype: torch.tensor(values, dtype=dtype, device=device)
        return cls(
            params=params,
            seeds=tuple(int(seed) for seed in seeds),
            seed_key=seed_keys(seeds),
            greedy=as_tensor([p.greedy for p in params], torch.bool),
            temperature=as_tensor(
                [1.0 if p.greedy else p.temperature for p in params], torch.float32
            ),
            top_k=as_tensor([p.top_k for p in params], torch.int64) if truncates else None,
            top_p=as_tensor([p.top_p for p in params], torch.float32) if truncates else None,
            topk_width=max(p.logprobs_topk for p in params),
            greedy_rows=sum(p.greedy for p in params),
        )


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
    batch: SamplingBatch | Sequence[SamplingParams],
    counters: Sequence[int] | np.ndarray | None = None,
) -> SampleOutput:
    """One token per row of logits [B, V] (float32); see the module docstring.

    batch: a SamplingBatch on the logits' device, or SamplingParams (seeds as in
    SamplingBatch.build). counters [B] on the host: each row's draw number (None: all 0)."""
    if not isinstance(batch, SamplingBatch):
        batch = SamplingBatch.build(batch, device=logits.device)
    counters = _check_inputs(logits, batch, counters)
    vocab = logits.shape[1]
    scaled = logits / batch.temperature[:, None]
    if batch.top_k is not None:
        keep = truncation_mask(scaled, batch.top_k, batch.top_p) | batch.greedy[:, None]
        scaled = scaled.masked_fill(~keep, -math.inf)
    # else nothing is truncated: no vocabulary sort
    logprobs = torch.log_softmax(scaled, dim=-1)
    if batch.greedy_rows == len(batch):
        token_ids = logits.argmax(dim=-1)
    else:
        # the exponential race: argmax p / E = argmin p / log u (log u < 0)
        keys = _to_device(row_keys(batch.seed_key, counters), logits.device)
        drawn = race_draw(logprobs, keys)  # one fused pass on a GPU
        if batch.greedy_rows:
            drawn = torch.where(batch.greedy, logits.argmax(dim=-1), drawn)
        token_ids = drawn
    chosen = logprobs.gather(-1, token_ids[:, None])[:, 0]
    topk_logprobs, topk_ids = logprobs.topk(min(batch.topk_width, vocab), dim=-1)
    return SampleOutput(token_ids, chosen, topk_ids, topk_logprobs)


def _check_inputs(logits: Tensor, batch: SamplingBatch, counters) -> Tensor:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise SamplingError(
            f"logits must be a float32 [batch, vocab] tensor, got {logits.dtype} "
            f"{tuple(logits.shape)}"
        )
    if logits.shape[0] == 0 or logits.shape[1] == 0:
        raise SamplingError(f"logits must not be empty, got shape {tuple(logits.shape)}")
    if len(batch) != logits.shape[0]:
        raise SamplingError(
            f"logits have {logits.shape[0]} rows but {len(batch)} SamplingParams were given"
        )
    if batch.device != logits.device:
        raise SamplingError(
            f"the SamplingBatch is on {batch.device}, the logits on {logits.device}"
        )
    if counters is None:
        return np.zeros(len(batch), dtype=np.int64)
    if isinstance(counters, Tensor) and counters.device.type != "cpu":
        raise SamplingError("counters must be on the host (a list, numpy array or CPU tensor)")
    counters = np.asarray(counters, dtype=np.int64)
    if counters.shape != (len(batch),):
        raise SamplingError(f"counters must have shape ({len(batch)},), got {counters.shape}")
    if len(counters) and (counters.min() < 0 or counters.max() > MASK32):
        raise SamplingError("counters must lie in [0, 2**32)")
    return counters
