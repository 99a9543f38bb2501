"""The reward stage's scoring: rewards routed by data_source plus the overlong shaping.

python -m pytest tests/stages/test_reward_shaping.py -q
"""

from __future__ import annotations

import dataclasses

import pytest

from sparrow.config import SparrowConfig
from sparrow.data.rollouts import RolloutRecord
from sparrow.data.step_rewards import score_records


def record(text: str, tokens: int, source: str = "") -> RolloutRecord:
    return RolloutRecord(
        prompt_index=0,
        sample_index=0,
        dataset_row=0,
        prompt_ids=(1,),
        output_ids=tuple(range(tokens)),
        actor_logprobs=(0.0,) * tokens,
        topk_ids=((0,),) * tokens,
        topk_logprobs=((0.0,),) * tokens,
        pages_read=(1,) * tokens,
        finish_reason="stop",
        answer="4",
        text=text,
        data_source=source,
    )


def test_routed_rewards_with_the_overlong_shaping():
    cfg = SparrowConfig()
    cfg = dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(cfg.rollout, max_new_tokens=16),
        algo=dataclasses.replace(cfg.algo, overlong_buffer=4, overlong_penalty=1.0),
        data=dataclasses.replace(cfg.data, reward_by_source={"aime": "math"}),
    )
    records = [record(r"\boxed{4}", 8, "aime"), record("4", 14), record("5", 16)]
    batch, shaped = score_records(cfg, records)
    assert batch.rewards == [1.0, 1.0, 0.0]
    assert shaped == pytest.approx([1.0, 0.5, -1.0])
