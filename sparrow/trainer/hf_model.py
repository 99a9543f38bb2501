"""The trainer's transformers model: loading it, its device and dtype, activation
checkpointing, and moving the trainer's state between the GPU and host memory.

    model = load_hf_model(path, resolve_device("auto"))
    model = empty_hf_model(path)                       # parameters on meta, for FSDP to shard
    for file, names in checkpoint_parts(path, model.state_dict(), tied_names(model)):
        part = read_part(path, file, names)            # one file's tensors, fp32, host
    enable_checkpointing(model)
    move_state(model, optimizer, torch.device("cpu"), stash)   # offload into a HostStash
    move_state(model, optimizer, device)                       # onload

Used by PolicyTrainer (rl/trainer.py); docs/trainer.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from sparrow.rl.checks import RLInputError
from sparrow.trainer.host_stash import HostStash

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise RLInputError(f"dtype {dtype!r} is unknown; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_hf_model(path: Path, device: torch.device) -> torch.nn.Module:
    """The checkpoint's causal LM in fp32 with SDPA attention, kept in eval mode: RL updates
    run without dropout, so scoring and the update's forward are the same computation."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path),
        attn_implementation="sdpa",
        local_files_only=True,
        **{dtype_key: torch.float32},
    )
    return model.to(device).eval()


def empty_hf_model(path: Path) -> torch.nn.Module:
    """The checkpoint's causal LM as load_hf_model makes it, with its parameters on the meta
    device (no memory, no values) and its buffers (rotary frequencies) real: for FSDP to shard
    before any weight is read (ShardedPolicyTrainer, then checkpoint_parts / read_part on one
    rank)."""
    import transformers
    from accelerate import init_empty_weights

    config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    with init_empty_weights(include_buffers=False):
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation="sdpa", **{dtype_key: torch.float32}
        )
    model.tie_weights()  # from_pretrained ties a tied output embedding; from_config does not
    return model.eval()


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """State-dict names that hold the same tensor as an earlier name (a tied output
    embedding: {"lm_head.weight": "model.embed_tokens.weight"})."""
    first: dict[int, str] = {}
    tied = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            tied[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return tied


def checkpoint_parts(path: Path, keys, tied: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    """The model's state-dict `keys` grouped by the checkpoint file that holds them, each as
    (file, {key: name in the file}); a name in `tied` (tied_names) missing from the files is
    read as the name it is tied to. From model.safetensors, or the shards
    model.safetensors.index.json names, in file order. Reads the index or the file's header
    only. RLInputError naming what is absent."""
    import json

    from safetensors import safe_open

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        where = json.loads(index.read_text())["weight_map"]
    elif (path / "model.safetensors").is_file():
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            where = {name: "model.safetensors" for name in f.keys()}
    else:
        raise RLInputError(f"{path}: no model.safetensors or model.safetensors.index.json")
    source = {k: (k if k in where else tied.get(k)) for k in keys}
    missing = sorted(k for k, v in source.items() if v not in where)
    if missing:
        raise RLInputError(
            f"{path}: the checkpoint lacks {len(missing)} tensors the model has, e.g. {missing[:3]}"
        )
    parts: dict[str, dict[str, str]] = {}
    for key, name in source.items():
        parts.setdefault(where[name], {})[key] = name
    return sorted(parts.items())


def read_part(path: Path, file: str, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """One checkpoint_parts entry's tensors in fp32 on the host, under the model's names (a
    tied name shares its tensor)."""
    from safetensors import safe_open

    read: dict[str, torch.Tensor] = {}
    with safe_open(str(Path(path) / file), "pt") as f:
        for name in set(names.values()):
            read[name] = f.get_tensor(name).to(torch.float32)
    return {key: read[name] for key, name in names.items()}


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer in the backward instead of keeping its activations.
    transformers checkpoints only in training mode, so the model is put in it with every
    dropout at 0: the forward stays the same computation as scoring's (eval mode)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for key in ("attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop"):
        if hasattr(model.config, key):
            setattr(model.config, key, 0.0)
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()


def state_slots(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> list[tuple[torch.Tensor, list[Callable[[torch.Tensor], None]]]]:
    """Every tensor an offload moves (the optimizer's parameters, i.e. the fp32 masters if
    any, the model's parameters, AdamW's moments, the buffers), each once, with the setters
    that point its owners at another tensor (a parameter keeps its object: `.data`)."""
    slots: dict[int, tuple[torch.Tensor, list]] = {}

    def add(tensor: torch.Tensor, setter: Callable[[torch.Tensor], None]) -> None:
        slots.setdefault(id(tensor), (tensor, []))[1].append(setter)

    trained = [p for group in optimizer.param_groups for p in group["params"]]
    for param in trained + list(model.parameters()):
        if id(param) in slots:
            continue
        add(param, lambda new, param=param: setattr(param, "data", new))
        for key, value in optimizer.state.get(param, {}).items():
            if torch.is_tensor(value) and value.dim() > 0:  # "step" stays a host scalar
                add(
                    value,
                    lambda new, state=optimizer.state[param], key=key: state.update({key: new}),
                )
    for owner in model.modules():
        for name, buffer in owner._buffers.items():
            if buffer is not None:
                add(buffer, lambda new, owner=owner, name=name: owner._buffers.update({name: new}))
    return list(slots.values())


@torch.no_grad()
def move_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    stash: HostStash | None = None,
) -> None:
    """state_slots' tensors to `device`, in place (the optimizer keeps its parameter objects).
    To the host through `stash` (rl/host_stash.py: one page-locked buffer, reused), complete
    on return; to a GPU, copies queued on the current stream from that page-locked memory,
    so this returns at once and the next kernels run after them. Every tensor is copied."""
    slots = state_slots(model, optimizer)
    tensors = [tensor for tensor, _ in slots]
    if device.type == "cpu" and stash is not None:
        moved = stash.to_host(tensors)
    else:
        moved = [t.to(device, non_blocking=True, copy=True) for t in tensors]
    for (_, setters), new in zip(slots, moved):
        for setter in setters:
            setter(new)
