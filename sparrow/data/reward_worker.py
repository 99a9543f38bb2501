"""The worker process of the reward runner (reward_runner.py starts it; nothing else should).

    python -m sparrow.data.reward_worker FD

FD is an inherited socket speaking multiprocessing.connection's framing. The parent sends its
sys.path and then the reward function (pickled by reference, so the child imports the module
that defines it); the worker calls the function's optional `warm_up()` (heavy imports, so they
do not count against the first call's timeout), says ("ready",), then answers each job
(index, completion, answer[, keyword arguments]) with (index, "ok", reward) or (index, "error", message, traceback)
until it reads None or the parent goes away. Started with `-m`, it never re-imports the
parent's __main__, unlike multiprocessing's spawn. A `module:function` or `file.py:function`
spec arrives as an object whose unpickling loads the function here (reward_spec.py).
"""

from __future__ import annotations

import math
import sys
import traceback
from multiprocessing.connection import Connection


def serve(conn: Connection) -> None:
    parent_path = conn.recv()
    sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
    function = conn.recv()
    warm_up = getattr(function, "warm_up", None)
    if callable(warm_up):
        warm_up()
    conn.send(("ready",))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        index, completion, answer, *keywords = job
        try:
            value = float(function(completion, answer, **(keywords[0] if keywords else {})))
            if not math.isfinite(value):
                raise ValueError(f"reward is {value}, not a finite number")
            conn.send((index, "ok", value))
        except Exception as err:  # the sample fails, the worker lives on
            conn.send((index, "error", f"{type(err).__name__}: {err}", traceback.format_exc()))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print(
            "usage: python -m sparrow.data.reward_worker FD (started by the reward runner)",
            file=sys.stderr,
        )
        return 2
    serve(Connection(int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
