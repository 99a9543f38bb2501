"""Code reward throughput on this machine's CPUs and the bwrap sandbox's cost per run (JSON).

    python benchmarks/code_reward.py                      # the figures of docs/code_rl.md
    python benchmarks/code_reward.py --smoke              # small, seconds (tests)
    python benchmarks/code_reward.py --out results.json
    python benchmarks/code_reward.py --total-limits rlimits   # overhead without the run cgroup

overhead: the same trivial program (`print(1)`) run `--runs` times one after another, as
plain `python -I -B program.py` and through the sandbox (bwrap, the harness, the rlimits;
code_reward.run_test), both with the interpreter the sandbox uses; medians in ms and their
difference. throughput: the sample set's reference solutions (sparrow/assets/code,
ten programs, 31 tests; each test one sandboxed run) repeated `--copies` times, scored with
the registered `code` reward by the reward runner at each worker count of `--workers`:
programs and sandboxed runs per second, wall clock including the workers' start, every
reward checked to be 1.0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparrow.data.code_datasets import SAMPLE_PATH, read_code_file  # noqa: E402
from sparrow.data.code_reward import parse_tests, program_box, run_test  # noqa: E402
from sparrow.data.reward_runner import score_completions  # noqa: E402
from sparrow.data.sandbox import SandboxLimits, find_bwrap, sandbox_python  # noqa: E402

TRIVIAL = "print(1)\n"


def overhead(runs: int, total_limits: str = "auto") -> dict:
    python, limits = sandbox_python(), SandboxLimits(total_limits=total_limits)
    plain, sandboxed = [], []
    with tempfile.TemporaryDirectory() as folder, program_box(TRIVIAL) as box:
        program = Path(folder) / "program.py"
        program.write_text(TRIVIAL)
        for _ in range(runs):  # interleaved, so load on the machine hits both alike
            start = time.perf_counter()
            done = subprocess.run([python, "-I", "-B", str(program)], capture_output=True)
            plain.append(time.perf_counter() - start)
            assert done.stdout == b"1\n"
            start = time.perf_counter()
            result = run_test(box, 0, "", limits)
            sandboxed.append(time.perf_counter() - start)
            assert result.finished and result.stdout == b"1\n", result
    plain_ms, sandbox_ms = statistics.median(plain) * 1e3, statistics.median(sandboxed) * 1e3
    return {
        "runs": runs,
        "plain_python_ms": round(plain_ms, 1),
        "sandboxed_ms": round(sandbox_ms, 1),
        "overhead_ms": round(sandbox_ms - plain_ms, 1),
        "ratio": round(sandbox_ms / plain_ms, 2),
        "total_limits": result.total_limits,
    }


def throughput(copies: int, workers: int) -> dict:
    rows = [json.loads(line) for line in SAMPLE_PATH.read_text().splitlines()]
    _, answers = read_code_file(SAMPLE_PATH)
    solutions = [f"```python\n{json.loads(row['solutions'])[0]}```" for row in rows]
    completions, tests = solutions * copies, answers * copies
    runs = sum(len(parse_tests(a).inputs) for a in tests)
    start = time.perf_counter()
    batch = score_completions("code", completions, tests, timeout_s=60.0, workers=workers)
    seconds = time.perf_counter() - start
    if batch.rewards != [1.0] * len(completions):
        raise SystemExit(f"a reference solution did not score 1.0: {batch}")
    return {
        "workers": workers,
        "programs": len(completions),
        "sandboxed_runs": runs,
        "seconds": round(seconds, 2),
        "programs_per_s": round(len(completions) / seconds, 2),
        "runs_per_s": round(runs / seconds, 1),
    }


def facts() -> dict:
    bwrap = find_bwrap()
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", *sys.argv]),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "sandbox_python": sandbox_python(),
        "bwrap": version,
        "as_root": os.geteuid() == 0,
        "kernel": platform.release(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="trivial runs per arm")
    parser.add_argument("--copies", type=int, default=8, help="copies of the sample set")
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="3 runs, 1 copy, 2 workers")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument(
        "--total-limits", default="auto", help="SandboxLimits.total_limits of the overhead arm"
    )
    args = parser.parse_args(argv)
    runs, copies, workers = (
        (3, 1, [2])
        if args.smoke
        else (args.runs, args.copies, [int(w) for w in args.workers.split(",")])
    )
    payload = {
        "facts": facts(),
        "overhead": overhead(runs, args.total_limits),
        "throughput": [throughput(copies, count) for count in workers],
    }
    text = json.dumps(payload, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
