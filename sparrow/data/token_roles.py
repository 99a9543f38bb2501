"""The role of each generated token of a chase task (pointer_chase_long, multi_chase) on the
reference path: lookup, local, benign or answer while the sample follows it, unknown after.

    from sparrow.data.token_roles import ReferencePath, token_roles, role_codes
    roles = token_roles(prompt_text, output_ids, tokenizer.encode, tokenizer.eos_token_ids)
    # ["local", "local", "lookup", ...] one per output id; None: not a chase prompt
    role_codes(roles)                      # the same as small ints (ROLES' indices), for Parquet

Why: the study (docs/study.md) reports acceptance per role, to see whether the low-acceptance
tail a sparse actor makes sits on the tokens that decide the reward (lookups, answers) or on
harmless ones (tags). A token's role is the role of its place on the reference: token i has
the role of reference token i while tokens 0..i-1 followed the reference (token i itself may
be the one that leaves it: a wrong lookup is still a lookup); every later token is
`unknown`, as is a token past the reference's end. A benign token (a tag) follows the
reference whatever two-letter name it writes, defined in the prompt or not: no tag changes
the chain or the answer. (Only defined names were accepted at first; the v3 testbed model
writes undefined names as tags, which made every later token of its samples `unknown`.)

The reference is encoded piece by piece, one piece per run of characters of one role
(sparrow/data/multi_chase.py completion_roles); every piece boundary falls between a letter
and a non-letter, where neither the character tokenizer nor its letter-pair merges join two
characters, so the pieces' tokens are the whole text's tokens. A tokenizer for which that is
not so (checked) gets None, as does a prompt of another task.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import groupby

from sparrow.data.multi_chase import ROLES, chase_completion, completion_roles, parse_prompt

Encode = Callable[[str], list[int]]
ROLE_CODE = {role: code for code, role in enumerate(ROLES)}


@dataclass(frozen=True)
class ReferencePath:
    ids: tuple[int, ...]  # the reference completion's tokens, then the first eos id if any
    roles: tuple[str, ...]  # one per id
    benign_ids: frozenset[int]  # what a benign place accepts: any two-letter name's tokens

    @classmethod
    def of(cls, prompt: str, encode: Encode, eos_ids: Sequence[int] = ()) -> ReferencePath | None:
        """The reference of a chase prompt, or None (another task, or a tokenizer that joins
        characters across role boundaries)."""
        parsed = parse_prompt(prompt)
        if parsed is None:
            return None
        completion, _ = chase_completion(prompt)
        ids, roles = _encode_by_role(completion, encode)
        if ids != encode(completion):
            return None
        benign = _name_tokens(encode)
        tail = list(eos_ids[:1])
        return cls(tuple(ids + tail), tuple(roles + ["local"] * len(tail)), benign)

    def roles_of(self, output_ids: Sequence[int]) -> list[str]:
        """The role of each generated token (module doc)."""
        out, on_path = [], True
        for index, token in enumerate(output_ids):
            if not on_path or index >= len(self.ids):
                out.append("unknown")
                on_path = False
                continue
            role = self.roles[index]
            out.append(role)
            on_path = token == self.ids[index] or (role == "benign" and token in self.benign_ids)
        return out


@lru_cache(maxsize=8)
def _name_tokens(encode: Encode) -> frozenset[int]:
    """The tokens of every two-letter lowercase name (one a name with letter pairs, the
    letters with the character tokenizer)."""
    letters = string.ascii_lowercase
    return frozenset(token for a in letters for b in letters for token in encode(a + b))


def _encode_by_role(completion: str, encode: Encode) -> tuple[list[int], list[str]]:
    ids: list[int] = []
    roles: list[str] = []
    at = 0
    for role, run in groupby(completion_roles(completion)):
        width = len(list(run))
        piece = encode(completion[at : at + width])
        ids += piece
        roles += [role] * len(piece)
        at += width
    return ids, roles


def token_roles(
    prompt: str, output_ids: Sequence[int], encode: Encode, eos_ids: Sequence[int] = ()
) -> list[str] | None:
    """Roles of a sample's generated tokens (module doc); None for a prompt of another task."""
    path = ReferencePath.of(prompt, encode, eos_ids)
    return None if path is None else path.roles_of(output_ids)


def role_codes(roles: Sequence[str] | None) -> tuple[int, ...]:
    """ROLES' indices of the roles; () for None (no roles known)."""
    return () if roles is None else tuple(ROLE_CODE[role] for role in roles)


def role_names(codes: Sequence[int]) -> list[str]:
    return [ROLES[code] for code in codes]
