"""What a running train flow holds in memory, found by the tasks through (workdir, run_id).

    runtime = RunRuntime(cfg, run_id, store, model_path, tokenizer, train_data, ...)
    register(runtime)                       # the flow, once the run is open
    runtime = lookup(workdir, run_id)       # a task: plain values in, the live objects out
    trainer = runtime.trainer_before(step)  # the policy as it was when `step` began

Tasks take plain values (workdir, run id, step, paths) as Prefect's rules ask; the objects
that cannot travel as values (the DuckDB writer, the MLflow tracker, the Ray actor pool, the
trainer with its optimizer state, the DistillSparse distiller) live here, as typed fields,
for the life of the flow run: the flow builds the runtime and registers it, each task looks
it up once and hands it explicitly to its stage body. The trainer is any Trainer
(sparrow/trainer/protocol.py): a PolicyTrainer, or a TrainerGroup with trainer.num_workers. Nothing here is
state that a resume needs: the trainer is loaded back from the last recorded policy_update
folder whenever the one in memory is not at the right step. That folder loads whatever
trainer.num_workers wrote it: a group's (optimizer shards) into PolicyTrainer.load with
num_workers=0, one process's (optimizer.pt) into a group, a group's into any number of ranks.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparrow.config import SparrowConfig
from sparrow.errors import SparrowError
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import parse_fail_at
from sparrow.storage import RunLayout, Store
from sparrow.storage.run_rows import stage_records

if TYPE_CHECKING:
    from sparrow.data.datasets import PromptDataset, TextEncoder
    from sparrow.runtime.placement import Placement
    from sparrow.runtime.rollout.actors import ActorPool
    from sparrow.runtime.rollout.in_flight import InFlightRollout
    from sparrow.runtime.tracking import Tracker
    from sparrow.runtime.trainer_group.distill import GroupDistiller
    from sparrow.runtime.trainer_group.group import TrainerGroup
    from sparrow.trainer.distill import SparseDistiller
    from sparrow.trainer.protocol import Trainer

_RUNTIMES: dict[tuple[str, str], RunRuntime] = {}


class RuntimeMissingError(SparrowError):
    """A task ran outside a train flow that registered its run."""


def device_and_dtype(model_cfg: Any) -> tuple[str, str]:
    """(device, dtype name) from model.device / model.dtype: bf16 on GPU, fp32 on CPU for auto."""
    import torch

    device = model_cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = model_cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


@dataclass
class CachedDistiller:
    """The distill_lora stage's distiller between steps, holding the LoRA after `step`."""

    step: int
    distiller: SparseDistiller | GroupDistiller


