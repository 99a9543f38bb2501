"""Both rollout engines are RolloutEngines (sparrow/engine/protocol.py): the native Engine
built and checked live, vLLM's class checked by its names and signatures (its module imports
without the vllm package), and the backends are found by name."""

from __future__ import annotations

import sys

import pytest

from sparrow.engine import Engine, EngineConfig
from sparrow.engine.protocol import ROLLOUT_ENGINES, RolloutEngine, engine_class
from tests.protocol_check import mismatches

CAPABILITIES = ("takes_feed", "keeps_graphs", "needs_cuda")


def test_the_native_engine_is_a_rollout_engine(qwen3_checkpoint):
    from sparrow.model import load_tokenizer

    assert mismatches(Engine, RolloutEngine, CAPABILITIES) == []
    engine = Engine.from_checkpoint(
        str(qwen3_checkpoint),
        EngineConfig(page_size=8, num_pages=16),
        load_tokenizer(qwen3_checkpoint),
        None,
        "float32",
        "cpu",
    )
    assert isinstance(engine, RolloutEngine)
    assert (engine.takes_feed, engine.keeps_graphs, engine.needs_cuda) == (True, True, False)


def test_the_vllm_engine_class_is_a_rollout_engine_without_vllm():
    had_vllm = "vllm" in sys.modules
    cls = engine_class("vllm")
    assert cls.__name__ == "VllmEngine"
    assert ("vllm" in sys.modules) == had_vllm  # the class's module imports no vllm
    assert mismatches(cls, RolloutEngine, CAPABILITIES) == []
    assert (cls.takes_feed, cls.keeps_graphs, cls.needs_cuda) == (False, False, True)


def test_backends_are_found_by_name():
    assert ROLLOUT_ENGINES.names() == ["native", "vllm"]
    assert engine_class("native") is Engine
    with pytest.raises(KeyError, match="unknown rollout backend 'sglang'; valid: native, vllm"):
        engine_class("sglang")


def test_the_check_catches_a_class_that_falls_short():
    class Short:
        takes_feed = "yes"

        def generate(self, prompts):
            return []

    bad = mismatches(Short, RolloutEngine, CAPABILITIES)
    assert "Short.takes_feed is not a bool on the class" in bad
    assert "Short lacks from_checkpoint" in bad
    assert any(line.startswith("Short.generate takes ['prompts']") for line in bad)
