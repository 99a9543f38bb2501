"""Synthetic verifiable tasks for the embedded default: answers that need earlier context.

    from sparrow_core.data.synthetic import make_examples
    examples = make_examples("lookup_sum", count=4, seed=0)

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
# every character the task writes; the embedded tokenizer holds exactly these
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


TASKS = {"lookup_sum": LookupSumTask()}


def make_examples(task: str, count: int, seed: int, **sizes: int) -> list[Example]:
    """`count` examples of a named task, the same for the same seed."""
    if task not in TASKS:
        raise SparrowError(f"unknown synthetic task {task!r}; known: {', '.join(sorted(TASKS))}")
    spec = type(TASKS[task])(**sizes) if sizes else TASKS[task]
    rng = random.Random(seed)
    return [spec.make(rng) for _ in range(count)]
