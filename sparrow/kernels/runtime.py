"""Triton availability and kernel dispatch shared by every kernel file of this package.

    from sparrow.kernels.runtime import jit, tl, use_kernel
    @jit
    def _my_kernel(x_ptr, BLOCK: tl.constexpr): ...
    if use_kernel(x):            # CUDA tensors (or CPU tensors inside cpu_interpreter())
        _my_kernel[grid](x, BLOCK=64)

Triton is optional (the `gpu` extra): without it `use_kernel` is False and launchers run
their PyTorch reference. On a machine with triton but no CUDA, this module switches Triton
to its CPU interpreter (TRITON_INTERPRET=1, unless set otherwise) before importing it, since
Triton fixes compiled-or-interpreted when its own library functions are decorated; compiled
kernels could not run there anyway. CPU tensors still take the reference path unless a
caller opts in with `with cpu_interpreter():` (the CPU tests of the kernels do).

KernelOptions say how launchers choose among their kernels; the defaults are the measured
best, and `kernel_options(options)` sets others for a block (the engine runs each forward
under its EngineConfig's: engine/runner.py):
- programmatic_launch, the kernel families launched with programmatic dependent launch
  (Hopper and later), by default both: `attention` (q/k norm + RoPE, scoring, top-k,
  attention, split combine: each starts with `gdc_wait()`, which blocks until the kernel
  before it in the stream has finished and its writes are visible, and calls
  `gdc_launch_dependents()` once its main loop is done) and `linear` (the skinny decode
  projections of linear.py first ask the L2 for their first K tile of weights, then wait,
  and let the next kernel in once they leave their K loop). A kernel launched this way is
  placed on the GPU while the one before still runs; waiting before any access to data
  another kernel writes keeps every read-after-write and write-after-read order of a plain
  launch. On an H100 a Qwen3-1.7B B=16 step outside attention took 1819 instead of 1887 us
  with it. Letting the next kernel in as soon as a kernel's programs start, with whole
  weight slices asked for, was slower than no programmatic launch at all.
- skinny_linear: decode projections of up to 16 rows in linear.py's kernel (off: F.linear,
  cuBLAS, to compare);
- fold_norms: the RMSNorms and residual adds of a decode layer ride in those projections'
  kernels (model/stream.py; off: in the norm kernel, to compare).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
from collections.abc import Iterator

import torch

from sparrow.errors import SparrowError

if (
    importlib.util.find_spec("triton") is not None
    and "triton" not in sys.modules
    and not torch.cuda.is_available()
):
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # an older triton: programmatic launch stays off
        gdc_launch_dependents = gdc_wait = None
except ImportError:  # CPU installs without the gpu extra
    triton = None
    gdc_launch_dependents = gdc_wait = None
    HAS_TRITON = False

    class _LanguageStub:
        """Stands in for triton.language so kernel signatures still parse."""

        constexpr = None

    tl = _LanguageStub()  # type: ignore[assignment]

# Triton's own library functions were decorated under this setting, so it holds for good
INTERPRETER = HAS_TRITON and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_cpu_opt_in = [False]


class KernelInputError(SparrowError, ValueError):
    """Tensors a kernel launcher cannot take (shape, dtype, device or layout named)."""


@contextlib.contextmanager
def cpu_interpreter() -> Iterator[bool]:
    """Run kernels on CPU tensors in Triton's interpreter inside this block; yields whether
    that is possible (triton installed and imported in interpreter mode)."""
    previous = _cpu_opt_in[0]
    _cpu_opt_in[0] = INTERPRETER
    try:
        yield INTERPRETER
    finally:
        _cpu_opt_in[0] = previous


def use_kernel(*tensors: torch.Tensor) -> bool:
    """Whether a launcher should run its Triton kernel on these tensors (else the reference)."""
    if not HAS_TRITON:
        return False
    devices = {t.device.type for t in tensors}
    if devices == {"cuda"}:
        return not INTERPRETER
    return devices == {"cpu"} and _cpu_opt_in[0]


def _patch_interpreter_scalars() -> None:
    """The interpreter holds a scalar as a 1-element array and converts it with int(), which
    numpy >= 2.3 refuses for arrays of one dimension; loop bounds loaded from memory hit it.
    Re-register the conversion through a flat index (interpreter only)."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


if INTERPRETER:
    _patch_interpreter_scalars()


def jit(fn):
    """triton.jit when triton is installed; the bare function otherwise (never launched)."""
    return triton.jit(fn) if HAS_TRITON else fn


# the kernel families that may launch with programmatic dependent launch
PDL_FAMILIES = ("linear", "attention")


