"""A step's rollout records from the engines' samples: what the rollout stage writes.

    records = to_records(rows, results, tokenizer)   # [prompt][sample] -> RolloutRecord list

Each record carries the prompt as the model saw it (after the chat template), the row's
data_source and extra_info (they route and feed its reward), and, with the tokenizer, each
generated token's role on a chase task's reference path (sparrow/data/token_roles.py; empty
for other tasks), and the policy version that generated it (docs/async.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparrow.data.rollouts import RolloutRecord
from sparrow.data.token_roles import ReferencePath, role_codes


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    return tuple(getattr(tokenizer, "eos_token_ids", ()) or ())


def to_records(
    rows: Sequence[Any],
    results: Sequence[Sequence[Any]],
    tokenizer: Any = None,
    policy_version: int | None = None,
    first_index: int = 0,
) -> list[RolloutRecord]:
    """The step's records, prompt by prompt, sample by sample; each records the policy
    version whose weights the engines generated it with; prompt indices from first_index."""
    paths = [
        None
        if tokenizer is None
        else ReferencePath.of(row.prompt, tokenizer.encode, eos_ids(tokenizer))
        for row in rows
    ]
    return [
        RolloutRecord(
            prompt_index=first_index + p,
            sample_index=s.sample_index,
            dataset_row=row.row,
            prompt_ids=tuple(row.prompt_ids),
            output_ids=tuple(s.output_ids),
            actor_logprobs=tuple(s.logprobs),
            topk_ids=s.topk_ids,
            topk_logprobs=s.topk_logprobs,
            pages_read=tuple(s.pages_read),
            finish_reason=s.finish_reason,
            answer=row.answer,
            text=s.text or "",
            token_roles=() if path is None else role_codes(path.roles_of(s.output_ids)),
            prompt_text=row.prompt,
            data_source=row.data_source,
            extra_info=row.extra_info,
            policy_version=policy_version,
        )
        for p, (row, samples, path) in enumerate(zip(rows, results, paths))
        for s in samples
    ]
