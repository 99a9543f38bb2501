"""The trainer as Ray actors (2 gloo ranks on CPU) equals one process's PolicyTrainer; its
sharded checkpoint resumes on 1 rank, and a 1-rank one on 2; its weights reach every rollout
actor through the bucketed broadcast.

Marked slow: each rank is a process that loads torch and transformers (a few seconds each on a
2-core machine). Run: `python -m pytest tests/runtime/trainer_group/test_group.py -q`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from sparrow.engine import EngineConfig
from sparrow.runtime.rollout.actors import ActorPool
from sparrow.runtime.rollout.weight_sync import sync_group_to_pool
from sparrow.runtime.rollout.worker import WorkerSpec
from sparrow.runtime.trainer_group.group import TrainerGroup
from sparrow.runtime.trainer_group.rank import TrainerSpec
from sparrow.trainer.policy_trainer import PolicyTrainer
from tests.trainer.test_policy_trainer import (
    ALGO,
    SYSTEM,
    make_records,
    weights,
    with_actor_logprobs,
)

pytestmark = pytest.mark.slow

# one sequence per micro-batch, so the ranks hold different counts and one pads; a clip
# that is active, so the global gradient norm matters
GROUP_ALGO = dataclasses.replace(ALGO, grad_clip=0.05)
GROUP_SYSTEM = dataclasses.replace(SYSTEM, micro_batch_tokens=1)
REWARDS = (
    [0.0, 1.0, 1.0, 0.5, 0.2, 0.0],
    [1.0, 0.0, 0.0, 1.0, 0.5, 0.5],
    [0.3, 0.9, 0.0, 0.1, 1.0, 0.0],
)


@pytest.fixture(scope="module")
def ray_up(flow_environment):
    """The session's local Ray (tests/conftest.py), stopped after its last user: later tests
    count their own child processes."""
    flow_environment.start_ray()


def batch(trainer):
    records = make_records(prompts=3, group=2, seed=12)
    scores = trainer.score(records)
    update_records = with_actor_logprobs(records, scores, [0.1 * (i % 3) for i in range(6)])
    return records, scores, update_records, [s.dense_logprobs for s in scores]


def close(have: dict, want: dict, atol: float) -> None:
    assert set(have) >= set(want) - {"lm_head.weight"}  # tied to the embeddings
    for name, tensor in want.items():
        if name in have:
            torch.testing.assert_close(have[name], tensor, rtol=0, atol=atol, msg=name)


def test_two_ranks_equal_one_process_and_resume_on_another_count(
    ray_up, qwen3_checkpoint, tmp_path
):
    import ray

    single = PolicyTrainer(
        qwen3_checkpoint, GROUP_ALGO, device="cpu", seed=0, trainer_config=GROUP_SYSTEM
    )
    records, scores, update_records, old = batch(single)
    spec = TrainerSpec(str(qwen3_checkpoint), GROUP_ALGO, GROUP_SYSTEM, seed=0)
    two = TrainerGroup.start(spec, 2)
    try:
        got_scores = two.score(records)
        metrics = two.update(update_records, REWARDS[0], old, 2)
        seconds = two.rank_seconds()
        two.save(tmp_path / "two")
        # weights gathered on rank 0 while the other rank takes part (a collective)
        got = ray.get(
            [a.__ray_call__.remote(lambda r: r.trainer.full_state_dict()) for a in two.actors]
        )[0]
    finally:
        two.shutdown()
    expected = single.update(update_records, REWARDS[0], old, 2)
    assert len(seconds) == 2 and all(s["score"] > 0 and s["update"] > 0 for s in seconds)
    for want, have in zip(scores, got_scores):
        torch.testing.assert_close(
            torch.tensor(have.dense_logprobs), torch.tensor(want.dense_logprobs), rtol=0, atol=1e-5
        )
    assert expected["actor/grad_norm"] > GROUP_ALGO.grad_clip
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    close(got, weights(single), atol=1e-5)
    assert (tmp_path / "two" / "model.safetensors").is_file()

    # 2 ranks saved, 1 resumes: its second update lands where the single process's does
    one = TrainerGroup.start(spec, 1, resume_from=str(tmp_path / "two"))
    try:
        assert one.step == 1
        one.update(update_records, REWARDS[1], old, 2)
        one.save(tmp_path / "one")
    finally:
        one.shutdown()
    single.update(update_records, REWARDS[1], old, 2)
    # 1 rank saved, 2 resume: the third update too (AdamW moments resharded both ways)
    two = TrainerGroup.start(spec, 2, resume_from=str(tmp_path / "one"))
    try:
        two.update(update_records, REWARDS[2], old, 2)
        got = ray.get(
            [a.__ray_call__.remote(lambda r: r.trainer.full_state_dict()) for a in two.actors]
        )[0]
    finally:
        two.shutdown()
    before = weights(single)
    single.update(update_records, REWARDS[2], old, 2)
    close(got, weights(single), atol=3e-5)
    assert any(not torch.equal(before[k], got[k]) for k in got)  # the update moved them


def test_sync_gives_every_actor_the_trainers_weights(
    ray_up, qwen3_checkpoint, qwen3_sharded_checkpoint, tmp_path
):
    import ray

    # the actors start from other weights, so a sync that did nothing fails
    engine = EngineConfig(max_batch_size=4, page_size=4, num_pages=64)
    worker = WorkerSpec(
        model_path=str(qwen3_checkpoint),
        weights_path=str(qwen3_sharded_checkpoint),
        schedule=None,
        engine=engine,
    )
    # four processes on a Ray that counts the machine's CPUs (2 here): half a CPU each
    pool = ActorPool.start(worker, 2, {"num_cpus": 0.5})
    group = TrainerGroup.start(
        TrainerSpec(str(qwen3_checkpoint), GROUP_ALGO, GROUP_SYSTEM, seed=0),
        2,
        placement=[{"num_cpus": 0.5}] * 2,
    )
    try:
        single = PolicyTrainer(
            qwen3_checkpoint, GROUP_ALGO, device="cpu", seed=0, trainer_config=GROUP_SYSTEM
        )
        records, _, update_records, old = batch(single)
        group.update(update_records, REWARDS[0], old, 2)
        # a bucket of 16 KiB: the tiny model goes in dozens of buckets
        modes = sync_group_to_pool(group, pool, "unsaved", bucket_bytes=16 << 10)
        assert modes == ["gloo", "gloo"]
        want = ray.get(
            [a.__ray_call__.remote(lambda r: r.trainer.full_state_dict()) for a in group.actors]
        )[0]
        phases = group.last_sync
        unique = sum(t.numel() for t in load_file(qwen3_checkpoint / "model.safetensors").values())
        # fp32, the tied embedding packed and sent once (the file holds it once too)
        assert phases["packed_bytes"] == phases["sent_bytes"] == 4 * unique
        assert [e["tensors"] for e in phases["engines"]] == [len(want)] * 2  # names, lm_head too
        assert phases["seconds"] >= phases["gather_s"] + phases["transfer_s"] > 0
        engines = ray.get(
            [
                a.__ray_call__.remote(
                    lambda w: {k: v.clone() for k, v in w.engine.model.state_dict().items()}
                )
                for a in pool.actors
            ]
        )
        reference = _decoder_state(want, qwen3_checkpoint)
        for state in engines:
            assert set(state) == set(reference)
            for name, tensor in reference.items():
                assert torch.equal(state[name], tensor), name
        assert pool.spec.weights_path == "unsaved"
    finally:
        group.shutdown()
        pool.shutdown()


def _decoder_state(hf_state: dict, checkpoint) -> dict:
    """The engine decoder's own names for transformers-named weights."""
    from sparrow.model import load_model

    decoder = load_model(checkpoint)
    decoder.load_hf_state_dict(hf_state)
    return decoder.state_dict()


