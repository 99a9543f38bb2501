"""Chunked logprobs equal the whole-batch computation, forward and backward.

    python -m pytest tests/sparrow_core/rl/test_logprobs.py -q
"""

from __future__ import annotations

import pytest
import torch

from sparrow_core.rl.logprobs import chunked_logprobs


def full_logprobs(hidden, weight, targets, temperature):
    logits = (hidden @ weight.T).double() / temperature
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]


@pytest.mark.parametrize("chunk", [1, 5, 7, 100])
def test_chunks_equal_the_whole_batch_with_gradients(chunk):
    gen = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(23, 8, generator=gen, requires_grad=True)
    weight = torch.randn(50, 8, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (23,), generator=gen)
    upstream = torch.randn(23, generator=gen)
    got = chunked_logprobs(hidden, weight, targets, 0.7, chunk)
    (got * upstream).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want = full_logprobs(hidden, weight, targets, 0.7)
    (want * upstream).sum().backward()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[0], hidden.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad, rtol=1e-4, atol=1e-5)


def test_extra_ids_are_logprobs_at_those_ids():
    gen = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(9, 4, generator=gen), torch.randn(30, 4, generator=gen)
    targets = torch.randint(0, 30, (9,), generator=gen)
    ids = torch.randint(0, 30, (9, 5), generator=gen)
    lp, at_ids = chunked_logprobs(hidden, weight, targets, 1.0, 4, extra_ids=ids)
    table = torch.log_softmax((hidden @ weight.T).double(), -1)
    torch.testing.assert_close(at_ids.double(), table.gather(-1, ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp.double(), table.gather(-1, targets[:, None])[:, 0],
                               rtol=1e-5, atol=1e-5)


def test_bad_chunk_is_refused():
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_logprobs(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long),
                         1.0, 0)
