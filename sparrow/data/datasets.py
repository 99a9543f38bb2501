"""Prompt datasets for RL steps: the built-in synthetic task, Parquet files, JSONL files.

    from sparrow.data.datasets import load_prompts
    data = load_prompts("builtin:synthetic", "prompt", "answer", tokenizer, max_prompt_tokens=1024)
    data = load_prompts("/data/train.parquet", "problem", "solution", tokenizer, 2048, seed=7)
    rows = data.batch(step=3, prompts_per_step=4)   # [PromptRow(row, prompt, prompt_ids, answer)]

Specs: "builtin:synthetic" (the default task of sparrow.data.synthetic, pointer_chase,
the one the embedded model was trained on; "builtin:<task>" names any task there, and
"builtin:<task>:<size>=<n>,..." sets its sizes, e.g.
"builtin:pointer_chase_long:num_defs=512,num_hops=1450"; "builtin:math-train" and
"builtin:math-test" are files shipped in the package, sparrow/data/shipped.py; row r is made
from its own seed, derived from (seed, split, r), so train and eval never share a seed and any
row can be read without the ones before it; 2**62 rows), "<path>.parquet", "<path>.jsonl"
(one JSON object per line; either file in plain columns or in the community layout of
chat-message prompts, reward_model.ground_truth, data_source and extra_info:
sparrow/data/prompt_rows.py, chat messages rendered by the chat template of
sparrow/data/chat.py), "code:<path>" (TACO / CodeContests code problems whose answers
are their tests, for data.reward=code; sparrow/data/code_datasets.py). Answers are read
as text (a number becomes its decimal string).
A file is read and checked whole at load: every row needs a non-empty prompt and answer, and
every prompt must tokenize to at most max_prompt_tokens, and, given the model's context
(max_context), leave room in it for at least one generated token; the first bad row is one
DatasetError (PromptTooLongError for the context) naming the file and the row (0-based;
JSONL also gives the line).

batch(step, n) is deterministic in (seed, step): for files, the rows in an order shuffled
afresh every epoch (epoch e's order comes from the seed and e alone), read as one endless
stream, n per step; for the synthetic task, rows step * n ... step * n + n - 1.
Tests: `python -m pytest tests/data/test_datasets.py -q`; docs/trainer.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from sparrow.data.prompt_rows import DatasetError, FileRow, read_prompt_rows
from sparrow.data.shipped import shipped_names, shipped_path
from sparrow.data.synthetic import DEFAULT_TASK, TASKS, make_examples, task_spec
from sparrow.errors import SparrowError

if TYPE_CHECKING:
    from sparrow.data.chat import ChatRenderer

SYNTHETIC_SPECS = {
    "builtin:synthetic": DEFAULT_TASK,
    **{f"builtin:{name}": name for name in TASKS},
}
SYNTHETIC_ROWS = 2**62
SPLITS = ("train", "eval")
# keeps the synthetic rows' seeds clear of the small seeds scripts/train_tiny_model.py uses
_SEED_OFFSET = 2**40


class PromptTooLongError(DatasetError):
    """A prompt that leaves no room to generate within the model's context."""


def context_error(source: str, row: int, length: int, context: int) -> PromptTooLongError:
    return PromptTooLongError(
        f"{source}: row {row}: the prompt is {length} tokens but the model's context is "
        f"{context} tokens (model.max_context, or the checkpoint's max_position_embeddings), "
        f"which leaves no room to generate; shorten or drop that row, or use a model with a "
        f"longer context"
    )


class TextEncoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class PromptRow:
    row: int  # row in the dataset (0-based)
    prompt: str
    prompt_ids: tuple[int, ...]
    answer: str
    data_source: str = ""  # the row's data_source (community layout), "" for plain rows
    extra_info: str = ""  # JSON text of its extra_info dict, "" when it has none

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise DatasetError(f"row {self.row}: a prompt needs at least one token")


