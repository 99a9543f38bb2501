"""multi_chase: K interleaved pointer chases per prompt, graded reward, optional benign tags.

    from sparrow.data.synthetic import make_examples
    ex = make_examples("multi_chase", 1, seed=0, num_defs=64, num_hops=20, chains=4, tags=1)[0]
    ex.answer                                   # "qd mz ol ka": one name per chain
    chase_completion(ex.prompt)                 # (the reference completion, its answer)
    completion_roles(ex.completion)             # one role per character (ROLES)

The study testbed of issue 37 (docs/testbed.md, "The study testbed"). The prompt defines
num_defs names as one cycle (as pointer_chase_long) and asks where `chains` chases of
num_hops hops each end; their starts are spread evenly round the cycle, so no two chains
read the same definition until num_hops passes num_defs / chains. The chain of thought
interleaves them, one hop line each in turn, under one countdown of the lines still to go:

    def ka=qd qd=mz mz=ol ol=ka
    from ka mz hops 2
    3 ka=qd
    2 mz=ol
    1 qd=mz
    0 ol=ka
    Answer: mz ka

The reward (`share_match`, sparrow/data/rewards.py) is the share of the chains whose answer
is right, so a miss costs 1/chains and the samples of a group differ by degrees. With tags=1
the query line ends in `tags` and each hop line in a space and a tag, any defined name
(`3 ka=qd ol`): its distribution
(uniform over the names defined in the prompt) depends on context thousands of tokens back,
so a sparse actor that misses definition pages samples it differently, yet no tag changes
the chain or the answer. chains=1, tags=0 writes exactly pointer_chase_long's examples (the
same random draws), so V1 of the study is today's testbed task.

Roles of the reference's tokens (completion_roles): `lookup`, a hop line's target (read from
the definitions or, past the cycle, a line far back: the critical tokens, chains x num_hops
of them); `answer`, each name after "Answer:"; `benign`, a tag; `local`, everything else
(countdown, the current name copied from `chains` lines up, separators, "Answer:").
sparrow/data/token_roles.py maps them to a generated sample's tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from sparrow.data.synthetic import MAX_LONG_HOPS, NAMES, TASKS, Example
from sparrow.errors import SparrowError

ROLES = ("unknown", "lookup", "local", "benign", "answer")

# next_name(current, target) -> the name a hop line writes (training data with wrong hops)
NextName = Callable[[str, str], str]


@dataclass(frozen=True)
class MultiChaseTask:
    num_defs: int = 256
    num_hops: int = 75
    chains: int = 4
    # 1: each hop line ends in a tag naming a random defined name (never read by the reward)
    tags: int = 0

    def __post_init__(self) -> None:
        if not (
            1 <= self.chains <= self.num_defs <= len(NAMES)
            and 2 <= self.num_defs
            and 1 <= self.num_hops * self.chains <= MAX_LONG_HOPS
            and self.tags in (0, 1)
        ):
            raise SparrowError(
                f"multi_chase needs 2 <= num_defs <= {len(NAMES)}, 1 <= chains <= num_defs, "
                f"1 <= num_hops x chains <= {MAX_LONG_HOPS} and tags 0 or 1, got "
                f"num_defs={self.num_defs}, num_hops={self.num_hops}, chains={self.chains}, "
                f"tags={self.tags}"
            )

    def make(self, rng: random.Random) -> Example:
        # the same draws as pointer_chase_long first, so chains=1, tags=0 is that task
        cycle = rng.sample(NAMES, self.num_defs)
        targets = dict(zip(cycle, cycle[1:] + cycle[:1]))
        first = cycle.index(rng.choice(cycle))
        starts = [
            cycle[(first + j * self.num_defs // self.chains) % self.num_defs]
            for j in range(self.chains)
        ]
        order = cycle[:]
        rng.shuffle(order)
        prompt = (
            "def "
            + " ".join(f"{n}={targets[n]}" for n in order)
            + f"\nfrom {' '.join(starts)} hops {self.num_hops}{' tags' * self.tags}\n"
        )
        # tags from a stream of their own (seeded by the definitions), so the rows of one
        # seed hold the same chains with tags as without
        tag_rng = random.Random(" ".join(order))
        tag = (lambda: tag_rng.choice(cycle)) if self.tags else None
        completion, answer = chase_lines(targets, starts, self.num_hops, tag=tag)
        return Example(prompt, completion, answer)


def chase_lines(
    targets: dict[str, str],
    starts: list[str],
    num_hops: int,
    next_name: NextName | None = None,
    tag: Callable[[], str] | None = None,
) -> tuple[str, str]:
    """(completion, answer): the interleaved hop lines of every chain and the answer line;
    next_name picks each hop's name instead of the target, tag() each line's tag (none when
    None)."""
    lines_total = num_hops * len(starts)
    width = len(str(lines_total - 1))
    current, lines = list(starts), []
    for line in range(lines_total):
        chain = line % len(starts)
        target = targets[current[chain]]
        name = target if next_name is None else next_name(current[chain], target)
        suffix = f" {tag()}" if tag is not None else ""
        lines.append(f"{lines_total - 1 - line:0{width}d} {current[chain]}={name}{suffix}\n")
        current[chain] = name
    answer = " ".join(current)
    return "".join(lines) + f"Answer: {answer}", answer


@dataclass(frozen=True)
class ChasePrompt:
    targets: dict[str, str]
    starts: list[str]
    num_hops: int  # per chain
    tags: bool


def parse_prompt(prompt: str) -> ChasePrompt | None:
    """The parts of a pointer_chase_long or multi_chase prompt; None for another form (the
    definitions of those two map the names onto themselves, pointer_chase's do not)."""
    try:
        head, query = prompt.rstrip("\n").split("\n")
        words = query.split()
        tags = words[-1] == "tags"
        words = words[:-1] if tags else words
        if not head.startswith("def ") or words[0] != "from" or words[-2] != "hops":
            return None
        targets = dict(item.split("=") for item in head.split()[1:])
        if sorted(targets.values()) != sorted(targets):  # pointer_chase's are not one cycle
            return None
        return ChasePrompt(targets, words[1:-2], int(words[-1]), tags)
    except (ValueError, IndexError):
        return None


def chase_completion(
    prompt: str, next_name: NextName | None = None, tag: Callable[[], str] | None = None
) -> tuple[str, str] | None:
    """(completion, answer) that a prompt of this family asks for, or None for another form.
    A prompt with tags takes each line's tag from tag() (default: the first defined name;
    any defined name is right)."""
    parsed = parse_prompt(prompt)
    if parsed is None:
        return None
    first = next(iter(parsed.targets))
    tag = (tag or (lambda: first)) if parsed.tags else None
    return chase_lines(parsed.targets, parsed.starts, parsed.num_hops, next_name, tag)


def verified_share(prompt: str, completion: str) -> float:
    """Share of the chains whose every hop line in the completion names the prompt's target
    of the line's current name (from the chain's start on) and whose answer word is its end.

    share_match reads the answer line alone, which a model can fill without the lookups when
    the ends follow from the query line (num_hops a multiple of the starts' spacing: each
    chain ends on the next one's start); this grade credits only a chase actually made.
    Countdowns and tags are not read. Raises SparrowError for a prompt of another form.
    """
    parsed = parse_prompt(prompt)
    if parsed is None:
        raise SparrowError(f"not a multi_chase prompt: {prompt[:80]!r}")
    marker = completion.rfind("Answer:")
    body = completion[:marker] if marker >= 0 else completion
    hops = [line.split(" ")[1] if " " in line else "" for line in body.split("\n")]
    answers = completion[marker:].split("\n")[0].split()[1:] if marker >= 0 else []
    chains, right = len(parsed.starts), 0
    for chain, current in enumerate(parsed.starts):
        lines = hops[chain : parsed.num_hops * chains : chains]
        for line in lines:
            name = parsed.targets[current]
            if line != f"{current}={name}":
                break
            current = name
        else:
            right += len(lines) == parsed.num_hops and answers[chain : chain + 1] == [current]
    return right / chains


def completion_roles(completion: str) -> list[str]:
    """The role (ROLES) of each character of a reference completion of this family."""
    roles: list[str] = []
    for line in completion.split("\n"):
        if line.startswith("Answer:"):
            roles += ["local"] * len("Answer:")
            for index, word in enumerate(line[len("Answer:") :].split(" ")):
                roles += ["local"] * (index > 0) + ["answer" if word else "local"] * len(word)
        else:
            countdown, _, rest = line.partition(" ")
            current, _, rest = rest.partition("=")
            target, _, tag = rest.partition(" ")
            roles += ["local"] * (len(countdown) + 1 + len(current) + 1)
            roles += ["lookup"] * len(target)
            roles += ["local"] * (len(tag) > 0) + ["benign"] * len(tag)
            roles.append("local")  # the newline
    return roles[: len(completion)]


TASKS["multi_chase"] = MultiChaseTask()
