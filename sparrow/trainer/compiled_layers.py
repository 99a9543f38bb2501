"""torch.compile of each decoder layer of the trainer's model (regional compilation).

    count = compile_layers(model)       # every decoder layer now runs a compiled forward

A decoder layer is compiled once and reused by every layer of the same shapes, so the compile
takes seconds, not the minutes of a whole-model compile, and the model around the layers
(embedding, final norm, the chunked log-softmax) stays eager. Inside a layer the compiler
fuses what the eager model runs as separate kernels: RMSNorm's fp32 chain, the rotary
embedding, residual adds, SwiGLU's activation and product; and each layer's Python and
launch overhead (on an H100 at Qwen3-1.7B shape the trainer's host time was as long as its
GPU time) shrinks to a few compiled calls. Sequence lengths change with every micro-batch,
so the layers compile with dynamic shapes from the start (no recompile per length).

`nn.Module.compile` works in place: the layer keeps its parameters (the optimizer, master
weights, offload and checkpoints see the same tensors), and transformers' activation
checkpointing wraps the compiled call, so the backward recomputes it compiled too.
Numbers stay those of the eager layer up to rounding (fused kernels round in other places).
On a CPU the first call compiles for about a minute (tiny model) and gains nothing: the
option is for GPUs; `trainer.compile_layers` is off until measured there
(`python benchmarks/trainer.py --model DIR --tokens 8192 --seqs 4 --set compile_layers=true`).
Tests: `python -m pytest tests/trainer/test_compiled_layers.py -q` (the numeric one
runs with `-m gpu`).
"""

from __future__ import annotations

import torch


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (model.get_decoder().layers)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}'s decoder has no `layers` to compile")
    return list(layers)


def compile_layers(model: torch.nn.Module) -> int:
    """Compile every decoder layer of `model` in place (dynamic shapes); how many."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def is_compiled(layer: torch.nn.Module) -> bool:
    return getattr(layer, "_compiled_call_impl", None) is not None
