"""Stage 8, checkpoint: keep the step's policy as runs/<run_id>/checkpoints/step-<n>/.

    outcome = checkpoint_task(workdir, run_id, step, policy_dir)
    checkpoint_task(workdir, run_id, step, policy_dir, adapter_dir)   # DistillSparse's too

Runs every `pipeline.checkpoint_every` steps and after the last step (the flow decides).
The policy_update folder (safetensors, config, optimizer state) is hard-linked file by file
into the checkpoint folder (copied where links are not possible, e.g. across file systems),
written then renamed like a stage folder; the stage folder holds checkpoint.json naming it.
A checkpoint folder is a loadable Hugging Face checkpoint (`model.path=` it to start from it).
With an adapter folder (distill_lora's: the LoRA and its AdamW state) it is linked in as
distill/ beside the policy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import StageInputError, StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import RunRuntime, lookup
from sparrow.storage import atomic_dir


def link_tree(source: Path, target: Path) -> list[str]:
    """Hard-link (else copy) every file of `source` into `target`; the relative names."""
    names = []
    for path in sorted(source.rglob("*")):
        if not path.is_file():
            continue
        name = path.relative_to(source)
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target / name)
        except OSError:
            shutil.copy2(path, target / name)
        names.append(str(name))
    return names


def save_checkpoint(
    runtime: RunRuntime, step: int, policy_dir: str, out: Path, adapter_dir: str = ""
) -> StageWrite:
    source = runtime.policy_state(policy_dir)
    if not (source / "config.json").is_file():
        raise StageInputError(f"policy folder {policy_dir} holds no checkpoint (config.json)")
    target = runtime.layout.checkpoint_dir(step)
    with atomic_dir(target) as scratch:
        files = link_tree(source, scratch)
        if adapter_dir:
            files += [
                f"distill/{name}" for name in link_tree(Path(adapter_dir), scratch / "distill")
            ]
    contract.write_json(
        contract.CHECKPOINT.under(out),
        {"step": step, "path": str(target), "source": policy_dir, "files": files},
    )
    return StageWrite()


@task(name="checkpoint", cache_policy=NONE, **INFRA_RETRIES)
def checkpoint_task(
    workdir: str, run_id: str, step: int, policy_dir: str, adapter_dir: str = ""
) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(
        runtime,
        "checkpoint",
        step,
        lambda out: save_checkpoint(runtime, step, policy_dir, out, adapter_dir),
    )
