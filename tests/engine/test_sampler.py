"""The sampler against plain-loop references, exact frequencies and seeding rules; the
counter-based hash against a plain-Python transcription of its docstring."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from sparrow.engine.sampler import (
    SampleOutput,
    SamplingBatch,
    SamplingError,
    SamplingParams,
    exponential_from_bits,
    noise_bits,
    row_keys,
    sample,
    seed_keys,
    truncation_mask,
)


def _reference_distribution(row: list[float], temperature: float, top_k: int, top_p: float):
    """Plain-Python probabilities of the distribution sampled from (see the sampler's doc)."""
    scaled = [x / temperature for x in row]
    order = sorted(range(len(row)), key=lambda i: (-scaled[i], i))
    kept = set(range(len(row)))
    if top_k > 0:
        kth = scaled[order[min(top_k, len(row)) - 1]]
        kept = {i for i in kept if scaled[i] >= kth}
    biggest = max(scaled)
    weights = {i: math.exp(scaled[i] - biggest) for i in kept}
    total = sum(weights.values())
    if top_p < 1.0:
        nucleus, mass = set(), 0.0
        for i in order:
            if i not in kept:
                continue
            if mass >= top_p:
                break
            nucleus.add(i)
            mass += weights[i] / total
        kept = nucleus
        total = sum(weights[i] for i in kept)
    return [weights[i] / total if i in kept else 0.0 for i in range(len(row))]


MASK = 2**32 - 1


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _scramble32_reference(x: int) -> int:
    """The sampler docstring's scramble32, on Python integers."""
    x = (x * 0x3504F333) & MASK
    x ^= x >> 15
    x = (x * 0x5DB3D743) & MASK
    return x ^ (x >> 16)


def _mix32_reference(x: int) -> int:
    return _scramble32_reference(x ^ (x >> 16))


def _bits_reference(seed: int, counter: int, token: int) -> int:
    """bits[row, token] as the sampler docstring defines them, on Python integers."""
    seed_key = _mix32_reference(_mix32_reference((seed >> 32) ^ 0x1E3779B9) ^ (seed & MASK))
    row_key = _mix32_reference(seed_key ^ _mix32_reference(counter))
    token_key = _mix32_reference(_mix32_reference(token ^ 0x510E527F))
    return _scramble32_reference(row_key ^ token_key)


def _draw(logits, params, seeds, counters):
    return sample(logits, SamplingBatch.build(params, seeds, logits.device), counters)


def test_noise_bits_follow_the_documented_hash():
    seeds = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 123456789012345]
    counters = [0, 7, 1, 4095, 2**31, 3]
    bits = noise_bits(row_keys(seed_keys(seeds), counters), 50)
    for row, (seed, counter) in enumerate(zip(seeds, counters)):
        assert bits[row].tolist() == [_bits_reference(seed, counter, t) for t in range(50)]


def test_exponential_noise_is_positive_and_finite_at_the_extreme_bits():
    noise = exponential_from_bits(torch.tensor([0, 1, MASK - 1, MASK]))
    assert torch.isfinite(noise).all() and (noise > 0).all()
    assert noise[0].item() == pytest.approx(-math.log(0.5 / 2**32))
    assert noise[3].item() == pytest.approx(0.5 / 2**32, rel=1e-6)


def test_greedy_takes_the_argmax_with_temperature_one_logprobs():
    logits = torch.randn(5, 50, generator=_generator(0))
    params = [SamplingParams(temperature=0.0, top_k=3, top_p=0.5)] * 5
    out = sample(logits, params)
    assert isinstance(out, SampleOutput)
    assert out.token_ids.tolist() == [int(np.argmax(r)) for r in logits.numpy()]
    expected = torch.log_softmax(logits.double(), -1).max(-1).values.float()
    torch.testing.assert_close(out.logprobs, expected)


@pytest.mark.parametrize(
    "top_k,top_p",
    [(0, 1.0), (1, 1.0), (4, 1.0), (0, 0.3), (0, 0.9), (5, 0.6), (20, 0.99), (200, 0.5)],
)
def test_truncation_mask_matches_a_plain_loop(top_k, top_p):
    generator = _generator(top_k * 1000 + int(top_p * 100))
    # integer logits make ties at the k-th value, which must be kept
    logits = torch.randint(-4, 5, (6, 30), generator=generator).float()
    logits[3:] = torch.randn(3, 30, generator=generator) * 2
    batch = logits.shape[0]
    mask = truncation_mask(logits, torch.full((batch,), top_k), torch.full((batch,), top_p))
    for row in range(batch):
        probs = _reference_distribution(logits[row].tolist(), 1.0, top_k, top_p)
        assert mask[row].tolist() == [p > 0 for p in probs], (row, top_k, top_p)


