"""Teacher-forced accuracy: exact for a model that always predicts the reference, the product
of token probabilities for one that does not; the sampled grade credits no chain whose answer
was copied past wrong hop lines."""

import math
from types import SimpleNamespace

import pytest
import torch

from sparrow.data.multi_chase import chase_completion, parse_prompt
from sparrow.data.rewards import share_match_reward
from sparrow.data.synthetic import make_examples
from sparrow.experiments.testbed.data import encode, vocab
from sparrow.experiments.testbed.evaluate import sampled_grade, teacher_forced_accuracy


class NextTokenModel(torch.nn.Module):
    """Puts logit `margin` on the true next token (read from the input) and 0 elsewhere."""

    def __init__(self, margin: float):
        super().__init__()
        self.margin = margin
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the model a device

    def forward(self, input_ids):
        logits = torch.zeros(*input_ids.shape, len(vocab()))
        logits[:, :-1].scatter_(-1, input_ids[:, 1:, None], self.margin)
        return SimpleNamespace(logits=logits)


def test_a_model_predicting_the_reference_is_right_greedy_and_sampled():
    examples = make_examples("pointer_chase_long", 3, seed=2, num_defs=10, num_hops=15)
    result = teacher_forced_accuracy(NextTokenModel(60.0), examples, rows=2)
    by_hops = result.pop("sampled_estimate_by_hops")
    assert result.pop("argmax_by_role") == {"answer": 1.0, "local": 1.0, "lookup": 1.0}
    assert result == pytest.approx({"greedy": 1.0, "sampled_estimate": 1.0, "hop": 1.0})
    assert by_hops == pytest.approx({2: 1.0, 4: 1.0, 8: 1.0, 11: 1.0, 15: 1.0})


class LookupBlindModel(NextTokenModel):
    """NextTokenModel, but after each "=" it puts the margin on a wrong name."""

    def forward(self, input_ids):
        logits = super().forward(input_ids).logits
        after = input_ids[:, :-1] == vocab()["="]
        wrong = torch.where(after, input_ids[:, 1:] + 1, input_ids[:, 1:])
        logits[:, :-1] = 0.0
        logits[:, :-1].scatter_(-1, wrong[..., None], self.margin)
        return SimpleNamespace(logits=logits)


def test_argmax_by_role_tells_a_failed_lookup_from_a_failed_copy():
    examples = make_examples("multi_chase", 2, seed=4, num_defs=12, num_hops=2, chains=4)
    result = teacher_forced_accuracy(LookupBlindModel(5.0), examples)
    assert result["argmax_by_role"] == {"answer": 1.0, "local": 1.0, "lookup": 0.0}
    assert result["greedy"] == 0.0


def test_sampled_estimate_is_the_product_of_reference_probabilities():
    examples = make_examples("pointer_chase_long", 2, seed=2, num_defs=10, num_hops=15)
    margin, size = 3.0, len(vocab())
    p = math.exp(margin) / (math.exp(margin) + size - 1)
    result = teacher_forced_accuracy(NextTokenModel(margin), examples)
    _, mask = encode(examples[:1])
    completion = int(mask.sum()) - 1  # tokens of the completion, eos not counted
    line = 7  # '1' '4' ' ' name '=' name '\n': a name is one token
    assert result["greedy"] == 1.0
    assert result["sampled_estimate"] == pytest.approx(p**completion, rel=1e-4)
    assert result["hop"] == pytest.approx(p**line, rel=1e-4)
    for hops, estimate in result["sampled_estimate_by_hops"].items():
        assert estimate == pytest.approx(p ** (hops * line), rel=1e-4)
    assert teacher_forced_accuracy(NextTokenModel(0.0), examples)["greedy"] == 0.0


def test_tags_are_left_out_and_chains_make_a_graded_estimate():
    sizes = dict(num_defs=12, num_hops=3, chains=4)
    plain = make_examples("multi_chase", 2, seed=1, **sizes)
    tagged = make_examples("multi_chase", 2, seed=1, tags=1, **sizes)
    margin, size = 3.0, len(vocab())
    p = math.exp(margin) / (math.exp(margin) + size - 1)
    answer = 13  # 'A' 'ns' 'w' 'er' ':' and 4 x (' ', name)
    # '1' '1' ' ' name '=' name '\n', and ' ' before a tag; the tag counts for nothing
    for examples, line in ((plain, 7), (tagged, 8)):
        result = teacher_forced_accuracy(NextTokenModel(margin), examples)
        expected = p ** (3 * line + answer / 4)  # each chain: its 3 lines, a quarter of the answer
        assert result["sampled_estimate"] == pytest.approx(expected, rel=1e-4)
        assert result["hop"] == pytest.approx(p**line, rel=1e-4)
        assert result["sampled_estimate_by_hops"][1] == pytest.approx(p**line, rel=1e-4)


def test_sampled_grade_credits_a_chain_only_through_its_true_hops():
    # 64 hops of 4 chains round 256 names: each chain ends where the next one starts, so the
    # answer can be copied from the query line while every hop line is a made-up definition
    example = make_examples("multi_chase", 1, seed=3, num_defs=256, num_hops=64, chains=4)[0]
    starts = parse_prompt(example.prompt).starts
    assert example.answer.split() == starts[1:] + starts[:1]
    names = sorted(parse_prompt(example.prompt).targets)
    shortcut, _ = chase_completion(example.prompt, lambda current, target: names[0])
    shortcut = shortcut[: shortcut.rindex("Answer:")] + f"Answer: {example.answer}"
    assert share_match_reward(shortcut, example.answer) == 1.0
    assert sampled_grade(example, shortcut) == 0.0
    assert sampled_grade(example, example.completion) == 1.0
