"""Building blocks of the decoder: RMSNorm, rotary embedding, attention projections, MLP.

Everything works on a flat batch of tokens [T, ...] (several sequences packed end to end);
nothing here knows about sequences, caches or pages. Numerics follow transformers' Qwen3 /
Qwen2 / Llama modules (RMSNorm in float32, RoPE angles in float32 then cast, rotate-half
layout) so that logits agree with the trainer's model. Without autograd on CUDA the
elementwise work runs in fused Triton kernels of the same numerics (sparrow_core/kernels:
rms_norm with the residual add, qk_norm_rope, silu_mul; a handful of launches per layer
instead of about fifty); elsewhere, and whenever gradients are recorded, in PyTorch. The
projections of a decode batch (up to 64 rows) run in kernels/linear.py's skinny kernel,
down_proj reading the SwiGLU gate in; larger batches, autograd and wrapped (LoRA) modules
go through F.linear or the module itself. Both
residual adds ride in the next norm's kernel (DecoderLayer leaves the MLP's add pending).
An attention fn may offer a KV store target (AttentionFn's optional `kv_store`; the engine's
GPU decode does): SelfAttention hands it to qk_norm_rope unopened, which then also writes
the rotated k and v to the cache, so this module still knows nothing of pages.

Projection fusion (`fuse_projections()`, called for the whole model by
Decoder.fuse_projections): q/k/v rows share one weight tensor, gate/up rows another, and the
nn.Linear parameters become views into them, so one GEMM serves each group while names,
state_dict and in-place loads stay those of transformers. Under autograd the views run as
separate Linears (gradients land on the named parameters); a cast or move re-fuses (`_apply`).
Run the checks with `python -m pytest tests/sparrow_core/model tests/sparrow_core/kernels -q`.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch
from torch import Tensor, nn

from sparrow_core.errors import SparrowError
from sparrow_core.kernels.linear import skinny_linear
from sparrow_core.kernels.qk_norm_rope import qk_norm_rope
from sparrow_core.kernels.rms_norm import rms_norm
from sparrow_core.kernels.silu_mul import silu_mul
from sparrow_core.model.config import Llama3RopeScaling, ModelArch

# attention(layer_index, q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D]) -> [T, Hq, D].
# Optional: a method `kv_store(layer_index) -> kernels.kv_write.KVStore | None`, asked once
# per layer before q/k norm and RoPE. A KVStore (an opaque target here) is where qk_norm_rope
# stores the layer's rotated k and v in its own launch, so the attention call that follows
# must not store them again; None, or no such method: the attention call stores them.
AttentionFn = Callable[[int, Tensor, Tensor, Tensor], Tensor]
# the projection groups that fuse_projections() stacks into one weight each
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def project(linear: nn.Module, x: Tensor) -> Tensor:
    """linear(x), through the skinny decode kernel when linear is a plain nn.Linear (a
    wrapped one, e.g. with a LoRA adapter, runs its own forward)."""
    if type(linear) is nn.Linear:
        return skinny_linear(x, linear.weight, linear.bias)
    return linear(x)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, computed in float32 and cast back."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: Tensor, delta: Tensor | None) -> tuple[Tensor, Tensor]:
        """(norm(x + delta), x + delta), the sum rounded to x's dtype first: one kernel on GPU.
        delta None (nothing pending): (norm(x), x)."""
        if delta is None:
            return self(x), x
        return rms_norm(x, self.weight, self.eps, residual=delta)


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None
) -> Tensor:
    """Per-pair inverse frequencies [head_dim / 2] in float32, llama3 scaling applied."""
    # explicit cpu: the decoder may be built under a meta-device context
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
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


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T, H, D] rotated by the angles in cos/sin [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FusionError(SparrowError, ValueError):
    """Projections that cannot share one weight tensor; the message names them."""


class FusedRows:
    """One weight (and bias) tensor holding the output rows of several nn.Linear, in order.

    The Linears keep their Parameter objects; only `.data` is re-pointed at row slices of the
    fused tensor, so optimizers, state_dict() and in-place copies by name all reach it.
    """

    def __init__(self, names: tuple[str, ...], linears: tuple[nn.Linear, ...]):
        _check_fusable(names, linears)
        self.linears = linears
        self.rows = tuple(linear.out_features for linear in linears)
        # a normal tensor even inside inference_mode: the views may later join autograd
        with torch.no_grad(), torch.inference_mode(False):
            self.weight = torch.cat([linear.weight.detach() for linear in linears])
            has_bias = linears[0].bias is not None
            self.bias = (torch.cat([linear.bias.detach() for linear in linears])
                         if has_bias else None)
        start = 0
        for linear, rows in zip(linears, self.rows):
            linear.weight.data = self.weight[start:start + rows]
            if has_bias:
                linear.bias.data = self.bias[start:start + rows]
            start += rows

    def serves(self, linears: tuple[nn.Module, ...]) -> bool:
        """Whether these are still the fused Linears, each parameter still its slice."""
        if any(now is not then for now, then in zip(linears, self.linears)):
            return False
        start = 0
        for linear, rows in zip(linears, self.rows):
            if not (_is_slice(linear.weight, self.weight, start, rows)
                    and (self.bias is None or _is_slice(linear.bias, self.bias, start, rows))):
                return False
            start += rows
        return True


def _is_slice(param: Tensor, fused: Tensor, start: int, rows: int) -> bool:
    offset = start * fused.stride(0) * fused.element_size()
    return (param.data_ptr() == fused.data_ptr() + offset and param.shape[0] == rows
            and param.dtype == fused.dtype and param.device == fused.device)


def _check_fusable(names: tuple[str, ...], linears: tuple[nn.Module, ...]) -> None:
    for name, linear in zip(names, linears):
        if type(linear) is not nn.Linear:
            raise FusionError(f"{name} is a {type(linear).__name__}, not a plain nn.Linear: fuse "
                              "projections before wrapping them (LoRA adapters and the like)")
    kinds = {name: (str(linear.weight.dtype), str(linear.weight.device), linear.in_features,
                    linear.bias is not None) for name, linear in zip(names, linears)}
    if len(set(kinds.values())) > 1:
        shown = "; ".join(f"{name} {kind}" for name, kind in kinds.items())
        raise FusionError(f"cannot fuse {', '.join(names)}: they differ in (dtype, device, "
                          f"inputs, bias): {shown}")


class FusableProjections(nn.Module):
    """A module whose groups of nn.Linear children (FUSED_GROUPS) can share one weight each."""

    # each group: child names whose output rows are stacked, in this order
    FUSED_GROUPS: tuple[tuple[str, ...], ...] = ()

    def __init__(self):
        super().__init__()
        self._fused: dict[tuple[str, ...], FusedRows] = {}

    def fuse_projections(self) -> None:
        """Fuse every group (idempotent; a group whose sharing was broken is fused anew)."""
        for names in self.FUSED_GROUPS:
            linears = tuple(getattr(self, name) for name in names)
            current = self._fused.get(names)
            if current is None or not current.serves(linears):
                self._fused[names] = FusedRows(names, linears)

    @property
    def projections_fused(self) -> bool:
        """Whether every group is fused and its Linears still view the fused tensors."""
        return all(names in self._fused and self._fused[names].serves(
            tuple(getattr(self, name) for name in names)) for names in self.FUSED_GROUPS)

    def fused_linear(self, names: tuple[str, ...], x: Tensor) -> Tensor | None:
        """x through the group's fused weight [.., sum of rows], or None: run them one by one
        (not fused; autograd must reach the named parameters; sharing was broken)."""
        fused = self._fused.get(names)
        if fused is None:
            return None
        linears = tuple(getattr(self, name) for name in names)
        if not fused.serves(linears):
            warnings.warn(f"{'/'.join(names)} no longer view their fused weight (a parameter "
                          "or module was replaced); running them unfused until "
                          "fuse_projections() is called again", RuntimeWarning, stacklevel=3)
            return None
        if torch.is_grad_enabled() and any(
                p.requires_grad for linear in linears for p in linear.parameters()):
            return None
        return skinny_linear(x, fused.weight, fused.bias)

    def _apply(self, fn, recurse=True):
        # .to() / .half() / to_empty() give every parameter its own new tensor: fuse again
        result = super()._apply(fn, recurse)
        if self._fused:
            self.fuse_projections()
        return result


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

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attention: AttentionFn) -> Tensor:
        tokens = x.shape[0]
        qkv = self.fused_linear(QKV, x)
        if qkv is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:  # views of one [T, q + 2 kv] output; their rows are strided, not copied
            q, k, v = qkv.split(self.split_sizes, dim=-1)
        q = q.view(tokens, self.num_q_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        norm = ((self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
                if self.q_norm is not None else (None, None, 0.0))
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
        return project(self.o_proj, out.reshape(tokens, self.num_q_heads * self.head_dim))


class MLP(FusableProjections):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    FUSED_GROUPS = (GATE_UP,)

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.fused_linear(GATE_UP, x)
        if gate_up is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        elif type(self.down_proj) is nn.Linear:  # the gate read in by down's kernel
            return skinny_linear(gate_up, self.down_proj.weight, self.down_proj.bias, gated=True)
        else:  # the two halves as strided views: silu_mul takes any row stride
            gate, up = gate_up.split(self.up_proj.out_features, dim=-1)
        return self.down_proj(silu_mul(gate, up))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)), the last add left pending.

    `layer(x, delta, cos, sin, attention)` -> (x, mlp output), where delta is the previous
    layer's pending MLP output (None for the first): the next input norm or the final norm
    adds it in its own kernel (add_and_norm); the block's output is `x + delta`, bit for bit.
    """

    def __init__(self, arch: ModelArch, layer_index: int):
        super().__init__()
        self.self_attn = SelfAttention(arch, layer_index)
        self.mlp = MLP(arch.hidden_size, arch.intermediate_size)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, x: Tensor, delta: Tensor | None, cos: Tensor, sin: Tensor,
                attention: AttentionFn) -> tuple[Tensor, Tensor]:
        # the previous layer's MLP residual add, in this norm's kernel
        normed, x = self.input_layernorm.add_and_norm(x, delta)
        attended = self.self_attn(normed, cos, sin, attention)
        normed, x = self.post_attention_layernorm.add_and_norm(x, attended)
        return x, self.mlp(normed)
