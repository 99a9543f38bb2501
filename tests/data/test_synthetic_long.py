"""pointer_chase_long: answers follow from the prompt, every line needs a definition from far
back, same seed same examples, sizes checked, and built-in dataset specs carry the sizes."""

import re

import pytest

from sparrow.data.datasets import DatasetError, load_prompts, synthetic_spec
from sparrow.data.rewards import exact_match_reward
from sparrow.data.synthetic import ALPHABET, NAMES, make_examples
from sparrow.errors import SparrowError


def _parse(prompt: str) -> tuple[dict[str, str], str, int]:
    defs_line, from_line = prompt.rstrip("\n").split("\n")
    targets = dict(item.split("=") for item in defs_line.removeprefix("def ").split())
    _, start, _, hops = from_line.split()
    return targets, start, int(hops)


def test_answer_is_where_the_hops_land_and_lines_count_down():
    for ex in make_examples("pointer_chase_long", 8, seed=4, num_defs=40, num_hops=130):
        targets, current, hops = _parse(ex.prompt)
        lines = ex.completion.split("\n")
        assert len(lines) == hops + 1 and lines[-1] == f"Answer: {ex.answer}"
        for left, line in zip(range(hops - 1, -1, -1), lines):
            assert line == f"{left:03d} {current}={targets[current]}"
            current = targets[current]
        assert ex.answer == current
        assert exact_match_reward(ex.completion, ex.answer) == 1.0
        assert set(ex.prompt + ex.completion) <= set(ALPHABET)


def test_definitions_form_one_cycle_so_no_name_recurs_within_num_defs_hops():
    ex = make_examples("pointer_chase_long", 1, seed=9, num_defs=50, num_hops=120)[0]
    targets, start, _ = _parse(ex.prompt)
    assert len(targets) == 50 and sorted(targets.values()) == sorted(targets)
    seen, current = [], start
    for _ in range(50):
        seen.append(current)
        current = targets[current]
    assert len(set(seen)) == 50 and current == start
    sources = [line.split()[1].split("=")[0] for line in ex.completion.split("\n")[:-1]]
    assert all(sources[i] == sources[i - 50] for i in range(50, len(sources)))
    assert all(len(set(sources[i : i + 50])) == 50 for i in range(len(sources) - 49))


def test_default_sizes_put_the_definitions_thousands_of_tokens_back():
    ex = make_examples("pointer_chase_long", 1, seed=0)[0]
    assert len(ex.prompt) == 1557 and len(ex.completion) == 6010
    text = ex.prompt + ex.completion
    distances = []
    for match in re.finditer(r"\d+ (\w\w)=(\w\w)\n", ex.completion):
        at = len(ex.prompt) + match.start(1)
        definition = text.index(f"{match.group(1)}={match.group(2)}")
        assert definition < len(ex.prompt)  # the definition is in the prompt only
        distances.append(at - definition)
    distances.sort()
    # the median line reads its definition over 3,000 characters (= tokens) back
    assert distances[len(distances) // 2] > 3000 and distances[0] > 0


def test_same_seed_same_examples():
    a = make_examples("pointer_chase_long", 3, seed=7, num_defs=30, num_hops=45)
    assert a == make_examples("pointer_chase_long", 3, seed=7, num_defs=30, num_hops=45)
    assert a != make_examples("pointer_chase_long", 3, seed=8, num_defs=30, num_hops=45)


def test_sizes_are_checked_with_a_clear_error():
    with pytest.raises(SparrowError, match=r"2 <= num_defs <= 676.*num_defs=1"):
        make_examples("pointer_chase_long", 1, seed=0, num_defs=1)
    with pytest.raises(SparrowError, match=rf"num_defs <= {len(NAMES)}.*num_defs=677"):
        make_examples("pointer_chase_long", 1, seed=0, num_defs=677)
    with pytest.raises(SparrowError, match=r"1 <= num_hops <= 100000.*num_hops=0"):
        make_examples("pointer_chase_long", 1, seed=0, num_hops=0)
    with pytest.raises(SparrowError, match="has no size 'hops'; sizes: num_defs, num_hops"):
        make_examples("pointer_chase_long", 1, seed=0, hops=3)
    with pytest.raises(SparrowError, match="must be an integer"):
        make_examples("pointer_chase_long", 1, seed=0, num_hops="3")


def test_sixteen_thousand_token_chains_are_configurable():
    ex = make_examples("pointer_chase_long", 1, seed=1, num_defs=676, num_hops=1450)[0]
    assert 15_900 < len(ex.completion) < 16_100
    assert ex.completion.startswith("1449 ")


def test_dataset_spec_carries_sizes():
    assert synthetic_spec("builtin:pointer_chase_long") == ("pointer_chase_long", {})
    assert synthetic_spec("builtin:pointer_chase_long:num_defs=20,num_hops=30") == (
        "pointer_chase_long",
        {"num_defs": 20, "num_hops": 30},
    )
    assert synthetic_spec("builtin:synthetic:num_hops=3") == ("pointer_chase", {"num_hops": 3})

    class Chars:
        def encode(self, text):
            return list(text.encode())

    data = load_prompts(
        "builtin:pointer_chase_long:num_defs=20,num_hops=30", "prompt", "answer", Chars(), 512
    )
    row = data.row(3)
    assert row.prompt.count("=") == 20 and row.prompt.endswith("hops 30\n")
    assert data.row(3) == row
    for bad, message in [
        ("builtin:pointer_chase_long:num_defs", "not <name>=<integer>"),
        ("builtin:pointer_chase_long:num_defs=1", "2 <= num_defs"),
        ("builtin:pointer_chase_long:width=3", "no size 'width'"),
        ("builtin:long", "unknown built-in dataset"),
    ]:
        with pytest.raises(DatasetError, match=message):
            load_prompts(bad, "prompt", "answer", Chars(), 512)
