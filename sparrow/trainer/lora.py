"""The DistillSparse LoRA: peft adapters on the engine's Decoder, saved and merged by name.

    spec = LoraSpec(rank=16, alpha=32, targets=("q_proj", "v_proj"))
    model = attach_lora(load_model(path), spec, seed=0)   # base frozen, adapters trainable
    load_base(model, trainer.state_dict_for_sync())       # the base follows the policy
    with adapters_disabled(model): ...                    # the plain base (dense target)
    adapter = Adapter(spec, adapter_state(model))         # plain tensors, transformers names
    adapter.save(folder); adapter = Adapter.read(folder)
    merged = merge_weights(base_state, adapter)           # what the rollout engines load

The adapters live on the engine's own Decoder (sparrow/model/decoder.py) before any
projection fusion, so the teacher-forced block-sparse forward (engine/teacher_forced.py) runs
them exactly as the engine runs the merged weights; the layers run a wrapped module as a
module (layers.py). peft's LoRA: y = W x + (alpha / rank) * B A x, A random (kaiming, from
`seed`), B zero, so a fresh adapter changes nothing. An Adapter names its tensors
"<module>.lora_A.weight" [rank, in] and "<module>.lora_B.weight" [out, rank], <module> the
transformers name of the projection ("model.layers.0.self_attn.q_proj"); merge_weights gives,
per targeted weight W (fp32), W + scaling * B @ A and every other tensor untouched, lazily, so
a checkpoint is read one tensor at a time. Only the rollout engines ever load merged weights:
the trainer and the dense scorer keep the base. Tests: tests/trainer/test_lora.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from sparrow.errors import SparrowError

ADAPTER_FILE = "adapter.safetensors"
ADAPTER_CONFIG = "adapter.json"
# the projections a Decoder layer holds (transformers' names)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PEFT_NAME = "default"


class LoraError(SparrowError, ValueError):
    """An adapter that does not fit its model or its own settings; the message says which."""


@dataclass(frozen=True)
class LoraSpec:
    """Rank, alpha and target projections (short names) of the adapter."""

    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = PROJECTIONS

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.rank < 1:
            raise LoraError(f"LoRA rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise LoraError(f"LoRA alpha must be > 0, got {self.alpha}")
        unknown = sorted(set(self.targets) - set(PROJECTIONS))
        if unknown or not self.targets:
            raise LoraError(
                f"LoRA targets {list(self.targets)} must be a non-empty subset of "
                f"{', '.join(PROJECTIONS)}"
            )

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def attach_lora(model: nn.Module, spec: LoraSpec, seed: int = 0) -> nn.Module:
    """Inject adapters into `model` in place (unfused projections), freeze everything else."""
    from peft import LoraConfig, inject_adapter_in_model

    if getattr(model, "projections_fused", False):
        raise LoraError("attach the LoRA to a Decoder whose projections are not fused")
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.targets),
        lora_dropout=0.0,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # A's init; the caller's generator is left as it was
        inject_adapter_in_model(config, model, adapter_name=_PEFT_NAME)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    return model


def lora_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(transformers module name, peft LoRA layer) for every adapted projection."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for n, p in model.named_parameters() if ".lora_" in n]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """The plain base inside the block (no merge: the weights are not touched)."""
    layers = [module for _, module in lora_layers(model)]
    for module in layers:
        module.enable_adapters(False)
    try:
        yield model
    finally:
        for module in layers:
            module.enable_adapters(True)


def base_name(parameter_name: str) -> str:
    """ "...q_proj.base_layer.weight" -> "...q_proj.weight" (transformers' name)."""
    return parameter_name.replace(".base_layer.", ".")


@torch.no_grad()
def load_base(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy the base weights in place from transformers-named tensors (all of them must be
    there; a tied model skips "lm_head.weight"); adapters are left alone."""
    params = {base_name(n): p for n, p in model.named_parameters() if ".lora_" not in n}
    missing = sorted(set(params) - set(state_dict))
    if missing:
        raise LoraError(f"base weights lack {missing[:5]} ({len(missing)} missing)")
    for name, param in params.items():
        source = state_dict[name]
        if tuple(source.shape) != tuple(param.shape):
            raise LoraError(
                f"base tensor {name!r} has shape {tuple(source.shape)}, the model "
                f"expects {tuple(param.shape)}"
            )
        param.copy_(source)


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached fp32 copies of A and B per adapted projection, on the CPU."""
    out = {}
    for name, module in lora_layers(model):
        out[f"{name}.lora_A.weight"] = module.lora_A[_PEFT_NAME].weight.detach().float().cpu()
        out[f"{name}.lora_B.weight"] = module.lora_B[_PEFT_NAME].weight.detach().float().cpu()
    return out


@torch.no_grad()
def load_adapter_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    layers = dict(lora_layers(model))
    expected = {f"{n}.lora_{s}.weight" for n in layers for s in "AB"}
    if set(state) != expected:
        extra, missing = sorted(set(state) - expected), sorted(expected - set(state))
        raise LoraError(
            f"adapter tensors do not fit the model: unexpected {extra[:3]}, missing {missing[:3]}"
        )
    for name, module in layers.items():
        module.lora_A[_PEFT_NAME].weight.copy_(state[f"{name}.lora_A.weight"])
        module.lora_B[_PEFT_NAME].weight.copy_(state[f"{name}.lora_B.weight"])


@dataclass(frozen=True)
class Adapter:
    """A LoRA as plain tensors: what the distill stage saves and the engines merge."""

    spec: LoraSpec
    state: Mapping[str, torch.Tensor]

    def delta(self, module: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """scaling * B @ A in fp32 for one adapted projection (its weight's shape)."""
        a = self.state[f"{module}.lora_A.weight"].to(device, torch.float32)
        b = self.state[f"{module}.lora_B.weight"].to(device, torch.float32)
        return (b @ a) * self.spec.scaling

    @property
    def modules(self) -> list[str]:
        return sorted({k.rsplit(".lora_", 1)[0] for k in self.state})

    def save(self, folder: str | Path) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        save_file({k: v.contiguous() for k, v in self.state.items()}, str(folder / ADAPTER_FILE))
        (folder / ADAPTER_CONFIG).write_text(
            json.dumps(
                {
                    "rank": self.spec.rank,
                    "alpha": self.spec.alpha,
                    "targets": list(self.spec.targets),
                    "modules": self.modules,
                },
                indent=2,
            )
        )
        return folder

    @classmethod
    def read(cls, folder: str | Path) -> Adapter:
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / ADAPTER_FILE).is_file() or not (folder / ADAPTER_CONFIG).is_file():
            raise LoraError(f"{folder} holds no adapter ({ADAPTER_FILE}, {ADAPTER_CONFIG})")
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
        spec = LoraSpec(int(config["rank"]), float(config["alpha"]), tuple(config["targets"]))
        return cls(spec, load_file(str(folder / ADAPTER_FILE)))


class MergedWeights(Mapping[str, torch.Tensor]):
    """base with W + scaling * B @ A for every adapted weight, computed on access in fp32."""

    def __init__(self, base: Mapping[str, torch.Tensor], adapter: Adapter):
        self.base, self.adapter = base, adapter
        self._adapted = {f"{m}.weight": m for m in adapter.modules}
        missing = sorted(set(self._adapted) - set(base))
        if missing:
            raise LoraError(f"the adapter targets weights the base lacks: {missing[:3]}")

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self.base[name]
        module = self._adapted.get(name)
        if module is None:
            return tensor
        return tensor.float() + self.adapter.delta(module, tensor.device)

    def shape_of(self, name: str) -> tuple[int, ...]:
        shape_of = getattr(self.base, "shape_of", None)
        return tuple(shape_of(name)) if shape_of else tuple(self.base[name].shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


def merge_weights(
    base: Mapping[str, torch.Tensor], adapter: Adapter | None
) -> Mapping[str, torch.Tensor]:
    """The weights a rollout engine loads: base + the adapter's deltas (base when None)."""
    return base if adapter is None else MergedWeights(base, adapter)


def merged_for_engine(
    base: Mapping[str, torch.Tensor], adapter: Adapter, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """base with every adapted weight merged (fp32) and cast to `dtype`, held as tensors: for
    packers that read a mapping twice (engine/weight_share.py); the rest are base's own."""
    out = dict(base)
    for module in adapter.modules:
        name = f"{module}.weight"
        out[name] = (base[name].float() + adapter.delta(module, base[name].device)).to(dtype)
    return out
