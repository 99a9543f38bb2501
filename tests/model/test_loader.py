"""Loading checkpoints from disk: sharded files, dtypes, and the errors for broken directories."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from sparrow.model import (
    CheckpointError,
    ModelConfigError,
    WeightLoadError,
    causal_attention,
    load_model,
    read_arch,
)
from sparrow.model.config import Llama3RopeScaling
from sparrow.model.loader import INDEX_FILE, SafetensorsCheckpoint


def _logits(model, ids):
    with torch.no_grad():
        return model.compute_logits(
            model(ids, torch.arange(len(ids)), causal_attention([len(ids)]))
        )


def test_sharded_checkpoint_loads_and_matches_transformers(qwen3_sharded_checkpoint):
    from transformers import AutoModelForCausalLM

    index = json.loads((qwen3_sharded_checkpoint / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = load_model(qwen3_sharded_checkpoint)
    reference = AutoModelForCausalLM.from_pretrained(
        qwen3_sharded_checkpoint, attn_implementation="eager", dtype=torch.float32
    ).eval()
    ids = torch.randint(0, model.arch.vocab_size, (11,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = reference(ids[None]).logits[0]
    torch.testing.assert_close(_logits(model, ids), theirs, atol=1e-4, rtol=0)


def test_every_parameter_comes_from_the_file(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    tensors = load_file(str(qwen3_checkpoint / "model.safetensors"))
    params = dict(model.named_parameters())
    assert set(params) == set(tensors)  # tied: no lm_head.weight in the file
    for name, value in tensors.items():
        assert torch.equal(params[name], value), name


def test_bfloat16_load(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ids = torch.arange(9) * 7
    low = _logits(model, ids)
    assert low.dtype == torch.float32
    full = _logits(load_model(qwen3_checkpoint), ids)
    # bf16 keeps about 3 significant digits: close, not equal
    assert 0 < (low - full).abs().max() < 0.25


def test_read_arch_of_the_llama_fixture(llama_checkpoint):
    arch = read_arch(llama_checkpoint)
    assert arch.family == "llama" and not arch.tie_word_embeddings
    assert arch.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 64)
    assert (arch.num_q_heads, arch.num_kv_heads, arch.head_dim) == (3, 1, 24)
    assert arch.eos_token_ids == (256,)


def test_lazy_checkpoint_reports_shapes(qwen3_sharded_checkpoint):
    checkpoint = SafetensorsCheckpoint(qwen3_sharded_checkpoint)
    name = "model.layers.1.mlp.down_proj.weight"
    assert checkpoint.shape_of(name) == (64, 128)
    assert checkpoint[name].shape == (64, 128)
    assert name in checkpoint and len(checkpoint) == len(list(checkpoint))


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="nowhere"):
        load_model(tmp_path / "nowhere")


def test_missing_config(tmp_path, qwen3_checkpoint):
    shutil.copy(qwen3_checkpoint / "model.safetensors", tmp_path)
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path)


def test_missing_weights_mention_other_formats(tmp_path, qwen3_checkpoint):
    shutil.copy(qwen3_checkpoint / "config.json", tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="model.safetensors.*pytorch_model.bin"):
        load_model(tmp_path)


def test_missing_tensor_is_named(tmp_path, qwen3_checkpoint):
    shutil.copy(qwen3_checkpoint / "config.json", tmp_path)
    tensors = load_file(str(qwen3_checkpoint / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightLoadError, match="missing tensor 'model.layers.1.self_attn.k_norm"):
        load_model(tmp_path)


def test_missing_shard_is_named(tmp_path, qwen3_sharded_checkpoint):
    shutil.copytree(qwen3_sharded_checkpoint, tmp_path / "ckpt")
    index = json.loads((tmp_path / "ckpt" / INDEX_FILE).read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (tmp_path / "ckpt" / shard).unlink()
    with pytest.raises(CheckpointError, match=shard):
        load_model(tmp_path / "ckpt")


def test_unsupported_architecture_on_disk(tmp_path, qwen3_checkpoint):
    config = json.loads((qwen3_checkpoint / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="GPT2LMHeadModel"):
        load_model(tmp_path)
