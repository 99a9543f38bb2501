"""The calibrate flow's tasks: sample, replay under the budget grid, choose and store.

    path = sample_task(overrides, calibration_id)              # trajectories.json
    path = replay_task(overrides, calibration_id, path)        # table.json
    summary = choose_task(overrides, calibration_id, path)     # schedule, DuckDB, MLflow, plot
    timing = time_generation_task(overrides, calibration_id, path)   # optional: the paper's way

Everything lands under `<workdir>/calibrations/<calibration_id>/` by write-then-rename; each
task reads its inputs from the previous task's file, so it can be re-run alone. The library
does the work (sparrow/control/calibration.py, choose.py); the files and their readers are
sparrow/runtime/ledger/calibration_files.py's; sparrow/stages/calibrate_store.py
writes DuckDB and MLflow, sparrow/reports/calibration_plot.py draws the figure. Tasks take plain values
(config overrides, ids, paths), as Prefect's rules ask, and are never cached.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from sparrow.config import SparrowConfig, load_config
from sparrow.control.calibration import (
    Trajectory,
    flat_schedule,
    measure_on_policy,
    measure_topk_pages,
    sample_trajectories,
    topk_grid,
)
from sparrow.data.run_prompts import configured_prompts
from sparrow.engine import EngineConfig, SamplingParams
from sparrow.model.builtin import resolve_model_path
from sparrow.runtime.ledger.calibration_files import (
    CALIBRATION_TABLE,
    TRAJECTORIES,
    as_trajectories,
    calibration_dir,
    read_trajectories,
    table_to_dict,
    trajectory_dict,
    write_json,
)
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import device_and_dtype
from sparrow.sparse.io import resolve_schedule
from sparrow.sparse.schedule import Schedule


@functools.lru_cache(maxsize=2)
def load_policy(model_cfg: Any) -> tuple[Any, Any, Path]:
    """(model, tokenizer, checkpoint dir) of the `model` config group, loaded once per process."""
    import torch

    from sparrow.model import load_model, load_tokenizer

    path = resolve_model_path(model_cfg.path)
    device, dtype = device_and_dtype(model_cfg)
    return load_model(path, getattr(torch, dtype), device), load_tokenizer(path), path


def policy(cfg: SparrowConfig) -> tuple[Any, Any, Path]:
    return load_policy(cfg.model)


def base_schedule(cfg: SparrowConfig) -> Schedule:
    """schedule.name: the template (page size, bins, reserved pages, dense layers), under
    the configured selection, dense_heads and page_size (the replay scores by its rule)."""
    return resolve_schedule(cfg.schedule.name).configured(cfg.schedule)


def calibration_requests(
    cfg: SparrowConfig, tokenizer: Any, max_context: int, model_path: str | Path
) -> tuple[list, list[SamplingParams]]:
    """(prompt ids, sampling params) of the calibration prompts, seeded from pipeline.seed and
    rendered as training renders them (the model's chat template, data.chat_template); new
    tokens are cut to what the context leaves after each prompt."""
    cal, rollout = cfg.calibrate, cfg.rollout
    data = configured_prompts(
        cal.prompts or cfg.data.train, cfg.data, model_path, tokenizer, "train", cfg.pipeline.seed
    )
    rows = [data.row(i) for i in range(min(cal.num_prompts, len(data)))]
    new_tokens = cal.max_new_tokens or rollout.max_new_tokens
    context = cfg.model.max_context or max_context
    params = [
        SamplingParams(
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            n=cal.repeats,
            max_new_tokens=max(1, min(new_tokens, context - len(row.prompt_ids))),
            seed=cfg.pipeline.seed * 100_003 + i,
        )
        for i, row in enumerate(rows)
    ]
    return [list(r.prompt_ids) for r in rows], params


def engine_config(cfg: SparrowConfig, schedule: Schedule) -> EngineConfig:
    return EngineConfig.from_rollout(
        cfg.rollout, page_size=schedule.page_size, max_context=cfg.model.max_context
    )


def sample(overrides: list[str], calibration_id: str) -> str:
    """Trajectories to replay: dense ones (they fix the top-k grid when calibrate.topk_pages is
    empty), and with calibrate.sample_sparse, the sparse actor's own under every top-k of the grid."""
    cfg = load_config(overrides)
    model, tokenizer, model_path = policy(cfg)
    template = base_schedule(cfg)
    prompts, params = calibration_requests(
        cfg, tokenizer, model.arch.max_position_embeddings, model_path
    )
    engine = engine_config(cfg, template)
    clock = time.perf_counter()
    trajectories = sample_trajectories(model, tokenizer, prompts, params, engine_config=engine)
    grid = grid_for(cfg, trajectories, template)
    by_topk = {}
    if cfg.calibrate.sample_sparse:
        by_topk = {
            str(b): [
                trajectory_dict(t)
                for t in sample_trajectories(
                    model,
                    tokenizer,
                    prompts,
                    params,
                    schedule=flat_schedule(template, b),
                    engine_config=engine,
                )
            ]
            for b in grid
        }
    seconds = time.perf_counter() - clock
    out = calibration_dir(cfg.pipeline.workdir, calibration_id) / TRAJECTORIES
    data = {
        "sample_s": seconds,
        "sparse": cfg.calibrate.sample_sparse,
        "prompts": len(prompts),
        "topk_pages": list(grid),
        "trajectories": [trajectory_dict(t) for t in trajectories],
        "by_topk": by_topk,
    }
    return str(write_json(out, data))


def grid_for(cfg: SparrowConfig, trajectories: list[Trajectory], template: Schedule) -> tuple:
    if cfg.calibrate.topk_pages:
        return tuple(cfg.calibrate.topk_pages)
    longest = max(len(t.ids) for t in trajectories)
    return topk_grid(-(-longest // template.page_size))


def replay(overrides: list[str], calibration_id: str, trajectories_path: str) -> str:
    """The (topk_pages, bin) table: every top-k's own sparse trajectories replayed under it
    when they were sampled (calibrate.sample_sparse), else the dense ones under every top-k."""
    cfg = load_config(overrides)
    model, _, _ = policy(cfg)
    template = base_schedule(cfg)
    trajectories, data = read_trajectories(trajectories_path)
    # a file written before the rename holds "budgets" and "by_budget"
    grid = tuple(
        data.get("topk_pages") or data.get("budgets") or grid_for(cfg, trajectories, template)
    )
    by_topk = data.get("by_topk") or data.get("by_budget")
    num_bins = cfg.calibrate.num_bins or template.num_bins
    temperature = cfg.rollout.temperature or 1.0
    clock = time.perf_counter()
    if by_topk:
        table = measure_on_policy(
            model,
            {int(b): as_trajectories(rows) for b, rows in by_topk.items()},
            template,
            temperature,
            num_bins=num_bins,
            centroid_dtype=cfg.rollout.centroid_dtype,
        )
    else:
        table = measure_topk_pages(
            model,
            trajectories,
            template,
            grid,
            temperature,
            num_bins=num_bins,
            centroid_dtype=cfg.rollout.centroid_dtype,
        )
    seconds = time.perf_counter() - clock
    out = calibration_dir(cfg.pipeline.workdir, calibration_id) / CALIBRATION_TABLE
    return str(write_json(out, {"replay_s": seconds, **table_to_dict(table)}))


def time_generation(overrides: list[str], calibration_id: str, table_path: str) -> dict:
    """Seconds to generate the calibration requests under every top-k of the grid."""
    cfg = load_config(overrides)
    model, tokenizer, model_path = policy(cfg)
    template = base_schedule(cfg)
    prompts, params = calibration_requests(
        cfg, tokenizer, model.arch.max_position_embeddings, model_path
    )
    table = json.loads(Path(table_path).read_text())
    grid = table["topk_pages"] if "topk_pages" in table else table["budgets"]
    seconds = {}
    for topk_pages in grid:
        schedule = flat_schedule(template, topk_pages)
        clock = time.perf_counter()
        sample_trajectories(
            model,
            tokenizer,
            prompts,
            params,
            schedule=schedule,
            engine_config=engine_config(cfg, template),
        )
        seconds[int(topk_pages)] = time.perf_counter() - clock
    return {"generation_s_per_topk": seconds, "generation_s": sum(seconds.values())}


@task(name="calibrate-sample", cache_policy=NONE, **INFRA_RETRIES)
def sample_task(overrides: list[str], calibration_id: str) -> str:
    return sample(overrides, calibration_id)


@task(name="calibrate-replay", cache_policy=NONE, **INFRA_RETRIES)
def replay_task(overrides: list[str], calibration_id: str, trajectories_path: str) -> str:
    return replay(overrides, calibration_id, trajectories_path)


@task(name="calibrate-time-generation", cache_policy=NONE)
def time_generation_task(overrides: list[str], calibration_id: str, table_path: str) -> dict:
    return time_generation(overrides, calibration_id, table_path)
