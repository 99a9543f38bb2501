"""The decode-step benchmark's probes (`benchmarks/decode_step.py --compile-probe` and
`--profile`): what a step costs outside attention, with and without torch.compile's fusion,
and where one step's GPU time goes, kernel by kernel.

    python3 benchmarks/decode_step.py --compile-probe --models qwen3-1.7b --batches 16
    python3 benchmarks/decode_step.py --profile --models qwen3-1.7b --batches 16,64
"""

from __future__ import annotations

from dataclasses import replace

import torch

from benchmarks.common import device_facts, time_graph, write_json
from benchmarks.decode_step import (
    StepBench,
    model_arch,
    model_bench,
    non_attention_step_us,
    random_model,
)
from sparrow.engine.cuda_graphs import DecodeGraphs
from sparrow.sparse.presets import get_preset
from sparrow.sparse.scoring import get_rule


def fused_non_attention_step_us(bench: StepBench, batch: int) -> float:
    """The non-attention step with the model's elementwise ops fused by torch.compile: what
    the per-layer norm / RoPE / residual kernels cost beyond the weights (a probe only)."""
    ids = torch.zeros(batch, dtype=torch.long, device=bench.device)
    positions = torch.full((batch,), 100, dtype=torch.long, device=bench.device)
    model = bench.model
    forward = torch.compile(lambda i, p: model.compute_logits(model(i, p, lambda l, q, k, v: q)))

    def step():
        with torch.inference_mode():
            return forward(ids, positions)

    return time_graph(step, reps=10, flush=False)


def kernel_category(name: str) -> str:
    """Which part of a step a CUDA kernel belongs to, from its name."""
    lowered = name.lower()
    if any(tag in lowered for tag in ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas")):
        return "gemm"
    if lowered.startswith("memcpy") or lowered.startswith("memset"):
        return "copies"
    for kernel in (
        "paged_decode",
        "combine",
        "page_scores",
        "page_topk",
        "kv_write",
        "rms_norm",
        "qk_norm_rope",
        "silu_mul",
        "race_draw",
    ):
        if kernel in lowered:
            return kernel
    return "other"


def profile_step(
    bench: StepBench, batch: int, context: int, schedule, params_bytes: int, steps: int = 3
) -> dict:
    """Where one step's GPU time goes: the same kernels launched eagerly under the profiler
    (each kernel's own time; the graph only removes host gaps), summed per category, beside
    the graph's step time; the difference is time the GPU spends between kernels."""
    from torch.profiler import ProfilerActivity, profile

    eager = DecodeGraphs(bench.model, bench.cache, use_graphs=False)
    args = bench.inputs(batch, context, schedule)
    on_gpu = bench.device == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    eager.decode(*args, schedule)
    sync()
    with profile(activities=[ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            eager.decode(*args, schedule)
        sync()
    per_category: dict[str, dict[str, float]] = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None)
        if total is None:
            total = event.cuda_time_total
        if not total:
            continue
        part = per_category.setdefault(kernel_category(event.key), dict(us=0.0, kernels=0))
        part["us"] += total / steps
        part["kernels"] += event.count / steps
    kernels_us = sum(part["us"] for name, part in per_category.items() if name != "copies")
    graph_us = bench.step_us(batch, context, schedule)
    gemm_us = per_category.get("gemm", {}).get("us", float("nan"))
    return dict(
        batch=batch,
        context=context,
        sparse=schedule is not None,
        selection=schedule.selection if schedule is not None else None,
        graph_step_us=graph_us,
        kernels_us=kernels_us,
        between_kernels_us=graph_us - kernels_us,
        gemm_weight_bytes_per_s=params_bytes / (gemm_us * 1e-6),
        per_category=per_category,
    )


def compile_probe(args, device, batches, copy) -> int:
    rows = []
    for name in args.models.split(","):
        model = random_model(model_arch(name, args.smoke), device)
        bench = StepBench(model, 64, device)
        params_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        for batch in batches:
            rows.append(
                dict(
                    model=name,
                    batch=batch,
                    params_bytes=params_bytes,
                    non_attention_step_us=non_attention_step_us(bench, batch),
                    fused_non_attention_step_us=fused_non_attention_step_us(bench, batch),
                )
            )
            print(rows[-1], flush=True)
    write_json(
        args.out, dict(benchmark="decode_step-compile-probe", facts=device_facts(), rows=rows)
    )
    return 0


def profile_steps(args, device, batches, copy) -> int:
    rows = []
    contexts = (256,) if args.smoke else (1024, 32768)
    for name in args.models.split(","):
        rules = tuple(filter(None, args.selection.split(",")))
        bounds = any(get_rule(rule).bounds for rule in rules)
        bench, params_bytes = model_bench(
            name, batches, contexts, device, args.smoke, bounds=bounds
        )
        schedule = get_preset(f"{name}-0.86") if not args.smoke else None
        # dense, the preset's sparse step, then the same schedule under each --selection rule
        scheds = [None, schedule]
        if schedule is not None:
            scheds += [replace(schedule, selection=rule) for rule in rules]
        for batch in batches:
            for context in contexts:
                for sched in scheds:
                    row = profile_step(bench, batch, context, sched, params_bytes)
                    row.update(model=name, params_bytes=params_bytes)
                    rows.append(row)
                    print(
                        {
                            k: (round(v, 1) if isinstance(v, float) else v)
                            for k, v in row.items()
                            if k != "per_category"
                        },
                        flush=True,
                    )
        bench.graphs.clear()
    write_json(
        args.out,
        dict(benchmark="decode_step-profile", facts=device_facts(), copy_bandwidth=copy, rows=rows),
    )
    return 0
