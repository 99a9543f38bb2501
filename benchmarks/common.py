"""Shared pieces of the GPU benchmarks: device facts, timing, copy bandwidth, JSON output.

    from benchmarks.common import device_facts, time_graph, copy_bandwidth, write_json
    us = time_graph(lambda: kernel(x))          # median microseconds of CUDA-graph replays

Timing follows the workplace method: warm up (compiles kernels), capture the region in a
CUDA graph (launch gaps out of the figure), then per repetition flush the L2, record CUDA
events around one replay, and report the median. The flush reads a 256 MiB buffer (a sum):
the L2 ends up full of clean lines, as after a decode layer's weight reads. A flush that
writes (zeroing the buffer, flush="write") leaves up to the whole L2 dirty, and the timed
kernel then pays for writing those lines back to memory: measured on an H200, that adds
several microseconds to a 100 us kernel (benchmarks/sparse_stage.py times both). Copy bandwidth is a
large device-to-device copy, bytes read plus bytes written over its median time.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_FLUSH: dict[str, torch.Tensor] = {}


def device_facts() -> dict[str, Any]:
    """GPU name and the software the figures were taken with."""
    facts: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        # the project's environment (SPARROW_CACHE_DIR...) and the kernel choices in force
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("SPARROW_")},
        "kernel_options": _options_record(),
    }
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            gpu=props.name,
            multiprocessors=props.multi_processor_count,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
    else:
        facts["gpu"] = None
    return facts


def _flush_l2(mode: str) -> None:
    buffer = _FLUSH.get("l2")
    if buffer is None:
        buffer = _FLUSH["l2"] = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    if mode == "write":
        buffer.zero_()
    else:
        buffer.sum()


def time_graph(
    fn: Callable[[], Any],
    reps: int = 30,
    warmup: int = 3,
    graph: bool = True,
    flush: bool | str = True,
) -> float:
    """Median microseconds of one call of fn (as a CUDA graph replay when graph=True).
    flush: True or "read" (the default L2 flush), "write", or False (a warm L2)."""
    mode = "read" if flush is True else flush
    if not torch.cuda.is_available():  # smoke runs on CPU: a wall clock
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    run = fn
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            fn()
        run = captured.replay
        run()
    times = []
    for _ in range(reps):
        if mode:
            _flush_l2(mode)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def copy_bandwidth(gib: float = 2.0) -> dict[str, float]:
    """Device-to-device copy: bytes read + written per second (and the read-only half)."""
    if not torch.cuda.is_available():
        return {"bytes": 0, "us": 0.0, "bytes_per_s": float("nan")}
    count = int(gib * 2**30) // 2
    src = torch.randn(count, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    us = time_graph(functools.partial(dst.copy_, src), reps=20, flush=False)
    moved = 2 * src.numel() * src.element_size()
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": moved, "us": us, "bytes_per_s": moved / (us * 1e-6)}


def _options_record() -> dict[str, Any]:
    from sparrow.kernels.runtime import current_options

    options = current_options()
    return {
        "programmatic_launch": sorted(options.programmatic_launch),
        "skinny_linear": options.skinny_linear,
        "fold_norms": options.fold_norms,
    }


def add_kernel_option_flags(parser) -> None:
    """--programmatic-launch, --no-skinny-linear, --no-fold-norms: EngineConfig's kernel
    choices, to compare a benchmark under another (kernel_options_from takes them back)."""
    parser.add_argument(
        "--programmatic-launch",
        default="all",
        choices=("all", "none", "linear", "attention"),
        help="kernel families launched with programmatic dependent launch",
    )
    parser.add_argument(
        "--no-skinny-linear", action="store_true", help="decode projections through cuBLAS"
    )
    parser.add_argument(
        "--no-fold-norms", action="store_true", help="norms and residual adds in the norm kernel"
    )


def kernel_options_from(args):
    """The KernelOptions the flags of add_kernel_option_flags name."""
    from sparrow.engine.config import EngineConfig

    return EngineConfig(
        programmatic_launch=args.programmatic_launch,
        skinny_linear=not args.no_skinny_linear,
        fold_norms=not args.no_fold_norms,
    ).kernel_options()


def target_case_args(
    description: str, argv=None, flags: tuple[tuple[str, str], ...] = ()
) -> tuple[Any, str, int, int]:
    """--out, --smoke and the benchmark's own on/off flags ((name, help) pairs) at the target
    case (Qwen3-1.7B heads, batch 16, 32K; smoke: batch 2, 256 tokens, any device):
    (args, device, batch, context)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=None, help="write the JSON here too")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (any device)")
    for flag, text in flags:
        parser.add_argument(flag, action="store_true", help=text)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, context = (2, 256) if args.smoke else (16, 32768)
    return args, device, batch, context


def add_rollout_shape_args(parser) -> None:
    """The CPU host-path benchmarks' shape (sample_transfer.py, score_host.py): samples x
    tokens with a top-K per token, repetitions, --smoke and --out."""
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--prompt", type=int, default=164)
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="2,048 tokens, one repetition")
    parser.add_argument("--out", default=None)


def write_json(path: str | None, payload: dict[str, Any], quiet: bool = False) -> None:
    """Print the JSON document and, when a path is given, write it there too."""
    text = json.dumps(payload, indent=1, default=float)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    if not quiet:
        print(text if not path else f"wrote {path}")


def fill_random_(tensor: torch.Tensor, seed: int, chunk: int = 1 << 26) -> torch.Tensor:
    """Random normal values in place, chunk by chunk (no full-size float32 temporary)."""
    gen = torch.Generator(device=tensor.device).manual_seed(seed)
    flat = tensor.view(-1)
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk]
        part.copy_(torch.randn(part.shape, generator=gen, device=tensor.device))
    return tensor
