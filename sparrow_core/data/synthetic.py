"""Synthetic verifiable tasks for the embedded default: answers that need earlier context.

    from sparrow_core.data.synthetic import make_examples
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
"""

from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass

from sparrow_core.errors import SparrowError

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
        prompt = "def " + " ".join(f"{n}={values[n]}" for n in names) + "\nsum " + " ".join(terms) + "\n"
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
            "def " + " ".join(f"{n}={targets[n]}" for n in order)
            + f"\nfrom {chain[0]} hops {self.num_hops}\n"
        )
        lines = "".join(f"{a}={b}\n" for a, b in zip(chain, chain[1:]))
        return Example(prompt, lines + f"Answer: {chain[-1]}", chain[-1])


DEFAULT_TASK = "pointer_chase"
TASKS = {"pointer_chase": PointerChaseTask(), "lookup_sum": LookupSumTask()}


def make_examples(task: str, count: int, seed: int, **sizes: int) -> list[Example]:
    """`count` examples of a named task, the same for the same seed."""
    if task not in TASKS:
        raise SparrowError(f"unknown synthetic task {task!r}; known: {', '.join(sorted(TASKS))}")
    spec = type(TASKS[task])(**sizes) if sizes else TASKS[task]
    rng = random.Random(seed)
    return [spec.make(rng) for _ in range(count)]
