"""The offline selection study's replay: chase sequences teacher-forced densely and under a
flat schedule of one page-scoring rule and budget, with what each token's step read.

    from sparrow.experiments.testbed.selection_replay import (
        dense_pass, reference_sequence, sampled_sequence, sparse_pass)
    seqs = [reference_sequence(prompt_text, tokenizer, index=0)]
    dense = dense_pass(model, seqs, page_sizes=(16,))   # logits, dense logps, key-page mass
    cells = sparse_pass(model, seqs, schedule, dense.logits)   # one CellTokens a sequence
    cells[0].acceptance, cells[0].hits     # [generated] alpha; [lookups, sparse layers, Hkv]

The replay is the project's (engine/teacher/forced.py, held equal to sparse decode by its
tests; its page masks through the on_selection hook); acceptance is
mismatch/acceptance.py's exact sum of min(p, q) over the vocabulary. Token p of a sequence was
drawn from the logits at p - 1, so the step that drew it read the pages of row p - 1: a
lookup's key page is hit there or not. The first generated token comes from the dense
prefill (acceptance 1 under every budget, as in calibration). The dense pass also measures,
per (layer, KV head), the dense attention mass on each lookup's key page at that row: the
`oracle` rule's own score (sparse/scoring.py: softmax mass per page, mean over the group's
query heads), gathered at the key page.
Run `python -m pytest -q tests/benchmarks/test_selection_study.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sparrow.data.lookup_keys import lookup_key_positions
from sparrow.data.token_roles import ReferencePath
from sparrow.engine.teacher.forced import TeacherForcedAttention, teacher_forced_hidden
from sparrow.mismatch.acceptance import acceptance_from_logits
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import PageSummary, get_rule


@dataclass(frozen=True)
class StudySequence:
    """A prompt and one completion: the reference's tokens or a sample's."""

    ids: tuple[int, ...]
    prompt_len: int
    # per generated token: token_roles' role, and the prompt position of a lookup's key (-1)
    roles: tuple[str, ...]
    keys: tuple[int, ...]
    prompt_index: int
    # the prompt's reference completion (the step-0 accuracy estimate reads these)
    reference: bool
    # counts in the acceptance and recall statistics (False: a reference replayed for the
    # accuracy estimate beside sampled sequences)
    measured: bool = True

    @property
    def lookups(self) -> np.ndarray:
        """Generated indices of the lookup tokens with a key, in order."""
        return np.array([i for i, k in enumerate(self.keys) if k >= 0], dtype=np.int64)


def reference_sequence(
    prompt: str, tokenizer, index: int, measured: bool = True, completion: str | None = None
):
    """The reference completion of a chase prompt (eos last) as a StudySequence; with
    `completion` (the example's own, tags as the task drew them), that text instead of the
    reference's (whose tags all repeat the first defined name, unlike any training example)."""
    eos = tuple(tokenizer.eos_token_ids[:1])
    path = ReferencePath.of(prompt, tokenizer.encode, eos)
    if path is None:
        raise ValueError(f"not a chase prompt for this tokenizer: {prompt[:80]!r}")
    keys = lookup_key_positions(prompt, tokenizer.encode, eos)
    prompt_ids = tokenizer.encode(prompt)
    ids = path.ids if completion is None else tuple(tokenizer.encode(completion)) + eos
    roles = path.roles if completion is None else tuple(path.roles_of(ids))
    if "unknown" in roles:
        raise ValueError(f"completion {index} leaves its prompt's reference path")
    return StudySequence(
        tuple(prompt_ids) + ids,
        len(prompt_ids),
        roles,
        tuple(-1 if k is None else k for k in keys),
        index,
        reference=True,
        measured=measured,
    )


def sampled_sequence(prompt: str, tokenizer, output_ids: Sequence[int], index: int):
    """A sample of a chase prompt: roles from the reference path (unknown once it leaves),
    a lookup's key while the sample follows the path."""
    eos = tuple(tokenizer.eos_token_ids[:1])
    path = ReferencePath.of(prompt, tokenizer.encode, eos)
    roles = path.roles_of(output_ids)
    keys = lookup_key_positions(prompt, tokenizer.encode, eos)
    own = [
        keys[i] if role == "lookup" and keys[i] is not None else -1 for i, role in enumerate(roles)
    ]
    prompt_ids = tokenizer.encode(prompt)
    return StudySequence(
        tuple(prompt_ids) + tuple(output_ids),
        len(prompt_ids),
        tuple(roles),
        tuple(own),
        index,
        reference=False,
    )


@dataclass
class DensePass:
    # per sequence: float32 logits [generated, vocab] of the rows that drew each token
    logits: list[torch.Tensor]
    # per sequence: dense log-probability of each generated token [generated]
    logps: list[np.ndarray]
    # page size -> [layers, Hkv] summed key-page attention mass over lookups, and their count
    key_mass: dict[int, np.ndarray]
    lookups: int


@dataclass
class CellTokens:
    """One sequence under one schedule."""

    acceptance: np.ndarray  # [generated]
    logps: np.ndarray  # sparse log-probability of each generated token [generated]
    hits: np.ndarray  # [lookups, sparse layers, Hkv] bool: the key page was read
    pages_read: int  # summed over sparse decode rows, sparse layers and KV heads
    pages_present: int  # the same sum had every page been read


def _drawing_rows(seq: StudySequence) -> slice:
    return slice(seq.prompt_len - 1, len(seq.ids) - 1)


def _token_logps(logits: torch.Tensor, seq: StudySequence) -> np.ndarray:
    target = torch.tensor(seq.ids[seq.prompt_len :], device=logits.device)
    logp = torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]
    return logp.double().cpu().numpy()


