"""The offline selection study's numbers: one row per (page size, rule, budget) cell from its
replayed tokens, the step-0 accuracy estimate, the predicted cost and the retrieval-head
ranking (benchmarks/selection_study.py writes them; docs/selection.md, "The offline study",
says what each column means).

    ranking = head_ranking(dense.key_mass[16], dense.lookups, schedule)
    row = cell_row(seqs, cells, top_sparse_head(ranking, schedule))   # acceptance, recall...
    row["accuracy_estimate"] = accuracy_estimate(seqs, [c.logps for c in cells], newline, chains)
    row.update(predicted_cost(shape, hardware, schedule, prompt_len, gen_len))

Percentiles are numpy's linear ones, as bin_statistics'; intervals are 95% cluster-bootstrap
bounds over sequences (mismatch/bootstrap.py), the unit every token of one sequence shares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from sparrow.costmodel.presets import CostModelError, Hardware, ModelShape
from sparrow.costmodel.segments import schedule_cost, scoring_factors
from sparrow.experiments.testbed.evaluate import graded_estimate, line_logps
from sparrow.experiments.testbed.selection_replay import CellTokens, StudySequence
from sparrow.mismatch.bootstrap import LOW_ACCEPTANCE, bootstrap_intervals
from sparrow.sparse.schedule import Schedule

# token groups of the acceptance columns: token_roles' roles, "rest" (every role but
# lookup) and "all"
GROUPS = ("lookup", "local", "benign", "answer", "unknown", "rest", "all")
# statistics of each group; the lookup group's get bootstrap bounds too
STATISTICS = ("mean", "p5", "p1", "below_half")
BOUNDED = {"mean": "mean", "p5": "p5", "p1": "p1", "below_half": "share_below_half"}


def _statistics(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {name: math.nan for name in STATISTICS}
    return {
        "mean": float(values.mean()),
        "p5": float(np.percentile(values, 5)),
        "p1": float(np.percentile(values, 1)),
        "below_half": float((values < LOW_ACCEPTANCE).mean()),
    }


def _group_mask(roles: np.ndarray, group: str) -> np.ndarray:
    if group == "all":
        return np.ones(roles.shape, dtype=bool)
    if group == "rest":
        return roles != "lookup"
    return roles == group


def acceptance_columns(seqs: Sequence[StudySequence], cells: Sequence[CellTokens]) -> dict:
    """acceptance_<group>_<statistic> and _n per group; the lookup group's bounds as _lo, _hi."""
    measured = [(s, c) for s, c in zip(seqs, cells) if s.measured]
    roles = np.concatenate([np.array(s.roles, dtype=object) for s, _ in measured])
    alpha = np.concatenate([c.acceptance for _, c in measured])
    owner = np.concatenate([np.full(len(s.roles), j) for j, (s, _) in enumerate(measured)])
    row: dict = {}
    for group in GROUPS:
        mask = _group_mask(roles, group)
        row[f"acceptance_{group}_n"] = int(mask.sum())
        for name, value in _statistics(alpha[mask]).items():
            row[f"acceptance_{group}_{name}"] = value
    mask = _group_mask(roles, "lookup")
    bounds = bootstrap_intervals(alpha[mask], owner[mask]) if mask.any() else {}
    for name, key in BOUNDED.items():
        low, high = bounds.get(key, (math.nan, math.nan))
        row[f"acceptance_lookup_{name}_lo"], row[f"acceptance_lookup_{name}_hi"] = low, high
    return row


def recall_columns(
    seqs: Sequence[StudySequence], cells: Sequence[CellTokens], top: tuple[int, int] | None
) -> dict:
    """key_page_recall: share of (lookup token, sparse layer, KV head) whose step read the
    lookup's key page, with bootstrap bounds; _any_head: share of (lookup, sparse layer)
    where some KV head read it; _top_head: share of lookups whose step read it at `top`
    (index among the sparse layers, KV head: the head ranking's first sparse head);
    key_page_lookups: the lookups counted."""
    measured = [(s, c) for s, c in zip(seqs, cells) if s.measured and c.hits.size]
    if not measured:
        nan = math.nan
        return dict(key_page_recall=nan, key_page_recall_lo=nan, key_page_recall_hi=nan,
                    key_page_recall_any_head=nan, key_page_recall_top_head=nan,
                    key_page_lookups=0)  # fmt: skip
    hits = [c.hits.reshape(c.hits.shape[0], -1).astype(np.float64) for _, c in measured]
    owner = np.concatenate([np.full(h.size, j) for j, h in enumerate(hits)])
    flat = np.concatenate([h.reshape(-1) for h in hits])
    low, high = bootstrap_intervals(flat, owner)["mean"]
    any_head = np.concatenate([c.hits.any(axis=2).reshape(-1) for _, c in measured])
    at_top = math.nan
    if top is not None:
        at_top = float(np.concatenate([c.hits[:, top[0], top[1]] for _, c in measured]).mean())
    return {
        "key_page_recall": float(flat.mean()),
        "key_page_recall_lo": low,
        "key_page_recall_hi": high,
        "key_page_recall_any_head": float(any_head.mean()),
        "key_page_recall_top_head": at_top,
        "key_page_lookups": int(sum(c.hits.shape[0] for _, c in measured)),
    }