@dataclass
class RunRuntime:
    cfg: SparrowConfig
    run_id: str
    store: Store
    model_path: Path
    tokenizer: TextEncoder
    train_data: PromptDataset
    eval_data: PromptDataset | None = None
    tracker: Tracker | None = None
    pool: ActorPool | None = None
    schedule_name: str = ""
    schedule_start_version: int = 1
    # longest prompt + generation the engine accepts (model.max_context or the checkpoint's)
    max_context: int = 0
    # stage bodies run by this process (a resumed flow must not re-run recorded ones)
    stages_run: Counter = field(default_factory=Counter)
    # trainer.num_workers > 0: where ranks and engines go (sparrow/runtime/placement.py)
    placement: Placement | None = None
    # the distill_lora stage's distiller (sparrow/stages/distill_lora.py), None until its
    # first step and after anything that makes it stale
    distiller: CachedDistiller | None = None
    # the policy version the engines hold (the step of the update they loaded; 0 the initial
    # model), and a one-step-off rollout started ahead of its step (in_flight.py)
    engine_version: int = 0
    rollout_in_flight: InFlightRollout | None = None
    _trainer: Trainer | None = None
    _trainer_step: int = -1
    # trainers whose background save (policy_update on GPU) may still be writing
    _saving: list[Trainer] = field(default_factory=list)
    _group: TrainerGroup | None = None

    def __post_init__(self) -> None:
        self.layout = RunLayout(Path(self.cfg.pipeline.workdir), self.run_id)
        self.fail_at = parse_fail_at(self.cfg.pipeline.fail_at)
        self.kill_at = parse_fail_at(self.cfg.pipeline.kill_at)

    @property
    def key(self) -> tuple[str, str]:
        return _key(self.cfg.pipeline.workdir, self.run_id)

    def policy_folder_before(self, step: int) -> Path:
        """The newest recorded policy folder before `step`, else the initial model."""
        updates = self._updates_before(step)
        return self.policy_state(updates[-1].output_dir) if updates else self.model_path

    def policy_version_before(self, step: int) -> int:
        """The version policy_folder_before(step) holds: its update's step, 0 the initial model."""
        updates = self._updates_before(step)
        return updates[-1].step if updates else 0

    def _updates_before(self, step: int) -> list:
        return [
            r
            for r in stage_records(self.store, self.run_id)
            if r.stage == "policy_update" and r.step < step
        ]

    def policy_state(self, policy_dir: str | Path, wait: bool = True) -> Path:
        """The checkpoint folder of a policy_update stage folder: the folder itself, or the
        policy_state folder its state.json names (written in the background; `wait` joins
        the write)."""
        pointed = contract.pointed_policy(policy_dir)
        if pointed is None:
            return Path(policy_dir)
        if wait:
            self.wait_for_saves()
        return pointed

    def remember_save(self, trainer: Trainer) -> None:
        self._saving.append(trainer)

    def wait_for_saves(self) -> None:
        while self._saving:
            self._saving.pop().wait_for_save()

    def trainer_before(self, step: int) -> Trainer:
        """The trainer holding the policy (and optimizer state) that step `step` starts from."""
        trainer = self.trainer_after(step - 1)
        if trainer is not None:
            trainer.onload()
            return trainer
        from sparrow.trainer.policy_trainer import PolicyTrainer

        device, dtype = device_and_dtype(self.cfg.model)
        folder = self.policy_folder_before(step)
        if self.cfg.trainer.num_workers:
            trainer = self._start_trainer_group(folder, dtype)
        elif folder == self.model_path:
            trainer = PolicyTrainer(
                self.model_path,
                self.cfg.algo,
                device,
                dtype,
                self.cfg.pipeline.seed,
                trainer_config=self.cfg.trainer,
            )
        else:
            trainer = PolicyTrainer.load(folder, self.cfg.algo, device, dtype, self.cfg.trainer)
        self.set_trainer(trainer, step - 1)
        return trainer

    def _start_trainer_group(self, folder: Path, dtype: str) -> TrainerGroup:
        """trainer.num_workers ranks on Ray (sparrow/runtime/trainer_group/group.py), from `folder` (a saved
        policy, any number of ranks) or the initial model; a previous group is stopped."""
        from sparrow.runtime.trainer_group.group import TrainerGroup
        from sparrow.runtime.trainer_group.rank import TrainerSpec

        self.shutdown_trainer_group()
        self.distiller = None  # it lived on the old group's ranks
        spec = TrainerSpec(
            str(self.model_path),
            self.cfg.algo,
            self.cfg.trainer,
            seed=self.cfg.pipeline.seed,
            dtype=dtype,
            device=self.placement.device,
        )
        resume = "" if folder == self.model_path else str(folder)
        self._group = TrainerGroup.start(
            spec, self.cfg.trainer.num_workers, self.placement.trainer, resume_from=resume
        )
        return self._group

    def shutdown_trainer_group(self) -> None:
        if self._group is not None:
            self._group.shutdown()
            self._group = None

    def trainer_after(self, step: int) -> Trainer | None:
        """The in-memory trainer if it holds the policy after `step`, else None (also for a
        group stopped after a failure: the policy is read from its folder, and the next step
        starts a new group)."""
        if self._trainer is None or self._trainer_step != step or self._trainer.failed:
            return None
        return self._trainer

    # one GPU shared by the rollout engines and the trainer

    def before_rollout(self) -> dict[str, float]:
        """Give the rollout engines the GPU: the trainer drops its gradients (and, with
        trainer.offload_during_rollout, moves its weights and moments to host memory), the
        DistillSparse distiller frees its base weights (algo.distill.release_during_rollout), this
        process returns its cached blocks to the device, the engines allocate their caches.
        Returns the seconds of the trainer's part (`release_s`) and the engines' wake."""
        import time

        from sparrow.cuda_memory import return_cached_blocks

        clock = time.perf_counter()
        if self._trainer is not None and not self._trainer.failed:  # a stopped group holds nothing
            self._trainer.free_gradients()
            if self.cfg.trainer.offload_during_rollout and self._trainer.can_offload:
                self._trainer.offload()
        if self.distiller is not None and self.cfg.algo.distill.release_during_rollout:
            self.distiller.distiller.release_base()  # rebuilt from the trainer by the next step
        return_cached_blocks()
        released = time.perf_counter()
        self.pool.wake()
        return {"release_s": released - clock, "engine_wake_s": time.perf_counter() - released}

    def after_rollout(self) -> None:
        """Engines free their KV caches (rollout.release_memory) for scoring and the update."""
        if self.cfg.rollout.release_memory and self.pool_on_gpu:
            self.pool.sleep()

    @property
    def pool_on_gpu(self) -> bool:
        return self.pool is not None and str(self.pool.spec.device).startswith("cuda")

    def set_trainer(self, trainer: Trainer | None, step: int) -> None:
        """Remember the trainer as holding the policy after `step` (0: the initial one)."""
        self._trainer, self._trainer_step = trainer, step


@contextlib.contextmanager
def peak_memory():
    """Measures this process's peak CUDA memory over the block: yields a function that
    gives {name: GiB} (empty off CUDA)."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    yield lambda name: {name: torch.cuda.max_memory_allocated() / 2**30} if cuda else {}


def _key(workdir: str | Path, run_id: str) -> tuple[str, str]:
    return str(Path(workdir).resolve()), run_id


def register(runtime: RunRuntime) -> None:
    _RUNTIMES[runtime.key] = runtime


def release(runtime: RunRuntime) -> None:
    _RUNTIMES.pop(runtime.key, None)


def lookup(workdir: str | Path, run_id: str) -> RunRuntime:
    try:
        return _RUNTIMES[_key(workdir, run_id)]
    except KeyError:
        raise RuntimeMissingError(
            f"no train flow is running run {run_id!r} in workdir {workdir} in this process; "
            "stages run inside sparrow.flows.train.train_flow"
        ) from None
