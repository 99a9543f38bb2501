"""The sharded trainer's model before FSDP: parameters on the meta device, buffers real, and
the checkpoint read file by file as fp32 tensors under the model's state-dict names
(rl/hf_model.py)."""

import pytest
import torch

from sparrow.rl.checks import RLInputError
from sparrow.trainer.hf_model import (
    checkpoint_parts,
    empty_hf_model,
    load_hf_model,
    read_part,
    tied_names,
)


def read_full_state(path, keys, tied):
    """Every part the sharded trainer's rank 0 reads, joined."""
    state = {}
    for file, names in checkpoint_parts(path, keys, tied):
        state.update(read_part(path, file, names))
    return state


@pytest.mark.parametrize(
    "fixture", ["qwen3_checkpoint", "llama_checkpoint", "qwen3_sharded_checkpoint"]
)
def test_empty_model_reads_back_equal_to_the_loaded_one(fixture, request):
    """Tied (qwen3) and untied with llama3 RoPE scaling (llama) models, one file or shards:
    no parameter has memory, every buffer equals the loaded model's, and the state read for
    the empty model's names equals the loaded model's state dict."""
    path = request.getfixturevalue(fixture)
    empty, loaded = empty_hf_model(path), load_hf_model(path, torch.device("cpu"))
    assert all(p.is_meta for p in empty.parameters())
    for (name, buffer), (other, want) in zip(empty.named_buffers(), loaded.named_buffers()):
        assert name == other and not buffer.is_meta and torch.equal(buffer, want), name
    tied = tied_names(empty)
    assert (
        tied == {"lm_head.weight": "model.embed_tokens.weight"}
    ) == loaded.config.tie_word_embeddings
    state = read_full_state(path, empty.state_dict(), tied)
    want = loaded.state_dict()
    assert state.keys() == want.keys()
    for name, tensor in want.items():
        assert state[name].dtype == torch.float32 and torch.equal(state[name], tensor), name


def test_a_tensor_missing_from_the_checkpoint_is_named(qwen3_checkpoint):
    empty = empty_hf_model(qwen3_checkpoint)
    keys = list(empty.state_dict()) + ["model.layers.99.mlp.up_proj.weight"]
    with pytest.raises(RLInputError, match="layers.99.mlp.up_proj"):
        read_full_state(qwen3_checkpoint, keys, tied_names(empty))
    # untied, the output embedding has to be in the file
    with pytest.raises(RLInputError, match="lm_head.weight"):
        read_full_state(qwen3_checkpoint, empty.state_dict(), {})


def test_a_folder_without_weights_is_named(tmp_path):
    with pytest.raises(RLInputError, match="no model.safetensors"):
        read_full_state(tmp_path, ["x"], {})
