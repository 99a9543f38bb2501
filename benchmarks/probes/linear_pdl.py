"""Where programmatic dependent launch should let the next projection start: the model's
chain of projections (norms and residual adds folded in) with and without PDL, by trigger
point, prefetch depth and programs per SM.

    python3 benchmarks/probes/linear_pdl.py --out linear_pdl.json   # on a GPU
    python3 benchmarks/probes/linear_pdl.py --smoke                 # tiny layers, any device

A probe, kept to retune the projections' launch on another GPU or after a kernel change
(it chose the defaults of LinearLaunch.prefetch_k and late_trigger). Under PDL each
projection asks the L2 for its weights before it waits for x; with the whole slice asked
for and the next kernel launched as soon as every program of the one before had started,
the chain was slower than without PDL (1827 against 1453 us on an H100). The variants:
- `early` / `late`: the next kernel launches as soon as this one's programs start, or once
  they have left their K loop;
- `all` / `tilesN`: each program asks for its whole slice of the weight, or for the first N
  K tiles of each row;
- `one_per_sm`: as many pipeline stages as shared memory takes, so that no SM holds two
  programs of a projection (a PDL launch could otherwise stack them on the SMs that free
  up first);
- `narrow`: twice the programs (half the column tile, or twice the K splits).
Every variant's output is compared with the plain chain's (bit for bit), and each figure is
the median of CUDA-graph replays of the whole chain (28 layers of Qwen3-1.7B, distinct
weights), against the plain chain measured in the same run.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import copy_bandwidth, device_facts, target_case_args, time_graph, write_json  # noqa: E402
from benchmarks.linear import chain_tensors, chain_weights, layer_chain, projections  # noqa: E402
from sparrow.costmodel.presets import get_model  # noqa: E402
from sparrow.kernels.linear import default_launch  # noqa: E402
from sparrow.kernels.runtime import multiprocessors, programmatic_launch  # noqa: E402


def deep(launch, x, w):
    """More pipeline stages, up to every K tile of a program's range: about 120-140 KiB of
    shared memory, so that an SM holds one program of the projection. A gated call (x =
    [gate | up]) loads two x tiles a stage."""
    rows_tile = 16 * (2 if x.shape[1] == 2 * w.shape[1] else 1)
    stage = (launch.block_n + rows_tile) * launch.block_k * 2
    tiles = w.shape[1] // launch.split // launch.block_k
    return replace(launch, num_stages=max(1, min(tiles, 1 + (120 << 10) // stage)))


def narrow(launch, x, w):
    """Twice the programs: half the column tile, or twice the K splits where the tile is
    already 16 wide (a program's K range must stay a multiple of its tile)."""
    if launch.block_n >= 32:
        return replace(launch, block_n=launch.block_n // 2)
    if w.shape[1] % (2 * launch.split * launch.block_k) == 0:
        return replace(launch, split=2 * launch.split)
    return launch


def pdl_form(late: bool, tiles: int):
    """PDL with this trigger point, asking the L2 for `tiles` K tiles a row (0: all)."""
    return lambda launch, x, w: replace(
        launch, late_trigger=late, prefetch_k=tiles * launch.block_k
    )


# name -> (PDL on, the default launch changed as a function of it and the call's x and w)
VARIANTS = {
    "plain": (False, lambda launch, x, w: launch),
    "pdl_early_all": (True, pdl_form(False, 0)),
    "pdl_late_all": (True, pdl_form(True, 0)),
    "pdl_early_tiles2": (True, pdl_form(False, 2)),
    "pdl_late_tiles1": (True, pdl_form(True, 1)),
    "pdl_late_tiles2": (True, pdl_form(True, 2)),
    "pdl_late_tiles4": (True, pdl_form(True, 4)),
    "one_per_sm": (False, deep),
    "pdl_late_tiles2_one_per_sm": (
        True,
        lambda launch, x, w: deep(pdl_form(True, 2)(launch, x, w), x, w),
    ),
    "narrow": (False, narrow),
    "pdl_late_tiles1_narrow": (
        True,
        lambda launch, x, w: narrow(pdl_form(True, 1)(launch, x, w), x, w),
    ),
    "plain_again": (False, lambda launch, x, w: launch),
}


def run_variants(model: str, rows: int, device, smoke: bool) -> dict:
    shape = get_model(model)
    if smoke:
        shape = replace(shape, hidden=64, intermediate=128, q_heads=8, kv_heads=2, head_dim=8)
    proj = projections(model)
    if smoke:  # the same roles at toy widths: hidden 64, intermediate 128
        proj = {"qkv": (128, 64), "o": (64, 64), "gate_up": (256, 64), "down": (64, 128)}
    weights = chain_weights(proj, 2 if smoke else shape.layers, device)
    t = chain_tensors(weights, shape, rows, device)
    sms = multiprocessors(torch.device(device))
    out = {
        "model": model,
        "rows": rows,
        "layers": len(weights),
        "weight_bytes": sum(w.numel() * 2 for layer in weights for w in layer),
    }
    want = None
    for name, (pdl, change) in VARIANTS.items():

        def launch_of(x, w, reads_norm, change=change):
            return change(default_launch(x.shape[0], w.shape[0], w.shape[1], sms), x, w)

        run = layer_chain(weights, t, True, True, launch_of)
        with programmatic_launch("linear" if pdl else "0"):
            got = run().clone()  # once outside any graph: the check
            us = time_graph(run, reps=3 if smoke else 20)
        want = got if want is None else want
        out[name] = dict(
            us=us,
            bytes_per_s=out["weight_bytes"] / (us * 1e-6),
            equal_to_plain=bool(torch.equal(got, want)),
            launch_qkv=vars(launch_of(t["hidden"], weights[0][0], True)),
        )
        print(f"{name}: {us:.1f} us", flush=True)
    return out


def main(argv=None) -> int:
    args, device, _, _ = target_case_args(__doc__.splitlines()[0], argv)
    result = dict(
        benchmark="linear-pdl",
        facts=device_facts(),
        copy_bandwidth=copy_bandwidth(),
        chains=[run_variants("qwen3-1.7b", 16, device, args.smoke)],
    )
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
