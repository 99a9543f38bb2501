"""The adaptive length curriculum of the testbed run: a stage ends when its held-out hop
accuracy reaches a threshold or when its share of the steps is spent, whichever comes first.

    from sparrow.experiments.testbed.adaptive import AdaptiveCurriculum
    walk = AdaptiveCurriculum(plan, advance_accuracy=0.98, eval_every=50)
    stage, noisy = walk.stage_at(step)
    ended = walk.after_step(step + 1, evaluate)   # evaluate(stage) -> hop accuracy in [0, 1]
    # ended: None, or the StageEnd of the stage that just ended

Why: the first GPU run (docs/testbed.md) spent fixed shares of its steps on each length and
ended at 58% hop accuracy at full length; with fixed shares a stage that learns the lookup
quickly wastes its remaining steps on what it already knows, and one that has not learned it
moves on anyway. Here each stage's share in StepPlan is a cap measured from the run's start
(stage i ends at the latest at the cumulative share of stages 0..i), so steps a stage does not
need go to the next, longer stage, and a stage that has not reached the threshold keeps its
whole share, as in the fixed plan. advance_accuracy above 1 gives exactly the fixed plan.
The threshold the run uses, 0.98 a hop line, is about where a chain of the first stage's 30
hops is sampled right half the time (0.98 ** 30 = 0.55): the lookup works, not just often.
The last clean stage always runs to plan.clean_steps; the noisy tail after it is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sparrow.experiments.testbed.data import Stage, StepPlan


@dataclass(frozen=True)
class StageEnd:
    # index into plan.stages
    stage: int
    steps_done: int
    # "accuracy": the threshold was reached; "steps": the stage's share was spent
    reason: str
    # held-out hop accuracy at the stage's length when it ended
    hop_accuracy: float


@dataclass
class AdaptiveCurriculum:
    plan: StepPlan
    # hop accuracy at the stage's length that ends a stage early; > 1: never early
    advance_accuracy: float
    # steps between held-out checks within a stage (a stage's end is always checked)
    eval_every: int
    index: int = 0
    began: int = 0
    checks: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")

    @property
    def stage(self) -> Stage:
        return self.plan.stages[self.index]

    def cap(self, index: int) -> int:
        """The step at which stage `index` ends at the latest (the last: the clean steps)."""
        if index == len(self.plan.stages) - 1:
            return self.plan.clean_steps
        return round(sum(s.share for s in self.plan.stages[: index + 1]) * self.plan.clean_steps)

    def stage_at(self, step: int) -> tuple[Stage, bool]:
        """(stage, noisy) of step `step`, the steps being taken in order."""
        if step >= self.plan.clean_steps:
            return self.plan.stages[-1], True
        return self.stage, False

    def after_step(self, steps_done: int, evaluate: Callable[[Stage], float]) -> StageEnd | None:
        """After `steps_done` steps: check the current stage when its cap is reached or every
        eval_every of its steps; the StageEnd when it ends (the walk moves to the next)."""
        if steps_done > self.plan.clean_steps or self.index >= len(self.plan.stages):
            return None
        at_cap = steps_done >= self.cap(self.index)
        last = self.index == len(self.plan.stages) - 1
        due = (steps_done - self.began) % self.eval_every == 0 and not last
        if not (at_cap or due):
            return None
        accuracy = float(evaluate(self.stage))
        self.checks.append(
            {"stage": self.index, "steps_done": steps_done, "hop_accuracy": accuracy}
        )
        if not at_cap and accuracy < self.advance_accuracy:
            return None
        ended = StageEnd(self.index, steps_done, "steps" if at_cap else "accuracy", accuracy)
        # past the last stage the walk is over: stage_at gives the noisy tail
        self.index, self.began = self.index + 1, steps_done
        return ended
