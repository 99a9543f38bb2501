"""Synthetic verifiable tasks for the embedded default: answers that need earlier context.

    from sparrow.data.synthetic import make_examples
    examples = make_examples("pointer_chase", count=4, seed=0)

"pointer_chase" (the default): the prompt maps two-letter names to names and asks where a
chain of hops from a start name ends; each line of the chain of thought looks up the current
name's definition, far back in the prompt, and the answer is the last name reached. A model
that cannot read the right page of the prompt cannot follow the chain.

    def ka=qd qd=mz mz=ol xe=ka ...
    from ka hops 3
    ka=qd
    qd=mz
    mz=ol
    Answer: ol

"lookup_sum": the prompt defines variables (two-letter names, one digit each) and lists
some of them to add; the chain of thought looks up each listed name's value in the
definitions, far back in the context, and keeps a running sum mod 10; the answer is the last
running sum. Every line of the chain needs a page of the prompt that a tight sparse budget
may drop, so the task shows sparse/dense mismatch on a model small enough for a CPU.

    def ka=3 qd=7 mz=1 ...
    sum qd mz
    qd=7 s7
    mz=1 s8
    Answer: 8

"pointer_chase_long": the long-chain variant that the GPU testbed model learns
(docs/testbed.md). The definitions form one cycle through all num_defs names (a random
permutation with a single cycle), so a chain of num_hops hops never revisits a name within
num_defs hops: each line needs the current name's definition from the prompt, thousands of
tokens back, or, past num_defs hops, the line num_defs lines earlier (again far back). Each
line starts with the hops still to go after it (zero-padded), so knowing where to stop is a
local decrement rather than counting hundreds of lines. Defaults (256 names, 600 hops): a
1,557-character prompt and a 6,010-character chain of thought (tokens, with the character
tokenizer); num_hops=1450 gives about 16K.

    def ka=qd qd=mz mz=ol ol=ka
    from qd hops 5
    4 qd=mz
    3 mz=ol
    2 ol=ka
    1 ka=qd
    0 qd=mz
    Answer: mz

"multi_chase" (sparrow/data/multi_chase.py, registered at the end of this module): K
interleaved pointer_chase_long chains per prompt with a graded reward and optional benign
tags, the study testbed of docs/testbed.md.

Sizes are the task dataclass's fields: make_examples(task, count, seed, num_defs=..., ...).
"""

from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass, fields

from sparrow.errors import SparrowError

NAMES = ["".join(pair) for pair in itertools.product(string.ascii_lowercase, repeat=2)]
# every character the tasks write; the embedded tokenizer holds exactly these
ALPHABET = string.ascii_lowercase + string.digits + " =:\nA"


@dataclass(frozen=True)
class Example:
    prompt: str
    completion: str  # the reference chain of thought and answer (used to train the tiny model)
    answer: str


@dataclass(frozen=True)
class LookupSumTask:
    num_defs: int = 24
    num_terms: int = 12

    def __post_init__(self) -> None:
        if not 1 <= self.num_terms <= self.num_defs <= len(NAMES):
            raise SparrowError(
                f"lookup_sum needs 1 <= num_terms <= num_defs <= {len(NAMES)}, "
                f"got num_terms={self.num_terms}, num_defs={self.num_defs}"
            )

    def make(self, rng: random.Random) -> Example:
        names = rng.sample(NAMES, self.num_defs)
        values = {name: rng.randrange(10) for name in names}
        terms = rng.sample(names, self.num_terms)
        prompt = (
            "def " + " ".join(f"{n}={values[n]}" for n in names) + "\nsum " + " ".join(terms) + "\n"
        )
        lines, total = [], 0
        for name in terms:
            total = (total + values[name]) % 10
            lines.append(f"{name}={values[name]} s{total}\n")
        return Example(prompt, "".join(lines) + f"Answer: {total}", str(total))