class _KeyMass:
    """AttentionFn: dense attention, and per layer the oracle's mass on each lookup's key
    page (mean over the group's query heads) summed per KV head."""

    def __init__(self, attention, seqs, page_sizes, layers, kv_heads):
        self.attention, self.seqs, self.page_sizes = attention, seqs, page_sizes
        self.sums = {size: np.zeros((layers, kv_heads)) for size in page_sizes}
        self.oracle = get_rule("oracle")

    def __call__(self, layer, q, k, v):
        start = 0
        for seq in self.seqs:
            found = seq.lookups
            if found.size and seq.measured:
                rows = torch.as_tensor(seq.prompt_len + found - 1, device=q.device)
                span = slice(start, start + len(seq.ids))
                keys = torch.as_tensor([seq.keys[i] for i in found], device=q.device)
                for size in self.page_sizes:
                    pages = PageSummary(keys=k[span], positions=rows, page_size=size)
                    mass = self.oracle.score(q[span][rows], pages)  # [R, Hkv, P]
                    index = (keys // size).view(-1, 1, 1).expand(-1, mass.shape[1], 1)
                    on_key = mass.gather(-1, index)[..., 0].sum(0)
                    self.sums[size][layer] += on_key.double().cpu().numpy()
            start += len(seq.ids)
        return self.attention(layer, q, k, v)


@torch.no_grad()
def dense_pass(model, seqs: Sequence[StudySequence], page_sizes: Sequence[int]) -> DensePass:
    """Dense logits and logps of every generated token, and the key-page mass per head."""
    device = next(model.parameters()).device
    ids = [torch.as_tensor(s.ids, device=device) for s in seqs]
    lens = [len(s.ids) for s in seqs]
    attention = TeacherForcedAttention(lens, lens, None)
    arch = model.arch
    recorder = _KeyMass(attention, seqs, page_sizes, arch.num_layers, arch.num_kv_heads)
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    hidden = model(torch.cat(ids), positions, recorder).split(lens)
    logits = [model.compute_logits(h[_drawing_rows(s)]) for h, s in zip(hidden, seqs)]
    logps = [_token_logps(lg, s) for lg, s in zip(logits, seqs)]
    lookups = sum(s.lookups.size for s in seqs if s.measured)
    return DensePass(logits, logps, recorder.sums, lookups)


@torch.no_grad()
def sparse_pass(
    model,
    seqs: Sequence[StudySequence],
    schedule: Schedule,
    dense_logits: Sequence[torch.Tensor],
    centroid_dtype: str = "cache",
) -> list[CellTokens]:
    """Each sequence replayed under `schedule`: acceptance against the dense logits, sparse
    logps, key-page hits at the lookups' drawing rows and the pages its decode steps read."""
    sparse_layers = [i for i in range(model.arch.num_layers) if schedule.is_sparse_layer(i)]
    hits = [{} for _ in seqs]
    counts = np.zeros((len(seqs), 2), dtype=np.int64)  # pages read, pages present

    def on_selection(layer: int, index: int, pages: torch.Tensor) -> None:
        seq = seqs[index]
        found = seq.lookups
        rows = torch.as_tensor(seq.prompt_len + found - 1, device=pages.device)
        keys = torch.as_tensor([seq.keys[i] // schedule.page_size for i in found], dtype=torch.long)
        picked = pages[rows][:, :, keys.to(pages.device)]  # [R, Hkv, R]
        hits[index][layer] = picked.diagonal(dim1=0, dim2=2).T.cpu().numpy()
        # the decode steps: rows prompt_len .. length - 2 drew generated tokens 2 onwards
        steps = pages[seq.prompt_len : len(seq.ids) - 1]
        counts[index, 0] += int(steps.sum())
        present = torch.arange(seq.prompt_len, len(seq.ids) - 1) // schedule.page_size + 1
        counts[index, 1] += int(present.sum()) * pages.shape[1]

    hidden = teacher_forced_hidden(
        model,
        [list(s.ids) for s in seqs],
        [s.prompt_len for s in seqs],
        schedule,
        on_selection=on_selection,
        centroid_dtype=centroid_dtype,
    )
    out = []
    for index, (h, seq, dense) in enumerate(zip(hidden, seqs, dense_logits)):
        logits = model.compute_logits(h[_drawing_rows(seq)])
        alpha = acceptance_from_logits(dense, logits).double().cpu().numpy()
        missing = [i for i in sparse_layers if i not in hits[index]]
        if missing:  # the replay took a path without the hook: no recall to report
            raise RuntimeError(f"no page selection seen for sparse layers {missing}")
        grid = np.stack([hits[index][i] for i in sparse_layers], axis=1)
        out.append(CellTokens(alpha, _token_logps(logits, seq), grid, *counts[index]))
    return out
