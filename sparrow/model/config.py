"""The shape of a decoder-only model: ModelArch, read from a Hugging Face config.json.

    arch = ModelArch.from_hf_config(json.load(open("/models/Qwen3-1.7B/config.json")))
    arch.group_size       # query heads per KV head

Supported families: Qwen3ForCausalLM (per-head q/k RMSNorm), Qwen2ForCausalLM (q/k/v bias),
LlamaForCausalLM (optionally with llama3 RoPE scaling). Both config.json layouts are read:
transformers 5 (`rope_parameters`) and transformers 4 (`rope_theta` plus `rope_scaling`).
Anything the decoder does not implement (another RoPE type, sliding-window layers, another
activation, MLP bias) is a ModelConfigError naming the key, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparrow.errors import SparrowError

ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
}
FAMILIES = ("qwen3", "qwen2", "llama")


class ModelConfigError(SparrowError, ValueError):
    """A model config that the decoder cannot run; the message names the key."""


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent RoPE scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ModelConfigError(f"rope scaling factor must be positive, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ModelConfigError(
                "rope scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor}, {self.high_freq_factor}"
            )
        if self.original_max_position_embeddings < 1:
            raise ModelConfigError(
                "rope scaling original_max_position_embeddings must be positive, got "
                f"{self.original_max_position_embeddings}"
            )


@dataclass(frozen=True)
class ModelArch:
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    o_proj_bias: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))
        if self.family not in FAMILIES:
            raise ModelConfigError(
                f"unknown model family {self.family!r}; valid: {', '.join(FAMILIES)}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_q_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
        ):
            if getattr(self, name) < 1:
                raise ModelConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_q_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ModelConfigError(
                f"rms_norm_eps and rope_theta must be positive, got {self.rms_norm_eps}, "
                f"{self.rope_theta}"
            )
        if any(not 0 <= i < self.vocab_size for i in self.eos_token_ids):
            raise ModelConfigError(
                f"eos_token_ids {self.eos_token_ids} fall outside vocab_size {self.vocab_size}"
            )

    @property
    def group_size(self) -> int:
        """Query heads per KV head (the GQA ratio)."""
        return self.num_q_heads // self.num_kv_heads

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelArch:
        """Map a transformers config.json (as a dict) to a ModelArch."""
        family = _family(config)
        _check_unsupported(config)
        heads = _require(config, "num_attention_heads")
        hidden = _require(config, "hidden_size")
        attention_bias = bool(config.get("attention_bias", False))
        theta, scaling = _rope(config)
        eos = config.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        return cls(
            family=family,
            vocab_size=_require(config, "vocab_size"),
            hidden_size=hidden,
            num_layers=_require(config, "num_hidden_layers"),
            num_q_heads=heads,
            num_kv_heads=_optional(config, "num_key_value_heads", heads),
            head_dim=_optional(config, "head_dim", hidden // heads if heads > 0 else 0),
            intermediate_size=_require(config, "intermediate_size"),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            # the three families' config classes default to untied
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else attention_bias,
            qk_norm=family == "qwen3",
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=eos_ids,
            o_proj_bias=False if family == "qwen2" else attention_bias,
        )


def _family(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures") or []
    for name in archs:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    if not archs and config.get("model_type") in FAMILIES:
        return config["model_type"]
    raise ModelConfigError(
        f"unsupported model architecture {archs or config.get('model_type')!r}; "
        f"supported: {', '.join(ARCHITECTURES)}"
    )


def _require(config: Mapping[str, Any], key: str) -> int:
    if config.get(key) is None:
        raise ModelConfigError(f"model config.json lacks {key!r}")
    return int(config[key])


def _optional(config: Mapping[str, Any], key: str, default: int) -> int:
    return default if config.get(key) is None else int(config[key])


def _check_unsupported(config: Mapping[str, Any]) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"hidden_act {act!r} is not supported; only 'silu' is")
    if config.get("mlp_bias"):
        raise ModelConfigError("mlp_bias=true is not supported")
    if config.get("use_sliding_window"):
        raise ModelConfigError("use_sliding_window=true is not supported (full attention only)")
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ModelConfigError("partial_rotary_factor other than 1.0 is not supported")
    layer_types = config.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ModelConfigError(
            f"layer_types {sorted(set(layer_types))} are not supported; only 'full_attention' is"
        )


def _rope(config: Mapping[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    """(theta, scaling) from either rope_parameters (transformers 5) or rope_scaling (4)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ModelConfigError(
            f"rope_type {rope_type!r} is not supported; supported: 'default', 'llama3'"
        )
    try:
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    except KeyError as missing:
        raise ModelConfigError(f"llama3 rope scaling lacks {missing.args[0]!r}") from None
    return theta, scaling
