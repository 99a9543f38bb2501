"""The offline selection study's row arithmetic on hand-made replays: key-page recall over
heads, any head and the top head, acceptance by role, pages read, and the step-0 accuracy
estimate of a two-chain reference with tags."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparrow.data.char_tokenizer import char_tokenizer
from sparrow.experiments.testbed.selection_replay import (
    CellTokens,
    StudySequence,
    reference_sequence,
)
from sparrow.experiments.testbed.selection_summary import accuracy_estimate, cell_row

PROMPT = "def ka=qd qd=mz mz=ol ol=ka\nfrom ka mz hops 1 tags\n"


class PairTokenizer:
    eos_token_ids = (1,)

    def encode(self, text: str) -> list[int]:
        return char_tokenizer(True).encode(text).ids


def sequence(roles, keys, measured=True):
    return StudySequence(
        ids=(0,) * (4 + len(roles)),
        prompt_len=4,
        roles=tuple(roles),
        keys=tuple(keys),
        prompt_index=0,
        reference=True,
        measured=measured,
    )


def test_recall_acceptance_and_pages_read_by_hand():
    # one sequence: local, lookup, local, lookup; 2 sparse layers x 2 KV heads
    seq = sequence(["local", "lookup", "local", "lookup"], [-1, 1, -1, 2])
    hits = np.array(
        [
            [[True, False], [False, False]],  # first lookup: layer 0 head 0 only
            [[True, True], [False, True]],  # second: three of four
        ]
    )
    cell = CellTokens(np.array([1.0, 0.2, 0.9, 0.6]), np.zeros(4), hits, 30, 40)
    # a second, unmeasured sequence must change nothing
    other = CellTokens(np.zeros(4), np.zeros(4), ~hits, 40, 40)
    row = cell_row([seq, sequence(seq.roles, seq.keys, False)], [cell, other], top=(1, 1))
    assert row["key_page_recall"] == pytest.approx(4 / 8)
    assert row["key_page_recall_any_head"] == pytest.approx(3 / 4)  # (lookup, layer) pairs
    assert row["key_page_recall_top_head"] == pytest.approx(1 / 2)  # layer 1 head 1
    assert row["key_page_lookups"] == 2 and row["pages_read_share"] == pytest.approx(0.75)
    assert row["acceptance_lookup_mean"] == pytest.approx(0.4)
    assert row["acceptance_lookup_below_half"] == pytest.approx(0.5)
    assert row["acceptance_rest_mean"] == pytest.approx(0.95)
    assert row["acceptance_all_n"] == 4 and row["acceptance_benign_n"] == 0
    assert math.isnan(row["acceptance_benign_mean"])
    # one sequence: no spread between sequences to bound
    assert math.isnan(row["acceptance_lookup_mean_lo"])


def test_accuracy_estimate_multiplies_each_chain_and_frees_the_tags():
    seq = reference_sequence(PROMPT, PairTokenizer(), 0)
    roles = list(seq.roles)
    logps = np.zeros(len(roles))
    lookups = [i for i, role in enumerate(roles) if role == "lookup"]
    logps[lookups[0]] = math.log(0.5)  # the first chain's hop
    logps[[i for i, role in enumerate(roles) if role == "benign"]] = math.log(0.01)
    logps[-1] = math.log(0.01)  # the eos is not read
    # two chains of one hop each: (0.5 + 1.0) / 2
    assert accuracy_estimate([seq], [logps], PairTokenizer().encode("\n")[0], 2) == pytest.approx(
        0.75
    )
    logps[[i for i, role in enumerate(roles) if role == "answer"][0]] = math.log(0.25)
    # the answer line's logp is shared evenly: each chain times 0.25 ** (1 / 2)
    assert accuracy_estimate([seq], [logps], PairTokenizer().encode("\n")[0], 2) == pytest.approx(
        0.75 * 0.5
    )
