"""The `runs` row of a training run: create it, or resume it with the same configuration.

    run_id = new_run_id()                                    # "run-20261121-194652-3f2a"
    resumed = open_run(store, cfg, run_id, model_path)       # ConfigMismatchError on a change
    finish_run(store, run_id, "finished", mlflow_run_id)

A run keeps its resolved configuration (YAML) and a hash of it. Running the flow again with
the same pipeline.run_id resumes the run only if the configuration is the same, apart from the
keys that cannot change its results (RESUMABLE_KEYS: where it fails on purpose, how many steps,
where the workdir and the Ray cluster are, how many actors and trainer ranks, whether it writes
its report); any other
difference is ConfigMismatchError naming every key that differs, old and new value. With
partial rollouts (rollout.finish_fraction < 1) the number of actors is fixed too: each actor
closes on its own share of the groups, so their number changes which samples a step keeps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from datetime import datetime
from pathlib import Path

import yaml

from sparrow.config import SparrowConfig, to_yaml
from sparrow.config.renamed import CONFIG_RENAMES, move_keys, rename_keys
from sparrow.errors import SparrowError
from sparrow.storage import Store
from sparrow.storage.run_rows import insert_run, run_config_yaml, set_run_status

RESUMABLE_KEYS = frozenset(
    {
        "pipeline.fail_at",
        "pipeline.kill_at",
        "pipeline.steps",
        "pipeline.run_id",
        "pipeline.workdir",
        "pipeline.report",
        "ray.address",
        # which nodes the ranks and engines run on: a policy folder resumes anywhere
        "ray.placement_strategy",
        "rollout.num_actors",
        # how many GPUs train and generate: a sharded policy folder resumes on any number of ranks
        "trainer.num_workers",
        "trainer.sync_bucket_mib",
        "rollout.placement",
        "rollout.work_item_prompts",
    }
)


def resumable_keys(flat: dict[str, object]) -> frozenset[str]:
    """RESUMABLE_KEYS for a flat configuration: less rollout.num_actors when the rollout
    closes early (sparrow/runtime/rollout/dispatch.py, CloseRule: one share per actor)."""
    fraction = flat.get("rollout.finish_fraction", 1.0)
    if isinstance(fraction, (int, float)) and fraction < 1:
        return RESUMABLE_KEYS - {"rollout.num_actors"}
    return RESUMABLE_KEYS


class ConfigMismatchError(SparrowError):
    """A resumed run whose configuration differs from the one it was started with."""


def new_run_id() -> str:
    return f"run-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def flat_config(config: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flat_config(value, name))
        else:
            flat[name] = value
    return flat


def config_hash(cfg: SparrowConfig) -> str:
    """sha256 of the configuration without its resumable keys (equal hash: same results)."""
    flat = flat_config(dataclasses.asdict(cfg))
    resumable = resumable_keys(flat)
    flat = {k: v for k, v in flat.items() if k not in resumable}
    return hashlib.sha256(repr(sorted(flat.items())).encode()).hexdigest()


def config_differences(stored_yaml: str, cfg: SparrowConfig) -> list[str]:
    """'key: old -> new' for every key outside the resumable ones whose value changed. A key the
    stored config lacks (added to the schema since) counts as unchanged at its default."""
    # a run stored before a key was renamed holds the old name: compare it under the new one
    old = flat_config(
        move_keys(
            rename_keys(
                yaml.safe_load(stored_yaml) or {}, CONFIG_RENAMES, source="run config", warn=False
            )
        )
    )
    new = flat_config(yaml.safe_load(to_yaml(cfg)) or {})
    default = flat_config(yaml.safe_load(to_yaml(SparrowConfig())) or {})
    old.update({k: v for k, v in default.items() if k not in old and new.get(k) == v})
    keys = sorted((set(old) | set(new)) - (resumable_keys(old) & resumable_keys(new)))
    return [
        f"{k}: {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}"
        for k in keys
        if old.get(k, "(absent)") != new.get(k, "(absent)")
    ]


def open_run(store: Store, cfg: SparrowConfig, run_id: str, model_path: Path) -> bool:
    """Create the run's row, or check and reopen it; True when the run already existed."""
    with store.connect() as conn:
        stored_yaml = run_config_yaml(conn, run_id)
        if stored_yaml is None:
            insert_run(conn, run_id, str(model_path), to_yaml(cfg), config_hash(cfg))
            return False
        differences = config_differences(stored_yaml, cfg)
        if differences:
            raise ConfigMismatchError(
                f"run {run_id} was started with another configuration; differing keys: "
                + "; ".join(differences)
                + " (use the original values to resume, or a new pipeline.run_id)"
            )
        set_run_status(conn, run_id, "running")
    return True


def finish_run(store: Store, run_id: str, status: str, mlflow_run_id: str | None = None) -> None:
    with store.connect() as conn:
        set_run_status(conn, run_id, status, mlflow_run_id)
