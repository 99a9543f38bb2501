"""The compact decoder for the Qwen3 / Qwen2 / Llama families, over packed (varlen) batches.

    model = load_model("/models/Qwen3-1.7B")               # sparrow.model.loader
    hidden = model(input_ids, positions, causal_attention([5, 3]))   # [8, hidden]
    logits = model.compute_logits(hidden[[4, 7]])           # last token of each: [2, vocab]

input_ids and positions are flat [T] tensors holding any number of sequences end to end.
Attention is injected per call (`attention(layer_index, q, k, v)`, after q/k norm and RoPE),
so the decoder knows nothing of caches or paging: the engine's attention object writes and
reads its paged KV cache, dense or block-sparse (on GPU decode it hands each layer's
qk_norm_rope an opaque store target instead, so the write rides in that kernel: see
layers.AttentionFn). Parameter names are transformers' own
("model.layers.0.self_attn.q_proj.weight", "lm_head.weight"), so weights load and sync by
name with `load_hf_state_dict`. `model.fuse_projections()` (the engine calls it) stacks each
layer's q/k/v and gate/up weights into one tensor apiece, so a forward runs one GEMM per group;
names, state_dict and loading by name are unchanged. Tests: `python -m pytest
tests/model -q`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from sparrow.errors import SparrowError
from sparrow.kernels.linear import skinny_linear
from sparrow.model.config import ModelArch
from sparrow.model.fusion import FusableProjections
from sparrow.model.layers import AttentionFn, DecoderLayer, RMSNorm, Rotary
from sparrow.model.stream import Stream, read

# buffers some checkpoints carry that the decoder recomputes instead of loading
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(SparrowError, ValueError):
    """A state dict that does not fit the decoder; the message names the tensor."""


class DecoderBody(nn.Module):
    """Embedding, layers and final norm (transformers' `model.` prefix)."""

    def __init__(self, arch: ModelArch):
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)


class Decoder(nn.Module):
    """A decoder-only transformer; `arch` says which family and shape."""

    def __init__(self, arch: ModelArch):
        super().__init__()
        self.arch = arch
        self.model = DecoderBody(arch)
        self.rotary = Rotary(arch.head_dim, arch.rope_theta, arch.rope_scaling)
        if arch.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)

    def forward(self, input_ids: Tensor, positions: Tensor, attention: AttentionFn) -> Tensor:
        """Final-norm hidden states [T, hidden] for flat input_ids and positions [T]."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                "input_ids and positions must be flat [T] tensors of one shape, got "
                f"{tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        stream = Stream(x)
        for layer in self.model.layers:
            stream = layer(stream, cos, sin, attention)
        return read(self.model.norm.open(stream)[1])

    def fuse_projections(self) -> None:
        """Per layer, one weight tensor for q/k/v (and one bias with qkv_bias), one for gate/up.

        The nn.Linear parameters become views into them (same Parameter objects), so
        state_dict() and load_hf_state_dict keep working by transformers' names and update the
        fused tensors in place. Idempotent. Without autograd the forward runs one GEMM per
        group; when gradients are recorded for these parameters it runs them one by one, so
        gradients reach the named parameters. `.to()`, `.half()` and the like fuse anew. Fuse
        before capturing CUDA graphs: fusing moves the weights.
        """
        for module in self.modules():
            if isinstance(module, FusableProjections):
                module.fuse_projections()

    @property
    def projections_fused(self) -> bool:
        """Whether every layer's projections are fused and still view the fused tensors."""
        return all(
            module.projections_fused
            for module in self.modules()
            if isinstance(module, FusableProjections)
        )

    def output_embedding(self) -> Tensor:
        """The [vocab, hidden] matrix that maps hidden states to logits."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """Float32 logits [N, vocab] for hidden states [N, hidden]."""
        # the matmul runs in the weights' dtype, as transformers' lm_head does
        return skinny_linear(hidden, self.output_embedding()).float()

    @torch.no_grad()
    def load_hf_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True) -> None:
        """Copy weights in place from transformers-named tensors (dtype/device converted).

        strict=True: every parameter must be present. strict=False allows a partial update.
        Either way an unknown name or a shape mismatch is a WeightLoadError and nothing is
        half-copied: all names and shapes are checked before the first copy. A tied model
        accepts (and skips) "lm_head.weight", which transformers' state_dict() repeats.
        """
        params = dict(self.named_parameters())
        plan: list[tuple[Tensor, str]] = []
        for name in state_dict.keys():
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue
            if name not in params:
                raise WeightLoadError(f"unexpected tensor {name!r} for a {self.arch.family} model")
            plan.append((params[name], name))
        if strict:
            missing = sorted(set(params) - {name for _, name in plan})
            if missing:
                shown = ", ".join(repr(n) for n in missing[:5])
                more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
                raise WeightLoadError(f"missing tensor {shown}{more}")
        for param, name in plan:
            shape = tuple(_shape(state_dict, name))
            if shape != tuple(param.shape):
                raise WeightLoadError(
                    f"tensor {name!r} has shape {shape}, the model expects {tuple(param.shape)}"
                )
        for param, name in plan:
            param.copy_(state_dict[name])


def _shape(state_dict: Mapping[str, Tensor], name: str) -> tuple[int, ...]:
    """A tensor's shape without reading it, when the mapping can tell (lazy checkpoints)."""
    shape_of = getattr(state_dict, "shape_of", None)
    return tuple(shape_of(name)) if shape_of is not None else tuple(state_dict[name].shape)
