"""Roles of generated tokens on the reference path: right on hand-made samples with the
testbed tokenizer (one token a name) and the character tokenizer, `unknown` once a sample
leaves the path, tags free, other tasks None."""

from sparrow.data.char_tokenizer import char_tokenizer
from sparrow.data.synthetic import make_examples
from sparrow.data.token_roles import ReferencePath, role_codes, role_names, token_roles

PROMPT = "def ka=qd qd=mz mz=ol ol=ka\nfrom ka mz hops 1 tags\n"
EOS = 1


def pairs(text: str) -> list[int]:
    return char_tokenizer(True).encode(text).ids


def chars(text: str) -> list[int]:
    return char_tokenizer(False).encode(text).ids


def test_reference_sample_gets_every_role_in_place():
    sample = pairs("1 ka=qd ol\n0 mz=ol ka\nAnswer: qd ol") + [EOS]
    roles = token_roles(PROMPT, sample, pairs, [EOS])
    # "1", " ", ka, "=", qd, " ", ol, "\n" per hop line (one token a name)
    hop = ["local"] * 4 + ["lookup", "local", "benign", "local"]
    # A ns w er : space (the merges' order), the names, the eos
    answer = ["local"] * 6 + ["answer", "local", "answer", "local"]
    assert roles == hop * 2 + answer


def test_a_wrong_lookup_is_a_lookup_and_everything_after_is_unknown():
    sample = pairs("1 ka=mz ol\n0 mz=ol ka\nAnswer: qd ol")
    roles = token_roles(PROMPT, sample, pairs, [EOS])
    assert roles[:5] == ["local"] * 4 + ["lookup"]
    assert set(roles[5:]) == {"unknown"}


def test_any_name_as_tag_stays_on_the_path_anything_else_leaves_it():
    free = token_roles(PROMPT, pairs("1 ka=qd mz\n0 mz=ol qd\nAnswer: qd ol"), pairs, [EOS])
    assert "unknown" not in free and free.count("benign") == 2
    # zz is defined nowhere in the prompt: still a name, and no tag changes the chain
    undefined = token_roles(PROMPT, pairs("1 ka=qd zz\n0 mz=ol qd\nAnswer: qd ol"), pairs, [EOS])
    assert undefined == free
    off = token_roles(PROMPT, pairs("1 ka=qd 7\n0 mz=ol qd\n"), pairs, [EOS])
    assert off[6] == "benign" and set(off[7:]) == {"unknown"}
    chars_free = token_roles(PROMPT, chars("1 ka=qd zz\n0 mz=ol qd\n"), chars, [EOS])
    assert chars_free[8:10] == ["benign", "benign"] and "unknown" not in chars_free


def test_character_tokenizer_gives_each_character_its_role():
    roles = token_roles("def ka=qd qd=ka\nfrom ka hops 1\n", chars("0 ka=qd\nAnswer: qd"), chars)
    assert roles == ["local"] * 5 + ["lookup"] * 2 + ["local"] * 9 + ["answer"] * 2


def test_past_the_reference_and_other_tasks():
    sample = pairs("1 ka=qd ol\n0 mz=ol ka\nAnswer: qd ol") + [EOS, EOS, 5]
    assert token_roles(PROMPT, sample, pairs, [EOS])[-3:] == ["local", "unknown", "unknown"]
    lookup_sum = make_examples("lookup_sum", 1, seed=0)[0]
    assert token_roles(lookup_sum.prompt, [3, 4], pairs) is None
    assert role_codes(None) == ()


def test_generated_examples_follow_their_reference_and_codes_round_trip():
    for task, sizes in [
        ("multi_chase", dict(num_defs=30, num_hops=6, chains=4, tags=1)),
        ("pointer_chase_long", dict(num_defs=30, num_hops=40)),
    ]:
        for ex in make_examples(task, 3, seed=1, **sizes):
            path = ReferencePath.of(ex.prompt, pairs, [EOS])
            roles = path.roles_of(pairs(ex.completion) + [EOS])
            assert "unknown" not in roles
            assert roles.count("lookup") == len(ex.completion.split("\n")) - 1
            assert roles.count("answer") == len(ex.answer.split())
            assert role_names(role_codes(roles)) == roles
