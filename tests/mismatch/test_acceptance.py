"""Acceptance rates (exact and top-k bound) and length bins, checked against plain numpy loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparrow.errors import SparrowError
from sparrow.mismatch import acceptance as mismatch
from sparrow.mismatch.acceptance import (
    MismatchError,
    acceptance_from_logits,
    acceptance_from_logprobs,
    acceptance_lower_bound,
    acceptance_lower_bound_from_dense,
    bin_index,
)


def _softmax64(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def _loop_acceptance(dense_logits: torch.Tensor, actor_logits: torch.Tensor, temperature=1.0):
    """sum_x min(p, q) one row at a time, in float64."""
    dense = dense_logits.double().numpy().reshape(-1, dense_logits.shape[-1]) / temperature
    actor = actor_logits.double().numpy().reshape(-1, actor_logits.shape[-1]) / temperature
    out = [np.minimum(_softmax64(d), _softmax64(a)).sum() for d, a in zip(dense, actor)]
    return np.array(out).reshape(dense_logits.shape[:-1])


def _pair(shape, spread=1.0, noise=0.5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dense = spread * torch.randn(shape, generator=gen)
    actor = dense + noise * torch.randn(shape, generator=gen)
    return dense, actor


# exact acceptance


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_exact_matches_plain_loop(temperature):
    dense, actor = _pair((2, 3, 97), spread=3.0)
    got = acceptance_from_logits(dense, actor, temperature=temperature)
    assert got.shape == (2, 3) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), _loop_acceptance(dense, actor, temperature), atol=2e-6)


def test_hand_calculation_from_logprobs():
    # p = (0.5, 0.5), q = (0.9, 0.1): min sums to 0.5 + 0.1
    dense = torch.tensor([0.5, 0.5]).log()
    actor = torch.tensor([0.9, 0.1]).log()
    got = acceptance_from_logprobs(dense, actor)
    assert got.shape == ()
    assert got.item() == pytest.approx(0.6, abs=1e-6)


def test_identical_is_exactly_one_and_disjoint_is_zero():
    dense, _ = _pair((4, 50), spread=5.0)
    assert torch.equal(acceptance_from_logits(dense, dense), torch.ones(4))
    masked = torch.full((2, 6), float("-inf"))
    masked[:, :3] = 0.0
    other = masked.flip(-1)  # mass on the other three ids
    # 1 - TV is exact at 1; at 0 it carries the fp32 rounding of sum(p)
    torch.testing.assert_close(
        acceptance_from_logits(masked, other), torch.zeros(2), atol=1e-6, rtol=0
    )


def test_logprobs_are_renormalised():
    dense, actor = _pair((5, 40), spread=2.0)
    dense_lp, actor_lp = dense.log_softmax(-1), actor.log_softmax(-1)
    want = acceptance_from_logprobs(dense_lp, actor_lp)
    shifted = acceptance_from_logprobs(dense_lp + 0.01, actor_lp - 0.02)  # off-normal sums
    torch.testing.assert_close(shifted, want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(want.numpy(), _loop_acceptance(dense, actor), atol=2e-6)


def test_bf16_inputs_are_computed_in_fp32():
    dense, actor = _pair((8, 1000), spread=4.0, noise=0.3)
    dense16, actor16 = dense.bfloat16(), actor.bfloat16()
    got = acceptance_from_logits(dense16, actor16)
    assert got.dtype == torch.float32
    # the reference reads the same bf16 values, widened to float64
    np.testing.assert_allclose(got.numpy(), _loop_acceptance(dense16, actor16), atol=5e-6)
    assert bool(((got >= 0) & (got <= 1)).all())


def test_fp64_inputs_stay_fp64():
    dense, actor = _pair((3, 30), spread=2.0)
    got = acceptance_from_logits(dense.double(), actor.double())
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), _loop_acceptance(dense, actor), atol=1e-12)


def test_chunked_rows_equal_one_pass(monkeypatch):
    dense, actor = _pair((3, 7, 64), spread=2.0)
    whole = acceptance_from_logits(dense, actor)
    monkeypatch.setattr(mismatch, "_CHUNK_ELEMENTS", 64 * 2)  # two rows per chunk
    torch.testing.assert_close(acceptance_from_logits(dense, actor), whole, atol=0, rtol=0)


def test_exact_errors_name_the_argument():
    dense, actor = _pair((2, 10))
    with pytest.raises(MismatchError, match="dense_logits has shape"):
        acceptance_from_logits(dense, actor[:, :9])
    with pytest.raises(MismatchError, match="actor_logprobs must be a floating"):
        acceptance_from_logprobs(dense, actor.long())
    with pytest.raises(SparrowError, match="temperature"):
        acceptance_from_logits(dense, actor, temperature=0.0)


# top-k lower bound


def _topk_case(vocab, k, seed):
    dense, actor = _pair((6, vocab), spread=2.5, noise=0.8, seed=seed)
    actor_lp = actor.double().log_softmax(-1)
    dense_lp = dense.double().log_softmax(-1)
    top_lp, top_ids = actor_lp.topk(k, dim=-1)
    return dense, actor, dense_lp, top_ids, top_lp


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 5, 20])
def test_lower_bound_brackets_exact(seed, k):
    dense, actor, dense_lp, top_ids, top_lp = _topk_case(64, k, seed)
    lower, leftover = acceptance_lower_bound(dense_lp.gather(-1, top_ids), top_lp)
    exact = torch.from_numpy(_loop_acceptance(dense, actor))
    assert bool((lower <= exact + 1e-12).all())
    assert bool((exact <= lower + leftover + 1e-12).all())
    # leftover is the actor mass outside its top-k, by a loop over the ids
    probs = actor.double().softmax(-1).numpy()
    for row in range(6):
        outside = np.delete(probs[row], top_ids[row].numpy()).sum()
        assert leftover[row].item() == pytest.approx(outside, abs=1e-12)


def test_lower_bound_is_exact_when_k_is_vocab():
    dense, actor, dense_lp, top_ids, top_lp = _topk_case(30, 30, seed=7)
    lower, leftover = acceptance_lower_bound(dense_lp.gather(-1, top_ids), top_lp)
    np.testing.assert_allclose(lower.numpy(), _loop_acceptance(dense, actor), atol=1e-12)
    assert float(leftover.max()) < 1e-12


def test_lower_bound_hand_calculation():
    # actor top-2 = ids (0, 1) with q = (0.6, 0.3); dense p there = (0.2, 0.5)
    lower, leftover = acceptance_lower_bound(
        torch.tensor([0.2, 0.5]).log(), torch.tensor([0.6, 0.3]).log()
    )
    assert lower.item() == pytest.approx(0.2 + 0.3, abs=1e-6)
    assert leftover.item() == pytest.approx(0.1, abs=1e-6)


def test_lower_bound_from_dense_gathers_the_ids():
    dense, actor, dense_lp, top_ids, top_lp = _topk_case(50, 8, seed=3)
    # raw logits work too: the dense side is renormalised before the gather
    lower, leftover = acceptance_lower_bound_from_dense(dense.float(), top_ids, top_lp.float())
    want_lower, want_left = acceptance_lower_bound(dense_lp.gather(-1, top_ids), top_lp)
    np.testing.assert_allclose(lower.numpy(), want_lower.numpy(), atol=1e-6)
    np.testing.assert_allclose(leftover.numpy(), want_left.numpy(), atol=1e-6)


def test_lower_bound_from_dense_errors():
    dense, _, _, top_ids, top_lp = _topk_case(50, 8, seed=3)
    with pytest.raises(MismatchError, match=r"actor_topk_ids must lie in \[0, 50\)"):
        acceptance_lower_bound_from_dense(dense, top_ids + 45, top_lp)
    with pytest.raises(MismatchError, match="leading dims"):
        acceptance_lower_bound_from_dense(dense[:5], top_ids, top_lp)
    with pytest.raises(MismatchError, match="integer"):
        acceptance_lower_bound_from_dense(dense, top_ids.double(), top_lp)


# length bins


def test_bin_index_matches_loop_for_every_input_kind():
    positions = [0, 1, 1999, 2000, 2001, 39999, 40000, 123456]
    for num_bins in (None, 20, 3):
        want = [p // 2000 if num_bins is None else min(p // 2000, num_bins - 1) for p in positions]
        assert bin_index(np.array(positions), num_bins=num_bins).tolist() == want
        assert bin_index(torch.tensor(positions), num_bins=num_bins).tolist() == want
        assert [bin_index(p, num_bins=num_bins) for p in positions] == want
    assert bin_index(np.array([16, 31, 32]), bin_tokens=16).tolist() == [1, 1, 2]
    assert bin_index(np.array([4000.0, 1999.0])).tolist() == [2, 0]


def test_bin_index_errors():
    with pytest.raises(
        MismatchError, match=r"position must be >= 0: 2 bad rows, first at row 1: -3"
    ):
        bin_index(np.array([5, -3, -1]))
    with pytest.raises(MismatchError, match="position must be >= 0"):
        bin_index(torch.tensor([5, -3]))
    with pytest.raises(MismatchError, match="whole numbers"):
        bin_index(np.array([1.5]))
    with pytest.raises(MismatchError, match="bin_tokens"):
        bin_index(3, bin_tokens=0)
    with pytest.raises(MismatchError, match="num_bins"):
        bin_index(3, num_bins=0)
