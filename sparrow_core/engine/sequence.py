"""Per-sample state inside the engine (Sequence) and what generate() returns (SampleResult).

A Sequence is one sample of one prompt: its tokens (prompt then generated), its page table
(logical page i of the sequence lives in physical KV page page_table[i]), its sampling
parameters and 64-bit seed (the sampler's draw counter is its number of generated tokens),
and what was recorded for each generated token. The n samples of
a prompt are n Sequences that share the prompt's full pages.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparrow_core.engine.validate import SamplingParams

FINISH_REASONS = ("stop", "length")


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class SampleResult:
    """One generated sample: per token id, logprob, top-K, pages read; and why it ended."""

    prompt_index: int
    sample_index: int
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    topk_ids: tuple[tuple[int, ...], ...]
    topk_logprobs: tuple[tuple[float, ...], ...]
    # pages read per KV head in sparse layers at the step that produced each token
    pages_read: tuple[int, ...]
    finish_reason: str
    text: str | None = None

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        lengths = (len(self.logprobs), len(self.topk_ids), len(self.topk_logprobs),
                   len(self.pages_read))
        if any(length != n for length in lengths):
            raise ValueError(f"SampleResult fields disagree in length: {n} ids vs {lengths}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, "
                             f"got {self.finish_reason!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_index": self.prompt_index,
            "sample_index": self.sample_index,
            "output_ids": list(self.output_ids),
            "text": self.text,
            "logprobs": list(self.logprobs),
            "topk_ids": [list(row) for row in self.topk_ids],
            "topk_logprobs": [list(row) for row in self.topk_logprobs],
            "pages_read": list(self.pages_read),
            "finish_reason": self.finish_reason,
        }


@dataclass(eq=False)
class Sequence:
    seq_id: int
    prompt_index: int
    sample_index: int
    token_ids: list[int]
    prompt_len: int
    params: "SamplingParams"
    seed: int
    stop_ids: frozenset[int]
    page_table: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    logprobs: list[float] = field(default_factory=list)
    topk_ids: list[tuple[int, ...]] = field(default_factory=list)
    topk_logprobs: list[tuple[float, ...]] = field(default_factory=list)
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

    def append(self, token: int, logprob: float, topk_ids: tuple[int, ...],
               topk_logprobs: tuple[float, ...], pages_read: int) -> None:
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

    def fork(self, seq_id: int, sample_index: int, seed: int) -> "Sequence":
        """A new sample of the same prompt, before any token is generated (no pages yet)."""
        if self.num_generated:
            raise ValueError("only a sequence with no generated token can be forked")
        return Sequence(seq_id, self.prompt_index, sample_index, list(self.token_ids),
                        self.prompt_len, self.params, seed, self.stop_ids)

    def to_result(self, text: str | None = None) -> SampleResult:
        if self.finish_reason is None:
            raise ValueError(f"sequence {self.seq_id} has not finished")
        return SampleResult(
            prompt_index=self.prompt_index,
            sample_index=self.sample_index,
            output_ids=tuple(self.token_ids[self.prompt_len:]),
            logprobs=tuple(self.logprobs),
            topk_ids=tuple(self.topk_ids),
            topk_logprobs=tuple(self.topk_logprobs),
            pages_read=tuple(self.pages_read),
            finish_reason=self.finish_reason,
            text=text,
        )
