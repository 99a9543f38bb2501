"""The decoder on a CUDA device: fp32 equals transformers, bf16 stays close (marked gpu)."""

from __future__ import annotations

import pytest
import torch

from sparrow.model import causal_attention, load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _packed(model, sequences):
    device = model.output_embedding().device
    ids = torch.cat(sequences).to(device)
    positions = torch.cat([torch.arange(len(s)) for s in sequences]).to(device)
    with torch.no_grad():
        hidden = model(ids, positions, causal_attention([len(s) for s in sequences]))
        return model.compute_logits(hidden).cpu()


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.15)])
def test_cuda_logits_match_transformers(any_checkpoint, dtype, atol):
    from transformers import AutoModelForCausalLM

    model = load_model(any_checkpoint, dtype=dtype, device="cuda")
    assert model.output_embedding().is_cuda
    reference = (
        AutoModelForCausalLM.from_pretrained(
            any_checkpoint, attn_implementation="eager", dtype=dtype
        )
        .to("cuda")
        .eval()
    )
    generator = torch.Generator().manual_seed(0)
    sequences = [
        torch.randint(0, model.arch.vocab_size, (n,), generator=generator) for n in (9, 4, 30)
    ]
    ours = _packed(model, sequences)
    with torch.no_grad():
        theirs = torch.cat([reference(s[None].cuda()).logits[0].float().cpu() for s in sequences])
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)
