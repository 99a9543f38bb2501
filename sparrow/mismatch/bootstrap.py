"""Cluster-bootstrap confidence intervals of per-bin acceptance statistics.

    from sparrow.mismatch.bootstrap import bootstrap_intervals
    intervals = bootstrap_intervals(acceptance, trajectory_ids, seed=0)   # one bin's tokens
    low, high = intervals["p5"]                                           # 95% percentile interval
    delta, low, high = paired_difference_intervals(before, after, trajectory_ids)["p5"]

Tokens of one trajectory are correlated (one hard prefix lowers many of them), so the
resampling unit is the whole trajectory: each replicate draws as many trajectories as the bin
holds, with replacement, and takes every token of each draw. Each replicate's statistics are
those of bin_statistics (numpy's linear percentiles, the mean, the minimum, the share below
0.5) on the repeated tokens; the interval is the percentile interval of the replicates (the
plain percentile bootstrap; a bin with fewer than 2 trajectories gets NaN: one trajectory says
nothing about the spread between them). The replicates are computed without building them:
the bin is sorted once and each replicate is a vector of per-cluster repeat counts; the k-th
value of a replicate is found from its counts summed per block of sorted tokens, then inside
one block (tests hold it to a plain loop).
"""

from __future__ import annotations

import math

import numpy as np

# statistics that get an interval: the bin_stats columns <name>_lo and <name>_hi
STATISTICS = ("mean", "p1", "p5", "p10", "p50", "min", "share_below_half")
PERCENTILE_OF = {"p1": 1.0, "p5": 5.0, "p10": 10.0, "p50": 50.0}
RESAMPLES = 200
LEVEL = 0.95
# sorted tokens per block of the percentile search (_replicate_percentiles)
BLOCK_TOKENS = 512
# strictly below this counts in share_below_half (stats.LOW_ACCEPTANCE)
LOW_ACCEPTANCE = 0.5


def draw_clusters(num_clusters: int, resamples: int, seed: int | tuple[int, ...]) -> np.ndarray:
    """[resamples, num_clusters] cluster indices drawn with replacement (numpy's PCG64)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, num_clusters, size=(resamples, num_clusters))


def replicate_statistics(
    values: np.ndarray, clusters: np.ndarray, draws: np.ndarray
) -> dict[str, np.ndarray]:
    """Every statistic of STATISTICS on each replicate: {name: [resamples]}.

    values: one bin's acceptance; clusters: its trajectory codes in [0, K); draws: the
    [resamples, K] output of draw_clusters.
    """
    num_clusters = int(draws.shape[1])
    resamples = int(draws.shape[0])
    offsets = (np.arange(resamples) * num_clusters)[:, None]
    counts = np.bincount((draws + offsets).ravel(), minlength=resamples * num_clusters)
    counts = counts.reshape(resamples, num_clusters).astype(np.float64)
    sizes = np.bincount(clusters, minlength=num_clusters).astype(np.float64)
    sums = np.bincount(clusters, weights=values, minlength=num_clusters)
    low = np.bincount(clusters, weights=values < LOW_ACCEPTANCE, minlength=num_clusters)
    lowest = np.full(num_clusters, np.inf)
    np.minimum.at(lowest, clusters, values)
    tokens = counts @ sizes
    out = {
        "mean": np.clip(counts @ sums / tokens, 0.0, 1.0),
        "share_below_half": counts @ low / tokens,
        "min": np.where(counts > 0, lowest[None, :], np.inf).min(axis=1),
    }
    out.update(_replicate_percentiles(values, clusters, counts))
    return out


def _replicate_percentiles(
    values: np.ndarray, clusters: np.ndarray, counts: np.ndarray
) -> dict[str, np.ndarray]:
    """numpy's linear percentile of each replicate, the replicate given as repeat counts.

    The k-th (0-based) value of a replicate is the first token, in sorted order, whose
    cumulative repeat count exceeds k. The sorted tokens are cut into blocks of BLOCK_TOKENS;
    each block's per-cluster token counts, cumulated, give every replicate's count at every
    block end in one matrix product, which finds the block that holds the k-th value; only
    inside that block are the repeat counts cumulated token by token. Exact: the counts are
    integers far below 2**53."""
    order = np.argsort(values, kind="stable")
    ordered, codes = values[order], clusters[order]
    num_clusters, resamples = counts.shape[1], counts.shape[0]
    size = max(1, BLOCK_TOKENS)
    blocks = -(-values.size // size)
    pad = blocks * size - values.size  # the last block filled with a cluster counted 0 times
    codes = np.concatenate([codes, np.full(pad, num_clusters, dtype=codes.dtype)])
    weights = np.concatenate([counts, np.zeros((resamples, 1), dtype=counts.dtype)], axis=1)
    cells = (np.arange(codes.size) // size) * (num_clusters + 1) + codes
    per_block = np.bincount(cells, minlength=blocks * (num_clusters + 1)).astype(np.float64)
    per_block = per_block.reshape(blocks, num_clusters + 1)
    # replicate r's repeated tokens up to the end of block b: [resamples, blocks]
    at_ends = np.rint(weights.astype(np.float64) @ np.cumsum(per_block, axis=0).T).astype(np.int64)
    totals = at_ends[:, -1]
    rows = np.arange(resamples)
    out = {}
    for name, q in PERCENTILE_OF.items():
        h = (totals - 1) * (q / 100.0)
        below = np.floor(h).astype(np.int64)
        above = np.minimum(below + 1, totals - 1)
        a, b = (_kth(ordered, codes, weights, at_ends, rows, k, size) for k in (below, above))
        out[name] = a + (h - below) * (b - a)
    return out


def _kth(ordered, codes, weights, at_ends, rows, k, size) -> np.ndarray:
    """Each replicate's k[r]-th repeated value (module doc of _replicate_percentiles)."""
    block = (at_ends <= k[:, None]).sum(axis=1)  # the first block whose end count exceeds k
    before = np.where(block > 0, at_ends[rows, np.maximum(block - 1, 0)], 0)
    spots = block[:, None] * size + np.arange(size)[None, :]  # [resamples, size]
    running = before[:, None] + np.cumsum(weights[rows[:, None], codes[spots]], axis=1)
    first = (running <= k[:, None]).sum(axis=1)  # the first token whose count exceeds k
    return ordered[np.minimum(block * size + first, ordered.size - 1)]


