"""Selector distillation: DistillSparse's optional term that pulls the sparse actor's page
scores toward the dense policy's attention mass per page (algo.distill.selector_coef).

    probe = SelectorProbe(schedule, seq_lens, prompt_lens, per_sequence=32, centroid_dtype="cache")
    teacher_forced_hidden(model, seqs, prompt_lens, None, on_qk=probe.target)      # no grad
    teacher_forced_hidden(model, seqs, prompt_lens, schedule, on_qk=probe.student)  # LoRA on
    probe.loss()      # mean KL(dense mass || softmax(scores)) over rows, heads and layers
    probe.recall()    # share of that mass on the pages the rule picks (the schedule's top-k)

Top-k selection is discrete, so the token loss gives the LoRA no gradient toward picking a
better page; this term does, through the queries and keys the rule scores. On a few generated
positions of every sequence (`per_sequence`, evenly spaced, the same each step), for every
sparse layer and KV head: the target is the dense forward's attention mass per page (mean
over the group's query heads: the `oracle` rule), renormalised over the pages the decode step
could choose (full pages outside the reserved ones); the student is the schedule's rule scored
on the LoRA forward's queries and its keys' page summaries as the decode's cache holds them
(engine/teacher/selection.sequence_pages: centroids in the engine's centroid dtype, or key
bounds; gradients pass through both), divided by sqrt(head_dim), softmaxed over the same
pages. Rows with no choosable page are left out. Tests:
tests/trainer/test_selector_distill.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from sparrow.engine.teacher.selection import sequence_pages
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import PageSummary, get_rule
from sparrow.sparse.selection import eligible_pages, select_from_scores


def probe_positions(prompt_len: int, length: int, count: int) -> list[int]:
    """Up to `count` generated positions (prompt_len..length-1), evenly spaced, distinct."""
    if count < 1 or length <= prompt_len:
        return []
    steps = torch.linspace(prompt_len, length - 1, count).round().long().unique()
    return [int(p) for p in steps]


class SelectorProbe:
    """The two passes' hooks and what they leave (module doc)."""

    def __init__(
        self,
        schedule: Schedule,
        seq_lens: Sequence[int],
        prompt_lens: Sequence[int],
        per_sequence: int,
        centroid_dtype: str = "cache",
    ):
        self.schedule = schedule
        self.centroid_dtype = centroid_dtype
        self.rule = get_rule(schedule.selection)
        self.oracle = get_rule("oracle")  # the dense attention mass per page
        self.spans, start = [], 0
        for length, prompt_len in zip(seq_lens, prompt_lens):
            self.spans.append((start, length, probe_positions(prompt_len, length, per_sequence)))
            start += length
        self._on_device: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.targets: dict[tuple[int, int], torch.Tensor] = {}
        self.terms: list[torch.Tensor] = []
        self.recalls: list[torch.Tensor] = []

    def _rows(self, layer: int, device: torch.device):
        """(sequence index, its keys span, positions [R], top-k [R]) of a sparse layer's probed
        rows; the two tensors are made once per sequence, on the first layer's device."""
        if not self.schedule.is_sparse_layer(layer):
            return
        for index, (start, length, positions) in enumerate(self.spans):
            if not positions:
                continue
            if index not in self._on_device:
                topk = [self.schedule.topk_for_position(p) for p in positions]
                self._on_device[index] = (
                    torch.tensor(positions, device=device),
                    torch.tensor(topk, device=device),
                )
            yield index, slice(start, start + length), *self._on_device[index]

    def _choosable(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """[R, 1, P] pages the decode step at each row's position could choose by score."""
        s = self.schedule
        return eligible_pages(rows // s.page_size + 1, width, s.reserved_bos, s.reserved_eos)

    def target(self, layer: int, q: torch.Tensor, k: torch.Tensor) -> None:
        """Dense pass hook: each probed row's attention mass per choosable page, normalised."""
        for index, span, rows, _ in self._rows(layer, q.device):
            keys = k[span].detach()
            summary = PageSummary(keys=keys, positions=rows, page_size=self.schedule.page_size)
            mass = self.oracle.score(q[span][rows].detach(), summary)  # [R, Hkv, P]
            mass = mass * self._choosable(rows, mass.shape[-1])
            total = mass.sum(-1, keepdim=True)
            self.targets[(layer, index)] = torch.where(total > 0, mass / total, 0.0)

    def student(self, layer: int, q: torch.Tensor, k: torch.Tensor) -> None:
        """LoRA pass hook: the KL of each probed row against its target, and the mass recall
        of the pages the rule would pick."""
        size, dim = self.schedule.page_size, q.shape[-1]
        for index, span, rows, topk in self._rows(layer, q.device):
            target = self.targets.get((layer, index))
            if target is None:
                raise RuntimeError(f"selector probe: no dense target for layer {layer}")
            summary = sequence_pages(k[span], size, self.centroid_dtype, self.rule)
            scores = self.rule.score(q[span][rows], summary) / math.sqrt(dim)  # [R, Hkv, P]
            choosable = self._choosable(rows, scores.shape[-1])
            # finite, so a row with nothing to choose (left out below) gives no NaN gradient
            logp = torch.log_softmax(scores.masked_fill(~choosable, -1e9), dim=-1)
            kept = target.sum(-1) > 0  # [R, Hkv]: rows and heads with a choosable page
            if not kept.any():
                continue
            safe = torch.where(choosable & (target > 0), target, 1.0)
            kl = (target * (safe.log() - logp.masked_fill(~choosable, 0.0))).sum(-1)
            self.terms.append(kl[kept].mean())
            picked = select_from_scores(
                scores.detach(),
                rows // size + 1,
                topk,
                self.schedule.reserved_bos,
                self.schedule.reserved_eos,
            )
            self.recalls.append((target * (picked & choosable)).sum(-1)[kept].mean())

    def loss(self) -> torch.Tensor | None:
        """Mean KL over the probed layers and sequences (with gradients); None without any."""
        return torch.stack(self.terms).mean() if self.terms else None

    def recall(self) -> float | None:
        """Mean share of the dense mass on the picked pages; None without any probed row."""
        return float(torch.stack(self.recalls).mean()) if self.recalls else None
