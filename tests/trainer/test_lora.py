"""The DistillSparse LoRA on the engine's Decoder: merge/unmerge round trip, the merged weights
an engine loads give the adapted forward, adapters off give the base, save/read by name."""

import pytest
import torch

from sparrow.engine.teacher.forced import teacher_forced_logits
from sparrow.model import load_model
from sparrow.model.builtin import resolve_model_path
from sparrow.model.loader import SafetensorsCheckpoint
from sparrow.trainer.lora import (
    Adapter,
    LoraError,
    LoraSpec,
    adapter_state,
    adapters_disabled,
    attach_lora,
    load_adapter_state,
    lora_layers,
    merge_weights,
)

SPEC = LoraSpec(rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"))


@pytest.fixture(scope="module")
def path():
    torch.set_num_threads(1)
    return resolve_model_path("builtin:tiny")


def adapted(path, seed=0):
    """The tiny model with a LoRA whose B is random too (a fresh B is 0 and changes nothing)."""
    model = attach_lora(load_model(path), SPEC, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            b = layer.lora_B["default"].weight
            b.copy_(0.05 * torch.randn(b.shape, generator=gen))
    return model


def ids():
    return [list(range(3, 40)), list(range(10, 30))]


def test_only_the_adapters_train_and_targets_are_wrapped(path):
    model = adapted(path)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    wrapped = {name.rsplit(".", 1)[1] for name, _ in lora_layers(model)}
    assert wrapped == set(SPEC.targets)
    assert len(list(lora_layers(model))) == 3 * model.arch.num_layers


def test_merge_unmerge_round_trip(path):
    model = adapted(path)
    adapter = Adapter(SPEC, adapter_state(model))
    base = {k: v.clone() for k, v in SafetensorsCheckpoint(path).items()}
    merged = merge_weights(base, adapter)
    for name, layer in lora_layers(model):
        layer.merge()
        torch.testing.assert_close(
            layer.base_layer.weight, merged[f"{name}.weight"], rtol=0, atol=1e-6
        )
        assert not torch.equal(merged[f"{name}.weight"], base[f"{name}.weight"])
        layer.unmerge()
        torch.testing.assert_close(
            layer.base_layer.weight, base[f"{name}.weight"], rtol=0, atol=1e-6
        )
    untouched = "model.layers.0.self_attn.k_proj.weight"
    assert merged[untouched] is base[untouched]


def test_engine_weights_from_merge_give_the_adapted_forward(path):
    """A plain Decoder loaded with merge(base, LoRA) (what an engine loads) computes what the
    adapted Decoder computes, dense and sparse; with adapters off the adapted one is the base."""
    from sparrow.sparse import get_preset

    model = adapted(path)
    plain = load_model(path)
    merged = load_model(path)
    merged.load_hf_state_dict(
        merge_weights(SafetensorsCheckpoint(path), Adapter(SPEC, adapter_state(model)))
    )
    schedule = get_preset("tiny-0.80")
    with torch.no_grad():
        for sched, lens in ((None, None), (schedule, [8, 6])):
            ours = teacher_forced_logits(model, ids(), lens, sched)
            theirs = teacher_forced_logits(merged, ids(), lens, sched)
            for a, b in zip(ours, theirs):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        with adapters_disabled(model):
            off = teacher_forced_logits(model, ids())
        base = teacher_forced_logits(plain, ids())
        on = teacher_forced_logits(model, ids())
    for a, b, c in zip(off, base, on):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        assert (c - b).abs().max() > 1e-3  # the adapter does change the forward


def test_adapter_save_read_and_load(path, tmp_path):
    model = adapted(path)
    adapter = Adapter(SPEC, adapter_state(model))
    adapter.save(tmp_path)
    again = Adapter.read(tmp_path)
    assert again.spec == SPEC and set(again.state) == set(adapter.state)
    other = attach_lora(load_model(path), SPEC, seed=5)
    load_adapter_state(other, again.state)
    for key, value in adapter_state(other).items():
        assert torch.equal(value, adapter.state[key])
    with pytest.raises(LoraError, match="do not fit"):
        load_adapter_state(other, {k: v for k, v in again.state.items() if "q_proj" not in k})


def test_spec_refuses_unknown_targets():
    with pytest.raises(LoraError, match="subset"):
        LoraSpec(rank=2, alpha=4, targets=("qkv",))
