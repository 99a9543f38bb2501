"""The adaptive curriculum: a stage ends at its accuracy threshold or at its step cap, spare
steps go to the next stage, and a threshold above 1 walks exactly the fixed plan."""

import pytest

from sparrow.experiments.testbed.adaptive import AdaptiveCurriculum
from sparrow.experiments.testbed.data import StepPlan, curriculum


def _walk(plan, evaluate, advance_accuracy=0.98, eval_every=5):
    """Every step's (stage index or 'noisy'), the StageEnds, and the walk."""
    walk = AdaptiveCurriculum(plan, advance_accuracy, eval_every)
    index = {stage: i for i, stage in enumerate(plan.stages)}
    seen, ends = [], []
    for step in range(plan.steps):
        stage, noisy = walk.stage_at(step)
        seen.append("noisy" if noisy else index[stage])
        if ended := walk.after_step(step + 1, evaluate):
            ends.append(ended)
    return seen, ends, walk


def test_a_threshold_above_one_walks_the_fixed_plan():
    plan = StepPlan(curriculum(256, 600), steps=100, noise_share=0.15)
    seen, ends, walk = _walk(plan, lambda stage: 1.0, advance_accuracy=1.01)
    index = {stage: i for i, stage in enumerate(plan.stages)}
    fixed = [
        ("noisy" if noisy else index[stage]) for stage, noisy in map(plan.stage_at, range(100))
    ]
    assert seen == fixed
    assert [(e.stage, e.steps_done, e.reason) for e in ends] == [
        (0, 8, "steps"),
        (1, 17, "steps"),
        (2, 26, "steps"),
        (3, 34, "steps"),
        (4, 42, "steps"),
        (5, 55, "steps"),
        (6, 68, "steps"),
        (7, 85, "steps"),
    ]
    # a check every 5 steps of a stage and one at each stage's end
    assert [c["steps_done"] for c in walk.checks if c["stage"] == 0] == [5, 8]


def test_a_stage_that_reaches_the_threshold_hands_its_steps_to_the_next():
    plan = StepPlan(curriculum(256, 600), steps=100, noise_share=0.15)
    calls = []

    def evaluate(stage):  # stage 5 (100 hops) learns by its 10th step, the others never
        calls.append(stage.num_hops)
        return 0.99 if stage.num_hops == 100 and calls.count(100) >= 2 else 0.5

    seen, ends, _ = _walk(plan, evaluate)
    assert [(e.stage, e.steps_done, e.reason) for e in ends] == [
        (0, 8, "steps"),
        (1, 17, "steps"),
        (2, 26, "steps"),
        (3, 34, "steps"),
        (4, 42, "steps"),
        (5, 52, "accuracy"),
        (6, 68, "steps"),
        (7, 85, "steps"),
    ]
    assert ends[5].hop_accuracy == pytest.approx(0.99) and ends[6].hop_accuracy == 0.5
    # stage 6 runs from step 52 to its cap at 68: its own 13 steps and stage 5's spare 3
    assert seen[:8] == [0] * 8 and seen[42:52] == [5] * 10 and seen[52:68] == [6] * 16
    assert seen[68:85] == [7] * 17 and seen[85:] == ["noisy"] * 15


def test_every_stage_learning_at_once_leaves_the_steps_to_the_full_length():
    plan = StepPlan(curriculum(256, 600), steps=100, noise_share=0.0)
    seen, ends, _ = _walk(plan, lambda stage: 1.0, eval_every=3)
    assert [(e.stage, e.steps_done, e.reason) for e in ends] == [
        (0, 3, "accuracy"),
        (1, 6, "accuracy"),
        (2, 9, "accuracy"),
        (3, 12, "accuracy"),
        (4, 15, "accuracy"),
        (5, 18, "accuracy"),
        (6, 21, "accuracy"),
        (7, 100, "steps"),
    ]
    assert seen.count(7) == 79
    with pytest.raises(ValueError, match="eval_every"):
        AdaptiveCurriculum(plan, 0.98, 0)
