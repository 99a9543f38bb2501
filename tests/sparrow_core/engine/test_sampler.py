"""The sampler against plain-loop references, exact frequencies and seeding rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from sparrow_core.engine.sampler import (
    SampleOutput,
    SamplingError,
    SamplingParams,
    sample,
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


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def test_greedy_takes_the_argmax_with_temperature_one_logprobs():
    logits = torch.randn(5, 50, generator=_generator(0))
    params = [SamplingParams(temperature=0.0, top_k=3, top_p=0.5)] * 5
    out = sample(logits, params, [None] * 5)
    assert isinstance(out, SampleOutput)
    assert out.token_ids.tolist() == [int(np.argmax(r)) for r in logits.numpy()]
    expected = torch.log_softmax(logits.double(), -1).max(-1).values.float()
    torch.testing.assert_close(out.logprobs, expected)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (1, 1.0), (4, 1.0), (0, 0.3), (0, 0.9),
                                         (5, 0.6), (20, 0.99), (200, 0.5)])
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
    params = [SamplingParams(temperature=0.7, top_k=6), SamplingParams(top_p=0.8),
              SamplingParams(temperature=1.3, top_k=10, top_p=0.7, logprobs_topk=3),
              SamplingParams(temperature=0.5, logprobs_topk=12)]
    out = sample(logits, params, [_generator(i) for i in range(4)])
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


def test_topk_width_is_the_largest_request_capped_at_the_vocabulary():
    logits = torch.randn(2, 8, generator=_generator(2))
    out = sample(logits, [SamplingParams(logprobs_topk=3), SamplingParams(logprobs_topk=50)],
                 [None, None])
    assert out.topk_ids.shape == (2, 8)
    out = sample(logits, [SamplingParams(logprobs_topk=0)] * 2, [None, None])
    assert out.topk_ids.shape == (2, 0)


def test_same_seed_same_tokens_whatever_else_is_in_the_batch():
    generator = _generator(3)
    steps = [torch.randn(3, 100, generator=generator) for _ in range(6)]
    params = SamplingParams(temperature=1.0, seed=7)

    def run(row_of_interest, batch_seeds):
        gens = [_generator(s) for s in batch_seeds]
        tokens = []
        for logits in steps:
            out = sample(logits, [params] * 3, gens)
            tokens.append(int(out.token_ids[row_of_interest]))
        return tokens

    alone = run(0, [7, 11, 12])
    assert run(0, [7, 99, 5]) == alone
    # the same logits row but a different seed: over six steps the tokens differ
    assert run(0, [8, 11, 12]) != alone


def test_global_generator_when_none_is_given():
    logits = torch.randn(2, 100, generator=_generator(4))
    torch.manual_seed(123)
    first = sample(logits, [SamplingParams()] * 2, [None, None]).token_ids
    torch.manual_seed(123)
    second = sample(logits, [SamplingParams()] * 2, [None, None]).token_ids
    assert first.tolist() == second.tolist()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 4, 1.0),
                                                     (1.5, 0, 0.75)])
def test_empirical_frequencies_match_the_distribution(temperature, top_k, top_p):
    logits_row = torch.tensor([1.5, 0.2, -0.3, 0.9, -1.0, 0.0])
    probs = np.array(_reference_distribution(logits_row.tolist(), temperature, top_k, top_p))
    draws = 12000
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    generator = _generator(5)
    out = sample(logits_row.expand(draws, -1).contiguous(), [params] * draws,
                 [generator] * draws)
    counts = np.bincount(out.token_ids.numpy(), minlength=6)
    assert counts[probs == 0].sum() == 0
    support = probs > 0
    result = stats.chisquare(counts[support], draws * probs[support])
    assert result.pvalue > 1e-3, (counts, draws * probs)


@pytest.mark.parametrize("field,value", [("temperature", -0.1), ("temperature", math.inf),
                                         ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
                                         ("max_new_tokens", 0), ("n", 0), ("logprobs_topk", -2),
                                         ("seed", -1), ("stop_token_ids", (3, -1))])
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
        sample(torch.zeros(2, 5), [SamplingParams()], [None, None])
    with pytest.raises(SamplingError, match="float32"):
        sample(torch.zeros(2, 5, dtype=torch.float64), [SamplingParams()] * 2, [None] * 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_rows_with_cuda_generators_are_reproducible_and_exact():
    logits_row = torch.tensor([1.5, 0.2, -0.3, 0.9, -1.0, 0.0], device="cuda")
    params = SamplingParams(temperature=0.8, top_p=0.9)
    probs = np.array(_reference_distribution(logits_row.tolist(), 0.8, 0, 0.9))
    draws = 20000

    def run(seed):
        generator = torch.Generator(device="cuda").manual_seed(seed)
        return sample(logits_row.expand(draws, -1).contiguous(), [params] * draws,
                      [generator] * draws)

    out = run(3)
    assert out.token_ids.is_cuda and torch.equal(out.token_ids, run(3).token_ids)
    counts = np.bincount(out.token_ids.cpu().numpy(), minlength=6)
    assert counts[probs == 0].sum() == 0
    support = probs > 0
    assert stats.chisquare(counts[support], draws * probs[support]).pvalue > 1e-3


def test_untruncated_rows_skip_the_sort_and_mix_with_seeded_and_shared_rows():
    logits = torch.randn(3, 50, generator=_generator(8))
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3),
              SamplingParams(temperature=0.0)]
    torch.manual_seed(5)
    out = sample(logits, params, [_generator(1), None, None])
    for row, p in enumerate(params):
        want = _reference_distribution(logits[row].tolist(), p.temperature or 1.0, 0, 1.0)
        assert float(out.logprobs[row]) == pytest.approx(
            math.log(want[int(out.token_ids[row])]), abs=1e-5)
        np.testing.assert_allclose(out.topk_logprobs[row].exp().numpy(),
                                   sorted(want, reverse=True)[:20], rtol=1e-5, atol=1e-7)
    assert int(out.token_ids[2]) == int(logits[2].argmax())
    # the seeded row draws the same token whatever the global generator's state
    torch.manual_seed(6)
    again = sample(logits, params, [_generator(1), None, None])
    assert int(again.token_ids[0]) == int(out.token_ids[0])
