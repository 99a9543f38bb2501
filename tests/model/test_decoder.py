"""The decoder's logits over packed batches against transformers' model, sequence by sequence."""

from __future__ import annotations

import pytest
import torch

from sparrow.model import causal_attention, load_model, read_arch

ATOL = 1e-4


def _hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    ).eval()


def _random_sequences(lengths, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]


def _packed_logits(model, sequences, offsets=None):
    offsets = offsets or [0] * len(sequences)
    ids = torch.cat(sequences)
    positions = torch.cat(
        [torch.arange(n) + o for n, o in zip((len(s) for s in sequences), offsets)]
    )
    with torch.no_grad():
        hidden = model(ids, positions, causal_attention([len(s) for s in sequences]))
        return model.compute_logits(hidden)


@pytest.mark.parametrize("lengths", [[7, 3, 19], [1, 33]])
def test_packed_logits_equal_transformers_per_sequence(any_checkpoint, lengths):
    model = load_model(any_checkpoint)
    reference = _hf_model(any_checkpoint)
    sequences = _random_sequences(lengths, model.arch.vocab_size, seed=sum(lengths))
    ours = _packed_logits(model, sequences)
    with torch.no_grad():
        theirs = torch.cat([reference(s[None]).logits[0] for s in sequences]).float()
    assert ours.dtype == torch.float32
    assert ours.shape == (sum(lengths), model.arch.vocab_size)
    # order-one logits, so a tolerance of 1e-4 is a real check
    assert theirs.std() > 0.5
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_llama3_scaling_reaches_long_positions(llama_checkpoint):
    # positions past original_max_position_embeddings (64), where the scaling matters most
    model = load_model(llama_checkpoint)
    reference = _hf_model(llama_checkpoint)
    (sequence,) = _random_sequences([150], model.arch.vocab_size, seed=5)
    ours = _packed_logits(model, [sequence])
    with torch.no_grad():
        theirs = reference(sequence[None]).logits[0]
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_positions_matter(qwen3_checkpoint):
    # RoPE is relative, so a uniform shift changes nothing, but a gap inside the sequence
    # changes the later logits beyond the tolerance above: the comparisons would see a RoPE bug
    model = load_model(qwen3_checkpoint)
    (sequence,) = _random_sequences([12], model.arch.vocab_size, seed=6)
    plain = _packed_logits(model, [sequence])
    shifted = _packed_logits(model, [sequence], offsets=[7])
    torch.testing.assert_close(plain, shifted, atol=1e-4, rtol=0)
    gapped_positions = torch.arange(12)
    gapped_positions[6:] += 5
    with torch.no_grad():
        gapped = model.compute_logits(model(sequence, gapped_positions, causal_attention([12])))
    torch.testing.assert_close(plain[:6], gapped[:6], atol=1e-5, rtol=0)
    assert (plain[6:] - gapped[6:]).abs().max() > 100 * ATOL


def test_packing_does_not_leak_between_sequences(qwen3_gqa3_checkpoint):
    model = load_model(qwen3_gqa3_checkpoint)
    first, second = _random_sequences([9, 6], model.arch.vocab_size, seed=7)
    packed = _packed_logits(model, [first, second])
    alone = _packed_logits(model, [second])
    torch.testing.assert_close(packed[9:], alone, atol=1e-5, rtol=0)


def test_attention_receives_rotated_heads_of_the_right_shapes(qwen3_gqa3_checkpoint):
    arch = read_arch(qwen3_gqa3_checkpoint)
    model = load_model(qwen3_gqa3_checkpoint)
    dense = causal_attention([4])
    seen = []

    def spy(layer_index, q, k, v):
        seen.append((layer_index, tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return dense(layer_index, q, k, v)

    model(torch.arange(4), torch.arange(4), spy)
    q_shape = (4, arch.num_q_heads, arch.head_dim)
    kv_shape = (4, arch.num_kv_heads, arch.head_dim)
    assert seen == [(i, q_shape, kv_shape, kv_shape) for i in range(arch.num_layers)]
    assert arch.group_size == 3


def test_attention_with_a_wrong_output_shape_is_an_error(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    with pytest.raises(ValueError, match="layer 0 returned shape"):
        model(torch.arange(3), torch.arange(3), lambda i, q, k, v: q[:, :1])
