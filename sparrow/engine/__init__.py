"""The rollout engine: paged KV cache with page centroids, continuous batching, dense or
block-sparse decode, and the teacher-forced form of the same selection.

    from sparrow.engine import Engine, EngineConfig, SamplingParams
    engine = Engine(model, tokenizer, EngineConfig(max_batch_size=64), schedule)
    results = engine.generate(prompt_ids, SamplingParams(max_new_tokens=1024, n=8))

docs/engine.md walks through the parts; tests live in tests/engine/.
"""

from sparrow.engine.config import EngineConfig, EngineError
from sparrow.engine.engine import Engine
from sparrow.engine.sampler import SampleOutput, SamplingParams, sample
from sparrow.engine.sequence import SampleResult, SelectionRecord
from sparrow.engine.teacher.forced import teacher_forced_hidden, teacher_forced_logits

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineError",
    "SampleOutput",
    "SampleResult",
    "SamplingParams",
    "SelectionRecord",
    "sample",
    "teacher_forced_hidden",
    "teacher_forced_logits",
]
