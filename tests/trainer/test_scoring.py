"""Dense scoring: equal to a plain per-sample forward, acceptance equal to a hand computation.

python -m pytest tests/trainer/test_scoring.py -q
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
import torch

from sparrow.data.rollouts import RolloutRecord, read_rollouts, write_rollouts
from sparrow.rl.checks import RLInputError
from sparrow.trainer.scoring import TokenScores, micro_batches, score_rollouts

VOCAB = 384  # the byte-level test checkpoints'


@pytest.fixture(scope="module")
def hf_model(qwen3_checkpoint):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        qwen3_checkpoint, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def record(prompt_index, sample_index, prompt, output, topk_ids=None, topk_logprobs=None):
    n = len(output)
    topk_ids = topk_ids if topk_ids is not None else [[t] for t in output]
    topk_logprobs = topk_logprobs if topk_logprobs is not None else [[-1.0]] * n
    return RolloutRecord(
        prompt_index,
        sample_index,
        prompt_index,
        tuple(prompt),
        tuple(output),
        tuple([-1.0] * n),
        tuple(map(tuple, topk_ids)),
        tuple(map(tuple, topk_logprobs)),
        tuple([1] * n),
        "stop",
        "0",
    )


def random_records(count, seed, k=5):
    rng = random.Random(seed)
    records = []
    for i in range(count):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))]
        output = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
        ids = [rng.sample(range(VOCAB), k) for _ in output]
        logprobs = [
            sorted(
                np.log(
                    np.random.default_rng(seed * 100 + i * 10 + j).dirichlet(np.ones(k + 1))[:k]
                ).tolist(),
                reverse=True,
            )
            for j in range(len(output))
        ]
        records.append(record(i // 2, i % 2, prompt, output, ids, logprobs))
    return records


def plain_logprobs(model, rec, temperature):
    """log softmax(logits / T) [n_generated, V] from one unpadded forward of one sequence."""
    ids = torch.tensor([rec.prompt_ids + rec.output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    start = len(rec.prompt_ids) - 1
    return torch.log_softmax(logits[start : start + len(rec.output_ids)], dim=-1)


@pytest.mark.parametrize("budget", [1, 30, 10_000])
def test_scores_equal_a_plain_forward_per_sample(hf_model, budget):
    records = random_records(7, seed=budget)
    scores = score_rollouts(hf_model, records, micro_batch_tokens=budget, temperature=0.7)
    assert len(scores) == len(records)
    for rec, got in zip(records, scores):
        full = plain_logprobs(hf_model, rec, 0.7)
        want = full.gather(-1, torch.tensor(rec.output_ids)[:, None])[:, 0]
        np.testing.assert_allclose(got.dense_logprobs, want.numpy(), atol=2e-5, rtol=0)
        # acceptance: a plain loop over tokens and top-K entries
        for j in range(len(rec.output_ids)):
            p = [math.exp(float(full[j, t])) for t in rec.topk_ids[j]]
            q = [math.exp(v) for v in rec.topk_logprobs[j]]
            assert got.acceptance[j] == pytest.approx(sum(map(min, p, q)), abs=2e-5)
            assert got.leftover_mass[j] == pytest.approx(1 - sum(q), abs=1e-6)


def test_acceptance_by_hand_on_a_tiny_case(hf_model):
    rec = record(
        0,
        0,
        [5, 6, 7],
        [8, 9],
        topk_ids=[[8, 1], [9, 2]],
        topk_logprobs=[[math.log(0.5), math.log(0.25)], [math.log(0.9), -math.inf]],
    )
    got = score_rollouts(hf_model, [rec], 64)[0]
    p = plain_logprobs(hf_model, rec, 1.0).exp()
    first = min(float(p[0, 8]), 0.5) + min(float(p[0, 1]), 0.25)
    second = min(float(p[1, 9]), 0.9)  # a truncated actor token (-inf) adds nothing
    assert got.acceptance == pytest.approx((first, second), abs=1e-6)
    assert got.leftover_mass == pytest.approx((0.25, 0.1), abs=1e-6)


def test_identical_full_distributions_accept_everything(hf_model):
    base = record(0, 0, [3, 4], [10, 11, 12])
    full = plain_logprobs(hf_model, base, 1.3)
    ids = [list(range(VOCAB))] * 3
    rec = record(0, 0, [3, 4], [10, 11, 12], ids, full.float().tolist())
    got = score_rollouts(hf_model, [rec], 64, temperature=1.3)[0]
    np.testing.assert_allclose(got.acceptance, [1.0] * 3, atol=1e-5)
    np.testing.assert_allclose(got.leftover_mass, [0.0] * 3, atol=1e-5)


def test_temperature_zero_scores_at_one(hf_model):
    records = random_records(3, seed=4)
    assert score_rollouts(hf_model, records, 64, 0.0) == score_rollouts(hf_model, records, 64, 1.0)
    assert score_rollouts(hf_model, records, 64, 2.0) != score_rollouts(hf_model, records, 64, 1.0)
    with pytest.raises(RLInputError, match="temperature"):
        score_rollouts(hf_model, records, 64, -1.0)


def test_empty_outputs_and_order(hf_model):
    records = random_records(4, seed=9)
    records.insert(1, record(5, 0, [1, 2], []))
    scores = score_rollouts(hf_model, records, 16)
    assert scores[1] == TokenScores((), (), ())
    assert [len(s.dense_logprobs) for s in scores] == [len(r.output_ids) for r in records]
    alone = score_rollouts(hf_model, [records[3]], 16)[0]
    np.testing.assert_allclose(alone.dense_logprobs, scores[3].dense_logprobs, atol=2e-5)


def test_records_read_back_as_arrays_score_like_tuples(hf_model, tmp_path):
    # float32-exact logprobs: the file keeps float32, so both forms hold the same values
    records = [
        dataclasses.replace(
            r,
            topk_logprobs=tuple(
                tuple(float(np.float32(v)) for v in row) for row in r.topk_logprobs
            ),
        )
        for r in random_records(6, seed=5)
    ]
    records.insert(2, record(7, 0, [4, 5], []))
    back = read_rollouts(write_rollouts(tmp_path / "rollouts.parquet", records))
    assert isinstance(back[0].topk_ids, np.ndarray) and back == records
    for budget in (1, 40, 10_000):
        want = score_rollouts(hf_model, records, budget, 0.7)
        assert score_rollouts(hf_model, back, budget, 0.7) == want
    # both forms within one micro-batch
    mixed = [back[0], records[1], back[3]]
    want = score_rollouts(hf_model, [records[0], records[1], records[3]], 10_000)
    assert score_rollouts(hf_model, mixed, 10_000) == want
    # array top-K out of the vocabulary, or wider than its logprobs, is named
    shape = back[0].topk_ids.shape
    outside = dataclasses.replace(back[0], topk_ids=np.full(shape, VOCAB, np.int32))
    with pytest.raises(RLInputError, match=r"top-K ids must lie in \[0, 384\)"):
        score_rollouts(hf_model, [outside], 64)
    wider = dataclasses.replace(back[0], topk_ids=np.zeros((shape[0], 6), np.int32))
    with pytest.raises(RLInputError, match=r"differ in length across tokens \(\[5, 6\]\)"):
        score_rollouts(hf_model, [wider], 64)


def test_micro_batches_keep_the_budget():
    records = random_records(20, seed=1)
    for budget in (1, 15, 40, 200):
        batches = micro_batches(records, budget)
        assert sorted(i for b in batches for i in b) == list(range(20))
        for b in batches:
            padded = len(b) * max(records[i].total_length for i in b)
            assert len(b) == 1 or padded <= budget
        lengths = [records[i].total_length for b in batches for i in b]
        assert lengths == sorted(lengths)
    # the packing ignores the order records come in
    shuffled = list(reversed(records))
    as_keys = lambda rs, bs: [[(rs[i].prompt_index, rs[i].sample_index) for i in b] for b in bs]
    assert as_keys(shuffled, micro_batches(shuffled, 40)) == as_keys(
        records, micro_batches(records, 40)
    )
    with pytest.raises(RLInputError, match="micro_batch_tokens"):
        micro_batches(records, 0)


def test_bad_top_k_is_named(hf_model):
    ragged = record(0, 0, [1], [2, 3], topk_ids=[[2, 3], [3]], topk_logprobs=[[-1, -2], [-1]])
    with pytest.raises(RLInputError, match=r"rollout \(0, 0\): top-K lists differ"):
        score_rollouts(hf_model, [ragged], 64)
    outside = record(0, 1, [1], [2], topk_ids=[[VOCAB]], topk_logprobs=[[-1.0]])
    with pytest.raises(RLInputError, match=r"top-K ids must lie in \[0, 384\)"):
        score_rollouts(hf_model, [outside], 64)


def test_every_family_scores_like_its_plain_forward(any_checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        any_checkpoint, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    records = random_records(4, seed=11)
    scores = score_rollouts(model, records, micro_batch_tokens=40)
    for rec, got in zip(records, scores):
        full = plain_logprobs(model, rec, 1.0)
        want = full.gather(-1, torch.tensor(rec.output_ids)[:, None])[:, 0]
        np.testing.assert_allclose(got.dense_logprobs, want.numpy(), atol=2e-5, rtol=0)
