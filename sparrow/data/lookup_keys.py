"""Where each lookup of a chase task's reference finds its key: the prompt token that the
lookup token copies.

    from sparrow.data.lookup_keys import lookup_key_positions
    keys = lookup_key_positions(prompt_text, tokenizer.encode)
    # one entry per token of ReferencePath.of(prompt_text, encode).ids: the prompt position
    # of the definition's target token that a lookup token copies; None for other roles
    page = keys[i] // page_size            # the key page of reference token i

A hop line `03 ka=qd` writes the target `qd` of the definition `ka=qd` in the prompt's def
line. The key of each token of that target is the matching token of the definition's target:
the first target token lies right after `ka=`, so its position is the token count of the
prompt text up to there (the boundary between `=` and a letter, where neither the character
tokenizer nor its letter-pair merges join characters, as sparrow/data/token_roles.py relies
on); a target of several tokens (plain characters: one per letter) maps token j of the run to
the definition's first target token + j. Past the cycle the same target also stands in a hop
line far back; the key stays the definition (the study asks whether selection finds it).
Run `python -m pytest tests/data/test_lookup_keys.py -q`.
"""

from __future__ import annotations

from itertools import groupby

from sparrow.data.multi_chase import chase_completion, parse_prompt
from sparrow.data.token_roles import Encode, ReferencePath


def definition_targets(prompt: str, encode: Encode) -> dict[str, int]:
    """name -> prompt token position of the first token of its definition's target."""
    parsed = parse_prompt(prompt)
    if parsed is None:
        raise ValueError(f"not a chase prompt: {prompt[:80]!r}")
    head = prompt.split("\n", 1)[0]
    out = {}
    for name in parsed.targets:
        # " name=" occurs once in the def line: elsewhere a name follows "=" or the line start
        at = head.index(f" {name}=") + len(name) + 2
        out[name] = len(encode(prompt[:at]))
    return out


def hop_currents(completion: str) -> list[str]:
    """The current name of each hop line of a reference completion, in order."""
    out = []
    for line in completion.split("\n"):
        if line.startswith("Answer:"):
            break
        out.append(line.split(" ")[1].split("=")[0])
    return out


def lookup_key_positions(
    prompt: str, encode: Encode, eos_ids: tuple[int, ...] = ()
) -> list[int | None]:
    """Per token of the reference (ReferencePath.of's ids, eos included when given): the prompt
    position of the key a lookup token copies, None for any other role (module doc)."""
    path = ReferencePath.of(prompt, encode, eos_ids)
    if path is None:
        raise ValueError(f"no reference path for this prompt and tokenizer: {prompt[:80]!r}")
    completion, _ = chase_completion(prompt)
    targets = definition_targets(prompt, encode)
    currents = iter(hop_currents(completion))
    keys: list[int | None] = []
    for role, run in groupby(path.roles):
        width = len(list(run))
        if role != "lookup":
            keys += [None] * width
            continue
        first = targets[next(currents)]
        keys += [first + j for j in range(width)]
    return keys
