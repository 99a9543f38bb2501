"""Model shapes and hardware for the eFLOPs cost model (sparrow/costmodel/eflops.py).

    from sparrow.costmodel.presets import get_model, get_hardware
    get_model("qwen3-1.7b").parameters   # 1,720,574,976, counted from the shapes
    get_hardware("h200").intensity       # 989.4e12 / 4.8e12 = 206.1 FLOP per byte

Model shapes are the public Qwen3 config files (the paper's table of them). P counts every
weight of the Qwen3 layout: embeddings, per layer the q/k/v/o projections (no biases), the
per-head q and k RMSNorm weights, the MLP gate/up/down projections and the two layer norms,
then the final norm and, where embeddings are not tied, a separate lm_head. The cost model's
D is the KV width of one token summed over layers and KV heads (layers x KV heads x head
dim), r the GQA ratio (query heads per KV head). Hardware: peak dense bf16 FLOP/s and HBM
bytes/s from the vendors' SXM datasheets; I = FLOP/s divided by bytes/s.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields

from sparrow.errors import SparrowError


class CostModelError(SparrowError, ValueError):
    """Bad input to the cost model (an unknown preset, a negative length, ...)."""


@dataclass(frozen=True)
class ModelShape:
    """The shapes that fix a decoder's parameter count P, KV width D and GQA ratio r."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    # Qwen3 normalises q and k per head; Qwen2 / Llama do not
    qk_norm: bool = True
    # Qwen2 has q/k/v biases; Qwen3 and Llama have none
    attention_bias: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
            ):
                raise CostModelError(
                    f"model {self.name!r}: {f.name} must be a positive integer, got {value!r}"
                )
        if self.q_heads % self.kv_heads:
            raise CostModelError(
                f"model {self.name!r}: q_heads ({self.q_heads}) must be a multiple of "
                f"kv_heads ({self.kv_heads})"
            )

    @property
    def parameters(self) -> int:
        """P: every weight, the embedding counted once more for an untied lm_head."""
        h, q, kv = self.hidden, self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        mlp = 3 * h * self.intermediate
        per_layer = attention + mlp + 2 * h
        embeddings = self.vocab * h * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * per_layer + h

    @property
    def kv_dim(self) -> int:
        """D: key (equally value) width of one token over all layers and KV heads."""
        return self.layers * self.kv_heads * self.head_dim

    @property
    def gqa_ratio(self) -> float:
        """r: query heads per KV head."""
        return self.q_heads / self.kv_heads

    @classmethod
    def from_hf_config(cls, config, name: str | None = None) -> ModelShape:
        """Shapes from a transformers config (Qwen3, Qwen2 or Llama style attribute names)."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            name=name or getattr(config, "name_or_path", "") or config.model_type,
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            q_heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qk_norm=config.model_type == "qwen3",
            attention_bias=bool(getattr(config, "attention_bias", config.model_type == "qwen2")),
        )


@dataclass(frozen=True)
class Hardware:
    """Peak dense bf16 compute and memory bandwidth of one accelerator."""

    name: str
    peak_flops: float
    memory_bytes_per_s: float
    description: str = ""

    def __post_init__(self) -> None:
        if not (self.peak_flops > 0 and self.memory_bytes_per_s > 0):
            raise CostModelError(f"hardware {self.name!r}: FLOP/s and bytes/s must be positive")

    @property
    def intensity(self) -> float:
        """I: FLOP per byte, so that bytes moved become equivalent FLOPs."""
        return self.peak_flops / self.memory_bytes_per_s


_QWEN3 = dict(head_dim=128, vocab=151_936, qk_norm=True, attention_bias=False)

MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            "qwen3-0.6b", 28, 1024, 16, 8, intermediate=3072, tied_embeddings=True, **_QWEN3
        ),
        ModelShape(
            "qwen3-1.7b", 28, 2048, 16, 8, intermediate=6144, tied_embeddings=True, **_QWEN3
        ),
        ModelShape("qwen3-4b", 36, 2560, 32, 8, intermediate=9728, tied_embeddings=True, **_QWEN3),
        ModelShape(
            "qwen3-8b", 36, 4096, 32, 8, intermediate=12288, tied_embeddings=False, **_QWEN3
        ),
        ModelShape(
            "qwen3-14b", 40, 5120, 40, 8, intermediate=17408, tied_embeddings=False, **_QWEN3
        ),
    )
}

HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", 989.4e12, 3.35e12, "H100 SXM: 989.4 TFLOP/s dense bf16, 3.35 TB/s"),
    "h200": Hardware("h200", 989.4e12, 4.8e12, "H200 SXM: 989.4 TFLOP/s dense bf16, 4.8 TB/s"),
}


def get_model(name: str) -> ModelShape:
    """A model preset; an unknown name is a CostModelError listing the valid ones."""
    if name not in MODELS:
        raise CostModelError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    return MODELS[name]


def get_hardware(name: str) -> Hardware:
    """A hardware preset; an unknown name is a CostModelError listing the valid ones."""
    if name not in HARDWARE:
        raise CostModelError(f"unknown hardware {name!r}; valid hardware: {', '.join(HARDWARE)}")
    return HARDWARE[name]
