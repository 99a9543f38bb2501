"""multi_chase: K interleaved chains, answers follow from the prompt, the reward is graded
(a miss costs 1/K), tags never change the reward, chains=1 without tags is pointer_chase_long,
and every character's role is right on hand-made examples."""

import random

import pytest

from sparrow.data.datasets import synthetic_spec
from sparrow.data.multi_chase import (
    chase_completion,
    completion_roles,
    parse_prompt,
    verified_share,
)
from sparrow.data.rewards import REWARD_FUNCTIONS, exact_match_reward, final_answer
from sparrow.data.synthetic import ALPHABET, make_examples
from sparrow.errors import SparrowError

share_match = REWARD_FUNCTIONS.get("share_match")


def _follow(prompt: str) -> list[str]:
    """Each chain's end, hop by hop with a plain loop over the definitions."""
    head, query = prompt.rstrip("\n").split("\n")
    targets = dict(item.split("=") for item in head.removeprefix("def ").split())
    words = [w for w in query.split() if w != "tags"]
    ends = []
    for start in words[1:-2]:
        current = start
        for _ in range(int(words[-1])):
            current = targets[current]
        ends.append(current)
    return ends


def test_answers_are_where_each_chain_lands_and_lines_interleave():
    for ex in make_examples("multi_chase", 6, seed=2, num_defs=40, num_hops=9, chains=4):
        assert ex.answer.split() == _follow(ex.prompt)
        lines = ex.completion.split("\n")
        assert len(lines) == 4 * 9 + 1 and lines[-1] == f"Answer: {ex.answer}"
        assert [int(line.split()[0]) for line in lines[:-1]] == list(range(35, -1, -1))
        starts = parse_prompt(ex.prompt).starts
        assert [line.split()[1].split("=")[0] for line in lines[:4]] == starts
        assert share_match(ex.completion, ex.answer) == 1.0
        assert set(ex.prompt + ex.completion) <= set(ALPHABET)


def test_chains_start_spread_round_the_cycle_so_none_meets_another():
    ex = make_examples("multi_chase", 1, seed=5, num_defs=64, num_hops=16, chains=4)[0]
    sources = [line.split()[1].split("=")[0] for line in ex.completion.split("\n")[:-1]]
    assert len(set(sources)) == len(sources)  # 64 / 4 = 16 hops each: no definition twice


def test_one_chain_without_tags_is_pointer_chase_long():
    sizes = dict(num_defs=30, num_hops=45)
    assert make_examples("multi_chase", 3, seed=7, chains=1, **sizes) == make_examples(
        "pointer_chase_long", 3, seed=7, **sizes
    )


def test_reward_is_the_share_of_chains_right():
    rng = random.Random(0)
    for ex in make_examples("multi_chase", 20, seed=3, num_defs=20, num_hops=3, chains=4):
        gold = ex.answer.split()
        guess = [g if rng.random() < 0.5 else rng.choice(["aa", "zz", ""]) for g in gold]
        text = ex.completion.rsplit("Answer:", 1)[0] + "Answer: " + " ".join(guess)
        right = 0
        for place in range(len(gold)):  # a plain loop over the places the answer reads
            predicted = final_answer(text).split()
            right += place < len(predicted) and predicted[place] == gold[place]
        assert share_match(text, ex.answer) == pytest.approx(right / 4)
    assert share_match("Answer: ab cd ef", "ab cd ef gh") == 0.75
    assert share_match("Answer: ab xx ef gh ij", "ab cd ef gh") == 0.75
    assert share_match("no answer", "ab") == 0.0
    assert share_match("Answer: ab", "ab") == exact_match_reward("Answer: ab", "ab") == 1.0


def test_tags_name_defined_names_and_never_change_the_reward():
    plain = make_examples("multi_chase", 4, seed=9, num_defs=24, num_hops=5, chains=4)
    tagged = make_examples("multi_chase", 4, seed=9, num_defs=24, num_hops=5, chains=4, tags=1)
    for a, b in zip(plain, tagged):
        assert b.prompt == a.prompt[:-1] + " tags\n"
        assert b.answer == a.answer
        defined = parse_prompt(b.prompt).targets
        b_lines, a_lines = b.completion.split("\n"), a.completion.split("\n")
        for a_line, b_line in zip(a_lines[:-1], b_lines[:-1]):
            head, tag = b_line.rsplit(" ", 1)
            assert head == a_line and tag in defined
        # any other defined tags: the same reward
        rng = random.Random(1)
        other, _ = chase_completion(b.prompt, tag=lambda: rng.choice(sorted(defined)))
        assert other != b.completion
        assert share_match(other, b.answer) == share_match(b.completion, b.answer) == 1.0


def test_wrong_hops_go_on_from_the_wrong_name():
    ex = make_examples("multi_chase", 1, seed=4, num_defs=12, num_hops=2, chains=2)[0]
    wrong, answer = chase_completion(ex.prompt, next_name=lambda current, target: current)
    assert answer == " ".join(parse_prompt(ex.prompt).starts)  # every hop stayed put
    assert share_match(wrong, ex.answer) == 0.0


def test_roles_of_hand_made_lines():
    completion = "3 ka=qd ol\n2 mz=ol ka\n1 qd=mz qd\n0 ol=ka mz\nAnswer: mz ka"
    roles = completion_roles(completion)
    code = "".join({"local": ".", "lookup": "L", "benign": "b", "answer": "A"}[r] for r in roles)
    assert code == (".....LL.bb." * 4) + "........AA.AA"
    assert (
        "".join(
            {"local": ".", "lookup": "L", "answer": "A"}[r]
            for r in completion_roles("1 ka=qd\n0 qd=mz\nAnswer: mz")
        )
        == ".....LL." * 2 + "........AA"
    )


def test_sizes_are_checked_and_carried_by_the_dataset_spec():
    with pytest.raises(SparrowError, match="chains=9"):
        make_examples("multi_chase", 1, seed=0, num_defs=8, chains=9)
    with pytest.raises(SparrowError, match="tags=2"):
        make_examples("multi_chase", 1, seed=0, tags=2)
    assert synthetic_spec("builtin:multi_chase:chains=4,tags=1,num_hops=10") == (
        "multi_chase",
        {"chains": 4, "tags": 1, "num_hops": 10},
    )
    assert parse_prompt("what is 2 + 2") is None and chase_completion("def x\nhops") is None


def test_verified_share_credits_a_chain_for_its_true_hops_and_answer_only():
    ex = make_examples("multi_chase", 1, seed=4, num_defs=40, num_hops=9, chains=4, tags=1)[0]
    assert verified_share(ex.prompt, ex.completion) == 1.0  # tags are not read
    lines = ex.completion.split("\n")
    countdown, pair, tag = lines[5].split(" ")  # chain 1's second hop made up
    lines[5] = f"{countdown} {pair.split('=')[0]}=zz {tag}"
    assert verified_share(ex.prompt, "\n".join(lines)) == 0.75
    assert share_match("\n".join(lines), ex.answer) == 1.0
    words = ex.answer.split()
    wrong_answer = ex.completion.replace(ex.answer, " ".join(words[:3] + ["zz"]))
    assert verified_share(ex.prompt, wrong_answer) == 0.75
    cut = "\n".join(ex.completion.split("\n")[:-5] + [f"Answer: {ex.answer}"])
    assert verified_share(ex.prompt, cut) == 0.0  # the last hop of every chain missing
    assert verified_share(ex.prompt, f"Answer: {ex.answer}") == 0.0
    with pytest.raises(SparrowError):
        verified_share("what is 2+2?\n", "Answer: 4")
