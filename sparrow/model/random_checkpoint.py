"""Tiny random checkpoints in Hugging Face layout, for tests and the embedded default.

    make_random_checkpoint("/tmp/tiny-qwen3")                        # qwen3, tied, 2 layers
    make_random_checkpoint("/tmp/tiny-llama", "llama", tie_word_embeddings=False,
                           rope_scaling=LLAMA3_TEST_SCALING, shards=2)
    python -m sparrow.model.random_checkpoint OUT_DIR [FAMILY]

Builds the transformers model (Qwen3ForCausalLM / Qwen2ForCausalLM / LlamaForCausalLM),
fills it with seeded random weights scaled so that activations and logits are of order one
(transformers' own 0.02 init gives near-uniform logits, which would let a wrong decoder pass
a tolerance test), saves it with save_pretrained (sharded when shards > 1), and writes a
byte-level tokenizer: token id b is byte b (0..255), then the special tokens below.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from sparrow.model.config import FAMILIES, ModelConfigError
from sparrow.model.tokenizer import SPECIAL_TOKENS, build_byte_tokenizer

# a llama3 scaling whose wavelength thresholds fall inside a tiny head's frequency range
LLAMA3_TEST_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
DEFAULT_VOCAB_SIZE = 384


def make_random_checkpoint(
    out_dir: str | Path,
    family: str = "qwen3",
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_q_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    intermediate_size: int = 128,
    tie_word_embeddings: bool = True,
    rope_scaling: Mapping[str, Any] | None = None,
    rope_theta: float = 10000.0,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    shards: int = 1,
) -> Path:
    """Write a random model plus tokenizer to out_dir; returns the directory."""
    if family not in FAMILIES:
        raise ModelConfigError(f"unknown model family {family!r}; valid: {', '.join(FAMILIES)}")
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ModelConfigError(
            f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} "
            f"(256 bytes and {len(SPECIAL_TOKENS)} special tokens), got {vocab_size}"
        )
    if shards < 1:
        raise ModelConfigError(f"shards must be at least 1, got {shards}")
    config = _hf_config(
        family,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_q_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        tie_word_embeddings=tie_word_embeddings,
        rope_theta=rope_theta,
        rope_scaling=dict(rope_scaling) if rope_scaling else None,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        bos_token_id=SPECIAL_TOKENS["<|bos|>"],
        eos_token_id=SPECIAL_TOKENS["<|endoftext|>"],
        pad_token_id=SPECIAL_TOKENS["<|endoftext|>"],
    )
    model = _hf_model(family, config)
    randomize_weights(model, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_kwargs: dict[str, Any] = {}
    if shards > 1:
        total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        save_kwargs["max_shard_size"] = max(1, math.ceil(total / shards))
    model.save_pretrained(out, **save_kwargs)
    build_byte_tokenizer(out)
    return out


def randomize_weights(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights with order-one activations: linears N(0, 1/fan_in), norms near 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.2 * noise
            elif name.endswith("bias"):
                value = 0.2 * noise
            elif "embed_tokens" in name or name.startswith("lm_head"):
                # logits of standard deviation about 2 after the final norm
                value = noise * (2.0 / math.sqrt(param.shape[1]))
            else:
                value = noise / math.sqrt(param.shape[1])
            param.copy_(value)


def _hf_config(family: str, **kwargs: Any):
    import transformers

    if family == "qwen2":
        # Qwen2 configs carry no head_dim unless it differs from hidden / heads
        if kwargs["head_dim"] * kwargs["num_attention_heads"] == kwargs["hidden_size"]:
            kwargs.pop("head_dim")
        return transformers.Qwen2Config(**kwargs)
    if family == "qwen3":
        return transformers.Qwen3Config(**kwargs)
    return transformers.LlamaConfig(**kwargs)


def _hf_model(family: str, config):
    import transformers

    classes = {
        "qwen3": transformers.Qwen3ForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "llama": transformers.LlamaForCausalLM,
    }
    return classes[family](config).eval()


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: python -m sparrow.model.random_checkpoint OUT_DIR [FAMILY]")
        return 2
    out = make_random_checkpoint(argv[0], argv[1] if len(argv) > 1 else "qwen3")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
