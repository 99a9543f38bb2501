"""DistillSparse's selector term (sparrow/trainer/selector_distill.py): the dense target is the
attention mass per choosable page (checked against attention computed here), the student's KL
carries gradients to the queries and keys, recall is 1 when the top-k covers every choosable
page, and on the tiny model a few LoRA steps lower the term on a fixed batch.

Run: `python -m pytest tests/trainer/test_selector_distill.py -q`.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sparrow.model.builtin import resolve_model_path
from sparrow.sparse.schedule import Schedule
from sparrow.trainer.selector_distill import SelectorProbe, probe_positions
from tests.trainer.distill_fixtures import measured_around_steps, sparse_rollouts
from tests.trainer.test_distill import SCHEDULE, distiller

PAGE = 4


def schedule(topk: int = 2, skip=()) -> Schedule:
    return Schedule(
        name="probe", topk_pages=(topk,), page_size=PAGE, bin_tokens=1000, reserved_bos=1,
        reserved_eos=1, skip_layers=tuple(skip),
    )  # fmt: skip


def qk(length=40, heads=4, kv_heads=2, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(length, heads, dim, generator=gen, requires_grad=True)
    k = torch.randn(length, kv_heads, dim, generator=gen, requires_grad=True)
    return q, k


def test_positions_are_evenly_spaced_generated_ones():
    assert probe_positions(10, 40, 4) == [10, 20, 29, 39]
    assert probe_positions(10, 12, 8) == [10, 11]
    assert probe_positions(10, 10, 4) == [] and probe_positions(0, 5, 0) == []


def test_the_key_bounds_rule_is_scored_too_and_passes_gradients_to_the_keys():
    """The student reads the page summaries the decode's cache holds (sequence_pages): the
    quest rule's key bounds as well as centroids."""
    q, k = qk()
    probe = SelectorProbe(dataclasses.replace(schedule(), selection="quest"), [40], [10], 4)
    probe.target(0, q, k)
    probe.student(0, q, k)
    loss = probe.loss()
    assert loss.item() > 0 and 0 < probe.recall() < 1
    loss.backward()
    assert k.grad[:36].abs().sum() > 0  # the full pages' keys, through their bounds


def test_the_target_is_the_dense_mass_per_choosable_page():
    q, k = qk()
    probe = SelectorProbe(schedule(), [40], [10], per_sequence=4)
    probe.target(0, q, k)
    target = probe.targets[(0, 0)]
    assert target.shape == (4, 2, 10)
    for row, t in enumerate([10, 20, 29, 39]):
        logits = torch.einsum("hd,khd->hk", q[t], k[: t + 1].repeat_interleave(2, dim=1))
        weights = torch.softmax(logits / math.sqrt(8), dim=-1).detach()  # [Hq, t + 1]
        per_page = torch.zeros(4, 10).index_add_(1, torch.arange(t + 1) // PAGE, weights)
        mass = per_page.view(2, 2, 10).mean(1)  # the KV group's query heads
        choosable = (torch.arange(10) >= 1) & (torch.arange(10) < t // PAGE + 1 - 1)
        want = mass * choosable
        torch.testing.assert_close(target[row], want / want.sum(-1, keepdim=True))


def test_the_student_kl_reaches_queries_and_keys_and_full_topk_recalls_everything():
    q, k = qk()
    probe = SelectorProbe(schedule(topk=100), [40], [10], per_sequence=4)
    probe.target(0, q, k)
    probe.student(0, q, k)
    loss = probe.loss()
    assert loss.item() > 0 and probe.recall() == pytest.approx(1.0)
    loss.backward()
    assert q.grad.abs().sum() > 0 and k.grad.abs().sum() > 0
    tight = SelectorProbe(schedule(topk=1), [40], [10], per_sequence=4)
    tight.target(0, q, k)
    tight.student(0, q, k)
    assert 0 < tight.recall() < 1


def test_skipped_layers_are_not_probed_and_a_missing_target_is_an_error():
    q, k = qk()
    probe = SelectorProbe(schedule(skip=(0,)), [40], [10], per_sequence=4)
    probe.target(0, q, k)
    probe.student(0, q, k)
    assert probe.loss() is None and probe.recall() is None
    with pytest.raises(RuntimeError, match="no dense target for layer 1"):
        probe.student(1, q, k)


def test_lora_steps_lower_the_selector_term_on_a_fixed_batch():
    path = resolve_model_path("builtin:tiny")
    records = sparse_rollouts(path, SCHEDULE)
    plain = distiller(path).distill(records, SCHEDULE, update=False)
    assert "distill/selector_loss" not in plain  # off by default
    d = distiller(path, kl_coef=0.0, selector_coef=1.0, selector_positions=8)
    first, last = measured_around_steps(d, records, SCHEDULE)
    # the tiny model on 2026-11-29: 0.089 -> 0.071, recall 0.745 -> 0.753
    assert first["distill/selector_loss"] > 0
    assert last["distill/selector_loss"] < 0.9 * first["distill/selector_loss"]
    assert 0 < first["distill/selector_recall"] < 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_the_term_matches_the_cpu_and_falls():
    """The teacher-forced kernels' path (CUDA) hands the same queries and keys to the term."""
    from sparrow.model.loader import SafetensorsCheckpoint
    from sparrow.trainer.distill import SparseDistiller
    from tests.trainer.test_distill import algo

    path = resolve_model_path("builtin:tiny")
    records = sparse_rollouts(path, SCHEDULE)
    settings = dict(kl_coef=0.0, selector_coef=1.0, selector_positions=8)
    cpu = distiller(path, **settings).distill(records, SCHEDULE, update=False)
    gpu = SparseDistiller(path, algo(**settings), "cuda", "float32", seed=0)
    gpu.set_base(SafetensorsCheckpoint(path))
    first, last = measured_around_steps(gpu, records, SCHEDULE)
    assert first["distill/selector_loss"] == pytest.approx(cpu["distill/selector_loss"], rel=1e-3)
    assert first["distill/selector_recall"] == pytest.approx(
        cpu["distill/selector_recall"], abs=1e-3
    )
    assert last["distill/selector_loss"] < 0.9 * first["distill/selector_loss"]
