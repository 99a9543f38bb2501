"""Building blocks of the decoder: RMSNorm, rotary embedding, attention projections, MLP.

Everything works on a flat batch of tokens [T, ...] (several sequences packed end to end);
nothing here knows about sequences, caches or pages. Numerics follow transformers' Qwen3 /
Qwen2 / Llama modules (RMSNorm in float32, RoPE angles in float32 then cast, rotate-half
layout) so that logits agree with the trainer's model. Without autograd on CUDA the
elementwise work runs in fused Triton kernels of the same numerics (sparrow/kernels:
rms_norm with the residual add, qk_norm_rope, silu_mul); elsewhere, and whenever gradients
are recorded, in PyTorch. Between sublayers the residual stream travels as a
`stream.Stream`: a decode batch of up to 16 rows runs its projections in kernels/linear.py's
skinny kernel, which also applies the RMSNorm before q/k/v and gate/up as it reads x and
does the residual adds after o_proj and down_proj as it writes (down_proj reading the
SwiGLU gate in), so a layer has no norm or add launch of its own; larger batches, autograd
and wrapped (LoRA) modules run the norm kernel (the pending add in it) and F.linear or the
module itself. An attention fn may offer a KV store target (AttentionFn's optional
`kv_store`; the engine's GPU decode does): SelfAttention hands it to qk_norm_rope unopened,
which then also writes the rotated k and v to the cache, so this module still knows nothing
of pages. q/k/v and gate/up share one weight tensor each once fused (model/fusion.py).
Run the checks with `python -m pytest tests/model tests/kernels -q`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from sparrow.kernels.qk_norm_rope import qk_norm_rope
from sparrow.kernels.rms_norm import rms_norm
from sparrow.kernels.silu_mul import silu_mul
from sparrow.model.config import Llama3RopeScaling, ModelArch
from sparrow.model.fusion import GATE_UP, QKV, FusableProjections
from sparrow.model.stream import Normed, Stream, add_linear, open_stream, read

# attention(layer_index, q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D]) -> [T, Hq, D].
# Optional: a method `kv_store(layer_index) -> kernels.kv_write.KVStore | None`, asked once
# per layer before q/k norm and RoPE. A KVStore (an opaque target here) is where qk_norm_rope
# stores the layer's rotated k and v in its own launch, so the attention call that follows
# must not store them again; None, or no such method: the attention call stores them.
AttentionFn = Callable[[int, Tensor, Tensor, Tensor], Tensor]


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, computed in float32 and cast back."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)

    def open(self, stream: Stream) -> tuple[Tensor, Tensor | Normed]:
        """(the stream's x with any pending add done, norm(x)), the norm possibly left to
        the next projection's kernel (a Normed; see model/stream.py)."""
        return open_stream(stream, self.weight, self.eps)


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None
) -> Tensor:
    """Per-pair inverse frequencies [head_dim / 2] in float32, llama3 scaling applied."""
    # explicit cpu: the decoder may be built under a meta-device context
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    # llama3: long wavelengths slow down by `factor`, short ones stay, the band between blends
    context = scaling.original_max_position_embeddings
    low_freq_wavelen = context / scaling.low_freq_factor
    high_freq_wavelen = context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    slowed = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * slowed / scaling.factor + smooth * slowed
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, slowed)


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half layout) from explicit positions.

    The inverse frequencies are kept out of the module's buffers so that `.to(bfloat16)`
    never rounds them; angles are computed in float32 for every call, then cast.
    """

    def __init__(self, head_dim: int, theta: float, scaling: Llama3RopeScaling | None):
        super().__init__()
        self._inv_freq = rope_inverse_frequencies(head_dim, theta, scaling)
        self._by_device: dict[torch.device, Tensor] = {}

    def inverse_frequencies(self, device: torch.device) -> Tensor:
        if device not in self._by_device:
            self._by_device[device] = self._inv_freq.to(device)
        return self._by_device[device]

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin [T, 1, head_dim] for positions [T], in `dtype`."""
        angles = positions.float()[:, None] * self.inverse_frequencies(positions.device)[None, :]
        angles = torch.cat((angles, angles), dim=-1)[:, None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)


class SelfAttention(FusableProjections):
    """Q/K/V projections, optional per-head q/k RMSNorm, RoPE; attention itself is injected."""

    FUSED_GROUPS = (QKV,)

    def __init__(self, arch: ModelArch, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_q_heads = arch.num_q_heads
        self.num_kv_heads = arch.num_kv_heads
        self.head_dim = arch.head_dim
        q_size, kv_size = arch.num_q_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        self.q_proj = nn.Linear(arch.hidden_size, q_size, bias=arch.qkv_bias)
        self.k_proj = nn.Linear(arch.hidden_size, kv_size, bias=arch.qkv_bias)
        self.v_proj = nn.Linear(arch.hidden_size, kv_size, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(q_size, arch.hidden_size, bias=arch.o_proj_bias)
        if arch.qk_norm:
            self.q_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps)
            self.k_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self, x: Tensor | Normed, cos: Tensor, sin: Tensor, attention: AttentionFn, residual: Tensor
    ) -> Stream:
        """The stream residual + o_proj(attention(q, k, v)) for rows x (or norm(x))."""
        qkv = self.fused_linear(QKV, x)
        if qkv is None:
            x = read(x)
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:  # views of one [T, q + 2 kv] output; their rows are strided, not copied
            q, k, v = qkv.split(self.split_sizes, dim=-1)
        tokens = q.shape[0]
        q = q.view(tokens, self.num_q_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        norm = (
            (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            if self.q_norm is not None
            else (None, None, 0.0)
        )
        offer = getattr(attention, "kv_store", None)  # optional: see AttentionFn
        store = None if offer is None else offer(self.layer_index)
        q, k = qk_norm_rope(q, k, cos, sin, *norm, v=None if store is None else v, store=store)
        out = attention(self.layer_index, q, k, v)
        expected = (tokens, self.num_q_heads, self.head_dim)
        if tuple(out.shape) != expected:
            raise ValueError(
                f"attention for layer {self.layer_index} returned shape {tuple(out.shape)}, "
                f"expected {expected}"
            )
        return add_linear(
            residual, out.reshape(tokens, self.num_q_heads * self.head_dim), self.o_proj
        )


class MLP(FusableProjections):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    FUSED_GROUPS = (GATE_UP,)

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor | Normed, residual: Tensor) -> Stream:
        """The stream residual + down(silu(gate(x)) * up(x)) for rows x (or norm(x))."""
        gate_up = self.fused_linear(GATE_UP, x)
        if gate_up is None:
            x = read(x)
            return add_linear(
                residual, silu_mul(self.gate_proj(x), self.up_proj(x)), self.down_proj
            )
        return add_linear(residual, gate_up, self.down_proj, gated=True)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)).

    `layer(stream, cos, sin, attention)` -> the next stream (model/stream.py): the block's
    output is its x plus any pending delta, which the next norm adds in its own kernel.
    """

    def __init__(self, arch: ModelArch, layer_index: int):
        super().__init__()
        self.self_attn = SelfAttention(arch, layer_index)
        self.mlp = MLP(arch.hidden_size, arch.intermediate_size)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, stream: Stream, cos: Tensor, sin: Tensor, attention: AttentionFn) -> Stream:
        x, normed = self.input_layernorm.open(stream)
        stream = self.self_attn(normed, cos, sin, attention, residual=x)
        x, normed = self.post_attention_layernorm.open(stream)
        return self.mlp(normed, residual=x)
