"""Kernel tests run each launcher on CPU tensors in Triton's interpreter when triton is
installed (`interpreted` fixture), and otherwise through the launchers' PyTorch fallback, so
the same value checks hold either way. GPU tests (marked gpu) run on the device machine."""

from __future__ import annotations

import numpy as np
import pytest

from sparrow.kernels.runtime import HAS_TRITON, cpu_interpreter


@pytest.fixture
def interpreted():
    """Kernels on CPU tensors run in the interpreter inside the test (if triton is here)."""
    with cpu_interpreter() as active:
        if HAS_TRITON:
            # triton imported before sparrow.kernels would leave compiled mode on
            assert active, "triton is installed but not in interpreter mode"
        yield active


@pytest.fixture
def bf16_dot(monkeypatch):
    """Triton 3.6's interpreter multiplies bfloat16 tl.dot operands as their uint16 bit
    patterns (it stores bfloat16 as uint16); widen them to float32 first, which is exact,
    as the tensor cores are."""
    if not HAS_TRITON:
        return
    from triton.runtime import interpreter

    tl = interpreter.tl
    original = interpreter.InterpreterBuilder.create_dot

    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        return interpreter.TensorHandle(
            (x.data.astype(np.uint32) << 16).view(np.float32), tl.float32
        )

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
