"""Kernel tests run each launcher on CPU tensors in Triton's interpreter when triton is
installed (`interpreted` fixture), and otherwise through the launchers' PyTorch fallback, so
the same value checks hold either way. GPU tests (marked gpu) run on the device machine."""

from __future__ import annotations

import pytest

from sparrow_core.kernels.runtime import HAS_TRITON, cpu_interpreter


@pytest.fixture
def interpreted():
    """Kernels on CPU tensors run in the interpreter inside the test (if triton is here)."""
    with cpu_interpreter() as active:
        if HAS_TRITON:
            # triton imported before sparrow_core.kernels would leave compiled mode on
            assert active, "triton is installed but not in interpreter mode"
        yield active
