"""Partial rollouts: a step's batch that closes before its longest sample (docs/async.md).

    carried = carried_from(runtime, step)          # step - 1's carried.parquet ([] at step 1)
    partial = plan_partial(runtime, plan, carried)  # fewer new prompts, resumed requests, rule
    results = runtime.pool.generate_closing(partial.prompts, partial.params, partial.rule)
    batch, carried_on, metrics = partial.split(results, runtime.tokenizer)

With rollout.finish_fraction < 1 the rollout of step s holds prompts_per_step GRPO groups:
the C groups step s - 1 carried first (prompt indices 0..C-1), then the first
prompts_per_step - C of the step's own rows. A carried sample that had not finished resumes
as a request of its own: its prompt plus the tokens it has as the prefix, the rest of its
token budget, seeded per (step, prompt, sample) (requests.resume_seed); the engines decode it
with the weights they hold now. The generation closes once finish_fraction of the groups have
every sample finished, every carried group among them (so a sample is carried once at most
and its tokens span two versions). The groups complete then are the step's batch; the rest
go to the step's carried.parquet with the tokens they have. Each token keeps the policy
version that drew it (RolloutRecord.token_versions) and its behavior logprob.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sparrow.data.rollouts import RolloutRecord, read_rollouts
from sparrow.data.token_roles import ReferencePath, role_codes
from sparrow.engine import SamplingParams
from sparrow.engine.sequence import OPEN
from sparrow.runtime.ledger import contract
from sparrow.runtime.rollout.dispatch import CloseRule
from sparrow.runtime.rollout.records import eos_ids, to_records
from sparrow.runtime.rollout.requests import resume_seed, sampling_params
from sparrow.storage.run_rows import stage_record

if TYPE_CHECKING:
    from sparrow.runtime.rollout.in_flight import RolloutPlan
    from sparrow.runtime.run_runtime import RunRuntime


def carried_from(runtime: RunRuntime, step: int) -> list[RolloutRecord]:
    """The samples the rollout of step - 1 carried into `step` (its recorded carried.parquet;
    none at step 1)."""
    if step <= 1:
        return []
    previous = stage_record(runtime.store, runtime.run_id, step - 1, "rollout")
    if previous is None:
        raise RuntimeError(f"the rollout of step {step - 1} is not recorded before step {step}")
    path = contract.CARRIED.under(previous.output_dir)
    return read_rollouts(path) if path.is_file() else []


def _groups(records: Sequence[RolloutRecord]) -> list[list[RolloutRecord]]:
    by_prompt: dict[int, list[RolloutRecord]] = {}
    for record in records:
        by_prompt.setdefault(record.prompt_index, []).append(record)
    return [sorted(g, key=lambda r: r.sample_index) for _, g in sorted(by_prompt.items())]


@dataclass(frozen=True)
class PartialRollout:
    plan: RolloutPlan  # its rows: the step's new prompts only
    carried: list[list[RolloutRecord]]  # per carried group (renumbered 0..C-1), its samples
    resumed: list[tuple[int, int]]  # per resumed request: (carried group, sample position)
    prompts: list[list[int]]  # resumed requests first, then the new prompts
    params: list[SamplingParams]
    rule: CloseRule

    def split(
        self, results: Sequence[Sequence[Any]], tokenizer: Any = None
    ) -> tuple[list[RolloutRecord], list[RolloutRecord], dict[str, float]]:
        """(the step's batch: every group complete, the records carried on, metrics) from
        the engines' results, one list per request in self.prompts' order."""
        plan, count = self.plan, len(self.resumed)
        groups = [list(group) for group in self.carried]
        for (group, position), samples in zip(self.resumed, results[:count]):
            groups[group][position] = _resumed(
                groups[group][position], samples[0], plan.policy_version, tokenizer
            )
        fresh = to_records(
            plan.rows, results[count:], tokenizer, plan.policy_version, len(self.carried)
        )
        groups += _groups(fresh)
        complete = [all(r.finish_reason != OPEN for r in group) for group in groups]
        batch = [r for group, done in zip(groups, complete) if done for r in group]
        carried_on = [r for group, done in zip(groups, complete) if not done for r in group]
        metrics = {
            "rollout/groups": float(sum(complete)),
            "rollout/carried_in_groups": float(len(self.carried)),
            "rollout/resumed_samples": float(count),
            "rollout/carried_out_groups": float(len(groups) - sum(complete)),
            "rollout/carried_out_open": float(sum(r.finish_reason == OPEN for r in carried_on)),
        }
        return batch, carried_on, metrics


def plan_partial(
    runtime: RunRuntime, plan: RolloutPlan, carried: Sequence[RolloutRecord]
) -> PartialRollout:
    """The step's requests: the carried groups' open samples resumed, then as many new
    prompts as leave the groups at prompts_per_step; and the rule that closes it."""
    cfg = runtime.cfg
    groups = [
        [replace(r, prompt_index=index) for r in group]
        for index, group in enumerate(_groups(carried))
    ]
    rows = plan.rows[: max(0, len(plan.rows) - len(groups))]
    new_params = sampling_params(runtime, rows, plan.step, first_index=len(groups))
    resumed, prompts, params, labels = [], [], [], []
    for index, group in enumerate(groups):
        for position, record in enumerate(group):
            if record.finish_reason != OPEN:
                continue
            resumed.append((index, position))
            prompts.append([*record.prompt_ids, *record.output_ids])
            params.append(_resume_params(runtime, plan.step, record))
            labels.append(index)
    prompts += [list(row.prompt_ids) for row in rows]
    params += new_params
    labels += [len(groups) + i for i in range(len(rows))]
    rule = CloseRule(tuple(labels), cfg.rollout.finish_fraction, frozenset(range(len(groups))))
    return PartialRollout(
        replace(plan, rows=rows, params=new_params), groups, resumed, prompts, params, rule
    )


def _resume_params(runtime: RunRuntime, step: int, record: RolloutRecord) -> SamplingParams:
    """The rest of the sample's token budget, under the rollout's sampling."""
    rollout = runtime.cfg.rollout
    budget = min(rollout.max_new_tokens, runtime.max_context - len(record.prompt_ids))
    return SamplingParams(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=budget - len(record.output_ids),
        seed=resume_seed(
            runtime.cfg.pipeline.seed,
            rollout.seed,
            step,
            record.prompt_index,
            record.sample_index,
        ),
        n=1,
        logprobs_topk=rollout.logprobs_topk,
    )


def _rows(part: Any, n: int) -> np.ndarray:
    """A record's or result's top-K rows as an [n, K] array (K 0 when there are no tokens)."""
    array = np.asarray(part)
    return array.reshape(n, -1) if n else array.reshape(0, 0)


def _resumed(record: RolloutRecord, sample: Any, version: int, tokenizer: Any) -> RolloutRecord:
    """A carried record with the tokens its resumed request added (drawn by `version`)."""
    old, new = len(record.output_ids), len(sample.output_ids)
    output = (*record.output_ids, *sample.output_ids)
    versions = record.versions_of_tokens(version) + [version] * new
    topk = {}
    for name, theirs in (("topk_ids", sample.topk_ids), ("topk_logprobs", sample.topk_logprobs)):
        parts = [p for p in (_rows(getattr(record, name), old), _rows(theirs, new)) if len(p)]
        topk[name] = np.concatenate(parts) if parts else _rows(theirs, 0)
    roles: tuple = ()
    text = sample.text or ""
    if tokenizer is not None:
        path = ReferencePath.of(record.prompt_text, tokenizer.encode, eos_ids(tokenizer))
        roles = () if path is None else role_codes(path.roles_of(output))
        text = tokenizer.decode(list(output), skip_special_tokens=True)
    return replace(
        record,
        output_ids=output,
        actor_logprobs=(*record.actor_logprobs, *sample.logprobs),
        pages_read=(*record.pages_read, *sample.pages_read),
        finish_reason=sample.finish_reason,
        text=text,
        token_roles=roles,
        policy_version=versions[0],
        token_versions=versions if len(set(versions)) > 1 else (),
        **topk,
    )
