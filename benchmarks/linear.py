"""Decode-shaped projections: our skinny linear kernel against cuBLAS (F.linear), one process.

    python3 benchmarks/linear.py --out linear.json                 # on a GPU
    python3 benchmarks/linear.py --smoke                           # tiny shapes, any device

For each projection of the Qwen3-1.7B and Qwen3-4B shapes (fused q/k/v, o, fused gate/up,
down, lm_head) at 16 and 64 rows: cuBLAS, our default launch, and a sweep of launches
(column tile, K tile, K splits, stages, tile orientation). Each call reads a different copy
of the weight (copies cycled within one CUDA graph until at least 256 MiB are read), so
every figure is a cold read of W, as in a decode step, with the launch gaps between
kernels included. Also the whole chain of a model's projections (every layer, distinct
weights): cuBLAS with the SwiGLU gate as its own kernel, against our default launches with
the gate read in by the down projection (and with programmatic dependent launch); and, at
up to 16 rows, that chain with each layer's two RMSNorms and residual adds, in their own
kernels or folded into the projections (`with_norms`). Bytes/s count the weights read; the copy
bandwidth of the same run is the baseline. Figures whose name does not end in `_pdl` are
taken without programmatic dependent launch, whatever the kernel options say (it is on by
default: EngineConfig.programmatic_launch); benchmarks/probes/linear_pdl.py compares its forms.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import copy_bandwidth, device_facts, time_graph, write_json  # noqa: E402
from sparrow.costmodel.presets import get_model  # noqa: E402
from sparrow.kernels.linear import MAX_ROWS, LinearLaunch, RowNorm, default_launch, skinny_linear
from sparrow.kernels.rms_norm import rms_norm  # noqa: E402
from sparrow.kernels.runtime import multiprocessors, programmatic_launch  # noqa: E402
from sparrow.kernels.silu_mul import silu_mul  # noqa: E402

READ_PER_TIMING = 256 << 20


def projections(model: str) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of each weight a decode step reads, per layer and once (lm_head)."""
    shape = get_model(model)
    q, kv = shape.q_heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return {
        "qkv": (q + 2 * kv, shape.hidden),
        "o": (shape.hidden, q),
        "gate_up": (2 * shape.intermediate, shape.hidden),
        "down": (shape.hidden, shape.intermediate),
        "lm_head": (shape.vocab, shape.hidden),
    }


