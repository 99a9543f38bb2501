"""Opening and closing a training run: everything the train flow does around its steps.

    runtime = open_run_runtime(cfg)     # checks inputs, takes the workdir, opens/resumes the run
    ...steps...
    close_run_runtime(runtime, "finished")

Bad inputs fail first, before anything is written or started: the model directory, its
tokenizer, the datasets (every row needs its answer field, every prompt fits
data.max_prompt_tokens and leaves room in the model's context), so a bad input leaves no
`runs` row and its run id stays free. Then the
workdir's single writer lock (a second writer gets WorkdirBusyError and changes nothing), the
`runs` row (created, or resumed with a configuration check), the schedule the run starts
with, Ray and the rollout actors (built from the newest recorded policy), and the MLflow run,
opened while the actors build their engines.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sparrow.config import ConfigError, SparrowConfig
from sparrow.data.run_prompts import configured_prompts
from sparrow.engine import EngineConfig
from sparrow.errors import is_disk_full
from sparrow.model import load_tokenizer, read_arch
from sparrow.model.builtin import resolve_model_path
from sparrow.runtime.ledger.retention import repair_unsaved_policies, wait_for_deletions
from sparrow.runtime.ledger.run_record import finish_run, new_run_id, open_run
from sparrow.runtime.ledger.schedules import schedule_in_force, start_schedule
from sparrow.runtime.rollout.actors import ActorPool, actor_resources, start_ray
from sparrow.runtime.rollout.requests import max_new_tokens_for
from sparrow.runtime.rollout.worker import WorkerSpec
from sparrow.runtime.run_runtime import RunRuntime, device_and_dtype, register, release
from sparrow.storage import Store


def with_run_id(cfg: SparrowConfig) -> SparrowConfig:
    """The config with pipeline.run_id filled in (a new id when it is empty)."""
    if cfg.pipeline.run_id:
        return cfg
    pipeline = dataclasses.replace(cfg.pipeline, run_id=new_run_id())
    return dataclasses.replace(cfg, pipeline=pipeline)


def check_steps(cfg: SparrowConfig) -> None:
    """A run of no steps would open services and a `runs` row for nothing: refuse it."""
    if cfg.pipeline.steps < 1:
        raise ConfigError(
            f"pipeline.steps={cfg.pipeline.steps}: a run needs at least 1 step "
            "(a finished run is extended by resuming it with a larger pipeline.steps)"
        )


def check_inputs(cfg: SparrowConfig) -> dict:
    """Load what a bad input would break, before the workdir is touched."""
    check_steps(cfg)
    model_path = resolve_model_path(cfg.model.path)
    arch = read_arch(model_path)
    tokenizer = load_tokenizer(model_path)
    data = cfg.data
    # every prompt of a file (a built-in task's as it is made) must leave room to generate
    max_context = cfg.model.max_context or arch.max_position_embeddings
    train = configured_prompts(
        data.train, data, model_path, tokenizer, "train", cfg.pipeline.seed, max_context
    )
    evaluation = None
    if data.eval:  # rendered by the same chat template as the training prompts
        evaluation = configured_prompts(
            data.eval, data, model_path, tokenizer, "eval", cfg.pipeline.seed, max_context
        )
    train.batch(0, data.prompts_per_step)  # a built-in task's rows are checked as made
    return dict(
        model_path=model_path,
        tokenizer=tokenizer,
        train_data=train,
        eval_data=evaluation,
        max_context=max_context,
    )


def open_run_runtime(cfg: SparrowConfig) -> tuple[RunRuntime, bool, bool]:
    """(runtime, resumed, started_ray); the runtime is registered for the tasks."""
    inputs = check_inputs(cfg)
    store = Store.open_writer(cfg.pipeline.workdir)
    runtime = None
    try:
        resumed = open_run(store, cfg, cfg.pipeline.run_id, inputs["model_path"])
        runtime = RunRuntime(cfg, cfg.pipeline.run_id, store, **inputs)
        if resumed:
            repair_unsaved_policies(runtime)
        # the first step's prompts must fit the context before any actor starts
        for row in runtime.train_data.batch(0, cfg.data.prompts_per_step):
            max_new_tokens_for(runtime, row, cfg.data.train)
        runtime.schedule_name, runtime.schedule_start_version = start_schedule(
            store, runtime.run_id, cfg.schedule.name, cfg.schedule
        )
        started_ray = start_ray(cfg.ray.address)
        # the actors build their engines in their own processes while MLflow opens its store
        runtime.pool = start_pool(runtime, wait=False)
        from sparrow.runtime.tracking import Tracker

        runtime.tracker = Tracker.start(cfg, runtime.run_id, cfg.pipeline.workdir)
        if not runtime.tracker.resumed:
            schedule, version = schedule_in_force(
                store, runtime.run_id, runtime.schedule_name, runtime.schedule_start_version, 1
            )
            runtime.tracker.log_schedule(schedule, version, step=0)
        finish_run(store, runtime.run_id, "running", runtime.tracker.mlflow_run_id)
        runtime.pool.wait_ready()
    except BaseException:
        if runtime is not None:
            close_run_runtime(runtime, "failed")
        else:
            store.close()
        raise
    register(runtime)
    return runtime, resumed, started_ray


def start_pool(runtime: RunRuntime, wait: bool = True) -> ActorPool:
    cfg = runtime.cfg
    first = cfg.pipeline.steps + 1
    schedule, _ = schedule_in_force(
        runtime.store, runtime.run_id, runtime.schedule_name, runtime.schedule_start_version, 1
    )
    device, dtype = device_and_dtype(cfg.model)
    count, resources, device = actor_resources(cfg.rollout.num_actors, device.startswith("cuda"))
    placement = None
    if cfg.trainer.num_workers:  # a trainer group: its ranks and the engines placed together
        from sparrow.runtime.placement import plan_placement

        runtime.placement = plan_placement(
            cfg.trainer.num_workers,
            cfg.rollout.placement,
            cfg.rollout.num_actors,
            device.startswith("cuda"),
            cfg.ray.placement_strategy,
        )
        placement = runtime.placement.engines
        count, resources = len(placement), placement[0]
    runtime.engine_version = runtime.policy_version_before(first)
    spec = WorkerSpec(
        model_path=str(runtime.model_path),
        weights_path=str(runtime.policy_folder_before(first)),
        adapter_path=_adapter_before(runtime, first),
        schedule=schedule if cfg.schedule.sparse else None,
        engine=EngineConfig.from_rollout(
            cfg.rollout, page_size=schedule.page_size, max_context=cfg.model.max_context
        ),
        device=device,
        dtype=dtype,
        threads=int(resources.get("num_cpus", 1)),
        backend=cfg.rollout.backend,
    )
    return ActorPool.start(spec, count, resources, placement, cfg.rollout.work_item_prompts, wait)


def _adapter_before(runtime: RunRuntime, step: int) -> str:
    """The DistillSparse LoRA the engines start with (a resumed run's newest), "" if none."""
    if not runtime.cfg.algo.distill.enabled:
        return ""
    from sparrow.stages.distill_lora import adapter_folder_before

    return adapter_folder_before(runtime, step)


def close_run_runtime(runtime: RunRuntime, status: str) -> None:
    """Stop the actors, close the MLflow run, mark the run, release the workdir."""
    release(runtime)
    # a rollout in flight is not waited for: it was recorded nowhere, and the actors stop
    # under it (its thread ends on their error); a resume generates it again
    runtime.rollout_in_flight = None
    try:
        runtime.wait_for_saves()
        wait_for_deletions()
        if runtime.pool is not None:
            runtime.pool.shutdown()
        runtime.shutdown_trainer_group()
        if runtime.placement is not None:
            runtime.placement.release()
        _record_end(runtime, status)
    finally:
        runtime.store.close()


def _record_end(runtime: RunRuntime, status: str) -> None:
    """Close the MLflow run and mark the run. A run ending on a full disk may not be able to
    write either: the error that stopped it is the one to show, and the run, left marked
    running with no writer, lists as interrupted and resumes the same way."""
    try:
        if runtime.tracker is not None:
            runtime.tracker.end(status)
        finish_run(runtime.store, runtime.run_id, status)
    except Exception as err:
        if status == "finished" or not is_disk_full(err, runtime.store.path):
            raise


def where_to_look(runtime: RunRuntime) -> list[str]:
    """Lines printed at the end of a run: the DuckDB file, a query, the MLflow UI."""
    workdir = Path(runtime.cfg.pipeline.workdir)
    uri = runtime.cfg.pipeline.mlflow_uri or f"sqlite:///{workdir.resolve()}/mlflow.db"
    query = (
        f"SELECT step, bin, p5, pages_read FROM bin_stats WHERE run_id = "
        f"'{runtime.run_id}' ORDER BY step, bin"
    )
    return [
        f"run {runtime.run_id}: files under {runtime.layout.run_dir}",
        f"mismatch history (DuckDB): {workdir / 'sparrow.duckdb'}",
        f'  sparrow query --workdir {workdir} "{query}"',
        f"  sparrow runs --workdir {workdir}",
        f"MLflow: sparrow ui --workdir {workdir}   (or mlflow ui --backend-store-uri {uri},",
        # MLflow 3.17's own behaviour (sparrow/cli/commands/ui.py): say so where it is offered
        "  which leaves worker processes running when stopped with SIGTERM)",
    ]
