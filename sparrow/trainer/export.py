"""A run's policy as a clean Hugging Face folder for serving: weights in bf16, no trainer state.

    from sparrow.trainer.export import export_policy, find_policy_folder
    source = find_policy_folder("./sparrow-work", "run-2026...", step=40)
    export_policy(source, "/models/my-qwen3-rl")          # transformers / vLLM load it

Where a step's policy lives: runs/<id>/checkpoints/step-<n>/ (the checkpoint stage's), else
the step's policy_update folder, or the policy_state folder its state.json names (a
background save). A folder whose tensors retention removed (pipeline.keep_checkpoints) is
not a source; the error lists the steps that still hold weights. The export loads the
weights with transformers in the chosen dtype and writes them with save_pretrained (sharded
as transformers shards), with the tokenizer files and generation_config.json: no
optimizer.pt, sharded_state/, rng_state.pt or trainer_state.json. The trainer computes with
transformers' model on the same weights, so the folder gives the trainer's logits up to the
dtype's rounding (tests/trainer/test_export.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from sparrow.errors import SparrowError
from sparrow.scratch import scratch_dir
from sparrow.trainer.checkpoint import TOKENIZER_FILES

STATE_POINTER = "state.json"  # the policy_update folder's pointer to a background save
_STEP = re.compile(r"^step-(\d+)$")
EXTRA_FILES = ("generation_config.json",)


class ExportError(SparrowError):
    """No policy to export, or an output folder that cannot be written."""


def find_policy_folder(workdir: str | Path, run_id: str, step: int | None = None) -> Path:
    """The folder holding step `step`'s policy weights (the newest step when None)."""
    run_dir = Path(workdir) / "runs" / run_id
    if not run_dir.is_dir():
        raise ExportError(f"no run {run_id!r} in {Path(workdir)} (sparrow runs lists them)")
    found = _weight_folders(run_dir)
    if not found:
        raise ExportError(f"run {run_id!r} holds no policy weights (no step was updated yet?)")
    if step is None:
        return found[max(found)]
    if step not in found:
        raise ExportError(
            f"run {run_id!r} has no policy weights for step {step}; steps with weights: "
            f"{', '.join(map(str, sorted(found)))} (retention keeps pipeline.keep_checkpoints; "
            f"pipeline.checkpoint_every keeps more)"
        )
    return found[step]


def _weight_folders(run_dir: Path) -> dict[int, Path]:
    """step -> folder with weights: policy_update folders, then checkpoints (preferred)."""
    found: dict[int, Path] = {}
    candidates = [(d, d / "policy_update") for d in run_dir.glob("step-*")]
    candidates += [(d, d) for d in (run_dir / "checkpoints").glob("step-*")]
    for step_dir, folder in candidates:
        match = _STEP.match(step_dir.name)
        pointer = folder / STATE_POINTER
        if pointer.is_file():
            folder = Path(json.loads(pointer.read_text())["state_dir"])
        if match and _has_weights(folder):
            found[int(match.group(1))] = folder
    return found


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def export_policy(source: str | Path, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    """Write the clean folder (see the module doc) to out_dir, which must not hold files."""
    import torch
    from transformers import AutoModelForCausalLM

    source, out = Path(source), Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"output folder {out} already exists and is not empty")
    if not _has_weights(source):
        raise ExportError(f"{source} holds no model weights (config.json and *.safetensors)")
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if dtype not in torch_dtype:
        raise ExportError(f"dtype must be one of {', '.join(torch_dtype)}, got {dtype!r}")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a command's output is its one line
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype[dtype])
    scratch = scratch_dir(out)  # makes out's parent too
    try:
        model.save_pretrained(scratch, safe_serialization=True)
        for name in (*TOKENIZER_FILES, *EXTRA_FILES):
            if (source / name).is_file():
                shutil.copyfile(source / name, scratch / name)
        if out.exists():
            out.rmdir()
        os.replace(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
