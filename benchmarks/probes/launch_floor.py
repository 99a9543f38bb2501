"""What one more kernel costs a decode step: chains of small kernels in one CUDA graph.

    python3 benchmarks/probes/launch_floor.py --out launch_floor.json    # on a GPU
    python3 benchmarks/probes/launch_floor.py --smoke                    # any device

A probe, kept to measure another GPU: on an H100 the floor (0.92 us per empty launch, 0.64
with programmatic dependent launch) was the gap between a decode step's kernels.

A decode step is a chain of about 200 (dense) to 250 (sparse) kernels replayed from a CUDA
graph, each waiting for the one before. Beside the bytes it moves, every kernel costs the
gap between the end of one kernel and the start of the next plus its own ramp: its first
loads in flight, its last program's tail. This times chains of `--length` launches of:
an empty kernel (one program per SM), the same with programmatic dependent launch (each
waits on the one before with griddepcontrol instead of the stream order), and a kernel
whose every program reads and writes 16 KB (one program per SM: the first bytes' latency
included); the microseconds per launch are the floor of one kernel on this GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import device_facts, time_graph, write_json  # noqa: E402
from sparrow.kernels.runtime import (
    HAS_TRITON,
    INTERPRETER,
    cpu_interpreter,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    multiprocessors,
    pdl_launch,
    programmatic_launch,
    tl,
)


@jit
def _empty_kernel(x_ptr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@jit
def _touch_kernel(src_ptr, dst_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs))


def chain(kind: str, length: int, device, pdl: bool):
    sms = multiprocessors(torch.device(device))
    block = 4096  # 16 KB of float32 per program
    src = torch.ones(sms * block, device=device)
    dst = torch.empty_like(src)

    def run():
        for _ in range(length):
            if kind == "empty":
                _empty_kernel[(sms,)](src, PDL=pdl, launch_pdl=pdl)
            else:
                _touch_kernel[(sms,)](src, dst, BLOCK=block, PDL=pdl, launch_pdl=pdl)

    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--length", type=int, default=200)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not HAS_TRITON or (device == "cpu" and not INTERPRETER):
        print("launch_floor: needs triton (compiled on a GPU, or its CPU interpreter)")
        return 1
    length = 4 if args.smoke else args.length
    with programmatic_launch(True):
        pdl = pdl_launch(torch.device(device))
    rows = {}
    for kind in ("empty", "touch_16kb"):
        for with_pdl in sorted({False, pdl}):
            run = chain(kind, length, device, with_pdl)
            if device == "cpu":  # --smoke: the kernels run once in the interpreter, untimed
                with cpu_interpreter():
                    run()
                continue
            us = time_graph(run, reps=20, flush=False)
            rows[f"{kind}_pdl" if with_pdl else kind] = dict(chain_us=us, us_per_kernel=us / length)
    write_json(
        args.out, dict(benchmark="launch-floor", facts=device_facts(), length=length, chains=rows)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
