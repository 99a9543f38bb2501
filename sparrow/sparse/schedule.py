"""A sparsity schedule: how many KV pages each decode step may read, per length bin.

A schedule holds the page size, the bin width in tokens, the top-k page count for every bin,
the always-read pages (reserved_bos at the start, reserved_eos most recent, the partial page
among them), the dense layers (skip_layers), the acceptance target it was chosen for, a
name, the page-scoring rule (`selection`, sparse/scoring.py; "centroid" by default) and the
(layer, KV head) pairs that read every page (`dense_heads`). A position past the last bin uses the last bin's budget (the reference schedules have
20 bins, the last one covering everything from 38K tokens on).

Schedule owns the rules every layer shares: bin_of (position -> length bin, clamped to the last
bin) and pages_read (top-k plus the reserved pages, at most the cache's n); it delegates to
sparrow/schedule_math.py, the pure copy that layers below sparse (mismatch, kernels) call.

The target: `cfg.schedule.target` is the source of truth for a run; aggregate_mismatch, the
controller and calibration hold every bin to it. `Schedule.target` records the target the
schedule was chosen for (a preset's paper target, or cfg.schedule.target when calibrated) and
is stored and shown with it; no control decision reads it.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace

from sparrow import schedule_math
from sparrow.errors import SparrowError
from sparrow.sparse.scoring import get_rule


class ScheduleError(SparrowError, ValueError):
    """A schedule that breaks an invariant (named in the message)."""


@dataclass(frozen=True)
class Schedule:
    """Top-k pages per length bin plus the always-read pages; invariants checked on creation."""

    name: str
    topk_pages: tuple[int, ...]
    page_size: int = 16
    bin_tokens: int = 2000
    reserved_bos: int = 1
    reserved_eos: int = 2
    skip_layers: tuple[int, ...] = (0, 1)
    target: float = 0.86
    description: str = field(default="", compare=False)
    # page-scoring rule (sparse/scoring.py SCORING_RULES; docs/selection.md)
    selection: str = "centroid"
    # (layer, KV head) pairs that read every page on sparse layers
    dense_heads: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        # accept lists from YAML/JSON; store tuples so the schedule is hashable
        object.__setattr__(self, "topk_pages", _int_tuple(self.name, "topk_pages", self.topk_pages))
        object.__setattr__(
            self, "skip_layers", _int_tuple(self.name, "skip_layers", self.skip_layers)
        )
        object.__setattr__(self, "dense_heads", _pairs(self.name, self.dense_heads))
        self.validate()

    def validate(self) -> None:
        where = f"schedule {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ScheduleError(f"a schedule needs a non-empty name, got {self.name!r}")
        for key in ("page_size", "bin_tokens", "reserved_bos", "reserved_eos"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ScheduleError(f"{where}: {key} must be an integer, got {value!r}")
        if isinstance(self.target, bool) or not isinstance(self.target, numbers.Real):
            raise ScheduleError(f"{where}: target must be a number, got {self.target!r}")
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ScheduleError(f"{where}: page_size must be a power of two, got {self.page_size}")
        if self.bin_tokens < 1:
            raise ScheduleError(f"{where}: bin_tokens must be positive, got {self.bin_tokens}")
        if not self.topk_pages:
            raise ScheduleError(f"{where}: topk_pages must list at least one bin")
        if any(pages < 1 for pages in self.topk_pages):
            raise ScheduleError(
                f"{where}: topk_pages must be positive, got {list(self.topk_pages)}"
            )
        for i, (a, b) in enumerate(zip(self.topk_pages, self.topk_pages[1:])):
            if b < a:
                raise ScheduleError(
                    f"{where}: topk_pages must be non-decreasing over bins, "
                    f"bin {i + 1} has {b} < bin {i} {a}"
                )
        if self.reserved_bos < 0 or self.reserved_eos < 1:
            raise ScheduleError(
                f"{where}: reserved_bos must be >= 0 and reserved_eos >= 1 "
                f"(the partial page is always read), got {self.reserved_bos}, {self.reserved_eos}"
            )
        if any(i < 0 for i in self.skip_layers):
            raise ScheduleError(f"{where}: skip_layers must be layer indices >= 0")
        if not 0.0 < self.target <= 1.0:
            raise ScheduleError(f"{where}: target must be in (0, 1], got {self.target}")
        try:
            get_rule(self.selection)
        except (ValueError, TypeError) as err:
            raise ScheduleError(f"{where}: selection: {err}") from None
        if any(layer < 0 or head < 0 for layer, head in self.dense_heads):
            raise ScheduleError(f"{where}: dense_heads must hold (layer, KV head) pairs >= 0")

    @property
    def num_bins(self) -> int:
        return len(self.topk_pages)

    def bin_of(self, position):
        """Bin index of a total position (prompt plus generated), clamped to the last bin.

        Takes an int (checked >= 0), a numpy array or a torch tensor (not checked: no device
        sync on the decode path) and returns the same kind.
        """
        if isinstance(position, numbers.Real) and position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        return schedule_math.bin_of(position, self.bin_tokens, self.num_bins)

    def topk_for_position(self, position: int) -> int:
        """Top-k pages chosen by score at this total position (reserved pages not counted)."""
        return self.topk_pages[self.bin_of(position)]

    def pages_read(self, position: int, num_pages: int | None = None) -> int:
        """Pages read per step at this position: top-k plus the reserved pages, at most
        num_pages (the cache's page count; no more than k eligible pages is a dense step)."""
        return self.pages_for_topk(self.topk_for_position(position), num_pages)

    def pages_for_topk(self, topk_pages, num_pages=None):
        """Pages read per step when `topk_pages` are chosen (a bin's or a grid candidate's):
        top-k plus this schedule's reserved pages, at most num_pages when given."""
        return schedule_math.pages_read(topk_pages, self.reserved_bos, self.reserved_eos, num_pages)

    def budget_tokens(self, position: int) -> int:
        """KV budget B in tokens at this position (pages read times page size)."""
        return self.pages_read(position) * self.page_size

    def is_sparse_layer(self, layer: int) -> bool:
        return layer not in self.skip_layers

    def dense_heads_of(self, layer: int) -> tuple[int, ...]:
        """KV heads of `layer` that read every page (dense_heads), in order."""
        return tuple(sorted(head for at, head in self.dense_heads if at == layer))

    def bin_bounds(self, index: int) -> tuple[int, int | None]:
        """Total positions [start, end) of a bin; the last bin's end is None (open)."""
        if not 0 <= index < self.num_bins:
            raise ValueError(f"bin index must be in [0, {self.num_bins}), got {index}")
        end = None if index == self.num_bins - 1 else (index + 1) * self.bin_tokens
        return index * self.bin_tokens, end

    def reserved_pages(self) -> int:
        """Pages always read outside the top-k: reserved_bos + reserved_eos."""
        return self.reserved_bos + self.reserved_eos

    def at_page_size(self, page_size: int) -> Schedule:
        """The same token budgets in pages of `page_size` tokens: top-k and reserved pages
        scaled by the ratio of the sizes (16 -> 8 doubles them; 8 -> 16 needs even counts)."""
        if page_size == self.page_size:
            return self
        counts = (*self.topk_pages, self.reserved_bos, self.reserved_eos)
        scaled = [count * self.page_size / page_size for count in counts]
        if any(value != int(value) for value in scaled):
            raise ScheduleError(
                f"schedule {self.name!r}: pages of {self.page_size} tokens do not make whole "
                f"pages of {page_size} ({list(counts)} top-k and reserved)"
            )
        *topk, bos, eos = (int(value) for value in scaled)
        return replace(
            self, page_size=page_size, topk_pages=tuple(topk), reserved_bos=bos, reserved_eos=eos
        )

    def configured(self, settings) -> Schedule:
        """This schedule under a run's `schedule` config group (sparrow.config.schema
        ScheduleConfig): its selection and dense_heads, and page_size when not 0."""
        page_size = int(settings.page_size)
        schedule = self.at_page_size(page_size) if page_size else self
        return replace(
            schedule,
            selection=settings.selection,
            dense_heads=tuple(tuple(pair) for pair in settings.dense_heads),
        )


def _pairs(name: str, values) -> tuple[tuple[int, int], ...]:
    """dense_heads as sorted, distinct (layer, head) integer pairs."""
    pairs = set()
    for value in values:
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ScheduleError(
                f"schedule {name!r}: dense_heads must hold (layer, KV head) pairs, got {value!r}"
            )
        pairs.add(_int_tuple(name, "dense_heads", value))
    return tuple(sorted(pairs))


def _int_tuple(name: str, key: str, values) -> tuple[int, ...]:
    # int() alone would truncate 2.5 to 2 or accept "3"; a schedule is written in whole pages
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value:
            raise ScheduleError(f"schedule {name!r}: {key} must hold integers, got {value!r}")
        out.append(int(value))
    return tuple(out)
