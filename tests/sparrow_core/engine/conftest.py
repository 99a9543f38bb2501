"""Fixtures for the engine tests: loaded tiny models and a one-thread torch.

The engine tests run many tiny ops; with torch's default intra-op threads on a busy 2-core
machine they slow down tenfold, so each engine test module asks for `single_thread`.
"""

from __future__ import annotations

import pytest
import torch

from sparrow_core.model import load_model, load_tokenizer


@pytest.fixture
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def qwen3_model(qwen3_checkpoint):
    return load_model(qwen3_checkpoint)


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_checkpoint):
    return load_tokenizer(qwen3_checkpoint)
