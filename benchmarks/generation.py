"""Benchmark (c): a real generation of 8K new tokens (dense, then the 0.86 preset) through
the engine, to check benchmark (b)'s step-time sum within 10%.

    python benchmarks/generation.py --out generation.json        # on a GPU
    python benchmarks/generation.py --smoke                      # tiny model, any device

Qwen3-1.7B shape with random weights (bf16), batch 16, distinct random 1K-token prompts,
ignore_eos, temperature 1. In the same process it first measures (b)'s graph-replayed step
times at the contexts the generation passes (1K..9K) and sums them over the 8K positions
(the prediction); then it times engine.generate wall to wall, dense and sparse with the
engine's default overlapped decode (host work of step t while the GPU runs step t+1), and
dense once more with overlap off. The difference per step is the engine's host work left
uncovered (scheduling, sampling, top-20 logprobs, Python bookkeeping) plus prefill; graph
capture is reported separately and subtracted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_facts, write_json  # noqa: E402
from benchmarks.decode_step import PAGE, StepBench, model_arch, random_model  # noqa: E402
from sparrow.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from sparrow.engine.kv_cache import bytes_per_page  # noqa: E402
from sparrow.sparse.presets import get_preset  # noqa: E402


def predicted_us(bench, batch, prompt, new, schedule, contexts):
    steps = [bench.step_us(batch, c, schedule) for c in contexts]
    positions = np.arange(prompt, prompt + new - 1) + 1  # the first token comes from prefill
    return float(np.interp(positions, contexts, steps).sum()), steps


def random_prompts(batch: int, prompt_len: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """The rollout workload's prompts: batch distinct prompts of uniform random token ids."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, prompt_len).tolist() for _ in range(batch)]


def timed_generate(engine, prompts, new):
    params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)
    before = engine.runner.graphs.capture_seconds if engine.runner.graphs else 0.0
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    capture = (engine.runner.graphs.capture_seconds if engine.runner.graphs else 0.0) - before
    lengths = [len(s.output_ids) for group in results for s in group]
    return dict(
        wall_s=wall,
        capture_s=capture,
        generated_per_sample=sorted(set(lengths)),
        tokens=sum(lengths),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--model", default="qwen3-1.7b")
    parser.add_argument(
        "--no-sync", action="store_true", help="skip the dense run with overlapped decode off"
    )
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, prompt, new = (2, 64, 96) if args.smoke else (16, 1024, 8192)
    contexts = tuple(np.linspace(prompt, prompt + new, 5).astype(int))
    arch = model_arch(args.model, args.smoke)
    model = random_model(arch, device)
    schedule = get_preset(f"{args.model}-0.86")
    pages = batch * -(-(prompt + new) // PAGE) + 64
    bench = StepBench(model, pages, device)
    pred_dense, dense_steps = predicted_us(bench, batch, prompt, new, None, contexts)
    pred_sparse, sparse_steps = predicted_us(bench, batch, prompt, new, schedule, contexts)
    del bench
    if device == "cuda":
        torch.cuda.empty_cache()
    mib = pages * bytes_per_page(arch, PAGE, torch.bfloat16) / 2**20
    engine = Engine(
        model,
        None,
        EngineConfig(
            max_batch_size=batch, kv_cache_mib=mib, ignore_eos=True, max_context=prompt + new + 16
        ),
    )
    prompts = random_prompts(batch, prompt, arch.vocab_size)
    engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=0))  # warm-up
    dense = timed_generate(engine, prompts, new)
    engine.set_schedule(schedule)
    sparse = timed_generate(engine, prompts, new)
    del engine  # its cache goes before the second engine's is made
    if device == "cuda":
        torch.cuda.empty_cache()
    synchronous = (
        Engine(
            model,
            None,
            EngineConfig(
                max_batch_size=batch,
                kv_cache_mib=mib,
                ignore_eos=True,
                max_context=prompt + new + 16,
                overlap=False,
            ),
        )
        if not args.no_sync
        else None
    )
    dense_sync = timed_generate(synchronous, prompts, new) if synchronous else None
    for run, pred in ((dense, pred_dense), (sparse, pred_sparse), (dense_sync, pred_dense)):
        if run is None:
            continue
        run["predicted_s"] = pred / 1e6
        run["measured_minus_capture_s"] = run["wall_s"] - run["capture_s"]
        run["measured_over_predicted"] = run["measured_minus_capture_s"] / run["predicted_s"]
        run["host_ms_per_step"] = (run["measured_minus_capture_s"] - run["predicted_s"]) / new * 1e3
    result = dict(
        benchmark="generation",
        facts=device_facts(),
        model=args.model,
        batch=batch,
        prompt_len=prompt,
        new_tokens=new,
        contexts=[int(c) for c in contexts],
        dense_step_us=dense_steps,
        sparse_step_us=sparse_steps,
        dense=dense,
        sparse=sparse,
        dense_without_overlap=dense_sync,
        speedup_measured=dense["measured_minus_capture_s"] / sparse["measured_minus_capture_s"],
        speedup_predicted=pred_dense / pred_sparse,
    )
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