def bootstrap_intervals(
    values,
    clusters,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int | tuple[int, ...] = 0,
) -> dict[str, tuple[float, float]]:
    """{statistic: (low, high)}: the percentile interval at `level` of `resamples` cluster
    bootstrap replicates; NaN bounds when the bin holds fewer than 2 clusters."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    codes, num_clusters = _codes(clusters)
    if codes.size != values.size:
        raise ValueError(f"clusters has {codes.size} entries but values has {values.size}")
    _check_level(level, resamples)
    if num_clusters < 2:
        return {name: (math.nan, math.nan) for name in STATISTICS}
    replicates = replicate_statistics(values, codes, draw_clusters(num_clusters, resamples, seed))
    return {name: _interval(replicates[name], level) for name in STATISTICS}


def paired_difference_intervals(
    before,
    after,
    clusters,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int | tuple[int, ...] = 0,
) -> dict[str, tuple[float, float, float]]:
    """{statistic: (after's minus before's, low, high)} for two measurements of the same tokens
    (the same trajectories replayed twice: before and after a change, or with and without a
    LoRA). Each replicate draws clusters once and takes the statistic of both measurements on
    that draw, so the interval is of the paired difference: what the two share (which
    trajectories are hard) cancels. NaN bounds with fewer than 2 clusters."""
    before = np.asarray(before, dtype=np.float64).reshape(-1)
    after = np.asarray(after, dtype=np.float64).reshape(-1)
    codes, num_clusters = _codes(clusters)
    if not before.size == after.size == codes.size:
        raise ValueError(
            f"before, after and clusters must be the same tokens: {before.size}, "
            f"{after.size}, {codes.size} entries"
        )
    if not codes.size:
        raise ValueError("no tokens to compare")
    _check_level(level, resamples)
    whole = np.arange(num_clusters)[None, :]  # the sample itself: every cluster once
    point = {name: float(a[0] - b[0]) for name, (a, b) in _both(before, after, codes, whole)}
    if num_clusters < 2:
        return {name: (point[name], math.nan, math.nan) for name in STATISTICS}
    draws = draw_clusters(num_clusters, resamples, seed)
    return {
        name: (point[name], *_interval(a - b, level))
        for name, (a, b) in _both(before, after, codes, draws)
    }


def _codes(clusters) -> tuple[np.ndarray, int]:
    """Each token's cluster as a code in [0, K), and K."""
    _, codes = np.unique(np.asarray(clusters).reshape(-1), return_inverse=True)
    return codes, int(codes.max()) + 1 if codes.size else 0


def _check_level(level: float, resamples: int) -> None:
    if not 0.0 < level < 1.0 or resamples < 2:
        raise ValueError(f"need 0 < level < 1 and resamples >= 2, got {level}, {resamples}")


def _interval(replicates: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval at `level` of the replicates."""
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(replicates, [tail, 100.0 - tail])
    return float(low), float(high)


def _both(before, after, codes, draws) -> list[tuple[str, tuple[np.ndarray, np.ndarray]]]:
    """[(statistic, (after's replicates, before's))] on the same draws."""
    first = replicate_statistics(before, codes, draws)
    second = replicate_statistics(after, codes, draws)
    return [(name, (second[name], first[name])) for name in STATISTICS]
