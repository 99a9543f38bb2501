"""Low-precision parameters with fp32 master copies that the optimizer steps.

    masters = MasterWeights(model, torch.bfloat16)          # model now holds bf16 parameters
    optimizer = torch.optim.AdamW(masters.parameters(), lr=1e-6)
    loss.backward()                                         # grads land on the masters, in fp32
    optimizer.step(); masters.publish()                     # masters -> the model's bf16 weights
    with masters.swapped_in():                              # the model shows fp32 masters
        model.save_pretrained(folder)

Why: under autocast with fp32 parameters every step casts each weight to bf16 and runs the
residual stream and norms in fp32; at Qwen3-1.7B shape those casts and fp32 elementwise
kernels took a third of scoring's GPU time. Holding the model in bf16 removes both, while the
fp32 masters keep updates at the reference lr of 1e-6 from rounding away (a bf16 weight has 8
bits of mantissa: an update below about 1/256 of the weight would vanish).

Gradients: a hook after each parameter's gradient is accumulated adds it, in fp32, to its
master's gradient and drops the bf16 one, so gradients summed over micro-batches are summed in
fp32 and only one parameter's bf16 gradient exists at a time. Tied parameters (the embeddings
and lm_head) are one parameter and get one master.
Tests: `python -m pytest tests/trainer/test_master_weights.py -q`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class MasterWeights:
    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.model = model
        self.dtype = dtype
        self.pairs: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        for param in model.parameters():  # unique parameters, in the model's order
            master = param.detach().to(torch.float32, copy=True)
            self.pairs.append((param, master))
            param.data = param.data.to(dtype)
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._hook_for(master))
        for owner in model.modules():  # floating buffers (RoPE tables are recomputed anyway)
            for name, buffer in list(owner._buffers.items()):
                if buffer is not None and buffer.is_floating_point() and name != "inv_freq":
                    owner._buffers[name] = buffer.to(dtype)

    @staticmethod
    def _hook_for(master: torch.Tensor):
        def accumulate(param: torch.Tensor) -> None:
            grad = param.grad.to(torch.float32)
            if master.grad is None:
                master.grad = grad if grad is not param.grad else grad.clone()
            else:
                master.grad.add_(grad)
            param.grad = None

        return accumulate

    def parameters(self) -> list[torch.Tensor]:
        """The fp32 masters, in the model's parameter order (what the optimizer steps)."""
        return [master for _, master in self.pairs]

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the masters into the model's low-precision parameters (rounding to nearest)."""
        for param, master in self.pairs:
            param.data.copy_(master)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[torch.nn.Module]:
        """The model with its parameters pointing at the fp32 masters, for saving or
        snapshotting exact weights; the low-precision ones are back on exit."""
        kept = [param.data for param, _ in self.pairs]
        try:
            for param, master in self.pairs:
                param.data = master
            yield self.model
        finally:
            for (param, _), data in zip(self.pairs, kept):
                param.data = data
