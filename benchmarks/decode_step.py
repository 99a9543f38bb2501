"""Benchmark (b): whole-model decode steps (CUDA graphs, random weights in the Qwen3-1.7B and
Qwen3-4B shapes), dense vs each model's 0.86 preset, and the rollout-equivalent time of a
32K-token generation from a 1K prompt, with the cost model's prediction beside it.

    python benchmarks/decode_step.py --out decode_step.json      # on a GPU
    python benchmarks/decode_step.py --smoke                     # tiny model, any device
    python benchmarks/decode_step.py --centroids float8_e4m3fn   # 8-bit page centroids
    python benchmarks/decode_step.py --programmatic-launch none  # EngineConfig's kernel choices
    python benchmarks/decode_step.py --models qwen3-1.7b --batches 16 \
        --selection centroid,centroid_maxhead,quest                # page-scoring rules side by side

Per (model, batch 16 / 64, context): every sequence sits at that context; one step is one
CUDA-graph replay (embedding, all layers with the KV write, attention, logits), median of
CUDA events. Cache pages come from a pool of a fixed size (what fits the GPU) shuffled into
the page tables, so sequences alias physical pages at long contexts; the pool is hundreds of
times the L2, so every page read is still an HBM read. Memory bound of a step: weights plus
the KV (and centroid) bytes it reads, over the device-to-device copy bandwidth measured in
the same run. Rollout-equivalent: the sum of step times over positions 1K .. 33K, linear
between measured contexts. With --selection, the sparse steps are timed again under each
listed page-scoring rule (the preset's pages: equal pages read) and each row gets
`sparse_us_by_selection` and `over_centroid` (step time over centroid's, per context).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    add_kernel_option_flags,
    copy_bandwidth,
    device_facts,
    fill_random_,
    kernel_options_from,
    time_graph,
    write_json,
)
from sparrow.costmodel import get_hardware, get_model, schedule_cost  # noqa: E402
from sparrow.costmodel.presets import Hardware  # noqa: E402
from sparrow.engine.cuda_graphs import DecodeGraphs, batch_bucket, sparsity_key, width_bucket
from sparrow.engine.kv_cache import KVCache, bytes_per_page  # noqa: E402
from sparrow.kernels.runtime import kernel_options  # noqa: E402
from sparrow.model.config import ModelArch  # noqa: E402
from sparrow.model.decoder import Decoder  # noqa: E402
from sparrow.sparse.presets import get_preset  # noqa: E402
from sparrow.sparse.scoring import get_rule  # noqa: E402
from sparrow.sparse.selection import pages_read  # noqa: E402

PAGE = 16
PROMPT, GENERATED = 1024, 32768
CONTEXTS = (1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768, 33792)


def model_arch(name: str, smoke: bool = False) -> ModelArch:
    shape = get_model(name)
    if smoke:
        return ModelArch(
            "qwen3",
            512,
            64,
            3,
            4,
            2,
            16,
            128,
            qk_norm=True,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
        )
    return ModelArch(
        "qwen3",
        shape.vocab,
        shape.hidden,
        shape.layers,
        shape.q_heads,
        shape.kv_heads,
        shape.head_dim,
        shape.intermediate,
        rope_theta=1e6,
        tie_word_embeddings=shape.tied_embeddings,
        qk_norm=True,
        max_position_embeddings=40960,
    )


def random_model(arch: ModelArch, device: str, dtype=torch.bfloat16) -> Decoder:
    """A decoder of that shape with seeded random weights (std 0.02), built on the device,
    projections fused (model/decoder.py) as in the engine."""
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Decoder(arch)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.02)
    model.fuse_projections()  # as the engine runs it: one GEMM for q/k/v, one for gate/up
    return model.eval()


class StepBench:
    """One model and a shuffled page pool; times decode steps at given contexts."""

    def __init__(
        self,
        model: Decoder,
        pool_pages: int,
        device: str,
        centroid_dtype: torch.dtype = torch.bfloat16,
        bounds: bool = False,
    ):
        arch = model.arch
        self.model, self.arch, self.device = model, arch, device
        self.cache = KVCache.allocate(
            arch,
            pool_pages,
            PAGE,
            torch.bfloat16,
            device,
            centroid_dtype=centroid_dtype,
            bounds=bounds,
        )
        fill_random_(self.cache.k, 1)
        fill_random_(self.cache.v, 2)
        fill_random_(self.cache.centroids, 3)
        if bounds:
            fill_random_(self.cache.bounds, 4)
        self.graphs = DecodeGraphs(model, self.cache, use_graphs=device == "cuda")
        self.pool_pages = pool_pages

    def inputs(self, batch: int, context: int, schedule):
        width = -(-context // PAGE)
        # independent random pages: when the pool is smaller than the logical cache, rows
        # share physical pages at uncorrelated times (no L2 reuse between rows)
        if batch * width <= self.pool_pages:
            tables = np.random.default_rng(width).permutation(self.pool_pages)[: batch * width]
        else:
            tables = np.random.default_rng(width).integers(0, self.pool_pages, batch * width)
        tables = tables.reshape(batch, width).astype(np.int32)
        positions = np.full(batch, context - 1, dtype=np.int64)
        slots = tables[:, -1].astype(np.int64) * PAGE + (context - 1) % PAGE
        ids = np.random.default_rng(context).integers(0, self.arch.vocab_size, batch)
        topk = None
        if schedule is not None:
            topk = np.full(batch, schedule.topk_for_position(context - 1), dtype=np.int64)
        return ids, positions, slots, tables, topk

    def step_us(self, batch: int, context: int, schedule, reps: int = 10) -> float:
        args = self.inputs(batch, context, schedule)
        self.graphs.decode(*args, schedule)  # captures the graph, stages the inputs
        if self.device != "cuda":  # smoke runs: one eager step on a wall clock
            start = time.perf_counter()
            self.graphs.decode(*args, schedule)
            return (time.perf_counter() - start) * 1e6
        key = (
            batch_bucket(batch),
            width_bucket(-(-context // PAGE)),
            sparsity_key(schedule, self.arch.num_layers),
        )
        graph = self.graphs.graphs[key][0]
        graph.replay()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return float(np.median(times))


def step_bytes(
    arch: ModelArch, params_bytes: int, batch: int, context: int, schedule, centroid_bytes: int = 2
) -> int:
    """Fewest bytes one step must read: weights, then per layer the KV (and centroids, of
    centroid_bytes each value) read."""
    n_pages = -(-context // PAGE)
    kv_token = arch.num_kv_heads * arch.head_dim * 2 * 2  # K and V, bf16
    dense_layer = batch * context * kv_token
    total = params_bytes
    for layer in range(arch.num_layers):
        if schedule is None or not schedule.is_sparse_layer(layer):
            total += dense_layer
            continue
        read = int(
            pages_read(
                n_pages,
                schedule.topk_for_position(context - 1),
                schedule.reserved_bos,
                schedule.reserved_eos,
            )
        )
        centroids = batch * n_pages * arch.num_kv_heads * arch.head_dim * centroid_bytes
        total += batch * read * PAGE * kv_token + centroids
    return total


def rollout_us(contexts, step_us) -> float:
    """Sum of step times over positions PROMPT .. PROMPT + GENERATED - 1 (context = pos + 1)."""
    context = np.arange(PROMPT, PROMPT + GENERATED) + 1
    return float(np.interp(context, contexts, step_us).sum())


def pool_pages_for(
    arch: ModelArch,
    budget_bytes: float,
    largest: int,
    centroid_dtype: torch.dtype = torch.bfloat16,
    bounds: bool = False,
) -> int:
    per_page = bytes_per_page(arch, PAGE, torch.bfloat16, centroid_dtype, bounds)
    return max(1, min(int(budget_bytes // per_page), largest))


def non_attention_step_us(bench: StepBench, batch: int) -> float:
    """A decode step whose attention returns q untouched: weights and every other op of the
    model, no cache traffic (what the step costs outside attention)."""
    ids = torch.zeros(batch, dtype=torch.long, device=bench.device)
    positions = torch.full((batch,), 100, dtype=torch.long, device=bench.device)
    model = bench.model

    def step():
        with torch.inference_mode():
            return model.compute_logits(model(ids, positions, lambda layer, q, k, v: q))

    return time_graph(step, reps=10, flush=False)


def eager_step_us(bench: StepBench, batch: int, context: int, reps: int = 5) -> float:
    """The same step with the same kernels launched from Python layer by layer (no graph)."""
    eager = DecodeGraphs(bench.model, bench.cache, use_graphs=False)
    args = bench.inputs(batch, context, None)
    eager.decode(*args, None)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        eager.decode(*args, None)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return float(np.median(times))


def hardware_for(gpu: str | None):
    return get_hardware("h200" if gpu and "H200" in gpu else "h100")


def run_batch(bench, name, batch, contexts, bandwidth, params_bytes, gpu, selections=()):
    schedule = get_preset(f"{name}-0.86")
    arch = bench.arch
    dense = [bench.step_us(batch, c, None) for c in contexts]
    sparse = [bench.step_us(batch, c, schedule) for c in contexts]
    by_selection = {
        rule: [bench.step_us(batch, c, replace(schedule, selection=rule)) for c in contexts]
        for rule in selections
        if rule != "centroid"
    }
    width = bench.cache.centroids.element_size()
    bound = lambda c, s: step_bytes(arch, params_bytes, batch, c, s, width) / bandwidth * 1e6
    dense_bound = [bound(c, None) for c in contexts]
    sparse_bound = [bound(c, schedule) for c in contexts]
    grid = np.arange(PROMPT, PROMPT + GENERATED + 1, 256) + 1
    byte_ratio = sum(step_bytes(arch, params_bytes, batch, int(c), None) for c in grid) / sum(
        step_bytes(arch, params_bytes, batch, int(c), schedule, width) for c in grid
    )
    roll_dense, roll_sparse = rollout_us(contexts, dense), rollout_us(contexts, sparse)
    shape = get_model(name)
    common = dict(model=shape, prompt_len=PROMPT, gen_len=GENERATED, samples=batch)
    measured_hw = Hardware("measured", hardware_for(gpu).peak_flops, bandwidth)
    row = dict(
        model=name,
        batch=batch,
        contexts=list(contexts),
        dense_us=dense,
        sparse_us=sparse,
        dense_bound_us=dense_bound,
        sparse_bound_us=sparse_bound,
        dense_over_bound=[m / b for m, b in zip(dense, dense_bound)],
        sparse_over_bound=[m / b for m, b in zip(sparse, sparse_bound)],
        rollout_dense_s=roll_dense / 1e6,
        rollout_sparse_s=roll_sparse / 1e6,
        rollout_speedup=roll_dense / roll_sparse,
        byte_bound_speedup=byte_ratio,
        costmodel_speedup=schedule_cost(
            schedule, hardware=hardware_for(gpu), **common
        ).predicted_speedup,
        costmodel_speedup_measured_bandwidth=schedule_cost(
            schedule, hardware=measured_hw, **common
        ).predicted_speedup,
    )
    if by_selection:
        row["sparse_us_by_selection"] = {"centroid": sparse, **by_selection}
        row["over_centroid"] = {
            rule: [t / c for t, c in zip(times, sparse)] for rule, times in by_selection.items()
        }
    if bench.device == "cuda":
        row["eager_step_us_2k_dense"] = eager_step_us(bench, batch, 2048)
        row["non_attention_step_us"] = non_attention_step_us(bench, batch)
        row["weights_bound_us"] = params_bytes / bandwidth * 1e6
    return row


def model_bench(
    name, batches, contexts, device, smoke, centroid_dtype=torch.bfloat16, bounds=False
) -> tuple[StepBench, int]:
    """A random model of this shape with a page pool as large as the GPU allows (12 GiB
    kept free) up to the widest case; and its parameter bytes."""
    arch = model_arch(name, smoke)
    model = random_model(arch, device)
    params_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(batches) * -(-max(contexts) // PAGE)
    free = torch.cuda.mem_get_info()[0] - 12 * 2**30 if device == "cuda" else 2**30
    pool = pool_pages_for(arch, free, largest, centroid_dtype, bounds)
    return StepBench(model, pool, device, centroid_dtype, bounds), params_bytes


def run_model(name, batches, contexts, bandwidth, device, smoke, centroid_dtype, selections=()):
    bounds = any(get_rule(rule).bounds for rule in selections)
    bench, params_bytes = model_bench(
        name, batches, contexts, device, smoke, centroid_dtype, bounds
    )
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    rows = []
    for batch in batches:
        rows.append(
            run_batch(bench, name, batch, contexts, bandwidth, params_bytes, gpu, selections)
        )
        rows[-1].update(
            params_bytes=params_bytes,
            pool_pages=bench.cache.num_pages,
            capture_seconds=bench.graphs.capture_seconds,
        )
        print(
            f"{name} B={batch}: rollout speedup {rows[-1]['rollout_speedup']:.2f} "
            f"(bytes {rows[-1]['byte_bound_speedup']:.2f}, cost model "
            f"{rows[-1]['costmodel_speedup']:.2f}); dense/bound "
            f"{[round(x, 2) for x in rows[-1]['dense_over_bound']]}",
            flush=True,
        )
        bench.graphs.clear()
    del bench
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON here too")
    parser.add_argument("--smoke", action="store_true", help="tiny model (any device)")
    parser.add_argument("--models", default="qwen3-1.7b,qwen3-4b")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument(
        "--compile-probe",
        action="store_true",
        help="only the torch.compile probe of the non-attention step",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only the per-kernel breakdown of steps at 1K and 32K",
    )
    parser.add_argument(
        "--centroids",
        default="bfloat16",
        choices=("bfloat16", "float8_e4m3fn"),
        help="page centroid dtype of the cache (EngineConfig.centroid_dtype)",
    )
    parser.add_argument(
        "--selection",
        default="",
        help="comma-separated page-scoring rules whose sparse steps are timed beside the "
        "preset's (centroid), e.g. centroid_maxhead,quest",
    )
    add_kernel_option_flags(parser)
    args = parser.parse_args(argv)
    for rule in filter(None, args.selection.split(",")):
        get_rule(rule)  # an unknown name fails now, listing the valid ones
    # as the engine's runner does: every step launched and captured under these options
    with kernel_options(kernel_options_from(args)):
        return run(args)


def run(args) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    copy = copy_bandwidth()
    bandwidth = copy["bytes_per_s"] if device == "cuda" else 1e12
    contexts = (64, 128, 256) if args.smoke else CONTEXTS
    batches = [int(b) for b in args.batches.split(",")]
    if args.compile_probe or args.profile:
        from benchmarks.decode_step_probes import compile_probe, profile_steps

        probe = compile_probe if args.compile_probe else profile_steps
        return probe(args, device, batches, copy)
    rows = []
    for name in args.models.split(","):
        rows.extend(
            run_model(
                name,
                batches,
                contexts,
                bandwidth,
                device,
                args.smoke,
                getattr(torch, args.centroids),
                tuple(filter(None, args.selection.split(","))),
            )
        )
    write_json(
        args.out,
        dict(
            benchmark="decode_step",
            facts=device_facts(),
            copy_bandwidth=copy,
            centroids=args.centroids,
            selection=args.selection or "centroid",
            prompt_len=PROMPT,
            gen_len=GENERATED,
            rows=rows,
        ),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
