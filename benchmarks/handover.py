"""The hand-over's collection with the imports' heap in sight and frozen, in one process: what
`return_cached_blocks` (the flow's hand-over to the rollout, an engine's sleep, a trainer
rank's update) costs with everything a `sparrow train` process imports, and inside
`frozen_heap` as the train flow now runs it.

    python benchmarks/handover.py --out handover.json          # 5 calls each way
    python benchmarks/handover.py --device cpu                  # the collection alone, no GPU

The process imports the train flow and what a run loads later (the Qwen3 model code, MLflow,
Ray, DuckDB), then, on CUDA, builds a small Qwen3-shaped model and one update's worth of
gradients and frees them, so the allocator holds cached blocks like a trainer after its update.
Per way: seconds per call (median over --calls), the objects the collector examined, and the
ratio in_sight / frozen. On CPU return_cached_blocks does nothing, so the collection it runs on
CUDA (gc.collect) is what is timed.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def import_a_run() -> int:
    """What a `sparrow train` process has imported by its first hand-over; the object count."""
    import duckdb  # noqa: F401
    import mlflow  # noqa: F401
    import ray  # noqa: F401
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401

    import sparrow.engine.engine  # noqa: F401
    import sparrow.flows.train  # noqa: F401
    import sparrow.trainer.policy_trainer  # noqa: F401

    return len(gc.get_objects())


def cached_blocks(device: str) -> None:
    """A small model's forward and backward on `device`, then everything dropped: the
    caching allocator keeps the blocks, as after a trainer's update."""
    import torch

    layers = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).to(device)
    layers(torch.randn(512, 2048, device=device)).square().mean().backward()
    del layers


def time_calls(device: str, calls: int) -> list[float]:
    import torch

    from sparrow.cuda_memory import return_cached_blocks

    # on CPU return_cached_blocks does nothing: its collection alone is timed
    handover = return_cached_blocks if device == "cuda" else gc.collect
    seconds = []
    for _ in range(calls):
        if device == "cuda":
            cached_blocks(device)
            torch.cuda.synchronize()
        clock = time.perf_counter()
        handover()
        seconds.append(time.perf_counter() - clock)
    return seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5, help="timed calls each way")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)
    import torch

    from benchmarks.common import device_facts, write_json
    from sparrow.cuda_memory import frozen_heap

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    objects = import_a_run()
    if device == "cuda":
        cached_blocks(device)  # CUDA's own start, not timed
    in_sight = time_calls(device, args.calls)
    frozen_before = gc.get_freeze_count()  # what a library may have frozen of its own
    with frozen_heap():
        frozen_objects = gc.get_freeze_count()
        frozen = time_calls(device, args.calls)
    result = {
        "benchmark": "handover",
        "device": device,
        "facts": device_facts(),
        "objects_after_imports": objects,
        "objects_frozen_before": frozen_before,
        "objects_frozen": frozen_objects,
        "calls": args.calls,
        "in_sight_s": statistics.median(in_sight),
        "frozen_s": statistics.median(frozen),
        "in_sight_calls_s": in_sight,
        "frozen_calls_s": frozen,
    }
    result["ratio"] = result["in_sight_s"] / max(result["frozen_s"], 1e-9)
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
