"""ModelArch from transformers config.json dicts: both layouts, every family, and refusals."""

from __future__ import annotations

import pytest

from sparrow.model.config import Llama3RopeScaling, ModelArch, ModelConfigError

# Qwen3-1.7B's public config.json (the fields the decoder reads), transformers 4 layout
QWEN3_1_7B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 6144,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "max_position_embeddings": 40960,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "sliding_window": None,
}
# Llama 3.1 8B's, transformers 4 layout (rope_scaling beside rope_theta)
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "mlp_bias": False,
    "attention_bias": False,
}
# Qwen2.5-0.5B's: no head_dim key, q/k/v bias implied by the family
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "eos_token_id": 151643,
    "use_sliding_window": False,
    "sliding_window": 32768,
}


def test_qwen3_config():
    arch = ModelArch.from_hf_config(QWEN3_1_7B)
    assert (arch.family, arch.num_layers, arch.hidden_size) == ("qwen3", 28, 2048)
    assert (arch.num_q_heads, arch.num_kv_heads, arch.head_dim, arch.group_size) == (16, 8, 128, 2)
    assert arch.qk_norm and arch.tie_word_embeddings and not arch.qkv_bias
    assert arch.rope_theta == 1e6 and arch.rope_scaling is None
    assert arch.eos_token_ids == (151645,) and arch.bos_token_id == 151643


def test_llama_config_with_llama3_scaling_in_the_old_layout():
    arch = ModelArch.from_hf_config(LLAMA_3_1_8B)
    assert arch.family == "llama" and arch.group_size == 4 and arch.head_dim == 128
    assert arch.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)
    assert arch.rope_theta == 500000.0 and arch.rms_norm_eps == 1e-5
    assert arch.eos_token_ids == (128001, 128008, 128009)
    assert not arch.qk_norm and not arch.qkv_bias and not arch.tie_word_embeddings


def test_new_layout_rope_parameters_read_the_same():
    new = dict(LLAMA_3_1_8B)
    new["rope_parameters"] = dict(new.pop("rope_scaling"), rope_theta=new.pop("rope_theta"))
    assert ModelArch.from_hf_config(new) == ModelArch.from_hf_config(LLAMA_3_1_8B)


def test_qwen2_head_dim_and_bias():
    arch = ModelArch.from_hf_config(QWEN2_5_0_5B)
    assert arch.head_dim == 64 and arch.group_size == 7
    assert arch.qkv_bias and not arch.o_proj_bias and not arch.qk_norm


def test_llama_attention_bias_also_biases_the_output_projection():
    arch = ModelArch.from_hf_config(dict(LLAMA_3_1_8B, attention_bias=True))
    assert arch.qkv_bias and arch.o_proj_bias


def test_unsupported_architecture_names_it_and_the_supported_ones():
    with pytest.raises(ModelConfigError) as err:
        ModelArch.from_hf_config(dict(QWEN3_1_7B, architectures=["MistralForCausalLM"]))
    message = str(err.value)
    assert "MistralForCausalLM" in message
    assert all(
        name in message for name in ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")
    )


@pytest.mark.parametrize(
    "change,named",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding_attention"),
        ({"num_key_value_heads": 5}, "num_kv_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"vocab_size": None}, "vocab_size"),
        ({"eos_token_id": 200000}, "eos_token_ids"),
    ],
)
def test_refusals_name_the_key(change, named):
    with pytest.raises(ModelConfigError, match=named):
        ModelArch.from_hf_config(dict(QWEN3_1_7B, **change))


def test_llama3_scaling_missing_a_key():
    broken = dict(LLAMA_3_1_8B, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ModelConfigError, match="low_freq_factor"):
        ModelArch.from_hf_config(broken)