def test_distill_on_the_ranks_and_sync_the_merged_weights(ray_up, tmp_path):
    import ray

    from sparrow.model.builtin import resolve_model_path
    from sparrow.model.loader import SafetensorsCheckpoint
    from sparrow.runtime.trainer_group.distill import DistillSpec, GroupDistiller
    from sparrow.trainer.distill import SparseDistiller
    from sparrow.trainer.lora import Adapter, adapter_state, merged_for_engine
    from tests.trainer.distill_fixtures import sparse_rollouts
    from tests.trainer.test_sharded_distill import ALGO, SCHEDULE, SYSTEM, close_lora, close_metrics

    path = resolve_model_path("builtin:tiny")
    records = sparse_rollouts(path, SCHEDULE, prompts=3, samples=2, new_tokens=24)
    engine = EngineConfig(max_batch_size=4, page_size=SCHEDULE.page_size, num_pages=64)
    pool = ActorPool.start(
        WorkerSpec(model_path=str(path), weights_path=str(path), schedule=None, engine=engine),
        2,
        {"num_cpus": 0.5},
    )
    group = TrainerGroup.start(
        TrainerSpec(str(path), ALGO, SYSTEM, seed=0), 2, placement=[{"num_cpus": 0.5}] * 2
    )
    full_state = lambda: ray.get(
        [a.__ray_call__.remote(lambda r: r.trainer.full_state_dict()) for a in group.actors]
    )[0]
    try:
        base = full_state()
        group.offload()  # as before a rollout: the ranks onload for the step themselves
        distiller = GroupDistiller.start(group, DistillSpec(seed=0))
        first = distiller.distill(records, SCHEDULE)
        distiller.save(tmp_path / "step1")
        distiller.release_base()
        modes = sync_group_to_pool(group, pool, str(path), 16 << 10, str(tmp_path / "step1"))
        engines = ray.get(
            [
                a.__ray_call__.remote(
                    lambda w: {k: v.clone() for k, v in w.engine.model.state_dict().items()}
                )
                for a in pool.actors
            ]
        )
        after_sync = full_state()
        # a distiller started from the folder on the ranks takes the second step
        resumed = GroupDistiller.start(group, DistillSpec(folder=str(tmp_path / "step1")))
        assert resumed.updates == 1
        second = resumed.distill(records, SCHEDULE)
        resumed.save(tmp_path / "step2")
    finally:
        group.shutdown()
        pool.shutdown()

    single = SparseDistiller(path, ALGO, "cpu", "float32", seed=0, trainer_config=SYSTEM)
    single.set_base(SafetensorsCheckpoint(path))
    close_metrics(first, single.distill(records, SCHEDULE))
    adapter = Adapter.read(tmp_path / "step1")
    close_lora(dict(adapter.state), adapter_state(single.model))
    close_metrics(second, single.distill(records, SCHEDULE))
    close_lora(dict(Adapter.read(tmp_path / "step2").state), adapter_state(single.model))

    # the engines hold merge(base, LoRA); the trainer's weights are the base still
    assert modes == ["gloo", "gloo"] and pool.spec.adapter_path == str(tmp_path / "step1")
    close(after_sync, base, atol=0.0)
    merged = _decoder_state(merged_for_engine(base, adapter, torch.float32), path)
    plain = _decoder_state(base, path)
    assert any(not torch.equal(merged[k], plain[k]) for k in merged)  # the LoRA moved them
    for state in engines:
        assert set(state) == set(merged)
        for name, tensor in merged.items():
            torch.testing.assert_close(state[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_the_update_is_sent_without_the_top_k_and_reads_none(qwen3_checkpoint):
    """What the ranks get for the update (without_topk) updates a trainer exactly as the full
    records do: the update reads no top-K."""
    from sparrow.runtime.trainer_group.group import without_topk

    runs = []
    for strip in (False, True):
        trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", seed=0, trainer_config=SYSTEM)
        records, _, update_records, old = batch(trainer)
        sent = without_topk(update_records) if strip else update_records
        if strip:
            assert all(r.topk_ids.shape == (len(r.output_ids), 0) for r in sent)
            assert [
                dataclasses.replace(r, topk_ids=u.topk_ids, topk_logprobs=u.topk_logprobs)
                for r, u in zip(sent, update_records)
            ] == update_records
        metrics = trainer.update(sent, list(REWARDS[0]), old, 2)
        runs.append((metrics, weights(trainer)))
    assert runs[0][0] == runs[1][0]
    close(runs[1][1], runs[0][1], atol=0.0)


def test_a_rank_gives_its_cached_blocks_back_after_the_update_and_before_the_rollout(monkeypatch):
    """A rank is its own process: after its update (the weight sync and the engine come next
    on its GPU) and when its gradients are dropped before a rollout, it empties its own CUDA
    cache; the driver's empty_cache does not reach it."""
    from sparrow.runtime.trainer_group.rank import TrainerRank

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    class Trainer:
        def onload(self):
            calls.append("onload")

        def update(self, *args):
            calls.append("update")
            return {"actor/loss": 0.0}

        def free_gradients(self):
            calls.append("free_gradients")

    rank = TrainerRank(0, 1)
    rank.trainer = Trainer()
    assert rank.update([], [], [], 2) == {"actor/loss": 0.0}
    assert calls == ["onload", "update", "empty_cache"]
    calls.clear()
    rank.free_gradients()
    assert calls == ["free_gradients", "empty_cache"]


def test_a_rank_that_fails_stops_the_group_at_once_and_its_error_comes_back(
    ray_up, qwen3_checkpoint
):
    """Rank 1 runs out of memory in its scoring forward while rank 0, done with its own,
    waits for it in the scores' all-gather: the driver does not wait with it (the gloo
    timeout), the group is stopped, rank 1's TrainerMemoryError comes back as itself, and the
    group refuses later calls."""
    from concurrent.futures import ThreadPoolExecutor

    import ray

    from sparrow.runtime.trainer_group.group import TrainerGroupError
    from sparrow.trainer.memory import TrainerMemoryError

    records = make_records(prompts=2, group=2, seed=3)
    group = TrainerGroup.start(
        TrainerSpec(str(qwen3_checkpoint), GROUP_ALGO, GROUP_SYSTEM, seed=0), 2
    )
    try:

        def out_of_memory(*args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.32 GiB")

        ray.get(
            group.actors[1].__ray_call__.remote(
                lambda rank: setattr(rank.trainer, "_token_logprobs", out_of_memory)
            )
        )
        with ThreadPoolExecutor(1) as pool:
            scoring = pool.submit(group.score, records)
            with pytest.raises(
                TrainerMemoryError,
                match="^dense scoring ran out of GPU memory.*trainer.micro_batch_tokens",
            ):
                scoring.result(timeout=120)
        assert group.failed.startswith(
            "the trainer group was stopped after score failed on "
            "rank 1: dense scoring ran out of GPU memory"
        )
        assert group.actors == []
        with pytest.raises(TrainerGroupError, match="stopped after score failed on rank 1"):
            group.free_gradients()
    finally:
        group.shutdown()
