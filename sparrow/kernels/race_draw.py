"""The sampler's exponential race in one pass: per row, argmax over the vocabulary of
p(v) / E(v), with E(v) = -log u(v) drawn from a counter-based hash of (row key, v).

    token_ids = race_draw(logprobs, row_key)        # [B, V] float32, [B] int64 -> [B] int64

row_key [B] holds each row's 32-bit key for this draw (engine/sampler.py derives it from the
request seed and the row's draw counter on the host). The bits of token v are
scramble32(row_key ^ token_key(v)), token_key(v) = mix32(mix32(v ^ TOKEN_SALT)); u = (bits +
0.5) / 2**32, strictly inside (0, 1) and exact in float64. The race keeps the token of
smallest p / log u (log u < 0), the first one on ties, which is the token of largest p / E.

scramble32 multiplies by an odd constant below 2**31, masks to 32 bits, and xorshifts, twice;
the masked int64 products of the PyTorch form and the wrapping uint32 products of the kernel
are the same bits, so the reference (numpy or torch, any device) and the kernel draw the same
noise. The kernel evaluates exp and log with CUDA's libdevice functions, which PyTorch's CUDA
exp and log also use, and divides in float64 as the reference does, so on a GPU both pick the
same token. The reference is about fifteen elementwise passes over [B, V]; the kernel reads
the logprobs once (one program per row and vocabulary chunk, then a [B, chunks] argmin).
Tests: `python -m pytest tests/kernels/test_race_draw.py -q`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparrow.kernels.runtime import (
    HAS_TRITON,
    INTERPRETER,
    check,
    check_integer,
    jit,
    multiprocessors,
    tl,
    use_kernel,
)

if HAS_TRITON:
    from triton.language.extra import libdevice
else:  # never launched without triton
    libdevice = None

MASK32 = 0xFFFFFFFF
MULTIPLIER_A = 0x3504F333
MULTIPLIER_B = 0x5DB3D743
TOKEN_SALT = 0x510E527F


# the hash in int64 (numpy arrays or tensors; inputs in [0, 2**32))


def scramble32(x):
    """Multiply, mask, xorshift 15, multiply, mask, xorshift 16: a bijection of 32-bit values
    held in int64 (odd multipliers below 2**31, so no product overflows)."""
    x = (x * MULTIPLIER_A) & MASK32
    x = x ^ (x >> 15)
    x = (x * MULTIPLIER_B) & MASK32
    return x ^ (x >> 16)


def mix32(x):
    """xorshift 16, then scramble32: the full mix for unmixed inputs (seeds, counters, ids)."""
    return scramble32(x ^ (x >> 16))


_TOKEN_KEYS: dict[tuple[int, str], Tensor] = {}


def token_keys(vocab: int, device: torch.device | str) -> Tensor:
    """[vocab] 32-bit keys of the token ids, computed once per (vocabulary, device)."""
    cache_key = (vocab, str(torch.device(device)))
    keys = _TOKEN_KEYS.get(cache_key)
    if keys is None:
        ids = torch.arange(vocab, dtype=torch.int64, device=device)
        keys = _TOKEN_KEYS[cache_key] = mix32(mix32(ids ^ TOKEN_SALT))
    return keys


def noise_bits(row_key: Tensor, vocab: int) -> Tensor:
    """[B, vocab] 32-bit values scramble32(row key ^ token key), on row_key's device."""
    return scramble32(row_key[:, None] ^ token_keys(vocab, row_key.device)[None, :])


def log_uniform(bits: Tensor) -> Tensor:
    """float64 log u, u = (bits + 0.5) / 2**32 strictly inside (0, 1): one scaling op, one log."""
    # a 0-dim host tensor: float64 result in one op, and no host-to-device copy
    half = torch.tensor(2.0**-33, dtype=torch.float64)
    return torch.add(half, bits, alpha=2.0**-32).log_()


def race_draw_reference(logprobs: Tensor, row_key: Tensor) -> Tensor:
    log_u = log_uniform(noise_bits(row_key, logprobs.shape[1]))
    return (logprobs.exp() / log_u).argmin(dim=-1)


