"""Calibration reads its prompts as training does: chat-message rows rendered by the run's
chat template (data.chat_template, data.enable_thinking), the same token ids the train flow's
rollouts would see.

python -m pytest tests/stages/test_calibrate_prompts.py -q
"""

from __future__ import annotations

import json

import pytest

from sparrow.config import load_config
from sparrow.data.datasets import DatasetError
from sparrow.flows.train_setup import check_inputs
from sparrow.model.builtin import resolve_model_path
from sparrow.stages.calibrate import calibration_requests

QUESTIONS = ("def ab=cd cd=ef\nfrom ab hops 2\n", "def xy=zq\nfrom xy hops 1\n")


@pytest.fixture
def chat_file(tmp_path):
    """A community-layout JSONL: chat-message prompts, reward_model.ground_truth."""
    path = tmp_path / "chat.jsonl"
    rows = [
        {
            "data_source": "chase",
            "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": "ef"},
        }
        for question in QUESTIONS
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_calibration_prompts_are_the_training_prompts_rendered_by_the_chat_template(chat_file):
    cfg = load_config(
        [
            f"data.train={chat_file}",
            "data.chat_template=builtin:plain",
            "data.enable_thinking=false",
            "calibrate.num_prompts=2",
        ]
    )
    inputs = check_inputs(cfg)
    tokenizer = inputs["tokenizer"]
    prompts, params = calibration_requests(
        cfg, tokenizer, inputs["max_context"], resolve_model_path(cfg.model.path)
    )
    trained = [list(inputs["train_data"].row(i).prompt_ids) for i in range(2)]
    assert prompts == trained
    assert tokenizer.decode(prompts[1]) == f"user: {QUESTIONS[1]}\nassistant:\nthink: none\n"
    assert [p.n for p in params] == [cfg.calibrate.repeats] * 2


def test_without_a_template_chat_prompts_are_refused_as_in_training(chat_file):
    cfg = load_config([f"data.train={chat_file}", "data.chat_template=none"])
    inputs = check_inputs(load_config([]))
    with pytest.raises(DatasetError, match="row 0: .*no chat template"):
        calibration_requests(
            cfg, inputs["tokenizer"], inputs["max_context"], resolve_model_path(cfg.model.path)
        )
