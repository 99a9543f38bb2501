"""Calibration: sample trajectories, replay them teacher-forced under a grid of budgets, and
measure the exact acceptance per token and its p5 per (budget, bin), with bootstrap bounds
over trajectories (the table itself: sparrow/control/acceptance_table.py).

    from sparrow.control.calibration import (sample_trajectories, measure_topk_pages,
                                                 topk_grid)
    trajectories = sample_trajectories(model, tokenizer, prompt_ids, params)   # dense sampling
    grid = topk_grid(max_pages=36)                # fits the tiny model: 1, 2, 3, 4, 8, ... 32
    table = measure_topk_pages(model, trajectories, template, grid, temperature=1.0,
                            centroid_dtype=cfg.rollout.centroid_dtype)  # as the rollout engine
    table.p5[topk_index, bin], table.tokens[bin]
    # on-policy: each budget's own sparse samples, replayed under that budget only
    table = measure_on_policy(model, {b: sample_trajectories(model, tokenizer, prompt_ids, params,
                                                             flat_schedule(template, b))
                                      for b in grid}, template)

The paper generated every sparsity setting separately and scored it with the dense model; here
the trajectories are sampled once (dense, or under a schedule) and each budget is
replayed teacher-forced (sparrow/engine/teacher/forced.py, equal to sparse decode), so
the acceptance is exact (both full distributions) and every budget is scored on the same
tokens. A flat schedule of one budget is the template (page size, bins, reserved pages, dense
layers) with a single bin. The token at total position p was drawn from the logits at p - 1;
the first generated token comes from the dense prefill, so its acceptance is 1 under every
budget, as in the rollout. measure_on_policy replays instead each budget's own trajectories,
sampled by the sparse actor under that budget: dense paths never show the states a sparse actor
reaches after its own mistakes, where acceptance is lowest (docs/calibration.md measures
both). The replay rounds page centroids as the rollout engine stores them (`centroid_dtype`, the
engine's EngineConfig.centroid_dtype): float8 centroids select slightly different pages, so a
schedule calibrated with one setting holds for rollouts with that setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sparrow.control.acceptance_table import (
    STATISTICS,
    AcceptanceTable,
    CalibrationError,
    table_from_tokens,
)
from sparrow.costmodel.presets import ModelShape
from sparrow.engine import Engine, EngineConfig, SamplingParams, teacher_forced_hidden
from sparrow.mismatch.acceptance import acceptance_from_logits, bin_index
from sparrow.sparse.schedule import Schedule

# the paper's page counts per bin (top-k pages, page size 16): the steps of its schedules
PAPER_TOPK_PAGES = (
    29,
    45,
    61,
    77,
    93,
    125,
    157,
    189,
    221,
    253,
    317,
    381,
    445,
    509,
    637,
    765,
    893,
    1021,
    1149,
)
# a grid for models whose trajectories hold only tens of pages (the embedded tiny model)
SMALL_TOPK_PAGES = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)
# the default grid's widest step between neighbouring budgets (topk_grid refines the lists
# above to it): a doubling grid jumped p5 from 0.05 to 0.85 to 0.997 in the testbed study, so
# no target between was bracketed; at 1.3 the paper's grid gains 36, 52 and 108 and the
# small one 5, 7, 10 and 14 (1 to 8 in steps of 1, then steps of at most a third)
MAX_STEP = 1.3


@dataclass(frozen=True)
class Trajectory:
    """One sampled sequence: prompt then generated ids; prompt_len splits them."""

    ids: tuple[int, ...]
    prompt_len: int

    def __post_init__(self) -> None:
        if not 1 <= self.prompt_len < len(self.ids):
            raise CalibrationError(
                f"a trajectory needs 1 <= prompt_len < length, got "
                f"prompt_len={self.prompt_len}, length={len(self.ids)}"
            )

    @property
    def positions(self) -> np.ndarray:
        """Total positions of the generated tokens."""
        return np.arange(self.prompt_len, len(self.ids))


def topk_grid(
    max_pages: int,
    paper: Sequence[int] = PAPER_TOPK_PAGES,
    small: Sequence[int] = SMALL_TOPK_PAGES,
    max_step: float | None = MAX_STEP,
) -> tuple[int, ...]:
    """The paper's grid below max_pages, or the small grid when fewer than 4 of its steps fit,
    refined so that neighbours differ by at most `max_step` (None: as listed)."""
    if max_pages < 2:
        raise CalibrationError(f"trajectories must span at least 2 pages, got {max_pages}")
    fitting = tuple(b for b in paper if b < max_pages)
    if len(fitting) < 4:
        fitting = tuple(b for b in small if b < max_pages)
    return fitting if max_step is None else refine_grid(fitting, max_step)


def refine_grid(grid: Sequence[int], max_step: float = MAX_STEP) -> tuple[int, ...]:
    """The grid with rounded geometric midpoints inserted wherever a budget is more than
    `max_step` times the one before (none between neighbours with no integer between)."""
    out = [int(grid[0])] if grid else []
    for high in grid[1:]:
        pending = [int(high)]
        while pending:
            low, top = out[-1], pending[-1]
            middle = round((low * top) ** 0.5)
            if top > max_step * low and low < middle < top:
                pending.append(middle)
            else:
                out.append(pending.pop())
    return tuple(out)


def model_shape(path: str | Path) -> ModelShape:
    """The cost model's shape of a checkpoint directory, from its config.json."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(path))
    return ModelShape.from_hf_config(config, name=Path(path).name)


