"""The testbed's training data: curriculum sizes, the step plan, wrong hops and encoding."""

import random

import pytest

from sparrow.data.synthetic import make_examples
from sparrow.experiments.testbed.data import (
    ONE_CHAIN_SHARE,
    ONE_CHAIN_START,
    TASK,
    VARIANTS,
    StepPlan,
    curriculum,
    derived_seed,
    encode,
    ends_on_a_start,
    held_out_examples,
    step_examples,
    vocab,
    with_wrong_hops,
)


def test_curriculum_grows_to_the_full_size_and_shares_sum_to_one():
    stages = curriculum(256, 600)
    assert [(s.num_defs, s.num_hops) for s in stages] == [
        (2, 1),
        (4, 2),
        (8, 5),
        (16, 15),
        (32, 30),
        (64, 100),
        (128, 300),
        (256, 600),
    ]
    assert sum(s.share for s in stages) == pytest.approx(1.0)
    assert [s.length for s in stages] == sorted(s.length for s in stages)
    # in tokens: 'de' 'f' ' ', 256 x 'ab' '=' 'cd' ' ' (the last ' ' a newline), 'fr' 'om' ' ',
    # name, ' ' 'ho' 'ps' ' ' '600' '\n'; 600 lines of '599' ' ' name '=' name '\n'; the answer
    # 'A' 'ns' 'w' 'er' ':' ' ' name; eos
    assert stages[-1].length == (3 + 256 * 4 + 3 + 1 + 4 + 3 + 1) + 600 * 8 + 7 + 1
    tiny = curriculum(2, 1)  # every stage the same size: one stage holding every share
    assert len(tiny) == 1 and tiny[0].share == pytest.approx(1.0)


def test_step_plan_walks_the_stages_then_the_noisy_tail():
    stages = curriculum(256, 600)
    plan = StepPlan(stages, steps=100, noise_share=0.15)
    assert plan.clean_steps == 85
    seen = [plan.stage_at(step) for step in range(100)]
    # the first stage's 10% of 85 clean steps: 8.5, rounded to even
    assert seen[0] == (stages[0], False) and seen[7] == (stages[0], False)
    assert seen[8] == (stages[1], False) and seen[84] == (stages[7], False)
    assert all(stage == stages[7] and noisy for stage, noisy in seen[85:])
    shares = dict((s.num_hops, share) for s, share in plan.step_shares())
    assert shares[600] == pytest.approx(0.2 * 0.85 + 0.15)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_step_data_depends_on_seed_and_step_only():
    stage = curriculum(64, 80)[1]
    a = step_examples(stage, 3, seed=1, step=7)
    assert a == step_examples(stage, 3, seed=1, step=7)
    assert a != step_examples(stage, 3, seed=1, step=8)
    assert a != step_examples(stage, 3, seed=2, step=7)
    assert a != step_examples(stage, 3, seed=1, step=7, micro=1)
    held = held_out_examples(64, 80, 4, seed=1)
    assert not set(held) & set(step_examples(curriculum(64, 80)[-1], 8, seed=1, step=0))
    assert derived_seed(1, "train", 2) != derived_seed(1, "train", 3) >= 0


def test_wrong_hops_keep_the_format_and_the_answer_follows_the_chain():
    ex = make_examples("pointer_chase_long", 1, seed=3, num_defs=20, num_hops=40)[0]
    assert with_wrong_hops(ex, 0.0, random.Random(0)) == ex
    noisy = with_wrong_hops(ex, 1.0, random.Random(0))
    targets = dict(item.split("=") for item in ex.prompt.split("\n")[0].split()[1:])
    lines = noisy.completion.split("\n")
    current = ex.prompt.split("\n")[1].split()[1]
    for left, line in zip(range(39, -1, -1), lines):
        count, hop = line.split()
        source, name = hop.split("=")
        assert int(count) == left and source == current
        assert name != targets[source] and name != source and name in targets
        current = name
    assert lines[-1] == f"Answer: {current}" and noisy.answer == current
    assert len(noisy.completion) == len(ex.completion)
    some = with_wrong_hops(ex, 0.1, random.Random(5))
    assert some == with_wrong_hops(ex, 0.1, random.Random(5)) != ex


def test_encode_gives_one_id_per_name_and_marks_the_completion():
    examples = make_examples("pointer_chase_long", 2, seed=0, num_defs=6, num_hops=5)
    ids, mask = encode(examples)
    ids_of = vocab()
    prompt, completion = examples[0].prompt, examples[0].completion
    # every name is one token; the other characters one each (def: 'de' 'f')
    names = prompt.split("\n")[0].split()[1:]
    # 'de' 'f' ' ', 6 x (name '=' name ' '), 'fr' 'om' ' ' name ' ' 'ho' 'ps' ' ' '5' '\n'
    prompt_tokens = 3 + 4 * 6 + 10
    # 5 x ('4' ' ' name '=' name '\n'), then 'A' 'ns' 'w' 'er' ':' ' ' name
    completion_tokens = 5 * 6 + 7
    assert ids.shape == mask.shape == (2, prompt_tokens + completion_tokens + 1)
    first = names[0].split("=")
    assert ids[0, :6].tolist() == [
        ids_of["de"],
        ids_of["f"],
        ids_of[" "],
        ids_of[first[0]],
        ids_of["="],
        ids_of[first[1]],
    ]
    assert ids[0, -1].item() == ids_of["<|endoftext|>"]
    assert mask[0].sum().item() == completion_tokens + 1
    assert not mask[0, :prompt_tokens].any()
    assert len(completion) == 5 * 8 + 10  # the characters: both names are two of them
    with pytest.raises(ValueError, match="differ in length"):
        encode(
            examples[:1] + make_examples("pointer_chase_long", 1, seed=0, num_defs=7, num_hops=5)
        )


def test_no_variant_lets_a_chain_end_on_a_start_named_in_the_query_line():
    assert ends_on_a_start(256, 64, chains=4) and ends_on_a_start(256, 256)  # the old sizes
    assert not ends_on_a_start(256, 63, chains=4) and not ends_on_a_start(676, 300, chains=4)
    for name, variant in VARIANTS.items():
        assert not ends_on_a_start(variant.num_defs, variant.num_hops, variant.chains), name
        example = make_examples(TASK, 1, seed=1, **variant.sizes())[0]
        starts = example.prompt.split("\n")[1].split()[1 : 1 + variant.chains]
        assert not set(example.answer.split()) & set(starts), name


def test_several_chains_learn_the_lookup_on_one_chain_first_and_never_read_a_start():
    stages = curriculum(**VARIANTS["v3"].sizes())
    one = [stage for stage in stages if stage.chains == 1]
    assert [(s.num_defs, s.num_hops) for s in one] == list(ONE_CHAIN_START)
    assert stages[: len(one)] == one and all(s.tags == 1 for s in stages)
    several = stages[len(one) :]
    assert [s.num_defs for s in several] == [32, 64, 128, 256]
    assert several[-1].sizes() == VARIANTS["v3"].sizes()
    for stage in several:
        assert stage.chains == 4 and stage.num_defs >= 2 * stage.chains
        assert not ends_on_a_start(stage.num_defs, stage.num_hops, stage.chains), stage
        assert stage.num_hops < stage.num_defs // stage.chains, stage
    assert abs(sum(stage.share for stage in stages) - 1.0) < 1e-9
    assert abs(sum(s.share for s in one) - ONE_CHAIN_SHARE) < 1e-9
