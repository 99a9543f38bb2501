"""Starting Prefect's temporary API server on a new PREFECT_HOME (`start_local_server`, what
`sparrow train` and each arm of a study do first), with the database made by the server's
migrations against copied from the kept empty one, in one run: seconds to the health check's
answer, the server's CPU seconds, and their ratios.

    python benchmarks/prefect_start.py --out prefect_start.json       # 3 new homes each way

"made": the cache folder emptied before each start, so the server makes its database; the
last of them leaves the template that the "copied" starts then use. Prefect is never imported
into this process (the servers are processes of their own, as in `sparrow train`).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_json  # noqa: E402
from sparrow.flows.prefect_env import quiet_prefect  # noqa: E402
from sparrow.flows.server_guard import start_local_server  # noqa: E402


def time_start(home: Path) -> tuple[float, float]:
    """(seconds to the server's answer, its CPU seconds) for one server on the new `home`."""
    os.environ["PREFECT_HOME"] = str(home)
    os.environ.pop("PREFECT_API_URL", None)
    quiet_prefect()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    clock = time.perf_counter()
    server = start_local_server()
    seconds = time.perf_counter() - clock
    server.stop()  # waited for: its CPU time is in RUSAGE_CHILDREN now
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return seconds, cpu


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3, help="new homes timed each way")
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)
    saved = {k: os.environ.get(k) for k in ("SPARROW_CACHE_DIR", "PREFECT_HOME", "PREFECT_API_URL")}
    made, copied = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            os.environ["SPARROW_CACHE_DIR"] = str(root / "cache")
            for index in range(args.starts):
                for kept in (root / "cache").glob("*"):
                    kept.unlink()
                made.append(time_start(root / f"made-{index}"))
            for index in range(args.starts):
                copied.append(time_start(root / f"copied-{index}"))
    finally:  # the caller's environment as it was
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    made_s, copied_s = [m[0] for m in made], [c[0] for c in copied]
    made_cpu, copied_cpu = [m[1] for m in made], [c[1] for c in copied]
    result = {
        "benchmark": "prefect_start",
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "starts": args.starts,
        "made_s": made_s,
        "copied_s": copied_s,
        "made_cpu_s": made_cpu,
        "copied_cpu_s": copied_cpu,
        "made_median_s": statistics.median(made_s),
        "copied_median_s": statistics.median(copied_s),
        "ratio": statistics.median(made_s) / statistics.median(copied_s),
        "cpu_ratio": statistics.median(made_cpu) / statistics.median(copied_cpu),
    }
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
