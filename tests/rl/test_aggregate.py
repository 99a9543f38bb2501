"""Loss aggregation against numpy, including empty sequences, NaN off the mask, micro-batches."""

import numpy as np
import pytest
import torch

from sparrow.rl import RLInputError, aggregate, count_for, masked_mean

VALUES = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]])
MASK = np.array([[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=bool)


def test_token_mean_is_sum_over_masked_tokens():
    got = aggregate(torch.tensor(VALUES), torch.tensor(MASK), "token_mean")
    assert float(got) == pytest.approx(VALUES[MASK].mean())  # (1 + 2 + 3 + 6) / 4 = 3


def test_sequence_mean_skips_sequences_without_tokens():
    got = aggregate(torch.tensor(VALUES), torch.tensor(MASK), "sequence_mean")
    # row 0 mean 2, row 1 mean 6, row 2 has no tokens and is left out
    assert float(got) == pytest.approx(4.0)
    assert count_for(torch.tensor(MASK), "sequence_mean") == 2
    assert count_for(torch.tensor(MASK), "token_mean") == 4


def test_values_off_the_mask_never_leak_even_nan():
    values = torch.tensor(VALUES, requires_grad=True)
    poisoned = torch.where(torch.tensor(MASK), values, torch.full_like(values, float("nan")))
    loss = aggregate(poisoned, torch.tensor(MASK), "token_mean")
    loss.backward()
    assert float(loss.detach()) == pytest.approx(3.0)
    assert values.grad.tolist() == (MASK / MASK.sum()).tolist()


def test_empty_mask_gives_zero_that_still_backpropagates():
    values = torch.ones(2, 3, requires_grad=True)
    loss = aggregate(values, torch.zeros(2, 3, dtype=torch.bool), "sequence_mean")
    loss.backward()
    assert float(loss.detach()) == 0.0 and values.grad.abs().sum() == 0


@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean"])
def test_micro_batches_with_global_normalizer_sum_to_full_batch(mode):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(6, 5, generator=gen)
    mask = torch.rand(6, 5, generator=gen) > 0.3
    full = aggregate(values, mask, mode)
    total = count_for(mask, mode)
    parts = sum(
        aggregate(values[s], mask[s], mode, normalizer=total) for s in (slice(0, 2), slice(2, 6))
    )
    assert float(parts) == pytest.approx(float(full), rel=1e-6)


def test_masked_mean_and_errors():
    assert masked_mean(torch.tensor(VALUES), torch.tensor(MASK)) == pytest.approx(3.0)
    assert masked_mean(torch.tensor(VALUES), torch.zeros(3, 4)) == 0.0
    with pytest.raises(RLInputError, match="seq_mean"):
        aggregate(torch.tensor(VALUES), torch.tensor(MASK), "seq_mean")
    with pytest.raises(RLInputError, match="only 0 and 1"):
        aggregate(torch.tensor(VALUES), torch.full((3, 4), 0.5), "token_mean")
    with pytest.raises(RLInputError, match="mask has shape"):
        aggregate(torch.tensor(VALUES), torch.ones(3, 3), "token_mean")
