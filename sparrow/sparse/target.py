"""The per-bin statistic a schedule holds at its target: p5 (the paper's) or another one.

    from sparrow.sparse.target import get_statistic
    statistic = get_statistic("p5")                # schedule.target_statistic
    statistic.column                               # its bin_stats / BinStats / table field
    statistic.misses(value, target)                # the bin is below its target
    statistic.oriented(values)                     # on the controller's higher-is-better axis

`schedule.target_statistic` names one entry of TARGET_STATISTICS: p5 (default), p1, p10, mean,
min (the lowest acceptance in the bin) or share_below_half (the share of the bin's tokens
with acceptance below 0.5). The controller (controller.py), calibration's choice (choose.py)
and the threshold events all compare "value >= target". For share_below_half lower is better,
so they are handed 1 - share against 1 - target: schedule.target is then the largest share
allowed (e.g. 0.02), and a bin misses when its share is above it. Beyond the paper, which
watched p5 only; p5 keeps every number exactly as before (oriented is the identity).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sparrow.registry import Registry

DEFAULT_STATISTIC = "p5"


@dataclass(frozen=True)
class TargetStatistic:
    """One per-bin acceptance statistic: its name, its column, and which way is better."""

    name: str
    # the field of BinStats and the column of bin_stats (and of AcceptanceTable) holding it
    column: str
    higher_is_better: bool = True
    description: str = ""

    def oriented(self, value):
        """The value on the higher-is-better axis (a float or a numpy array)."""
        return value if self.higher_is_better else 1.0 - value

    def misses(self, value: float, target: float) -> bool:
        """True when the bin's value is on the wrong side of the target."""
        return self.oriented(value) < self.oriented(target)

    def worst(self, values: Iterable[float]) -> float:
        """The worst of several bins' values (the lowest, or the highest share)."""
        values = list(values)
        return min(values) if self.higher_is_better else max(values)


TARGET_STATISTICS: Registry[TargetStatistic] = Registry("target statistic")

for _statistic in (
    TargetStatistic("p5", "p5", description="5th percentile of acceptance (the paper's)"),
    TargetStatistic("p1", "p1", description="1st percentile of acceptance"),
    TargetStatistic("p10", "p10", description="10th percentile of acceptance"),
    TargetStatistic("mean", "mean", description="mean acceptance"),
    TargetStatistic("min", "min", description="lowest acceptance in the bin"),
    TargetStatistic(
        "share_below_half",
        "share_below_half",
        higher_is_better=False,
        description="share of tokens with acceptance below 0.5",
    ),
):
    TARGET_STATISTICS.register(_statistic.name)(_statistic)


def get_statistic(name: str = DEFAULT_STATISTIC) -> TargetStatistic:
    """The statistic called `name`; KeyError listing the valid names otherwise."""
    return TARGET_STATISTICS.get(name)
