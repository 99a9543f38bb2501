"""One rollout engine as the body of a Ray actor: what it is built from and what it answers.

    spec = WorkerSpec(model_path, weights_path, schedule, EngineConfig(), device="cuda")
    worker = RolloutWorker(spec)      # in a Ray actor (sparrow/runtime/rollout/actors.py) or in-process
    worker.generate(prompt_ids, params); worker.sleep(); worker.wake(); worker.rollout_stats()

`WorkerSpec.backend` picks the engine (`rollout.backend`): native (sparrow/engine) or vllm
(sparrow/vllm: GPU only); both are a RolloutEngine (sparrow/engine/protocol.py), and what
differs between them is asked of the class's capabilities, never of the backend's name. The weight-sync methods come from
SyncedWorker (sparrow/runtime/rollout/actor_sync.py). `generate_from` takes requests from a PromptSource actor
while the engine runs (sparrow/runtime/rollout/dispatch.py). A native GPU engine's actor runs on
torch's expandable segments (engine_process_env) so its decode graphs survive the sleep.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparrow.engine.config import EngineConfig
from sparrow.engine.protocol import RolloutEngine, engine_class
from sparrow.runtime.rollout.actor_sync import SyncedWorker
from sparrow.sparse import Schedule


@dataclass(frozen=True)
class WorkerSpec:
    """Everything an actor needs to build its engine; plain values only (pickled to Ray)."""

    model_path: str  # architecture and tokenizer
    weights_path: str  # a checkpoint folder whose safetensors hold the current policy
    schedule: Schedule | None  # None decodes densely
    engine: EngineConfig
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 1
    adapter_path: str = ""  # a DistillSparse LoRA folder merged into the weights; "" none
    backend: str = "native"  # rollout.backend: a name of sparrow.engine.protocol.ROLLOUT_ENGINES

    @property
    def engine_class(self) -> type[RolloutEngine]:
        return engine_class(self.backend)


class SourceFeed:
    """The engine's feed over a PromptSource actor: one Ray call per request taken."""

    def __init__(self, source: Any, worker: int, rollout: int):
        self.source, self.worker, self.rollout = source, worker, rollout
        self.labels: list[int] = []

    def take(self):
        import ray

        request = ray.get(self.source.take.remote(self.worker, self.rollout))
        if request:
            self.labels.append(request[0])
        return request

    def full(self) -> None:
        # no wait: the source runs one caller's calls in order
        self.source.full.remote(self.worker, self.rollout)


