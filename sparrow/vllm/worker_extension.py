"""What vLLM's GPU worker does for the project: load trainer weights into its model in place,
and hand a sparsity schedule to the sparse attention backend's layers (sparse_backend.py).

vLLM mixes this class into its worker (LLM(worker_extension_cls=...)), and the engine calls
its methods by name through LLM.collective_rpc (engine.py). The model's own load_weights
takes transformers names and fuses q/k/v and gate/up itself, as when it reads a checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class WeightLoader:
    def sparrow_load_weights(self, weights: Mapping[str, Any], strict: bool = True) -> int:
        """Copy `weights` (transformers names) into the model; strict: every parameter of the
        model must be among them. Returns how many parameters were written."""
        import torch

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with torch.no_grad():
            loaded = set(model.load_weights(weights=iter(weights.items())))
        if strict:
            missing = sorted({name for name, _ in model.named_parameters()} - loaded)
            if missing:
                raise ValueError(
                    f"{len(missing)} vLLM parameters got no weights, e.g. "
                    f"{missing[:3]} (strict load of {len(weights)} tensors)"
                )
        torch.cuda.synchronize()
        return len(loaded)

    def sparrow_set_schedule(self, schedule: Any) -> int:
        """Give the sparse attention backend's layers `schedule` (a Schedule, or None for
        dense decode); returns how many layers took it (0: the backend is not in use)."""
        from sparrow.vllm.sparse_backend import set_worker_schedule

        return set_worker_schedule(self, schedule)
