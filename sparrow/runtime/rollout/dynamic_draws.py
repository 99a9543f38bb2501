"""The rollout stage's dynamic sampling (algo.dynamic_sampling): draws scored, groups kept.

    rows, results, metrics = informative_rollouts(runtime, step, rows, params)

Draw 0 is the step's own prompts; draw d > 0 takes data.prompts_per_step prompts from the
dataset's d-th stream for this step (PromptDataset.batch(step, n, draw=d)), its requests
seeded apart from the other draws'. Each draw is generated, scored as the reward stage scores
(routing and overlong shaping included), and sparrow.rl.dynamic_sampling.fill_batch keeps the
groups whose rewards differ, up to algo.dynamic_sampling_max_draws draws. The reward stage
scores the kept samples again from the rollout file (the same rewards for a deterministic
reward function; a resume re-runs the rollout stage whole, so the draws repeat exactly).
"""

from __future__ import annotations

from sparrow.data.step_rewards import score_records
from sparrow.rl.dynamic_sampling import fill_batch
from sparrow.runtime.rollout.records import to_records
from sparrow.runtime.rollout.requests import sampling_params
from sparrow.runtime.run_runtime import RunRuntime


def informative_rollouts(runtime: RunRuntime, step: int, rows: list, params: list):
    """(rows, per-row samples, dynamic/* metrics) of the kept groups, in batch order."""
    cfg = runtime.cfg
    per_step = cfg.data.prompts_per_step
    drawn: list[tuple[list, list]] = []

    def draw(index: int) -> list[list[float]]:
        draw_rows, draw_params = rows, params
        if index > 0:
            draw_rows = runtime.train_data.batch(step - 1, per_step, draw=index)
            draw_params = sampling_params(runtime, draw_rows, step, first_index=index * per_step)
        results = runtime.pool.generate([list(r.prompt_ids) for r in draw_rows], draw_params)
        drawn.append((draw_rows, results))
        records = to_records(draw_rows, results)
        _, shaped = score_records(cfg, records)
        groups: list[list[float]] = [[] for _ in draw_rows]
        for record, reward in zip(records, shaped):
            groups[record.prompt_index].append(reward)
        return groups

    filled = fill_batch(draw, per_step, cfg.algo.dynamic_sampling_max_draws)
    kept_rows = [drawn[d][0][g] for d, g in filled.kept]
    kept_results = [drawn[d][1][g] for d, g in filled.kept]
    return kept_rows, kept_results, filled.metrics()
