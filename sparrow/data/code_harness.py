"""Runs inside the sandbox, as /sandbox/harness.py: sets the limits, then runs one test of
/sandbox/program.py. The code reward copies this file there; nothing imports it.

    python -I -B /sandbox/harness.py stdin 3 '{"CPU": 2, "AS": 536870912, ...}'
    python -I -B /sandbox/harness.py call 3 '{...}' FUNCTION_NAME

stdin: test 3's input (/sandbox/3.in) becomes fd 0 and the program runs as __main__; the
parent compares what it prints. call: the program runs as a module (its `if __name__ ==
"__main__":` block does not), then FUNCTION_NAME (a top-level function, else a method of a
class Solution, as LeetCode-style rows define it) is called with the arguments of
/sandbox/3.json; the return value goes to stdout as JSON and the program's own prints go to
stderr. The rlimits (resource module names without RLIMIT_) are set after the harness has
read its inputs and before the program's first line. Standard library only, any Python 3.
"""

import json
import os
import resource
import runpy
import sys

PROGRAM = "/sandbox/program.py"


def set_limits(limits):
    for name, value in limits.items():
        kind = getattr(resource, "RLIMIT_" + name)
        hard = value + 1 if name == "CPU" else value  # SIGXCPU at the soft limit, SIGKILL after
        resource.setrlimit(kind, (value, hard))


def run_stdin(test, limits):
    fd = os.open("/sandbox/%s.in" % test, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    set_limits(limits)
    sys.argv = [PROGRAM]
    runpy.run_path(PROGRAM, run_name="__main__")


def find_function(namespace, name):
    function = namespace.get(name)
    if callable(function):
        return function
    solution = namespace.get("Solution")
    if isinstance(solution, type) and callable(getattr(solution, name, None)):
        return getattr(solution(), name)
    raise NameError("the program defines no function %r (nor Solution.%s)" % (name, name))


def run_call(test, limits, name):
    with open("/sandbox/%s.json" % test) as handle:
        args = json.load(handle)
    result_fd = os.dup(1)
    os.dup2(2, 1)  # the program's prints must not pass for its return value
    set_limits(limits)
    sys.argv = [PROGRAM]
    function = find_function(runpy.run_path(PROGRAM, run_name="sparrow_program"), name)
    result = function(*args) if isinstance(args, list) else function(args)
    payload = json.dumps(result, default=repr).encode()
    while payload:
        payload = payload[os.write(result_fd, payload) :]


def main(argv):
    mode, test, limits = argv[1], argv[2], json.loads(argv[3])
    if mode == "stdin":
        run_stdin(test, limits)
    elif mode == "call":
        run_call(test, limits, argv[4])
    else:
        raise SystemExit("unknown mode %r" % mode)
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
