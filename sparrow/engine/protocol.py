"""The rollout engine's interface: what a rollout actor asks of an engine, whichever backend.

    cls = engine_class(cfg.rollout.backend)     # "native": Engine, "vllm": VllmEngine
    cls.takes_feed, cls.keeps_graphs             # capabilities, readable before one is built
    engine = cls.from_checkpoint(weights_path, config, tokenizer, schedule, dtype, device)
    isinstance(engine, RolloutEngine)            # the names are there (runtime_checkable)

A backend is one class registered in ROLLOUT_ENGINES under its `rollout.backend` name; the
runtime (sparrow/runtime/rollout/) builds it through from_checkpoint and asks its
capabilities instead of comparing backend names:
- takes_feed: generate(..., feed=source) pulls requests while it runs (the native engine's
  continuous batching), so a pool of several actors can hand prompts out by load;
- keeps_graphs: its decode CUDA graphs can outlive sleep() (rollout.keep_graphs), which needs
  torch's expandable segments in the actor's process;
- needs_cuda: it cannot run on CPU.
A new backend registers its class here and is checked by tests/engine/test_protocol.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sparrow.registry import Registry

if TYPE_CHECKING:
    from sparrow.engine.config import EngineConfig
    from sparrow.engine.sequence import SampleResult
    from sparrow.engine.validate import SamplingParams
    from sparrow.sparse import Schedule


@runtime_checkable
class RolloutEngine(Protocol):
    """A rollout engine (see the module doc)."""

    @property
    def takes_feed(self) -> bool:
        """generate() accepts feed=: requests taken while it runs."""
        ...

    @property
    def keeps_graphs(self) -> bool:
        """Its decode graphs can survive sleep() (with rollout.keep_graphs)."""
        ...

    @property
    def needs_cuda(self) -> bool:
        """It runs only on a CUDA device."""
        ...

    @property
    def schedule(self) -> Schedule | None:
        """The schedule decode uses now (None: dense)."""
        ...

    @property
    def cache(self) -> Any:
        """The KV cache while awake (its `num_pages`), None while asleep."""
        ...

    @property
    def stats(self) -> dict[str, float]:
        """Counts of the last generate() (steps, tokens, ...); may be empty."""
        ...

    @property
    def graphs(self) -> Any:
        """The decode graphs (capture_seconds, kept_wakes), None without any."""
        ...

    @classmethod
    def from_checkpoint(
        cls,
        weights_path: str,
        config: EngineConfig,
        tokenizer: Any,
        schedule: Schedule | None,
        dtype: str,
        device: str,
    ) -> RolloutEngine: ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        progress: bool = False,
    ) -> list[list[SampleResult]]: ...

    def set_schedule(self, schedule: Schedule | None) -> None: ...

    def update_weights(self, state_dict: Mapping[str, Any], strict: bool = True) -> None: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


# rollout.backend -> a function giving the class (imported on use: vLLM's imports no vllm
# until it starts, but a backend should cost nothing until it is asked for)
ROLLOUT_ENGINES: Registry[Any] = Registry("rollout backend")


@ROLLOUT_ENGINES.register("native")
def _native() -> type:
    from sparrow.engine.engine import Engine

    return Engine


@ROLLOUT_ENGINES.register("vllm")
def _vllm() -> type:
    from sparrow.vllm.engine import VllmEngine

    return VllmEngine


def engine_class(backend: str) -> type[RolloutEngine]:
    """The engine class of a rollout.backend name (KeyError naming the valid ones)."""
    return ROLLOUT_ENGINES.get(backend)()