# the kernel


@jit
def _scramble32(x):
    x = x * 0x3504F333
    x = x ^ (x >> 15)
    x = x * 0x5DB3D743
    return x ^ (x >> 16)


@jit
def _mix32(x):
    return _scramble32(x ^ (x >> 16))


@jit
def _race_kernel(
    logprob_ptr,
    key_ptr,
    best_value_ptr,
    best_index_ptr,
    vocab,
    row_stride,
    chunk,
    parts,
    BLOCK: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    key = tl.load(key_ptr + row).to(tl.uint32)
    start = part * chunk
    end = tl.minimum(start + chunk, vocab)
    best_value = tl.full([BLOCK], float("inf"), tl.float64)
    best_index = tl.zeros([BLOCK], tl.int32)
    for offset in range(start, end, BLOCK):
        v = offset + tl.arange(0, BLOCK)
        inside = v < end
        lp = tl.load(logprob_ptr + row * row_stride + v, mask=inside, other=float("-inf"))
        if LIBDEVICE:  # compiled: the functions PyTorch's CUDA exp and log call
            p = libdevice.exp(lp).to(tl.float64)
        else:  # Triton's CPU interpreter (numpy)
            p = tl.exp(lp).to(tl.float64)
        bits = _scramble32(key ^ _mix32(_mix32(v.to(tl.uint32) ^ 0x510E527F)))
        u = (bits.to(tl.uint64) * 2 + 1).to(tl.float64) * (2.0**-33)
        if LIBDEVICE:
            log_u = libdevice.log(u)
        else:
            log_u = tl.log(u)
        ratio = tl.where(inside, p / log_u, float("inf"))
        better = ratio < best_value  # strictly: each lane keeps its first minimum
        best_value = tl.where(better, ratio, best_value)
        best_index = tl.where(better, v, best_index)
    smallest = tl.min(best_value, axis=0)
    first = tl.min(tl.where(best_value == smallest, best_index, vocab), axis=0)
    tl.store(best_value_ptr + row * parts + part, smallest)
    tl.store(best_index_ptr + row * parts + part, first)


def race_draw(logprobs: Tensor, row_key: Tensor, block: int = 1024) -> Tensor:
    """The drawn token of every row [B] int64 (see the module docstring)."""
    check(
        logprobs.dim() == 2 and logprobs.dtype == torch.float32,
        f"logprobs must be a float32 [B, V] tensor, got {logprobs.dtype} {tuple(logprobs.shape)}",
    )
    check(
        tuple(row_key.shape) == (logprobs.shape[0],),
        f"row_key must be [{logprobs.shape[0]}], got {tuple(row_key.shape)}",
    )
    check_integer("row_key", row_key)
    check(
        row_key.device == logprobs.device,
        f"row_key is on {row_key.device}, logprobs on {logprobs.device}",
    )
    row_key = row_key.to(torch.int64)
    if not use_kernel(logprobs, row_key):
        return race_draw_reference(logprobs, row_key)
    logprobs = logprobs if logprobs.stride(-1) == 1 else logprobs.contiguous()
    batch, vocab = logprobs.shape
    # about two programs per multiprocessor, each a whole number of blocks
    parts = max(1, min(-(-2 * multiprocessors(logprobs.device) // batch), -(-vocab // block)))
    chunk = -(-vocab // (parts * block)) * block
    parts = -(-vocab // chunk)
    best_value = torch.empty(batch, parts, dtype=torch.float64, device=logprobs.device)
    best_index = torch.empty(batch, parts, dtype=torch.int32, device=logprobs.device)
    _race_kernel[(batch, parts)](
        logprobs,
        row_key,
        best_value,
        best_index,
        vocab,
        logprobs.stride(0),
        chunk,
        parts,
        BLOCK=block,
        LIBDEVICE=not INTERPRETER,
        num_warps=4,
    )
    # the first part holding the row's minimum holds its first minimum
    take = best_value.argmin(dim=1, keepdim=True)
    return best_index.gather(1, take)[:, 0].to(torch.int64)