class RolloutWorker(SyncedWorker):
    """One engine; the body of a Ray actor (plain class, so tests may run it in-process);
    its weight-sync methods come from SyncedWorker (sparrow/runtime/rollout/actor_sync.py)."""

    def __init__(self, spec: WorkerSpec):
        from sparrow.cuda_memory import freeze_actor_heap

        freeze_actor_heap()  # before the engine: the sleep's collection skips the imports
        self.engine = build_engine(spec)
        self.weights_path = spec.weights_path
        self.counts: dict[str, float] = {}  # rollout_stats()
        if spec.adapter_path:
            self.load_weights(spec.weights_path, spec.adapter_path)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: Sequence[Any], close: Any = None
    ) -> list[list[Any]]:
        """`close`: an EarlyClose (sparrow/engine/close.py; the native engine's)."""
        extra = {} if close is None else {"close": close}
        return self._counted(lambda: self.engine.generate(prompts, list(params), **extra))

    def generate_from(self, source: Any, worker: int, rollout: int) -> list[tuple[int, list]]:
        """Requests pulled from a PromptSource actor (sparrow/runtime/rollout/dispatch.py) while the
        engine runs (the native engine's feed): (prompt index, samples) per request taken."""
        feed = SourceFeed(source, worker, rollout)
        results = self._counted(lambda: self.engine.generate([], [], feed=feed))
        return list(zip(feed.labels, results))

    def _counted(self, run) -> list[list[Any]]:
        """run() (one engine call), its time and counts added to rollout_stats()."""
        clock, (captured, kept) = time.perf_counter(), _graph_counts(self.engine)
        results = run()
        seconds = time.perf_counter() - clock
        captured_after, kept_after = _graph_counts(self.engine)
        counts = {
            "calls": 1,
            "seconds": seconds,
            "capture_s": captured_after - captured,
            "graphs_kept": kept_after - kept,
            "samples": sum(len(samples) for samples in results),
            "tokens": sum(len(s.output_ids) for samples in results for s in samples),
            **self.engine.stats,
        }
        for key, value in counts.items():
            self.counts[key] = self.counts.get(key, 0) + value
        return results

    def rollout_stats(self) -> dict[str, float]:
        """Sums over the generate() calls since the last rollout_stats(): calls, seconds
        inside the engine, capture_s (CUDA graph captures), graphs_kept (wakes that replayed
        the graphs kept through a sleep), samples, tokens, the engine's
        step counts (prefill_steps, decode_steps, ...), and wake_s; then starts again."""
        counts, self.counts = self.counts, {}
        return counts

    def load_weights(self, path: str, adapter_path: str = "") -> str:
        from sparrow.model.loader import SafetensorsCheckpoint
        from sparrow.trainer.lora import Adapter, merge_weights

        adapter = Adapter.read(adapter_path) if adapter_path else None
        self.engine.update_weights(merge_weights(SafetensorsCheckpoint(path), adapter))
        self.weights_path = path
        return path

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> int:
        """Allocate the KV cache again; returns its size in pages."""
        clock, (_, kept) = time.perf_counter(), _graph_counts(self.engine)
        self.engine.wake()
        for key, value in (
            ("wake_s", time.perf_counter() - clock),
            ("graphs_kept", _graph_counts(self.engine)[1] - kept),
        ):
            self.counts[key] = self.counts.get(key, 0) + value
        return self.engine.cache.num_pages

    def memory(self) -> dict[str, float]:
        import torch

        if not torch.cuda.is_available():
            return {}
        return {
            "allocated_gib": torch.cuda.memory_allocated() / 2**30,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "reserved_gib": torch.cuda.memory_reserved() / 2**30,
        }

    def set_schedule(self, schedule: Schedule | None) -> None:
        self.engine.set_schedule(schedule)

    def info(self) -> dict[str, Any]:
        from sparrow.runtime.ray_results import node_id

        return {
            "pid": os.getpid(),
            "node_id": node_id(),
            "weights_path": self.weights_path,
            "schedule": None if self.engine.schedule is None else self.engine.schedule.name,
        }


def _graph_counts(engine: RolloutEngine) -> tuple[float, int]:
    """The engine's decode graphs' seconds spent capturing and wakes that kept them (zeros
    without graphs); the graphs may outlive a sleep, so a call's share is the difference."""
    graphs = engine.graphs
    return (graphs.capture_seconds, graphs.kept_wakes) if graphs is not None else (0.0, 0)


def build_engine(spec: WorkerSpec) -> RolloutEngine:
    """The spec's engine: the class rollout.backend names, from the spec's checkpoint."""
    import torch

    from sparrow.model import load_tokenizer

    if spec.device == "cpu":
        torch.set_num_threads(cpu_threads(spec.threads))
    return spec.engine_class.from_checkpoint(
        spec.weights_path,
        spec.engine,
        load_tokenizer(spec.model_path),
        spec.schedule,
        spec.dtype,
        spec.device,
    )


def engine_process_env(spec: WorkerSpec) -> dict[str, str]:
    """Environment of a native GPU engine's actor: torch's expandable segments, so the KV
    cache freed at sleep is mapped again at the same addresses at wake and the decode graphs
    kept through the sleep replay (rollout.keep_graphs; with the default allocator the
    driver may place it elsewhere). A PYTORCH_CUDA_ALLOC_CONF of the user's is left alone."""
    keeps = spec.engine_class.keeps_graphs and spec.device != "cpu" and spec.engine.keep_graphs
    if not keeps or "PYTORCH_CUDA_ALLOC_CONF" in os.environ:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def cpu_threads(cpus: int) -> int:
    """Torch threads of a CPU engine: its actor's CPUs, at most OMP_NUM_THREADS when that is
    set (the usual cap on a shared machine, which set_num_threads would otherwise override;
    Ray sets it to the actor's CPUs when the environment does not)."""
    cap = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(cpus, int(cap)) if cap.isdigit() and int(cap) > 0 else cpus)
