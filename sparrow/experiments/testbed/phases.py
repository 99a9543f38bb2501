"""When the testbed's noisy last phase begins, and a start from a kept model for it alone.

    from sparrow.experiments.testbed.phases import NoisePhase, load_start
    phase = NoisePhase(clean_steps=plan.clean_steps, noise_share=0.15, began=t0, deadline=t1)
    if phase.noisy(step): ...            # from this step on, full-length chains with wrong hops
    model, source = load_start("/tmp/tb-v2-small", sizes)   # --init-from
    save_kept_model(model, out, "bfloat16", info)           # weights + training_info.json
    sha = kept_weights_sha256("models/testbed-v2-small")    # raises if training_info disagrees

The noisy phase (a share of the steps at the end, on chains whose hops sometimes go wrong)
is what makes a testbed model right when greedy but only partly right when sampled, which
GRPO needs. A step plan measured at the start can be wrong: on a shared GPU each step took
longer than measured, the wall clock ended training before the plan reached the noisy phase,
and the model came out sampling the reference. So the phase begins at the plan's step or
once the clean phase has used its share of the time, whichever comes first.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM

# the model dimensions a start must share with the run's arguments (config key, argument)
SHAPE_KEYS = (
    ("num_hidden_layers", "layers"),
    ("hidden_size", "hidden"),
    ("num_attention_heads", "heads"),
    ("num_key_value_heads", "kv_heads"),
    ("head_dim", "head_dim"),
    ("intermediate_size", "intermediate"),
)


@dataclass
class NoisePhase:
    """The step the noisy phase begins: `clean_steps` of the plan, or the first step after
    the clean phase's share of the time (1 - noise_share of began..deadline) is spent."""

    clean_steps: int
    noise_share: float
    began: float
    deadline: float
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    started_at: int | None = None

    def noisy(self, step: int) -> bool:
        if self.started_at is not None:
            return True
        if self.noise_share <= 0:
            return False
        clean_time = self.began + (1 - self.noise_share) * (self.deadline - self.began)
        if step >= self.clean_steps or self.clock() >= clean_time:
            self.started_at = step
            return True
        return False

    @property
    def cut_by_time(self) -> bool:
        """True when the clock, not the plan, began the noisy phase."""
        return self.started_at is not None and self.started_at < self.clean_steps

    def record(self, steps_done: int) -> dict:
        noisy = 0 if self.started_at is None else steps_done - self.started_at
        return {
            "clean_steps_done": steps_done - noisy,
            "noise_steps_done": noisy,
            "curriculum_cut_by_time": self.cut_by_time,
        }


class StartError(ValueError):
    """A --init-from folder that cannot start this run."""


def load_start(folder: str | Path, sizes: dict) -> tuple[Qwen3ForCausalLM, dict]:
    """(the kept model in float32, {path, model_safetensors_sha256 of its training_info});
    refuses a folder without weights or whose dimensions are not the run's `sizes`."""
    folder = Path(folder)
    if not (folder / "model.safetensors").is_file():
        raise StartError(f"--init-from {folder}: no model.safetensors there")
    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32)
    wrong = [
        f"{arg} {sizes[arg]} (the model has {getattr(model.config, key)})"
        for key, arg in SHAPE_KEYS
        if getattr(model.config, key) != sizes[arg]
    ]
    if wrong:
        raise StartError(f"--init-from {folder}: the run asks for {', '.join(wrong)}")
    info_path = folder / "training_info.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    source = {
        "path": str(folder),
        "model_safetensors_sha256": info.get("model_safetensors_sha256"),
    }
    return model, source


def weights_sha256(folder: str | Path) -> str:
    """sha256 of the folder's model.safetensors (training_info.json's model_safetensors_sha256)."""
    return hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()


def save_kept_model(model: Qwen3ForCausalLM, folder: Path, dtype: str, info: dict) -> None:
    """Save the model (in bfloat16 when dtype says so: half the bytes, for a model kept in the
    repository) and training_info.json naming its weights' sha256 (kept_weights_sha256 checks it)."""
    model.generation_config.pad_token_id = model.config.pad_token_id
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder)
    info["model_safetensors_sha256"] = weights_sha256(folder)
    write_training_info(folder, info)


def write_training_info(folder: Path, info: dict) -> None:
    (folder / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")


def kept_weights_sha256(folder: str | Path) -> str:
    """The kept model's weights' sha256, checked against the one its training_info.json names
    (when it names one); a difference is a StartError naming both."""
    folder = Path(folder)
    got = weights_sha256(folder)
    info_path = folder / "training_info.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    want = info.get("model_safetensors_sha256")
    if want and got != want:
        raise StartError(
            f"{folder}/model.safetensors has sha256 {got}, training_info.json names {want}"
        )
    return got
