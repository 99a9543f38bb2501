"""Triton kernels of the rollout engine, one per file, each beside its checked launcher and
the PyTorch reference it must equal (docs/kernels.md). Launchers fall back to the reference
off GPU; `python -m pytest tests/kernels -q` runs them in Triton's interpreter
on CPU when triton is installed."""
