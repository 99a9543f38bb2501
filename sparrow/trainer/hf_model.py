"""The trainer's transformers model: loading it, its device and dtype, activation
checkpointing, and moving the trainer's state between the GPU and host memory.

    model = load_hf_model(path, resolve_device("auto"))
    model = empty_hf_model(path)                       # parameters on meta, for FSDP to shard
    for file, names in checkpoint_parts(path, model.state_dict(), tied_names(model)):
        part = read_part(path, file, names)            # one file's tensors, fp32, host
    enable_checkpointing(model)
    move_state(model, optimizer, torch.device("cpu"))     # offload; back with the GPU device

Used by PolicyTrainer (rl/trainer.py); docs/trainer.md.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sparrow.rl.checks import RLInputError

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


def move_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> None:
    """Parameters, buffers, the optimizer's parameters (the fp32 masters, if any) and its
    moments to `device`, in place (the optimizer keeps its parameter objects). Host copies
    are pinned, so both directions are async copies that one synchronize at the end completes."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        if device.type == "cpu" and tensor.is_cuda:
            host = torch.empty_like(tensor, device="cpu", pin_memory=True)
            return host.copy_(tensor, non_blocking=True)
        return tensor.to(device, non_blocking=True)

    trained = [p for group in optimizer.param_groups for p in group["params"]]
    moved = {id(p) for p in trained}
    for param in trained + [p for p in model.parameters() if id(p) not in moved]:
        param.data = move(param.data)
        state = optimizer.state.get(param, {})
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                state[key] = move(value)
    for owner in model.modules():
        for name, buffer in list(owner._buffers.items()):
            if buffer is not None:
                owner._buffers[name] = move(buffer)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