def test_logprobs_are_under_the_truncated_renormalised_distribution():
    generator = _generator(1)
    logits = torch.randn(4, 40, generator=generator) * 3
    params = [
        SamplingParams(temperature=0.7, top_k=6),
        SamplingParams(top_p=0.8),
        SamplingParams(temperature=1.3, top_k=10, top_p=0.7, logprobs_topk=3),
        SamplingParams(temperature=0.5, logprobs_topk=12),
    ]
    out = _draw(logits, params, range(4), [0, 5, 9, 2])
    assert out.topk_ids.shape == out.topk_logprobs.shape == (4, 20)
    for row, p in enumerate(params):
        probs = _reference_distribution(logits[row].tolist(), p.temperature, p.top_k, p.top_p)
        token = int(out.token_ids[row])
        assert probs[token] > 0
        assert out.logprobs[row].item() == pytest.approx(math.log(probs[token]), abs=1e-5)
        ranked = sorted(range(40), key=lambda i: -probs[i])[:20]
        want = [math.log(probs[i]) if probs[i] > 0 else -math.inf for i in ranked]
        got = out.topk_logprobs[row].tolist()
        kept = sum(q > 0 for q in probs)
        assert got[:kept] == pytest.approx(want[:kept], abs=1e-5)
        assert all(v == -math.inf for v in got[kept:])
        assert out.topk_ids[row, :kept].tolist() == ranked[:kept]


def test_the_drawn_token_is_the_exponential_race_of_the_documented_noise():
    logits = torch.randn(3, 30, generator=_generator(9)) * 2
    params = [SamplingParams(temperature=0.8), SamplingParams(top_k=5), SamplingParams(top_p=0.6)]
    seeds, counters = [5, 2**40 + 3, 77], [0, 12, 3]
    out = _draw(logits, params, seeds, counters)
    for row, p in enumerate(params):
        probs = _reference_distribution(logits[row].tolist(), p.temperature, p.top_k, p.top_p)
        races = [
            probs[t] / -math.log((_bits_reference(seeds[row], counters[row], t) + 0.5) / 2**32)
            for t in range(30)
        ]
        assert int(out.token_ids[row]) == max(range(30), key=races.__getitem__)


def test_topk_width_is_the_largest_request_capped_at_the_vocabulary():
    logits = torch.randn(2, 8, generator=_generator(2))
    out = sample(logits, [SamplingParams(logprobs_topk=3), SamplingParams(logprobs_topk=50)])
    assert out.topk_ids.shape == (2, 8)
    out = sample(logits, [SamplingParams(logprobs_topk=0)] * 2)
    assert out.topk_ids.shape == (2, 0)


def test_same_seed_same_tokens_whatever_else_is_in_the_batch_and_whatever_its_row():
    generator = _generator(3)
    steps = [torch.randn(100, generator=generator) for _ in range(8)]
    params = SamplingParams(temperature=1.0)

    def run(row_of_interest, batch_seeds):
        tokens = []
        for counter, row in enumerate(steps):
            # the other rows hold other logits, seeds and counters
            logits = torch.randn(len(batch_seeds), 100, generator=generator)
            logits[row_of_interest] = row
            counters = torch.randint(0, 50, (len(batch_seeds),), generator=generator)
            counters[row_of_interest] = counter
            out = _draw(logits, [params] * len(batch_seeds), batch_seeds, counters)
            tokens.append(int(out.token_ids[row_of_interest]))
        return tokens

    alone = run(0, [7])
    assert run(0, [7, 11, 12]) == alone
    assert run(2, [99, 5, 7, 1]) == alone
    # the same logits but another seed: over eight steps the tokens differ
    assert run(0, [8, 11, 12]) != alone


def test_seeds_from_params_or_the_global_generator():
    logits = torch.randn(2, 100, generator=_generator(4))
    torch.manual_seed(123)
    first = sample(logits, [SamplingParams()] * 2).token_ids
    torch.manual_seed(123)
    second = sample(logits, [SamplingParams()] * 2).token_ids
    assert first.tolist() == second.tolist()
    batch = SamplingBatch.build([SamplingParams(seed=41), SamplingParams()])
    assert batch.seeds[0] == 41


def _chi_square_pvalue(tokens, probs):
    counts = np.bincount(tokens, minlength=len(probs))
    assert counts[probs == 0].sum() == 0
    support = probs > 0
    return stats.chisquare(counts[support], len(tokens) * probs[support]).pvalue


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 4, 1.0), (1.5, 0, 0.75)])
def test_empirical_frequencies_match_the_distribution(temperature, top_k, top_p):
    logits_row = torch.tensor([1.5, 0.2, -0.3, 0.9, -1.0, 0.0])
    probs = np.array(_reference_distribution(logits_row.tolist(), temperature, top_k, top_p))
    draws = 12000
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * draws
    logits = logits_row.expand(draws, -1).contiguous()
    # many seeds at one counter, and one seed along its counter
    across = _draw(logits, params, range(1000, 1000 + draws), None)
    along = _draw(logits, params, [5] * draws, torch.arange(draws))
    assert _chi_square_pvalue(across.token_ids.numpy(), probs) > 1e-3
    assert _chi_square_pvalue(along.token_ids.numpy(), probs) > 1e-3


