"""How kernels/linear.py's skinny decode linear kernel cuts its work: the launch dataclass and
the default launch per shape (from the H100 sweep of benchmarks/linear.py).

    launch = default_launch(rows=16, n_out=4096, k_len=2048, sms=132)

Tests: `python -m pytest tests/kernels/test_linear.py -q`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparrow.kernels.runtime import next_power_of_2

SMEM_BUDGET = 200 * 1024  # pipelined tiles of x and W; Hopper allows 227 KiB a block


@dataclass(frozen=True)
class LinearLaunch:
    """How the kernel cuts the work: column tile, K tile, K splits, warps, pipeline stages;
    w_major puts W's tile on the tensor core's M side (N = the rows of x). Under
    programmatic dependent launch only: prefetch_k, the K columns of each weight row a
    program asks the L2 for before it waits for x (0: its whole K range), and late_trigger,
    which lets the next kernel launch once this one's programs have left their K loop
    instead of as soon as they start."""

    block_n: int = 64
    block_k: int = 256
    split: int = 1
    num_warps: int = 4
    num_stages: int = 4
    w_major: bool = True
    prefetch_k: int = 0
    late_trigger: bool = False


def default_launch(rows: int, n_out: int, k_len: int, sms: int) -> LinearLaunch:
    """The launch the H100 sweep of benchmarks/linear.py favours for decode shapes: about one
    program per SM or more, long K ranges split (down_proj), 128-wide tiles for lm_head;
    the K tile then shrinks (to 16) until it divides K (small models). Under PDL, the form
    benchmarks/probes/linear_pdl.py measured fastest."""
    w_major = rows <= 16
    if n_out >= 256 * sms:  # lm_head: plenty of column blocks
        launch = LinearLaunch(128, 128, 1, 4, 4, w_major)
    elif k_len >= 2 * n_out and k_len % (4 * 128) == 0:  # down_proj: few columns, long K
        launch = LinearLaunch(64 if rows <= 16 else 32, 128, 4, 4, 4, w_major)
    else:
        block_n = 32 if n_out >= 31 * sms else 16  # about one program per SM or more
        block_k = 256 if n_out <= 64 * 64 else 128
        launch = LinearLaunch(block_n, block_k, 1, 4, 4, w_major)
    block_k = launch.block_k
    while k_len % (block_k * launch.split) and block_k > 16:
        block_k //= 2
    # under PDL: the first K tile asked for early, the next kernel let in late (measured with
    # benchmarks/probes/linear_pdl.py: the whole slice at once, let in early, was slower than
    # no PDL; the prologue's reads then compete with the running kernel's stream)
    return replace(launch, block_k=block_k, prefetch_k=block_k, late_trigger=True)


def prefetch_lines(launch: LinearLaunch, k_len: int) -> int:
    """128-byte lines of each weight row the PDL prologue asks the L2 for (16-bit weights:
    64 columns a line), a power of two up to 64."""
    columns = k_len // launch.split
    if launch.prefetch_k:
        columns = min(columns, launch.prefetch_k)
    return min(64, next_power_of_2(-(-columns // 64)))


def pipeline_stages(launch: LinearLaunch, rows: int) -> int:
    """Pipeline stages that fit in shared memory."""
    tile_bytes = (launch.block_n + max(16, next_power_of_2(rows))) * launch.block_k * 2
    return max(1, min(launch.num_stages, SMEM_BUDGET // tile_bytes))