@dataclass(frozen=True)
class PointerChaseTask:
    num_defs: int = 24
    num_hops: int = 12

    def __post_init__(self) -> None:
        if not 1 <= self.num_hops < self.num_defs <= len(NAMES):
            raise SparrowError(
                f"pointer_chase needs 1 <= num_hops < num_defs <= {len(NAMES)}, "
                f"got num_hops={self.num_hops}, num_defs={self.num_defs}"
            )

    def make(self, rng: random.Random) -> Example:
        names = rng.sample(NAMES, self.num_defs)
        chain = names[: self.num_hops + 1]
        targets = {a: b for a, b in zip(chain, chain[1:])}
        # the rest (and the chain's end) point anywhere: the answer is where the hops land
        for name in names[self.num_hops + 1 :] + [chain[-1]]:
            targets[name] = rng.choice([n for n in names if n != name])
        order = names[:]
        rng.shuffle(order)
        prompt = (
            "def "
            + " ".join(f"{n}={targets[n]}" for n in order)
            + f"\nfrom {chain[0]} hops {self.num_hops}\n"
        )
        lines = "".join(f"{a}={b}\n" for a, b in zip(chain, chain[1:]))
        return Example(prompt, lines + f"Answer: {chain[-1]}", chain[-1])


# longest chain pointer_chase_long makes (its countdown would pass 5 digits)
MAX_LONG_HOPS = 100_000


@dataclass(frozen=True)
class PointerChaseLongTask:
    num_defs: int = 256
    num_hops: int = 600

    def __post_init__(self) -> None:
        if not 2 <= self.num_defs <= len(NAMES) or not 1 <= self.num_hops <= MAX_LONG_HOPS:
            raise SparrowError(
                f"pointer_chase_long needs 2 <= num_defs <= {len(NAMES)} and "
                f"1 <= num_hops <= {MAX_LONG_HOPS}, "
                f"got num_defs={self.num_defs}, num_hops={self.num_hops}"
            )

    def make(self, rng: random.Random) -> Example:
        # a random order of the names read as one cycle: no name recurs within num_defs hops
        cycle = rng.sample(NAMES, self.num_defs)
        targets = dict(zip(cycle, cycle[1:] + cycle[:1]))
        start = rng.choice(cycle)
        order = cycle[:]
        rng.shuffle(order)
        prompt = (
            "def "
            + " ".join(f"{n}={targets[n]}" for n in order)
            + f"\nfrom {start} hops {self.num_hops}\n"
        )
        lines, end = long_chase_lines(targets, start, self.num_hops)
        return Example(prompt, lines + f"Answer: {end}", end)


def long_chase_lines(
    targets: dict[str, str], start: str, num_hops: int, next_name=None
) -> tuple[str, str]:
    """(chain-of-thought lines, name reached) of pointer_chase_long; next_name(current,
    target) picks each hop's name instead of the target (training data with wrong hops)."""
    width = len(str(num_hops - 1))
    lines, current = [], start
    for left in range(num_hops - 1, -1, -1):
        name = targets[current] if next_name is None else next_name(current, targets[current])
        lines.append(f"{left:0{width}d} {current}={name}\n")
        current = name
    return "".join(lines), current


DEFAULT_TASK = "pointer_chase"
TASKS = {
    "pointer_chase": PointerChaseTask(),
    "lookup_sum": LookupSumTask(),
    "pointer_chase_long": PointerChaseLongTask(),
}


def task_spec(task: str, **sizes: int):
    """The task object `task` names, with `sizes` (its fields) in place of the defaults."""
    if task not in TASKS:
        raise SparrowError(f"unknown synthetic task {task!r}; known: {', '.join(sorted(TASKS))}")
    if not sizes:
        return TASKS[task]
    valid = [f.name for f in fields(TASKS[task])]
    for name, value in sizes.items():
        if name not in valid:
            raise SparrowError(
                f"synthetic task {task!r} has no size {name!r}; sizes: {', '.join(valid)}"
            )
        if isinstance(value, bool) or not isinstance(value, int):
            raise SparrowError(
                f"synthetic task {task!r}: size {name} must be an integer, got {value!r}"
            )
    return type(TASKS[task])(**sizes)


def make_examples(task: str, count: int, seed: int, **sizes: int) -> list[Example]:
    """`count` examples of a named task, the same for the same seed."""
    spec = task_spec(task, **sizes)
    rng = random.Random(seed)
    return [spec.make(rng) for _ in range(count)]


# registers "multi_chase" (it imports TASKS from here, so it comes last)
from sparrow.data import multi_chase as _multi_chase  # noqa: E402,F401