def flat_schedule(template: Schedule, topk_pages: int) -> Schedule:
    """The template with one bin of `topk_pages`: every position reads the same pages."""
    return dataclasses.replace(
        template, name=f"{template.name}-flat-{topk_pages}", topk_pages=(topk_pages,)
    )


def sample_trajectories(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    schedule: Schedule | None = None,
    engine_config: EngineConfig | None = None,
) -> list[Trajectory]:
    """Sample with the engine (dense, or under `schedule`); samples with no new token are left out."""
    if len(prompts) != len(params) or not prompts:
        raise CalibrationError(
            f"need one SamplingParams per prompt and at least one prompt, "
            f"got {len(prompts)} prompts and {len(params)} params"
        )
    page_size = schedule.page_size if schedule is not None else 16
    config = engine_config or EngineConfig(page_size=page_size, max_batch_size=64)
    engine = Engine(model, tokenizer, config, schedule)
    results = engine.generate([list(p) for p in prompts], list(params))
    out = []
    for prompt, samples in zip(prompts, results):
        for sample in samples:
            if sample.output_ids:
                out.append(Trajectory(tuple(prompt) + tuple(sample.output_ids), len(prompt)))
    return out


def _groups(trajectories: Sequence[Trajectory], batch_tokens: int) -> list[list[Trajectory]]:
    groups: list[list[Trajectory]] = [[]]
    for trajectory in trajectories:
        size = sum(len(t.ids) for t in groups[-1])
        if groups[-1] and size + len(trajectory.ids) > batch_tokens:
            groups.append([])
        groups[-1].append(trajectory)
    return groups


@torch.no_grad()
def replay_acceptance(
    model: torch.nn.Module,
    trajectories: Sequence[Trajectory],
    schedules: Sequence[Schedule],
    temperature: float = 1.0,
    batch_tokens: int = 4096,
    centroid_dtype: str = "cache",
) -> list[np.ndarray]:
    """Exact acceptance of every generated token under each schedule: one array per schedule,
    the trajectories' tokens in order. Sequences go through the model together up to
    `batch_tokens` tokens at a time (full-vocabulary logits are [tokens, vocab] floats);
    centroid_dtype: the rollout engine's EngineConfig.centroid_dtype."""
    out: list[list[np.ndarray]] = [[] for _ in schedules]
    for group in _groups(trajectories, batch_tokens):
        ids = [list(t.ids) for t in group]
        prompt_lens = [t.prompt_len for t in group]
        # logits at p - 1 drew the token at p
        spans = [slice(t.prompt_len - 1, len(t.ids) - 1) for t in group]
        dense = teacher_forced_hidden(model, ids)
        for j, schedule in enumerate(schedules):
            sparse = teacher_forced_hidden(
                model, ids, prompt_lens, schedule=schedule, centroid_dtype=centroid_dtype
            )
            for d, q, span in zip(dense, sparse, spans):
                alpha = _acceptance_in_chunks(model, d[span], q[span], temperature, batch_tokens)
                out[j].append(alpha.double().cpu().numpy())
    return [np.concatenate(parts) for parts in out]


def _acceptance_in_chunks(
    model: torch.nn.Module,
    dense_hidden: torch.Tensor,
    sparse_hidden: torch.Tensor,
    temperature: float,
    chunk: int,
) -> torch.Tensor:
    """Acceptance per position from final hidden states, `chunk` positions of logits at a time:
    a 32K-token sequence's float32 logits at the real vocabulary would be 19 GB."""
    chunk = max(1, int(chunk))
    parts = [
        acceptance_from_logits(
            model.compute_logits(dense_hidden[i : i + chunk]),
            model.compute_logits(sparse_hidden[i : i + chunk]),
            temperature,
        )
        for i in range(0, dense_hidden.shape[0], chunk)
    ]
    return torch.cat(parts) if parts else dense_hidden.new_zeros(0)