def pdl_families(setting: str) -> frozenset[str]:
    """The families a programmatic_launch setting names: "none" (or "0", empty), "all" (or
    "1"), or one family or a comma list of PDL_FAMILIES."""
    setting = setting.strip().lower()
    if setting in ("", "0", "none"):
        return frozenset()
    if setting in ("1", "all"):
        return frozenset(PDL_FAMILIES)
    families = frozenset(part.strip() for part in setting.split(",") if part.strip())
    unknown = sorted(families - set(PDL_FAMILIES))
    if unknown:
        raise SparrowError(
            f"programmatic_launch={setting!r}: unknown kernel families "
            f"{unknown}; use none, all or a comma list of {list(PDL_FAMILIES)}"
        )
    return families


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """How launchers choose among their kernels (see the module docstring)."""

    # kernel families launched with programmatic dependent launch (a subset of PDL_FAMILIES)
    programmatic_launch: frozenset[str] = frozenset(PDL_FAMILIES)
    # decode projections of up to 16 rows in linear.py's kernel (False: F.linear)
    skinny_linear: bool = True
    # a decode layer's RMSNorms and residual adds in its projections' kernels
    fold_norms: bool = True

    def __post_init__(self) -> None:
        unknown = sorted(set(self.programmatic_launch) - set(PDL_FAMILIES))
        if unknown:
            raise SparrowError(
                f"KernelOptions.programmatic_launch: unknown kernel families "
                f"{unknown}; the families are {list(PDL_FAMILIES)}"
            )


_OPTIONS = [KernelOptions()]


def current_options() -> KernelOptions:
    """The KernelOptions in force (the defaults outside any kernel_options block)."""
    return _OPTIONS[0]


@contextlib.contextmanager
def kernel_options(options: KernelOptions) -> Iterator[None]:
    """Launchers choose their kernels by `options` inside this block. Set while kernels are
    launched, or captured into a CUDA graph (a replay keeps what its capture chose)."""
    previous = _OPTIONS[0]
    _OPTIONS[0] = options
    try:
        yield
    finally:
        _OPTIONS[0] = previous


@contextlib.contextmanager
def programmatic_launch(enabled: bool | str) -> Iterator[None]:
    """Programmatic dependent launch inside this block (benchmarks, tests): True for every
    family, False for none, or a setting as pdl_families takes it ("linear", "none")."""
    families = pdl_families(enabled if isinstance(enabled, str) else str(int(enabled)))
    with kernel_options(dataclasses.replace(_OPTIONS[0], programmatic_launch=families)):
        yield


def pdl_launch(device: torch.device, family: str = "attention") -> bool:
    """Whether a kernel of this family launches with programmatic dependent launch on this
    device: compiled CUDA on compute capability 9.0 or later, a triton that has it, and the
    family turned on."""
    return (
        family in _OPTIONS[0].programmatic_launch
        and device.type == "cuda"
        and not INTERPRETER
        and HAS_TRITON
        and gdc_wait is not None
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


_ARRIVALS: dict[tuple[str, str], torch.Tensor] = {}
ARRIVAL_MIN = 1 << 16


def arrival_counters(device: torch.device, count: int, tag: str) -> torch.Tensor:
    """`count` int32 counters, all zero, for a kernel whose programs count their arrivals per
    group (tl.atomic_add after their stores) so that the last to arrive does the group's
    final work; that program sets its counter back to zero, so they are zero again when the
    kernel ends and the same buffer serves every later launch and CUDA-graph replay.

    One buffer per (device, tag), at least ARRIVAL_MIN counters, allocated on first use; it
    must not grow while a CUDA graph is being captured (its memory would belong to the
    graph), so a capture that needs more than the warm-up allocated is refused. Kernels that
    share a tag must not run concurrently on different streams."""
    key = (str(device), tag)
    buffer = _ARRIVALS.get(key)
    if buffer is None or buffer.numel() < count:
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        check(
            not capturing,
            f"{tag}: {count} arrival counters are needed but only "
            f"{0 if buffer is None else buffer.numel()} were allocated before this CUDA "
            "graph capture; run the same launch once outside the capture first",
        )
        size = max(ARRIVAL_MIN, next_power_of_2(count))
        _ARRIVALS[key] = buffer = torch.zeros(size, dtype=torch.int32, device=device)
    return buffer


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a fixed 8 in the CPU interpreter)."""
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def check(condition: bool, message: str) -> None:
    """Raise KernelInputError(message) unless condition holds."""
    if not condition:
        raise KernelInputError(message)


def check_last_dim_contiguous(name: str, tensor: torch.Tensor) -> None:
    check(
        tensor.stride(-1) == 1,
        f"{name} must be contiguous in its last dimension, got strides {tuple(tensor.stride())}",
    )


def check_integer(name: str, tensor: torch.Tensor) -> None:
    check(
        not tensor.dtype.is_floating_point and tensor.dtype != torch.bool,
        f"{name} must hold integers, got {tensor.dtype}",
    )


def check_page_tables(page_tables: torch.Tensor, num_tokens: torch.Tensor, batch: int) -> None:
    """The per-sequence page tables [batch, W] and token counts [batch], both integers."""
    check(
        page_tables.dim() == 2 and page_tables.shape[0] == batch,
        f"page_tables must be [{batch}, W], got {tuple(page_tables.shape)}",
    )
    check(
        tuple(num_tokens.shape) == (batch,),
        f"num_tokens must be [{batch}], got {tuple(num_tokens.shape)}",
    )
    check_integer("page_tables", page_tables)
    check_integer("num_tokens", num_tokens)
