"""The cluster bootstrap of one bin's acceptance (sparrow/mismatch/bootstrap.py, run by
aggregate_mismatch for every bin of every step): seconds per bin at the sizes runs have, and,
with --against, the same bins timed with another version of the module in the same run.

    python benchmarks/bin_bootstrap.py --out bin_bootstrap.json
    git show REV:sparrow/mismatch/bootstrap.py > /tmp/before.py
    python benchmarks/bin_bootstrap.py --against /tmp/before.py --out bin_bootstrap.json

Cases (tokens in the bin x trajectories): the V2 study's first bin (128 samples of about
2,000 tokens: 256K x 128), a 32K run's bin at batch 16 and 64 (32K x 16, 128K x 64), and a
bin of many short samples (64K x 2,048). Values are drawn from a Beta(20, 1) per token (the
shape of acceptance), clusters as consecutive runs. Per case: the median of --repeats timed
calls (after one untimed), and with --against its time, the ratio and whether the intervals
are equal.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = {"study-v2": (256_000, 128), "32k-b16": (32_768, 16), "32k-b64": (131_072, 64)}
CASES["short-samples"] = (65_536, 2_048)


def load(path: str):
    spec = importlib.util.spec_from_file_location("bootstrap_against", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seconds(function, values, clusters, repeats: int) -> tuple[float, dict]:
    result = function(values, clusters, seed=0)
    times = []
    for _ in range(repeats):
        clock = time.perf_counter()
        function(values, clusters, seed=0)
        times.append(time.perf_counter() - clock)
    return statistics.median(times), result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", help="another bootstrap.py to time on the same bins")
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)
    from benchmarks.common import device_facts, write_json
    from sparrow.mismatch.bootstrap import bootstrap_intervals

    other = load(args.against).bootstrap_intervals if args.against else None
    rng = np.random.default_rng(0)
    cases = {}
    for name, (tokens, trajectories) in CASES.items():
        values = rng.beta(20.0, 1.0, size=tokens)
        clusters = np.repeat(np.arange(trajectories), tokens // trajectories)
        row = {"tokens": tokens, "trajectories": trajectories}
        row["seconds"], mine = seconds(bootstrap_intervals, values, clusters, args.repeats)
        if other is not None:
            row["against_seconds"], theirs = seconds(other, values, clusters, args.repeats)
            row["speedup"] = row["against_seconds"] / row["seconds"]
            row["same_intervals"] = mine == theirs
        cases[name] = row
    result = {
        "benchmark": "bootstrap",
        "facts": device_facts(),
        "repeats": args.repeats,
        "against": args.against,
        "cases": cases,
    }
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