def test_consecutive_draws_of_a_row_are_independent():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    draws = 8000
    logits = torch.tensor(probs, dtype=torch.float32).log().expand(draws, -1).contiguous()
    tokens = _draw(
        logits, [SamplingParams()] * draws, [3] * draws, torch.arange(draws)
    ).token_ids.numpy()
    pairs = np.zeros((4, 4))
    np.add.at(pairs, (tokens[:-1], tokens[1:]), 1)
    assert stats.chi2_contingency(pairs).pvalue > 1e-3
    # and two seeds at the same counters
    other = _draw(
        logits, [SamplingParams()] * draws, [4] * draws, torch.arange(draws)
    ).token_ids.numpy()
    pairs = np.zeros((4, 4))
    np.add.at(pairs, (tokens, other), 1)
    assert stats.chi2_contingency(pairs).pvalue > 1e-3


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1),
        ("temperature", math.inf),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("max_new_tokens", 0),
        ("n", 0),
        ("logprobs_topk", -2),
        ("seed", -1),
        ("stop_token_ids", (3, -1)),
    ],
)
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(SamplingError, match=field):
        SamplingParams(**{field: value})


def test_params_are_frozen_and_lists_become_tuples():
    params = SamplingParams(stop_token_ids=[5, 6])
    assert params.stop_token_ids == (5, 6)
    with pytest.raises(AttributeError):
        params.top_k = 3


def test_mismatched_inputs_are_errors():
    with pytest.raises(SamplingError, match="2 rows but 1 SamplingParams"):
        sample(torch.zeros(2, 5), [SamplingParams()])
    with pytest.raises(SamplingError, match="float32"):
        sample(torch.zeros(2, 5, dtype=torch.float64), [SamplingParams()] * 2)
    with pytest.raises(SamplingError, match=r"counters must have shape \(2,\)"):
        sample(torch.zeros(2, 5), [SamplingParams()] * 2, [0, 1, 2])
    with pytest.raises(SamplingError, match=r"counters must lie in \[0, 2\*\*32\)"):
        sample(torch.zeros(2, 5), [SamplingParams()] * 2, [0, -1])
    with pytest.raises(SamplingError, match="got 1 seeds for 2"):
        SamplingBatch.build([SamplingParams()] * 2, seeds=[1])
    for bad in (-1, 2**63, 1.5, True):
        with pytest.raises(SamplingError, match="seeds must be integers"):
            SamplingBatch.build([SamplingParams()], seeds=[bad])


def test_untruncated_rows_skip_the_sort_and_mix_with_greedy_rows():
    logits = torch.randn(3, 50, generator=_generator(8))
    params = [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=0.0),
    ]
    out = _draw(logits, params, [1, 2, 3], [0, 0, 0])
    for row, p in enumerate(params):
        want = _reference_distribution(logits[row].tolist(), p.temperature or 1.0, 0, 1.0)
        assert float(out.logprobs[row]) == pytest.approx(
            math.log(want[int(out.token_ids[row])]), abs=1e-5
        )
        np.testing.assert_allclose(
            out.topk_logprobs[row].exp().numpy(),
            sorted(want, reverse=True)[:20],
            rtol=1e-5,
            atol=1e-7,
        )
    assert int(out.token_ids[2]) == int(logits[2].argmax())
    # the global generator's state does not matter to seeded rows
    torch.manual_seed(6)
    again = _draw(logits, params, [1, 2, 3], [0, 0, 0])
    assert again.token_ids.tolist() == out.token_ids.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_draws_equal_cpu_draws_and_are_exact():
    seeds = torch.randint(0, 2**62, (64,), generator=_generator(10))
    counters = torch.randint(0, 10000, (64,), generator=_generator(11))
    keys = row_keys(seed_keys(seeds.numpy()), counters.numpy())
    cpu_bits = noise_bits(keys, 1000)
    cuda_bits = noise_bits(keys, 1000, "cuda")
    assert cuda_bits.is_cuda and torch.equal(cpu_bits, cuda_bits.cpu())
    logits_row = torch.tensor([1.5, 0.2, -0.3, 0.9, -1.0, 0.0])
    probs = np.array(_reference_distribution(logits_row.tolist(), 0.8, 0, 0.9))
    draws = 20000
    params = [SamplingParams(temperature=0.8, top_p=0.9)] * draws
    logits = logits_row.expand(draws, -1).contiguous()
    on_cuda = _draw(logits.cuda(), params, range(draws), None)
    on_cpu = _draw(logits, params, range(draws), None)
    assert on_cuda.token_ids.is_cuda
    assert torch.equal(on_cuda.token_ids.cpu(), on_cpu.token_ids)
    assert _chi_square_pvalue(on_cuda.token_ids.cpu().numpy(), probs) > 1e-3
