"""Chunked logprobs equal the whole-batch computation, forward and backward.

python -m pytest tests/trainer/test_logprobs.py -q
"""

from __future__ import annotations

import pytest
import torch

from sparrow.trainer.logprobs import chunked_logprobs


def full_logprobs(hidden, weight, targets, temperature):
    logits = (hidden @ weight.T).double() / temperature
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]


def assert_like_the_whole_batch(logprobs, seed, rows=23, vocab=50):
    """logprobs(hidden, weight, targets, temperature) against autograd through the float64
    log-softmax of the whole batch: values and both gradients."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 8, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, 8, generator=gen, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    upstream = torch.randn(rows, generator=gen)
    got = logprobs(hidden, weight, targets, 0.7)
    (got * upstream).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want = full_logprobs(hidden, weight, targets, 0.7)
    (want * upstream).sum().backward()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[0], hidden.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 7, 100])
def test_chunks_equal_the_whole_batch_with_gradients(chunk):
    assert_like_the_whole_batch(
        lambda h, w, t, temperature: chunked_logprobs(h, w, t, temperature, chunk), chunk
    )


def test_extra_ids_are_logprobs_at_those_ids():
    gen = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(9, 4, generator=gen), torch.randn(30, 4, generator=gen)
    targets = torch.randint(0, 30, (9,), generator=gen)
    ids = torch.randint(0, 30, (9, 5), generator=gen)
    lp, at_ids = chunked_logprobs(hidden, weight, targets, 1.0, 4, extra_ids=ids)
    table = torch.log_softmax((hidden @ weight.T).double(), -1)
    torch.testing.assert_close(at_ids.double(), table.gather(-1, ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        lp.double(), table.gather(-1, targets[:, None])[:, 0], rtol=1e-5, atol=1e-5
    )


def test_bad_chunk_is_refused():
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_logprobs(
            torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long), 1.0, 0
        )


def compiled_against_plain(device, dtype, tolerance):
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(37, 16, generator=gen).to(device, dtype)
    weight = torch.randn(300, 16, generator=gen).to(device, dtype)
    targets = torch.randint(0, 300, (37,), generator=gen).to(device)
    extra = torch.randint(0, 300, (37, 4), generator=gen).to(device)
    with torch.no_grad():
        for ids in (None, extra):
            plain = chunked_logprobs(hidden, weight, targets, 0.7, 16, ids)
            got = chunked_logprobs(hidden, weight, targets, 0.7, 16, ids, compiled=True)
            for a, b in zip(
                plain if ids is not None else [plain], got if ids is not None else [got]
            ):
                assert b.dtype == torch.float32 and b.shape == a.shape
                torch.testing.assert_close(b, a, rtol=tolerance, atol=tolerance)
    # against float64 log-softmax of the same (low-precision) logits
    logits = torch.nn.functional.linear(hidden, weight).double() / 0.7
    want = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(got[0].double(), want, rtol=tolerance, atol=tolerance)


@pytest.mark.slow
def test_the_compiled_log_softmax_gives_the_plain_numbers_on_cpu():
    compiled_against_plain("cpu", torch.float32, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_compiled_log_softmax_gives_the_plain_numbers_on_gpu():
    compiled_against_plain("cuda", torch.bfloat16, 1e-4)


@pytest.mark.slow
def test_the_trainer_scores_through_the_compiled_log_softmax_when_asked(
    qwen3_checkpoint, monkeypatch
):
    import dataclasses

    import numpy as np

    from sparrow.config.schema import AlgoConfig, TrainerConfig
    from sparrow.trainer import logprobs
    from sparrow.trainer.policy_trainer import PolicyTrainer
    from tests.trainer.test_policy_trainer_gpu import make_records

    calls = []
    compiled = logprobs._compiled_normalized_at

    def counting():
        calls.append(1)
        return compiled()

    monkeypatch.setattr(logprobs, "_compiled_normalized_at", counting)
    algo = AlgoConfig(lr=1e-3)
    system = TrainerConfig(micro_batch_tokens=64, logits_chunk_tokens=8)
    records = make_records(seed=2)
    trainers = [
        PolicyTrainer(qwen3_checkpoint, algo, device="cpu", trainer_config=system),
        PolicyTrainer(
            qwen3_checkpoint,
            algo,
            device="cpu",
            trainer_config=dataclasses.replace(system, compile_logprobs=True),
        ),
    ]
    plain = trainers[0].score(records)
    assert not calls
    asked = trainers[1].score(records)
    assert calls
    for a, b in zip(plain, asked):
        np.testing.assert_allclose(b.dense_logprobs, a.dense_logprobs, atol=1e-5)
        np.testing.assert_allclose(b.acceptance, a.acceptance, atol=1e-5)
    # the update through LinearLogprob: the same loss and gradient norm, the same new weights
    records = [
        dataclasses.replace(r, actor_logprobs=s.dense_logprobs) for r, s in zip(records, plain)
    ]
    old = [s.dense_logprobs for s in plain]
    metrics = [t.update(records, [1.0, 0.0, 0.0, 1.0], old, group_size=2) for t in trainers]
    for key in ("actor/loss", "actor/grad_norm"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-5, abs=1e-7)
    # AdamW divides by the gradient's size: where a gradient is near zero, float rounding in
    # it moves a weight by up to a few percent of lr (1e-3)
    for a, b in zip(trainers[0].model.parameters(), trainers[1].model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=3e-5)
    # the options' default (null) means "where the trainer runs on CUDA"; a set value wins
    cuda = torch.device("cuda")
    assert not trainers[0].compiles("compile_logprobs")
    assert not trainers[0].compiles("compile_layers")
    trainers[0].device = cuda
    assert trainers[0].compiles("compile_logprobs") and trainers[0].compiles("compile_layers")
    trainers[1].trainer_config = dataclasses.replace(system, compile_logprobs=False)
    trainers[1].device = cuda
    assert not trainers[1].compiles("compile_logprobs")


@pytest.mark.parametrize("compile_parts", [False, True])
def test_the_linear_logprob_function_gives_autograds_values_and_gradients(compile_parts):
    """One chunk's LinearLogprob (its elementwise parts plain or compiled) against autograd
    through the float64 log-softmax: values and both gradients."""
    from sparrow.trainer.logprobs import LinearLogprob

    assert_like_the_whole_batch(
        lambda h, w, t, temperature: LinearLogprob.apply(h, w, t, temperature, compile_parts),
        11,
        rows=19,
        vocab=60,
    )


@pytest.mark.parametrize("chunk", [4, 100])
def test_compiled_chunks_with_gradients_equal_the_checkpointed_ones(chunk):
    gen = torch.Generator().manual_seed(chunk + 1)
    hidden = torch.randn(23, 8, generator=gen, requires_grad=True)
    weight = torch.randn(50, 8, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (23,), generator=gen)
    extra = torch.randint(0, 50, (23, 3), generator=gen)
    upstream = torch.randn(23, generator=gen)
    results = []
    for compiled in (False, True):
        lp, at = chunked_logprobs(hidden, weight, targets, 0.7, chunk, extra, compiled=compiled)
        (lp * upstream).sum().backward()
        results.append((lp.detach(), at, hidden.grad.clone(), weight.grad.clone()))
        hidden.grad = weight.grad = None
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def gradients_in_low_precision(device, autocast):
    """bf16 matrix products (under autocast from float32 tensors, or bf16 tensors as with
    master weights): the compiled path's values and gradients match the checkpointed path's."""
    gen = torch.Generator().manual_seed(21)
    dtype = torch.float32 if autocast else torch.bfloat16
    hidden = torch.randn(40, 32, generator=gen).to(device, dtype).requires_grad_()
    weight = torch.randn(500, 32, generator=gen).to(device, dtype).requires_grad_()
    targets = torch.randint(0, 500, (40,), generator=gen).to(device)
    upstream = torch.randn(40, generator=gen).to(device)
    results = []
    for compiled in (False, True):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            lp = chunked_logprobs(hidden, weight, targets, 1.0, 16, compiled=compiled)
        (lp * upstream).sum().backward()
        results.append(
            (lp.detach().float(), hidden.grad.float().clone(), weight.grad.float().clone())
        )
        hidden.grad = weight.grad = None
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("autocast", [True, False])
def test_compiled_gradients_in_bf16_match_on_cpu(autocast):
    gradients_in_low_precision("cpu", autocast)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("autocast", [True, False])
def test_compiled_gradients_in_bf16_match_on_gpu(autocast):
    gradients_in_low_precision("cuda", autocast)
