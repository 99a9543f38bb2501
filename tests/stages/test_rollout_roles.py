"""The rollout stage's records carry each token's role on a chase task's reference path."""

from types import SimpleNamespace

import numpy as np

from sparrow.data.char_tokenizer import char_tokenizer
from sparrow.data.datasets import PromptRow
from sparrow.data.synthetic import make_examples
from sparrow.data.token_roles import role_names
from sparrow.runtime.rollout.records import to_records


class PairTokenizer:
    eos_token_ids = (1,)

    def encode(self, text):
        return char_tokenizer(True).encode(text).ids


def _sample(index, ids):
    n = len(ids)
    return SimpleNamespace(
        sample_index=index,
        output_ids=ids,
        logprobs=[0.0] * n,
        topk_ids=np.zeros((n, 1), np.int32),
        topk_logprobs=np.zeros((n, 1), np.float32),
        pages_read=[1] * n,
        finish_reason="stop",
        text="",
    )


def test_records_hold_roles_for_chase_prompts_and_none_for_others():
    tok = PairTokenizer()
    chase = make_examples("multi_chase", 1, seed=0, num_defs=12, num_hops=2, chains=2)[0]
    other = make_examples("lookup_sum", 1, seed=0)[0]
    rows = [
        PromptRow(0, chase.prompt, tuple(tok.encode(chase.prompt)), chase.answer),
        PromptRow(1, other.prompt, tuple(tok.encode(other.prompt)), other.answer),
    ]
    right = tok.encode(chase.completion) + [1]
    wrong = right[:4] + [right[4] + 1] + right[5:]  # the first lookup goes wrong
    results = [[_sample(0, right), _sample(1, wrong)], [_sample(0, [5, 6])]]
    records = to_records(rows, results, tok)
    assert role_names(records[0].token_roles).count("lookup") == 4
    assert "unknown" not in role_names(records[0].token_roles)
    wrong_roles = role_names(records[1].token_roles)
    assert wrong_roles[4] == "lookup" and set(wrong_roles[5:]) == {"unknown"}
    assert records[2].token_roles == ()
    assert all(r.token_roles == () for r in to_records(rows, results))
