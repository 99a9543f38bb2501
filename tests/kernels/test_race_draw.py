"""The fused exponential race against its PyTorch reference and a plain per-token loop."""

import math

import numpy as np
import pytest
import torch

from sparrow.kernels.race_draw import (
    MASK32,
    mix32,
    race_draw,
    race_draw_reference,
    scramble32,
    token_keys,
)
from sparrow.kernels.runtime import KernelInputError


def logprob_rows(batch, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=gen) * 3
    logits[0, : vocab // 2] = -math.inf  # a truncated row
    return torch.log_softmax(logits, dim=-1)


def loop_draw(logprobs, key):
    """One row by hand in Python integers and floats."""
    best, best_v = math.inf, -1
    for v in range(logprobs.shape[0]):
        token = int(v) ^ 0x510E527F
        token = int(mix32(mix32(np.int64(token))))
        bits = int(scramble32(np.int64(int(key) ^ token)))
        log_u = math.log((bits + 0.5) / 2**32)
        ratio = math.exp(float(logprobs[v])) / log_u
        if ratio < best:
            best, best_v = ratio, v
    return best_v


def test_hash_is_a_bijection_on_a_sample_and_stays_in_32_bits():
    x = np.arange(0, 1 << 16, dtype=np.int64) * 65521
    out = scramble32(x & MASK32)
    assert out.min() >= 0 and out.max() <= MASK32
    assert len(np.unique(out)) == len(x)


def test_reference_equals_a_plain_loop():
    logprobs = logprob_rows(3, 300, 0)
    keys = torch.tensor([7, 123456789, MASK32], dtype=torch.int64)
    got = race_draw_reference(logprobs, keys)
    for row in range(3):
        assert int(got[row]) == loop_draw(logprobs[row], keys[row])
    assert int(got[0]) >= 150  # never a truncated token


@pytest.mark.parametrize("vocab,block", [(1000, 128), (300, 1024), (4099, 256)])
def test_kernel_equals_reference(interpreted, vocab, block):
    logprobs = logprob_rows(4, vocab, vocab)
    keys = torch.tensor([1, 2**31 + 5, 999, 0], dtype=torch.int64)
    want = race_draw_reference(logprobs, keys)
    assert torch.equal(race_draw(logprobs, keys, block=block), want)


def test_draw_frequencies_follow_p():
    # one row, many keys: the race picks token v with probability p(v)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logprobs = probs.log().expand(20000, 4).contiguous()
    keys = torch.from_numpy(mix32(np.arange(20000, dtype=np.int64)))
    counts = torch.bincount(race_draw(logprobs, keys), minlength=4).double()
    expected = probs.double() * 20000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001


def test_token_keys_are_cached_per_device():
    assert token_keys(50, "cpu") is token_keys(50, "cpu")


def test_launcher_checks_inputs():
    with pytest.raises(KernelInputError, match="float32"):
        race_draw(torch.zeros(2, 5, dtype=torch.float64), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(KernelInputError, match="row_key must be"):
        race_draw(torch.zeros(2, 5), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(KernelInputError, match="integers"):
        race_draw(torch.zeros(2, 5), torch.zeros(2))


@pytest.mark.gpu
def test_kernel_equals_reference_on_gpu():
    logprobs = logprob_rows(16, 151936, 3).cuda()
    keys = torch.from_numpy(mix32(np.arange(16, dtype=np.int64) * 977)).cuda()
    for step in range(4):
        keys = (keys * 3 + step) & MASK32
        want = race_draw_reference(logprobs, keys)
        assert torch.equal(race_draw(logprobs, keys), want)