def cell_row(
    seqs: Sequence[StudySequence],
    cells: Sequence[CellTokens],
    top: tuple[int, int] | None = None,
) -> dict:
    """Acceptance by token group, key-page recall (`top` as recall_columns') and pages read
    of one cell."""
    measured = [c for s, c in zip(seqs, cells) if s.measured]
    read = sum(c.pages_read for c in measured)
    present = sum(c.pages_present for c in measured)
    row = {"pages_read_share": read / present if present else math.nan}
    row.update(recall_columns(seqs, cells, top))
    row.update(acceptance_columns(seqs, cells))
    return row


def accuracy_estimate(
    seqs: Sequence[StudySequence], logps: Sequence[np.ndarray], newline: int, chains: int
) -> float:
    """The step-0 sampled accuracy (expected graded reward) of the reference sequences from
    these per-token logps: evaluate.py's estimate (tags free, the eos left out)."""
    lines = []
    for seq, logp in zip(seqs, logps):
        if not seq.reference:
            continue
        generated = torch.tensor(seq.ids[seq.prompt_len :])[:-1]  # the completion, no eos
        free = torch.tensor([role == "benign" for role in seq.roles[:-1]])
        values = torch.from_numpy(logp[:-1]).masked_fill(free, 0.0)
        lines.append(line_logps(generated, values, newline))
    if not lines:
        return math.nan
    return float(graded_estimate(torch.stack(lines), chains).mean())


def predicted_cost(
    shape: ModelShape, hardware: Hardware, schedule: Schedule, prompt_len: int, gen_len: int
) -> dict:
    """The cost model's sparse/dense eFLOPs ratio of one sample under the flat schedule, its
    scoring priced for the schedule's rule, the prompt's scoring as published and per page
    (`_pages`: what the engine reads); None for a rule that cannot decode (oracle)."""
    keys = ("predicted_cost_over_dense", "predicted_speedup", "predicted_cost_over_dense_pages",
            "predicted_speedup_pages", "scoring_memory_factor", "scoring_compute_factor")  # fmt: skip
    try:
        compute, memory = scoring_factors(schedule.selection, shape.gqa_ratio)
        costs = [
            schedule_cost(
                schedule,
                model=shape,
                hardware=hardware,
                prompt_len=prompt_len,
                gen_len=gen_len,
                samples=1,
                scoring=scoring,
            )  # fmt: skip
            for scoring in ("published", "pages")
        ]
    except CostModelError:
        return dict.fromkeys(keys)
    values = []
    for cost in costs:
        values += [cost.sparse.total / cost.dense.total, cost.predicted_speedup]
    return dict(zip(keys, values + [memory, compute]))


def head_ranking(key_mass: np.ndarray, lookups: int, template: Schedule) -> list[dict]:
    """(layer, KV head) by mean dense attention mass on the lookups' key pages, largest first."""
    mean = key_mass / max(1, lookups)
    rows = [
        {
            "layer": layer,
            "kv_head": head,
            "key_page_mass": float(mean[layer, head]),
            "sparse_layer": template.is_sparse_layer(layer),
        }
        for layer in range(mean.shape[0])
        for head in range(mean.shape[1])
    ]
    return sorted(rows, key=lambda r: -r["key_page_mass"])


def top_sparse_head(ranking: Sequence[dict], template: Schedule) -> tuple[int, int] | None:
    """(index among the sparse layers, KV head) of the ranking's first head on a sparse layer."""
    for entry in ranking:
        if entry["sparse_layer"]:
            sparse = [i for i in range(entry["layer"] + 1) if template.is_sparse_layer(i)]
            return len(sparse) - 1, entry["kv_head"]
    return None
