"""Training data of the testbed model: a chase task (pointer_chase_long, or multi_chase's
K chains with or without tags: the VARIANTS) along a length curriculum, with wrong hops in
the last phase.

    from sparrow.experiments.testbed.data import StepPlan, curriculum, encode, step_examples
    plan = StepPlan(curriculum(num_defs=256, num_hops=600), steps=1800, noise_share=0.15)
    plan = StepPlan(curriculum(**VARIANTS["v3"].sizes()), steps=1800, noise_share=0.15)
    stage, noisy = plan.stage_at(step)          # the chain sizes of that step; noisy: last phase
    examples = step_examples(stage, rows=4, seed=0, step=step)
    ids, loss_mask = encode(examples)           # [rows, length] int64 and bool (completion)

Every example of one (num_defs, num_hops) has the same length (names, countdown and answer
are of fixed width), so a batch is a plain rectangle: no padding and no attention mask, and
SDPA runs its causal flash kernel. Step s's examples come from a seed made of (seed, s) alone,
so a rerun reads the same data whatever ran before, and the wrong hops of the last phase come
from their own stream, so the clean chains are the same with or without them.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache

import torch

from sparrow.data.char_tokenizer import EOS_TOKEN, char_tokenizer, char_vocab
from sparrow.data.multi_chase import chase_completion, parse_prompt
from sparrow.data.synthetic import Example, make_examples

# multi_chase with chains=1, tags=0 writes exactly pointer_chase_long's examples, so the
# first testbed's data are unchanged (sparrow/data/multi_chase.py)
TASK = "multi_chase"
# the testbed's tokenizer: characters, and one token per two-letter name
# (sparrow/data/char_tokenizer.py says why)
LETTER_PAIRS = True
# (share of the full num_defs, share of the full num_hops, share of the clean-phase steps):
# the lookup is learnt among a handful of names first, then the names and hops double up to
# the full length the model is evaluated and used at. The shares are caps
# (sparrow/experiments/testbed/adaptive.py): a stage that reaches its accuracy threshold hands its
# remaining steps on. Measured on the GPU (docs/testbed.md): curricula that began at 16 or 32
# names never learnt the lookup in 4,000 steps (the long stages learnt only to copy the line
# num_defs lines back, a fixed offset); beginning at 2 names, every model size tried reached
# 0.99 at 2 names within 300 steps and 1.0 at 32 names by step 1,300
CURRICULUM = (
    (1 / 128, 1 / 600, 0.1),
    (1 / 64, 1 / 300, 0.1),
    (1 / 32, 1 / 120, 0.1),
    (1 / 16, 1 / 40, 0.1),
    (1 / 8, 1 / 20, 0.1),
    (1 / 4, 1 / 6, 0.15),
    (1 / 2, 1 / 2, 0.15),
    (1, 1, 0.2),
)


@dataclass(frozen=True)
class Variant:
    """A testbed task of the study (docs/testbed.md): multi_chase sizes."""

    num_defs: int
    # hops per chain
    num_hops: int
    chains: int = 1
    tags: int = 0

    def sizes(self) -> dict[str, int]:
        return {
            "num_defs": self.num_defs,
            "num_hops": self.num_hops,
            "chains": self.chains,
            "tags": self.tags,
        }


# the study's variants (docs/study.md): v1 is the first testbed's task at the study's
# length, v2 four chains, v3 four chains with benign tags; the -long ones are 12-16K tokens
VARIANTS = {
    "v1": Variant(256, 255),
    "v2": Variant(256, 63, chains=4),
    "v3": Variant(256, 63, chains=4, tags=1),
    "v2-long": Variant(676, 300, chains=4),
    "v3-long": Variant(676, 300, chains=4, tags=1),
}


def ends_on_a_start(num_defs: int, num_hops: int, chains: int = 1) -> bool:
    """Whether a chain's last hop lands on a start named in the query line (its own, or the
    next chain's): the answer could then be copied from the prompt without one lookup. The
    starts lie num_defs // chains names apart round the cycle (multi_chase)."""
    starts = {(j * num_defs // chains) % num_defs for j in range(chains)}
    return any((start + num_hops) % num_defs in starts for start in starts)


@dataclass(frozen=True)
class Stage:
    num_defs: int
    # hops per chain
    num_hops: int
    # share of the clean phase's steps
    share: float
    chains: int = 1
    tags: int = 0

    @property
    def length(self) -> int:
        """Tokens of one example: prompt, chain of thought, answer and eos."""
        return _length(self.num_defs, self.num_hops, self.chains, self.tags)

    def sizes(self) -> dict[str, int]:
        return {
            "num_defs": self.num_defs,
            "num_hops": self.num_hops,
            "chains": self.chains,
            "tags": self.tags,
        }


@lru_cache(maxsize=64)
def _length(num_defs: int, num_hops: int, chains: int = 1, tags: int = 0) -> int:
    sizes = dict(num_defs=num_defs, num_hops=num_hops, chains=chains, tags=tags)
    example = make_examples(TASK, 1, seed=0, **sizes)[0]
    return len(token_ids(example.prompt)) + len(token_ids(example.completion)) + 1


# several chains: the one-chain stages first, as the first testbed learnt them (names, hops);
# at most half of the clean steps, what a stage does not use passing on (adaptive.py)
ONE_CHAIN_START = ((2, 1), (4, 2), (8, 5), (16, 15), (32, 30))
ONE_CHAIN_SHARE = 0.4


def curriculum(num_defs: int, num_hops: int, chains: int = 1, tags: int = 0) -> list[Stage]:
    """CURRICULUM scaled to the full sizes; repeated sizes (tiny tasks) merge their shares.

    With several chains: the lookup is learnt on one chain first (ONE_CHAIN_START, up to the
    names a chain has at full size), then the names double with every chain, each such stage
    with at least 2 names a chain and fewer hops than the starts' spacing, so no stage can be
    answered from the query line. A curriculum that began with 4 chains among 4 names (each
    chain's one hop ends on the next chain's start) learnt that copy first and the lookup
    only in part, on the GPU and on a CPU; one that began with one chain among 2 names and
    then went to 4 chains learnt no more on the CPU (docs/testbed.md, "The study testbed")."""
    if chains == 1:
        rows = [
            (max(2, min(num_defs, round(num_defs * d))), max(1, round(num_hops * h)), share, 1)
            for d, h, share in CURRICULUM
        ]
    else:
        start = [(d, h) for d, h in ONE_CHAIN_START if d <= max(2, num_defs // chains)]
        rows = [(d, h, ONE_CHAIN_SHARE / len(start), 1) for d, h in start]
        sizes = [num_defs]
        while sizes[0] // 2 >= max(2 * chains, start[-1][0]) and len(sizes) < 4:
            sizes.insert(0, sizes[0] // 2)
        shares = (0.1, 0.15, 0.15, 0.2)[-len(sizes) :]
        scale = (1 - ONE_CHAIN_SHARE) / sum(shares)
        for defs, share in zip(sizes, shares):
            hops = num_hops if defs == num_defs else max(1, min(num_hops, defs // chains - 1))
            rows.append((defs, hops, share * scale, chains))
    stages: list[Stage] = []
    for defs, hops, share, k in rows:
        stage = Stage(defs, hops, share, k, tags)
        if stages and stages[-1].sizes() == stage.sizes():
            stages[-1] = Stage(defs, hops, stages[-1].share + share, k, tags)
        else:
            stages.append(stage)
    return stages


@dataclass(frozen=True)
class StepPlan:
    stages: tuple[Stage, ...] | list[Stage]
    steps: int
    # share of the steps, at the end, trained on chains with wrong hops (full length)
    noise_share: float = 0.0

    @property
    def clean_steps(self) -> int:
        return self.steps - round(self.steps * self.noise_share)

    def stage_at(self, step: int) -> tuple[Stage, bool]:
        """(stage, noisy) of step `step`: the clean curriculum, then the full-length noisy tail."""
        if step >= self.clean_steps:
            return self.stages[-1], True
        end = 0.0
        for stage in self.stages:
            end += stage.share
            if step < round(end * self.clean_steps):
                return stage, False
        return self.stages[-1], False

    def step_shares(self) -> list[tuple[Stage, float]]:
        """Each stage with its share of all steps (the noisy tail counted with the last)."""
        clean = self.clean_steps / self.steps if self.steps else 1.0
        shares = [(stage, stage.share * clean) for stage in self.stages]
        shares[-1] = (shares[-1][0], shares[-1][1] + 1.0 - clean)
        return shares


def derived_seed(*parts: object) -> int:
    """A 63-bit seed from the parts' text: distinct streams for (seed, purpose, step)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def step_examples(stage: Stage, rows: int, seed: int, step: int, micro: int = 0) -> list[Example]:
    return make_examples(TASK, rows, derived_seed(seed, "train", step, micro), **stage.sizes())


def held_out_examples(
    num_defs: int,
    num_hops: int,
    count: int,
    seed: int,
    stream: str = "held-out",
    chains: int = 1,
    tags: int = 0,
) -> list[Example]:
    """Evaluation prompts of those sizes, from a stream training never reads; the stage
    checks use their own stream ("stage-eval"), so the final held-out prompts play no part
    in when the curriculum advances."""
    sizes = dict(num_defs=num_defs, num_hops=num_hops, chains=chains, tags=tags)
    return make_examples(TASK, count, derived_seed(seed, stream), **sizes)


def with_wrong_hops(example: Example, rate: float, rng: random.Random) -> Example:
    """The example with each hop, at probability `rate`, sent to another defined name than
    the right one (the chain goes on from there and the answer is where it ends); tags,
    if the task has them, drawn afresh from rng."""
    if rate <= 0:
        return example
    names = sorted(parse_prompt(example.prompt).targets)
    if len(names) < 3:  # no wrong name besides the current one and its target
        return example

    def next_name(current: str, target: str) -> str:
        if rng.random() >= rate:
            return target
        while (name := rng.choice(names)) in (current, target):
            pass
        return name

    completion, answer = chase_completion(example.prompt, next_name, lambda: rng.choice(names))
    return Example(example.prompt, completion, answer)


def token_ids(text: str) -> list[int]:
    """The testbed tokenizer's ids of `text` (what the model folder's tokenizer.json gives)."""
    return char_tokenizer(LETTER_PAIRS).encode(text).ids


def vocab() -> dict[str, int]:
    return char_vocab(LETTER_PAIRS)


def encode(examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, loss_mask) [rows, length]: ids as the testbed tokenizer gives them (prompt and
    completion apart: a prompt ends in a newline, which no merge crosses), eos last;
    loss_mask is True on the completion and eos (the tokens the model must produce)."""
    eos = vocab()[EOS_TOKEN]
    rows, masks = [], []
    for example in examples:
        prompt = token_ids(example.prompt)
        completion = token_ids(example.completion) + [eos]
        rows.append(prompt + completion)
        masks.append([False] * len(prompt) + [True] * len(completion))
    lengths = sorted({len(row) for row in rows})
    if len(lengths) != 1:
        raise ValueError(f"examples of one batch differ in length: {lengths}")
    return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.bool)