class PromptDataset:
    """Rows of (prompt, answer) with deterministic per-step batches; see the module doc."""

    def __init__(
        self,
        source: str,
        prompts: Sequence[str] | None,
        answers: Sequence[str] | None,
        tokenizer: TextEncoder,
        max_prompt_tokens: int,
        split: str,
        seed: int,
        max_context: int | None = None,
        meta: Sequence[tuple[str, str]] | None = None,
    ):
        self.source = source
        self.max_context = max_context
        self.split = split
        self.seed = seed
        self.max_prompt_tokens = max_prompt_tokens
        self._tokenizer = tokenizer
        self._prompts = prompts
        self._answers = answers
        self._meta = meta  # (data_source, extra_info) per row of a file, if any has them
        self._task, self._sizes = (
            synthetic_spec(source) if source.startswith("builtin:") else (None, {})
        )

    @property
    def endless(self) -> bool:
        """A synthetic task's rows, made from seeds, never run out (a file's do)."""
        return self._prompts is None

    @property
    def num_rows(self) -> int:
        return SYNTHETIC_ROWS if self._prompts is None else len(self._prompts)

    def __len__(self) -> int:
        return self.num_rows

    def row(self, index: int) -> PromptRow:
        """Row `index`, tokenized and checked against max_prompt_tokens."""
        if not 0 <= index < self.num_rows:
            raise DatasetError(f"{self.source}: row {index} is out of range [0, {self.num_rows})")
        if self._prompts is None:
            example = make_examples(
                self._task, 1, synthetic_row_seed(self.seed, self.split, index), **self._sizes
            )[0]
            prompt, answer = example.prompt, example.answer
        else:
            prompt, answer = self._prompts[index], self._answers[index]
        ids = self._tokenizer.encode(prompt)
        check_prompt_length(self.source, index, len(ids), self.max_prompt_tokens, self.max_context)
        meta = self._meta[index] if self._meta is not None else ("", "")
        return PromptRow(index, prompt, tuple(int(i) for i in ids), answer, *meta)

    def batch(self, step: int, prompts_per_step: int, draw: int = 0) -> list[PromptRow]:
        """The prompts of RL step `step` (0-based); the same for the same seed and step.
        draw > 0: dynamic sampling's further draws of that step, each from a stream of its
        own (another shuffle of the file, or synthetic rows far from the training stream)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise DatasetError(f"step must be an integer >= 0, got {step!r}")
        if (
            isinstance(prompts_per_step, bool)
            or not isinstance(prompts_per_step, int)
            or prompts_per_step < 1
        ):
            raise DatasetError(
                f"prompts_per_step must be an integer >= 1, got {prompts_per_step!r}"
            )
        start = step * prompts_per_step
        return [self.row(self._stream_row(start + i, draw)) for i in range(prompts_per_step)]

    def _stream_row(self, position: int, draw: int = 0) -> int:
        if self._prompts is None:
            return (position + draw * _DRAW_STRIDE) % SYNTHETIC_ROWS
        epoch, offset = divmod(position, self.num_rows)
        seed = self.seed if draw == 0 else _draw_seed(self.seed, draw)
        return int(_epoch_order(seed, epoch, self.num_rows)[offset])


# dynamic sampling's draw d reads synthetic rows d * 2**56 on: no run reaches the next stream
_DRAW_STRIDE = 2**56


def _draw_seed(seed: int, draw: int) -> int:
    entropy = [abs(seed), int(seed < 0), draw]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)


@lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, num_rows: int) -> np.ndarray:
    return np.random.default_rng([abs(seed), int(seed < 0), epoch]).permutation(num_rows)


def synthetic_spec(spec: str) -> tuple[str, dict[str, int]]:
    """(task, sizes) of "builtin:synthetic", "builtin:<task>" or "builtin:<task>:k=n,...";
    DatasetError naming the spec for an unknown task, a malformed size or a bad value."""
    base, _, size_text = spec.partition(":")[2].partition(":")
    if f"builtin:{base}" not in SYNTHETIC_SPECS:
        raise DatasetError(
            f"unknown built-in dataset {spec!r}; valid: "
            + ", ".join(sorted(SYNTHETIC_SPECS) + shipped_names())
            + " (sizes as builtin:<task>:<size>=<n>,...)"
        )
    task, sizes = SYNTHETIC_SPECS[f"builtin:{base}"], {}
    for item in filter(None, size_text.split(",")):
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().lstrip("-").isdigit():
            raise DatasetError(f"dataset {spec!r}: size {item!r} is not <name>=<integer>")
        sizes[name.strip()] = int(value)
    try:
        task_spec(task, **sizes)
    except SparrowError as err:
        raise DatasetError(f"dataset {spec!r}: {err}") from None
    return task, sizes


def synthetic_row_seed(seed: int, split: str, row: int) -> int:
    """A distinct seed per (seed, split, row); train seeds are even and eval seeds odd."""
    zigzag = 2 * seed if seed >= 0 else -2 * seed - 1  # every integer seed to a distinct n >= 0
    pair = (zigzag + row) * (zigzag + row + 1) // 2 + row  # Cantor pairing: distinct per pair
    return _SEED_OFFSET + 2 * pair + SPLITS.index(split)


def check_prompt_length(
    source: str, row: int, length: int, limit: int, context: int | None = None
) -> None:
    if length == 0:
        raise DatasetError(
            f"{source}: row {row}: the prompt encodes to no tokens "
            "(every character is unknown to the tokenizer)"
        )
    if length > limit:
        raise DatasetError(
            f"{source}: row {row}: the prompt is {length} tokens, longer than "
            f"data.max_prompt_tokens={limit}"
        )
    if context is not None and length >= context:
        raise context_error(source, row, length, context)


def load_prompts(
    spec: str,
    prompt_key: str,
    answer_key: str,
    tokenizer: TextEncoder,
    max_prompt_tokens: int,
    split: str = "train",
    seed: int = 0,
    max_context: int | None = None,
    chat: ChatRenderer | None = None,
) -> PromptDataset:
    """The dataset `spec` names (see the module doc), checked row by row; with max_context,
    a prompt that fills the model's context is PromptTooLongError. Chat-message prompts are
    rendered by `chat` (sparrow/data/chat.py); without one they are an error naming the row."""
    if split not in SPLITS:
        raise DatasetError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if (
        isinstance(max_prompt_tokens, bool)
        or not isinstance(max_prompt_tokens, int)
        or max_prompt_tokens < 1
    ):
        raise DatasetError(f"max_prompt_tokens must be an integer >= 1, got {max_prompt_tokens!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise DatasetError(f"seed must be an integer, got {seed!r}")
    if not isinstance(spec, str) or not spec:
        raise DatasetError(f"dataset spec must be a non-empty string, got {spec!r}")
    spec = str(shipped_path(spec) or spec)  # "builtin:math-train": a file in the package
    if spec.startswith("builtin:"):
        synthetic_spec(spec)  # an unknown task or a bad size fails here, naming the spec
        dataset = PromptDataset(
            spec, None, None, tokenizer, max_prompt_tokens, split, seed, max_context
        )
        dataset.row(0)  # a limit too small for the task fails now, not at step 0
        return dataset
    if spec.startswith("code:"):  # TACO / CodeContests rows; answers are tests (code_datasets.py)
        from sparrow.data.code_datasets import parse_code_spec, read_code_file

        path, time_limit_s = parse_code_spec(spec)
        prompts, answers = read_code_file(path, time_limit_s)
        meta = None
    else:
        path = Path(spec).expanduser()
        rows = read_prompt_rows(path, prompt_key, answer_key)
        prompts = [_prompt_text(path, row, file_row, chat) for row, file_row in enumerate(rows)]
        answers = [r.answer for r in rows]
        meta = [(r.data_source, r.extra_info) for r in rows]
        if not any(any(m) for m in meta):
            meta = None
    for row, prompt in enumerate(prompts):
        check_prompt_length(
            str(path), row, len(tokenizer.encode(prompt)), max_prompt_tokens, max_context
        )
    return PromptDataset(
        str(path), prompts, answers, tokenizer, max_prompt_tokens, split, seed, max_context, meta
    )


def _prompt_text(path: Path, row: int, file_row: FileRow, chat: ChatRenderer | None) -> str:
    """A plain prompt as it is; chat messages rendered by the chat template."""
    if isinstance(file_row.prompt, str):
        return file_row.prompt
    from sparrow.data.chat import ChatTemplateError

    if chat is None:
        raise DatasetError(
            f"dataset {path}: row {row}: the prompt is a list of chat messages and no chat "
            f"template is set (data.chat_template)"
        )
    try:
        return chat.render(file_row.prompt)
    except ChatTemplateError as err:
        raise DatasetError(f"dataset {path}: row {row}: {err}") from None
