"""Opening MLflow tracking on a new workdir (`Tracker.start`), with the store copied from the
kept empty one against made by MLflow's migrations, in one run: seconds and their ratio.

    python benchmarks/tracking_start.py --out tracking_start.json       # 5 new workdirs each way

Each way starts from its own cache folder: "migrated" from an empty one on every start (no
kept store to copy), "copied" from one whose store was kept by a first, untimed start. The
first start of the process (imports, MLflow's first client) is untimed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_json  # noqa: E402
from sparrow.config import load_config  # noqa: E402
from sparrow.runtime.tracking import Tracker  # noqa: E402


def time_starts(cfg, root: Path, cache: Path, starts: int, keep_cache: bool) -> list[float]:
    os.environ["SPARROW_CACHE_DIR"] = str(cache)
    Tracker.start(cfg, "first", root / "first")  # untimed; keeps the empty store in `cache`
    seconds = []
    for index in range(starts):
        if not keep_cache:
            for kept in cache.glob("*.db"):
                kept.unlink()
        clock = time.perf_counter()
        Tracker.start(cfg, "run", root / f"work-{index}")
        seconds.append(time.perf_counter() - clock)
    return seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="new workdirs timed each way")
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)
    cfg = load_config([])
    users = os.environ.get("SPARROW_CACHE_DIR")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            migrated = time_starts(cfg, root / "m", root / "cache-m", args.starts, False)
            copied = time_starts(cfg, root / "c", root / "cache-c", args.starts, True)
    finally:  # the caller's cache folder as it was
        if users is None:
            os.environ.pop("SPARROW_CACHE_DIR", None)
        else:
            os.environ["SPARROW_CACHE_DIR"] = users
    result = {
        "benchmark": "tracking_start",
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "starts": args.starts,
        "migrated_s": migrated,
        "copied_s": copied,
        "migrated_median_s": statistics.median(migrated),
        "copied_median_s": statistics.median(copied),
        "ratio": statistics.median(migrated) / statistics.median(copied),
    }
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
