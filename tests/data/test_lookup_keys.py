"""The key of each lookup of a chase reference: hand-counted positions with the character
tokenizer, the copied token itself with the testbed tokenizer (one token a name), and every
lookup of generated multi_chase prompts pointing at a definition of its own target."""

import pytest

from sparrow.data.char_tokenizer import char_tokenizer
from sparrow.data.lookup_keys import definition_targets, hop_currents, lookup_key_positions
from sparrow.data.synthetic import make_examples
from sparrow.data.token_roles import ReferencePath

PROMPT = "def ka=qd qd=mz mz=ol ol=ka\nfrom ka mz hops 1 tags\n"


def pairs(text: str) -> list[int]:
    return char_tokenizer(True).encode(text).ids


def chars(text: str) -> list[int]:
    return char_tokenizer(False).encode(text).ids


def test_character_tokens_hand_counted():
    # d0 e1 f2 _3 k4 a5 =6 q7 d8 _9 q10 d11 =12 m13 z14 _15 m16 z17 =18 o19 l20
    assert definition_targets(PROMPT, chars) == {"ka": 7, "qd": 13, "mz": 19, "ol": 25}
    keys = lookup_key_positions(PROMPT, chars)
    path = ReferencePath.of(PROMPT, chars)
    # reference "1 ka=qd ka\n0 mz=ol ka\nAnswer: qd ol": lookups qd (chars 5, 6) and ol (16, 17)
    found = {i: k for i, k in enumerate(keys) if k is not None}
    assert found == {5: 7, 6: 8, 16: 19, 17: 20}
    assert [path.roles[i] for i in found] == ["lookup"] * 4
    assert len(keys) == len(path.ids)


def test_letter_pairs_key_is_the_copied_token():
    keys = lookup_key_positions(PROMPT, pairs, eos_ids=(1,))
    path = ReferencePath.of(PROMPT, pairs, (1,))
    prompt_ids = pairs(PROMPT)
    lookups = [i for i, role in enumerate(path.roles) if role == "lookup"]
    assert len(lookups) == 2 and len(keys) == len(path.ids)
    assert [prompt_ids[keys[i]] for i in lookups] == [pairs("qd")[0], pairs("ol")[0]]
    # the token before a key is "=", and the one before that the current name
    assert [prompt_ids[keys[i] - 2] for i in lookups] == [pairs("ka")[0], pairs("mz")[0]]
    assert all(keys[i] is None for i in range(len(keys)) if i not in lookups)


def test_hop_currents_read_each_line():
    assert hop_currents("1 ka=qd ol\n0 mz=ol ka\nAnswer: qd ol") == ["ka", "mz"]


@pytest.mark.parametrize("chains,tags", [(1, 0), (4, 0), (4, 1)])
def test_every_lookup_of_generated_prompts_copies_its_key(chains, tags):
    for example in make_examples(
        "multi_chase", 3, seed=5, num_defs=32, num_hops=12, chains=chains, tags=tags
    ):
        prompt_ids = pairs(example.prompt)
        path = ReferencePath.of(example.prompt, pairs)
        keys = lookup_key_positions(example.prompt, pairs)
        lookups = [i for i, role in enumerate(path.roles) if role == "lookup"]
        assert len(lookups) == chains * 12
        for i in lookups:
            assert 0 < keys[i] < len(prompt_ids)
            assert prompt_ids[keys[i]] == path.ids[i]
            assert prompt_ids[keys[i] - 1] == pairs("=")[0]


def test_another_task_is_refused():
    with pytest.raises(ValueError, match="not a chase prompt"):
        definition_targets("what is 2+2\n", chars)
