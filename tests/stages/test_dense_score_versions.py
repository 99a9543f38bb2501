"""dense_score's second look at stale samples: each is scored against the dense policy of the
version that generated it (its policy folder; with a trainer group, on its rank 0), held to a
plain per-token loop; fresh samples keep the step's scores; a version newer than the scoring
policy is refused.

Run: `python -m pytest tests/stages/test_dense_score_versions.py -q`.
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sparrow.config.schema import TrainerConfig
from sparrow.data.rollouts import RolloutRecord
from sparrow.stages.dense_score import scores_of_versions
from sparrow.trainer.scoring import TokenScores
from sparrow.trainer.version_scores import VersionError, stale_versions

VOCAB = 384


def _record(i: int, version: int | None, rng: random.Random, k: int = 4) -> RolloutRecord:
    prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(2, 6)))
    output = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 7)))
    top = np.random.default_rng(i).dirichlet(np.ones(k + 1), size=len(output))[:, :k]
    return RolloutRecord(
        prompt_index=i // 2,
        sample_index=i % 2,
        dataset_row=i,
        prompt_ids=prompt,
        output_ids=output,
        actor_logprobs=tuple(float(np.log(t[0])) for t in top),
        topk_ids=tuple(tuple(rng.sample(range(VOCAB), k)) for _ in output),
        topk_logprobs=tuple(tuple(np.log(t).tolist()) for t in top),
        pages_read=(1,) * len(output),
        finish_reason="stop",
        answer="0",
        policy_version=version,
    )


def _plain(folder, record: RolloutRecord) -> tuple[list[float], list[float]]:
    """(dense logprob of each sampled token, sum over the top-K of min(p, q)) token by token,
    from one unpadded forward of the checkpoint in `folder`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = torch.tensor([record.prompt_ids + record.output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    start = len(record.prompt_ids) - 1
    dense, accept = [], []
    for t, token in enumerate(record.output_ids):
        p = torch.softmax(logits[start + t], dim=-1)
        dense.append(float(torch.log(p[token])))
        total = 0.0
        for idx, q in zip(record.topk_ids[t], record.topk_logprobs[t]):
            total += min(float(p[idx]), float(np.exp(q)))
        accept.append(total)
    return dense, accept


def test_stale_versions_group_older_samples_and_refuse_newer_ones():
    rng = random.Random(0)
    records = [_record(i, v, rng) for i, v in enumerate([2, 0, None, 1, 0])]
    assert stale_versions(records, current_version=2) == {0: [1, 4], 1: [3]}
    with pytest.raises(VersionError, match=r"sample \(0, 0\).*version 2, newer.*policy.s 1"):
        stale_versions(records, current_version=1)


def test_stale_samples_are_scored_against_their_own_version(qwen3_checkpoint, tiny_checkpoint):
    older = tiny_checkpoint("version-1", "qwen3", seed=7)  # same shape, other weights
    rng = random.Random(1)
    # step 3: the step's dense policy is version 2; versions 0 and 1 are stale
    records = [_record(i, v, rng) for i, v in enumerate([2, 1, 0, 2, 1, 0])]
    folders = {1: qwen3_checkpoint, 2: older}  # policy_folder_before(version + 1)
    runtime = SimpleNamespace(
        policy_folder_before=lambda step: folders[step],
        cfg=SimpleNamespace(trainer=TrainerConfig(micro_batch_tokens=64)),
    )
    trainer = SimpleNamespace(device="cpu", dtype=torch.float32, temperature=1.0, sharded=False)
    step_scores = [
        TokenScores(
            (-9.0,) * len(r.output_ids), (0.125,) * len(r.output_ids), (0.0,) * len(r.output_ids)
        )
        for r in records
    ]
    version_scores, stale = scores_of_versions(runtime, trainer, 3, records, step_scores)
    assert stale == 4
    for record, step_score, got in zip(records, step_scores, version_scores):
        if record.policy_version == 2:  # fresh: the step's own scores
            assert got is step_score
            continue
        dense, accept = _plain(folders[record.policy_version + 1], record)
        assert got.dense_logprobs == pytest.approx(dense, abs=1e-4)
        assert got.acceptance == pytest.approx(accept, abs=1e-4)
    # the two versions' policies differ, so the same sample is scored differently under each
    again = dataclasses.replace(records[1], policy_version=0)
    moved, _ = scores_of_versions(runtime, trainer, 3, [again], step_scores[1:2])
    assert moved[0].dense_logprobs != pytest.approx(version_scores[1].dense_logprobs, abs=1e-3)


def test_a_trainer_group_scores_stale_samples_on_its_rank_0(qwen3_checkpoint):
    from sparrow.runtime.trainer_group.rank import TrainerRank

    rank = TrainerRank(rank=0, world_size=2)  # its trainer: what score_checkpoint reads of it
    rank.trainer = SimpleNamespace(
        device=torch.device("cpu"),
        compute_dtype=torch.float32,
        temperature=1.0,
        trainer_config=TrainerConfig(micro_batch_tokens=64),
    )
    asked = []

    def on_rank_0(folder, samples):  # TrainerGroup.score_checkpoint, without Ray
        asked.append((str(folder), [(r.prompt_index, r.sample_index) for r in samples]))
        return rank.score_checkpoint(str(folder), samples)

    group = SimpleNamespace(device="cpu", sharded=True, score_checkpoint=on_rank_0)
    runtime = SimpleNamespace(
        policy_folder_before=lambda step: {1: qwen3_checkpoint}[step],
        cfg=SimpleNamespace(trainer=TrainerConfig(micro_batch_tokens=64)),
    )
    rng = random.Random(2)
    records = [_record(i, v, rng) for i, v in enumerate([1, 0, 1, 0])]
    step_scores = [TokenScores((-9.0,), (0.125,), (0.0,)) for _ in records]
    version_scores, stale = scores_of_versions(runtime, group, 2, records, step_scores)
    assert stale == 2 and asked == [(str(qwen3_checkpoint), [(0, 1), (1, 1)])]
    for i in (1, 3):
        dense, accept = _plain(qwen3_checkpoint, records[i])
        assert version_scores[i].dense_logprobs == pytest.approx(dense, abs=1e-4)
        assert version_scores[i].acceptance == pytest.approx(accept, abs=1e-4)
    assert version_scores[0] is step_scores[0] and version_scores[2] is step_scores[2]