def measure_topk_pages(
    model: torch.nn.Module,
    trajectories: Sequence[Trajectory],
    template: Schedule,
    topk_pages: Sequence[int],
    temperature: float = 1.0,
    num_bins: int = 0,
    bins: Sequence[int] | None = None,
    batch_tokens: int = 4096,
    centroid_dtype: str = "cache",
) -> AcceptanceTable:
    """Replay every trajectory under a flat schedule of each budget; statistics per (budget, bin).

    num_bins: columns of the table (0: up to the last bin holding a token). `bins` restricts
    the statistics to those bins (the controller re-measures only failing bins); others stay
    NaN with their token counts kept. centroid_dtype: the rollout engine's setting.
    """
    if not trajectories:
        raise CalibrationError("calibration needs at least one trajectory with generated tokens")
    grid = tuple(int(b) for b in topk_pages)
    if not grid or any(b < 1 for b in grid) or list(grid) != sorted(set(grid)):
        raise CalibrationError(
            f"topk_pages must be positive and strictly increasing, got {list(topk_pages)}"
        )
    schedules = [flat_schedule(template, b) for b in grid]
    acceptance = replay_acceptance(
        model, trajectories, schedules, temperature, batch_tokens, centroid_dtype
    )
    positions = np.concatenate([t.positions for t in trajectories])
    ids = _trajectory_ids(trajectories)
    return table_from_tokens(
        grid, positions, acceptance, template.bin_tokens, num_bins, bins, trajectories=ids
    )


def _trajectory_ids(trajectories: Sequence[Trajectory]) -> np.ndarray:
    """Each generated token's trajectory index: the bootstrap's resampling unit."""
    return np.concatenate([np.full(t.positions.size, k) for k, t in enumerate(trajectories)])


def measure_on_policy(
    model: torch.nn.Module,
    trajectories_by_topk: Mapping[int, Sequence[Trajectory]],
    template: Schedule,
    temperature: float = 1.0,
    num_bins: int = 0,
    batch_tokens: int = 4096,
    centroid_dtype: str = "cache",
) -> AcceptanceTable:
    """Each budget's own trajectories (sampled by the sparse actor under its flat schedule)
    replayed under that budget only: the acceptance the actor meets on the paths it takes, as a
    train step measures it. A bin's `tokens` is the fewest that any budget's paths put there."""
    grid = tuple(sorted(int(b) for b in trajectories_by_topk))
    if not grid or grid[0] < 1 or any(not trajectories_by_topk[b] for b in grid):
        raise CalibrationError(f"every top-k needs trajectories, got topk_pages {list(grid)}")
    measured = []
    for topk_pages in grid:
        trajectories = trajectories_by_topk[topk_pages]
        [alpha] = replay_acceptance(
            model,
            trajectories,
            [flat_schedule(template, topk_pages)],
            temperature,
            batch_tokens,
            centroid_dtype,
        )
        positions = np.concatenate([t.positions for t in trajectories])
        measured.append((positions, alpha, _trajectory_ids(trajectories)))
    width = max(
        [int(num_bins)]
        + [bin_index(int(pos.max()), template.bin_tokens) + 1 for pos, _, _ in measured]
    )
    tables = [
        table_from_tokens([b], pos, [alpha], template.bin_tokens, width, trajectories=ids, seed=j)
        for j, (b, (pos, alpha, ids)) in enumerate(zip(grid, measured))
    ]
    stats = {name: np.concatenate([getattr(t, name) for t in tables]) for name in STATISTICS}
    bounds = {name: np.concatenate([t.bounds[name] for t in tables]) for name in tables[0].bounds}
    tokens = np.min([t.tokens for t in tables], axis=0)
    samples = np.min([t.samples for t in tables], axis=0)
    return AcceptanceTable(
        grid, template.bin_tokens, tokens, **stats, samples=samples, bounds=bounds
    )


def schedule_acceptance(
    model: torch.nn.Module,
    trajectories: Sequence[Trajectory],
    schedule: Schedule,
    temperature: float = 1.0,
    centroid_dtype: str = "cache",
) -> tuple[np.ndarray, np.ndarray]:
    """(positions, exact acceptance) of every generated token under a (non-flat) schedule;
    centroid_dtype: the rollout engine's setting."""
    if not trajectories:
        raise CalibrationError("need at least one trajectory with generated tokens")
    alpha = replay_acceptance(
        model, trajectories, [schedule], temperature, centroid_dtype=centroid_dtype
    )[0]
    return np.concatenate([t.positions for t in trajectories]), alpha
