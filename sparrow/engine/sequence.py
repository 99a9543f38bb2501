"""Per-sample state inside the engine (Sequence) and what generate() returns (SampleResult).

A Sequence is one sample of one prompt: its tokens (prompt then generated), its page table
(logical page i of the sequence lives in physical KV page page_table[i]), its sampling
parameters and 64-bit seed (the sampler's draw counter is its number of generated tokens),
and what was recorded for each generated token. The n samples of
a prompt are n Sequences that share the prompt's full pages.

A SampleResult's top-K ids and logprobs are [tokens, K] int32 / float32 arrays
(sparrow/token_arrays.py; nested sequences given to it are converted): one buffer per
sample on its way through Ray, the rollout file and the scorer, not a Python object per entry.
Two results compare equal when their fields hold the same values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from sparrow.token_arrays import (
    TOPK_ID_DTYPE,
    TOPK_LOGPROB_DTYPE,
    TokenRows,
    same_values,
    token_matrix,
)

if TYPE_CHECKING:
    from sparrow.engine.validate import SamplingParams

FINISH_REASONS = ("stop", "length")
# a sample cut by an early close (sparrow/engine/close.py): it has more to generate
OPEN = "open"


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, eq=False)
class SampleResult:
    """One generated sample: per token id, logprob, top-K, pages read; and why it ended."""

    prompt_index: int
    sample_index: int
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    topk_ids: np.ndarray  # [tokens, K] int32
    topk_logprobs: np.ndarray  # [tokens, K] float32
    # pages read per KV head in sparse layers at the step that produced each token
    pages_read: tuple[int, ...]
    finish_reason: str
    text: str | None = None

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        for name, dtype in (("topk_ids", TOPK_ID_DTYPE), ("topk_logprobs", TOPK_LOGPROB_DTYPE)):
            rows = getattr(self, name)
            if not (isinstance(rows, np.ndarray) and rows.dtype == dtype and rows.ndim == 2):
                matrix = token_matrix(rows, dtype)  # [n, K]; an array of another dtype as is
                if matrix.size == 0:  # no tokens, or K = 0
                    matrix = np.zeros((len(matrix), 0), dtype)
                object.__setattr__(self, name, matrix.astype(dtype, copy=False))
        lengths = (
            len(self.logprobs),
            len(self.topk_ids),
            len(self.topk_logprobs),
            len(self.pages_read),
        )
        if any(length != n for length in lengths):
            raise ValueError(f"SampleResult fields disagree in length: {n} ids vs {lengths}")
        if self.finish_reason not in (*FINISH_REASONS, OPEN):
            raise ValueError(
                f"finish_reason must be one of {(*FINISH_REASONS, OPEN)}, got {self.finish_reason!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_index": self.prompt_index,
            "sample_index": self.sample_index,
            "output_ids": list(self.output_ids),
            "text": self.text,
            "logprobs": list(self.logprobs),
            "topk_ids": self.topk_ids.tolist(),
            "topk_logprobs": self.topk_logprobs.tolist(),
            "pages_read": list(self.pages_read),
            "finish_reason": self.finish_reason,
        }

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(same_values(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    __hash__ = None  # arrays inside


@dataclass(eq=False)
class Sequence:
    seq_id: int
    prompt_index: int
    sample_index: int
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]
    page_table: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    logprobs: list[float] = field(default_factory=list)
    # a row of K per generated token
    topk_ids: TokenRows = field(default_factory=lambda: TokenRows(TOPK_ID_DTYPE))
    topk_logprobs: TokenRows = field(default_factory=lambda: TokenRows(TOPK_LOGPROB_DTYPE))
    pages_read: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def max_tokens(self) -> int:
        """Prompt plus max_new_tokens: the longest this sequence can get."""
        return self.prompt_len + self.params.max_new_tokens

    def append(
        self, token: int, logprob: float, topk_ids: Any, topk_logprobs: Any, pages_read: int
    ) -> None:
        """Record a sampled token; set the finish reason when it stops or reaches the cutoff."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.topk_ids.append(topk_ids)
        self.topk_logprobs.append(topk_logprobs)
        self.pages_read.append(pages_read)
        if token in self.stop_ids:
            self.finish_reason = "stop"
        elif self.num_generated >= self.params.max_new_tokens:
            self.finish_reason = "length"

    def fork(self, seq_id: int, sample_index: int, seed: int) -> Sequence:
        """A new sample of the same prompt, before any token is generated (no pages yet)."""
        if self.num_generated:
            raise ValueError("only a sequence with no generated token can be forked")
        return Sequence(
            seq_id,
            self.prompt_index,
            sample_index,
            list(self.token_ids),
            self.prompt_len,
            self.params,
            seed,
            self.stop_ids,
        )

    def to_result(self, text: str | None = None) -> SampleResult:
        if self.finish_reason is None:
            raise ValueError(f"sequence {self.seq_id} has not finished")
        return SampleResult(
            prompt_index=self.prompt_index,
            sample_index=self.sample_index,
            output_ids=tuple(self.token_ids[self.prompt_len :]),
            logprobs=tuple(self.logprobs),
            topk_ids=self.topk_ids.array(self.params.logprobs_topk),
            topk_logprobs=self.topk_logprobs.array(self.params.logprobs_topk),
            pages_read=tuple(self.pages_read),
            finish_reason=self.finish_reason,
            text=text,
        )


@dataclass(frozen=True)
class SelectionRecord:
    """Debug record of one sparse layer of one decode step for one sample."""

    step: int
    layer: int
    prompt_index: int
    sample_index: int
    position: int
    # per KV head: the logical page indices read (page i holds positions i*ps .. i*ps+ps-1)
    pages: tuple[tuple[int, ...], ...]