def sweep_launches(n_out: int, k_len: int, sms: int, smoke: bool) -> list[LinearLaunch]:
    if smoke:
        return [LinearLaunch(block_n=16, block_k=64, split=2)]
    launches = []
    for block_n, block_k, split, stages, w_major in itertools.product(
        (16, 32, 64, 128), (128, 256), (1, 2, 4, 8), (4,), (True, False)
    ):
        programs = -(-n_out // block_n) * split
        smem = (block_n + 64) * block_k * 2 * stages
        if k_len % (block_k * split) or smem > 200 * 1024 or not 0.7 * sms <= programs <= 24 * sms:
            continue
        launches.append(LinearLaunch(block_n, block_k, split, 4, stages, w_major))
    return launches


def time_cold(fn_of_weight, weights) -> float:
    """Microseconds per call, each call reading the next copy of the weight."""
    return time_graph(lambda: [fn_of_weight(w) for w in weights], reps=20) / len(weights)


def bench_shape(rows, n_out, k_len, sms, smoke, device):
    dtype = torch.bfloat16
    bytes_w = n_out * k_len * 2
    copies = max(2, -(-READ_PER_TIMING // bytes_w))
    weights = [torch.randn(n_out, k_len, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
    x = torch.randn(rows, k_len, device=device, dtype=dtype)
    want = F.linear(x.float(), weights[0].float())
    row = {"rows": rows, "n": n_out, "k": k_len, "weight_bytes": bytes_w}
    row["cublas_us"] = time_cold(lambda w: F.linear(x, w), weights)
    default = default_launch(rows, n_out, k_len, sms)
    row["default_launch"] = vars(default)
    row["default_us"] = time_cold(lambda w: skinny_linear(x, w, launch=default), weights)
    with programmatic_launch("linear"):
        row["default_pdl_us"] = time_cold(lambda w: skinny_linear(x, w, launch=default), weights)
    row["default_max_abs_err"] = (
        (skinny_linear(x, weights[0], launch=default).float() - want).abs().max().item()
    )
    row["cublas_max_abs_err"] = (F.linear(x, weights[0]).float() - want).abs().max().item()
    sweep = []
    for launch in sweep_launches(n_out, k_len, sms, smoke):
        try:
            err = (skinny_linear(x, weights[0], launch=launch).float() - want).abs().max().item()
        except Exception as error:  # a launch Triton refuses (shared memory): recorded
            sweep.append({"launch": vars(launch), "us": float("inf"), "error": str(error)[:200]})
            continue
        us = time_cold(lambda w: skinny_linear(x, w, launch=launch), weights)
        sweep.append({"launch": vars(launch), "us": us, "max_abs_err": err})
    sweep.sort(key=lambda r: r["us"])
    row["sweep_best"] = sweep[:6]
    row["sweep_count"] = len(sweep)
    for name in ("cublas", "default"):
        row[f"{name}_bytes_per_s"] = bytes_w / (row[f"{name}_us"] * 1e-6)
    if sweep:
        row["best_bytes_per_s"] = bytes_w / (sweep[0]["us"] * 1e-6)
    del weights
    return row


LAYER_PROJECTIONS = ("qkv", "o", "gate_up", "down")


def chain_weights(proj: dict[str, tuple[int, int]], layers: int, device) -> list[list]:
    """Distinct random weights [N, K] for every layer's projections, in layer order."""
    return [
        [
            torch.randn(*proj[n], device=device, dtype=torch.bfloat16) * 0.02
            for n in LAYER_PROJECTIONS
        ]
        for _ in range(layers)
    ]


def chain(model: str, rows: int, device, layers: int | None = None) -> dict:
    """A model's projections in layer order, distinct weights: cuBLAS with the SwiGLU gate
    as its own kernel (kernels/silu_mul.py), against ours with the gate read in by down."""
    shape = get_model(model)
    layers = layers or shape.layers
    proj = projections(model)
    weights = chain_weights(proj, layers, device)
    inputs = {
        n: torch.randn(rows, proj[n][1], device=device, dtype=torch.bfloat16)
        for n in LAYER_PROJECTIONS
    }
    gate_up = torch.randn(rows, 2 * shape.intermediate, device=device, dtype=torch.bfloat16)

    def cublas():
        for w_qkv, w_o, w_gate_up, w_down in weights:
            F.linear(inputs["qkv"], w_qkv), F.linear(inputs["o"], w_o)
            F.linear(inputs["gate_up"], w_gate_up)
            F.linear(silu_mul(*gate_up.split(shape.intermediate, dim=-1)), w_down)

    def ours():
        for w_qkv, w_o, w_gate_up, w_down in weights:
            skinny_linear(inputs["qkv"], w_qkv), skinny_linear(inputs["o"], w_o)
            skinny_linear(inputs["gate_up"], w_gate_up)
            skinny_linear(gate_up, w_down, gated=True)

    result = {
        "model": model,
        "rows": rows,
        "layers": layers,
        "weight_bytes": sum(w.numel() * 2 for layer in weights for w in layer),
    }
    result["cublas_us"] = time_graph(cublas, reps=10)
    result["ours_us"] = time_graph(ours, reps=10)
    with programmatic_launch("linear"):  # each kernel asks the L2 for its weights early
        result["ours_pdl_us"] = time_graph(ours, reps=10)
    for name in ("cublas", "ours", "ours_pdl"):
        result[f"{name}_bytes_per_s"] = result["weight_bytes"] / (result[f"{name}_us"] * 1e-6)
    if rows <= MAX_ROWS:
        result["with_norms"] = norm_chains(weights, shape, rows, device)
    return result


def chain_tensors(weights, shape, rows, device) -> dict:
    """The activations a chain of layers reads (the same every layer: only the weights
    change), with the sums of squares a folded norm starts from."""
    t = dict(
        hidden=torch.randn(rows, shape.hidden, device=device, dtype=torch.bfloat16),
        attended=torch.randn(
            rows, shape.q_heads * shape.head_dim, device=device, dtype=torch.bfloat16
        ),
        gate_up=torch.randn(rows, 2 * shape.intermediate, device=device, dtype=torch.bfloat16),
        delta=torch.randn(rows, shape.hidden, device=device, dtype=torch.bfloat16),
        norm_weight=torch.ones(shape.hidden, device=device, dtype=torch.bfloat16),
    )
    t["sumsq"] = skinny_linear(t["attended"], weights[0][1], residual=t["hidden"])[1]
    return t


def layer_chain(weights, t, fold_norm: bool, fold_add: bool, launch_of=None):
    """A callable running every layer's projections with its two RMSNorms and residual
    adds, in their own kernels or folded into the projections; launch_of(x, w, reads_norm)
    picks each folded call's launch (default: default_launch). It returns the last
    residual sum."""

    def run():
        x, sq = t["hidden"], t["sumsq"]
        for w_qkv, w_o, w_gate_up, w_down in weights:
            for w_in, w_out, a, gated in (
                (w_qkv, w_o, t["attended"], False),
                (w_gate_up, w_down, t["gate_up"], True),
            ):
                if fold_norm:
                    skinny_linear(
                        x,
                        w_in,
                        launch=launch_of and launch_of(x, w_in, True),
                        norm=RowNorm(t["norm_weight"], 1e-6, sq),
                    )
                else:
                    normed = rms_norm(
                        x, t["norm_weight"], 1e-6, residual=None if fold_add else t["delta"]
                    )
                    skinny_linear(normed if fold_add else normed[0], w_in)
                if fold_add:
                    launch = launch_of and launch_of(a, w_out, False)
                    x, made = skinny_linear(a, w_out, launch=launch, gated=gated, residual=x)
                    sq = made if fold_norm else sq
                else:
                    skinny_linear(a, w_out, gated=gated)
        return x

    return run


def norm_chains(weights, shape, rows, device) -> dict:
    """The chain with a layer's two RMSNorms and residual adds, microseconds: in their own
    kernels (`separate`, the model's form with EngineConfig.fold_norms off), folded into the
    projections (`folded`: norm read in by q/k/v and gate/up, adds written by o and down),
    only the adds folded (`adds_folded`, norms in their kernels), only the norms folded
    (`norms_folded`, sums of squares precomputed), and folded with the norm-reading
    launches' tiles turned over (`folded_x_major`: x on the tensor core's M side), and folded
    with programmatic dependent launch (`folded_pdl`: each kernel asks the L2 for its first
    weight tile while the one before runs; benchmarks/probes/linear_pdl.py varies that)."""
    t = chain_tensors(weights, shape, rows, device)
    sms = multiprocessors(device)
    forms = {
        "separate": (False, False),
        "folded": (True, True),
        "adds_folded": (False, True),
        "norms_folded": (True, False),
    }
    timed = {
        name: time_graph(layer_chain(weights, t, *flags), reps=10) for name, flags in forms.items()
    }

    def x_major(x, w, reads_norm):
        launch = default_launch(x.shape[0], w.shape[0], w.shape[1], sms)
        return replace(launch, w_major=not reads_norm)

    timed["folded_x_major"] = time_graph(layer_chain(weights, t, True, True, x_major), reps=10)
    with programmatic_launch("linear"):
        timed["folded_pdl"] = time_graph(layer_chain(weights, t, True, True), reps=10)
    return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--models", default="qwen3-1.7b,qwen3-4b")
    parser.add_argument("--rows", default="16,64")
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sms = multiprocessors(device)
    result = {
        "benchmark": "linear",
        "facts": device_facts(),
        "copy_bandwidth": copy_bandwidth(),
        "shapes": [],
        "chains": [],
    }
    models = args.models.split(",")
    rows_list = [int(r) for r in args.rows.split(",")]
    with programmatic_launch(False):  # the `_pdl` figures turn it on for themselves
        run_cases(result, models, rows_list, sms, args, device)
    write_json(args.out, result, quiet=True)
    return 0


def run_cases(result, models, rows_list, sms, args, device) -> None:
    for model in models:
        for rows in rows_list:
            for name, (n_out, k_len) in projections(model).items():
                if args.smoke:
                    n_out, k_len = 64, 128
                row = bench_shape(rows, n_out, k_len, sms, args.smoke or args.no_sweep, device)
                row.update(model=model, projection=name)
                result["shapes"].append(row)
                best = row["sweep_best"][0]["us"] if row["sweep_best"] else float("nan")
                print(
                    f"{model} {name} M={rows} N={n_out} K={k_len}: cublas "
                    f"{row['cublas_us']:.1f} default {row['default_us']:.1f} pdl {row['default_pdl_us']:.1f} best {best:.1f} us"
                    f" {row['sweep_best'][0]['launch'] if row['sweep_best'] else ''}",
                    flush=True,
                )
            if not args.smoke:
                result["chains"].append(chain(model, rows, device))
                print(result["chains"][-1], flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
