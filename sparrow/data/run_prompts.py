"""A run's prompt datasets as its configuration names them, chat template included.

    from sparrow.data.run_prompts import configured_prompts
    train = configured_prompts(cfg.data.train, cfg.data, model_path, tokenizer, split="train")

Training, evaluation and calibration all read their rows through this one function, so a
chat-message prompt reaches the model rendered by the same template (data.chat_template,
data.enable_thinking) wherever it is used: calibrating on prompts the policy never sees in
training would measure the wrong distribution.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sparrow.data.chat import chat_renderer
from sparrow.data.datasets import PromptDataset, TextEncoder, load_prompts

if TYPE_CHECKING:
    from sparrow.config.schema import DataConfig


def configured_prompts(
    spec: str,
    data: DataConfig,
    model_path: str | Path,
    tokenizer: TextEncoder,
    split: str = "train",
    seed: int = 0,
    max_context: int | None = None,
) -> PromptDataset:
    """The dataset `spec` names, read with data's keys and limits and rendered with its chat
    template for the model at model_path (sparrow/data/datasets.py, sparrow/data/chat.py)."""
    return load_prompts(
        spec,
        data.prompt_key,
        data.answer_key,
        tokenizer,
        data.max_prompt_tokens,
        split=split,
        seed=seed,
        max_context=max_context,
        chat=chat_renderer(model_path, data.chat_template, data.enable_thinking),
    )
