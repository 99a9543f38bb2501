"""Rollout actors on a local Ray: results independent of the number of actors and of the work
items (continuous load), a dead actor replaced and its item retried, weights loaded by path
(also by replacements).

Marked slow: Ray and each actor process start in a few seconds on a 2-core machine.
Run: `python -m pytest tests/runtime/rollout/test_actors.py -q`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sparrow.engine import EngineConfig, SamplingParams
from sparrow.runtime.rollout.actors import ActorPool
from sparrow.runtime.rollout.dispatch import work_items
from sparrow.runtime.rollout.worker import RolloutWorker, WorkerSpec, engine_process_env
from sparrow.sparse import Schedule

pytestmark = pytest.mark.slow

PROMPTS = [[72, 101, 108, 108, 111], [1, 2, 3], [50, 60, 70, 80, 90, 100, 110]]
# a schedule with pages of 4 tokens so a 24-token sample really drops pages
SCHEDULE = Schedule(
    "test-tight",
    topk_pages=(1,),
    page_size=4,
    bin_tokens=64,
    reserved_bos=1,
    reserved_eos=1,
    skip_layers=(),
)


def params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=1.0, max_new_tokens=16, n=2, seed=100 + i, logprobs_topk=5)
        for i in range(len(PROMPTS))
    ]


@pytest.fixture(scope="module")
def ray_up(flow_environment):
    """The session's local Ray (tests/conftest.py), stopped after its last user: later tests
    count their own child processes."""
    flow_environment.start_ray()


@pytest.fixture
def spec(qwen3_checkpoint):
    return WorkerSpec(
        model_path=str(qwen3_checkpoint),
        weights_path=str(qwen3_checkpoint),
        schedule=SCHEDULE,
        engine=EngineConfig(max_batch_size=8, page_size=4, num_pages=128),
        threads=1,
    )


def in_process(spec: WorkerSpec) -> list[list]:
    threads = torch.get_num_threads()
    try:
        return RolloutWorker(spec).generate(PROMPTS, params())
    finally:
        torch.set_num_threads(threads)


def tokens(results) -> list[list[tuple[int, ...]]]:
    return [[sample.output_ids for sample in samples] for samples in results]


def test_results_do_not_depend_on_the_number_of_actors(ray_up, spec):
    expected = in_process(spec)
    assert len(expected) == 3 and all(len(s) == 2 for s in expected)
    # sparse decode: at most 1 + 1 reserved + 1 top-k pages read, of up to 6 held
    assert max(max(s.pages_read) for samples in expected for s in samples) == 3
    assert (
        max(len(p) + len(s.output_ids) for p, samples in zip(PROMPTS, expected) for s in samples)
        > 4 * 4
    )
    # one actor, one item; two actors, one item each; two actors taking one-prompt items as
    # each gets free
    for count, item_prompts in ((1, 0), (2, 0), (2, 1)):
        pool = ActorPool.start(spec, count, {"num_cpus": 1}, work_item_prompts=item_prompts)
        try:
            got = pool.generate(PROMPTS, params())
            stats = pool.rollout_stats()
            times = pool.last_dispatch
        finally:
            pool.shutdown()
        assert tokens(got) == tokens(expected)
        if item_prompts == 0:
            assert times.items == [1] * count and times.prompts == ([3] if count == 1 else [1, 2])
        assert sum(times.items) == len(work_items(3, count, item_prompts))
        assert sum(times.prompts) == 3 and 0 < max(times.busy_s) <= times.wall_s
        # each actor's engine ran the items it was handed, every sample to its last token
        assert [s["calls"] for s in stats] == times.items
        assert [s["samples"] for s in stats] == [2 * p for p in times.prompts]
        assert sum(s["tokens"] for s in stats) == sum(len(t) for ts in tokens(got) for t in ts)
        assert all(s["decode_steps"] > 0 and s["seconds"] > 0 for s in stats)
        for got_samples, want_samples in zip(got, expected):
            for a, b in zip(got_samples, want_samples):
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
                assert a.pages_read == b.pages_read


def test_dead_actor_is_replaced_and_its_item_retried(ray_up, spec):
    import ray

    pool = ActorPool.start(spec, 1, {"num_cpus": 1})
    try:
        first = pool.generate(PROMPTS, params())
        old_pid = pool.info()[0]["pid"]
        ray.kill(pool.actors[0], no_restart=True)
        again = pool.generate(PROMPTS, params())
        assert pool.replaced == 1 and pool.info()[0]["pid"] != old_pid
        assert tokens(again) == tokens(first)
    finally:
        pool.shutdown()


def test_a_dead_actor_of_a_pulling_pool_is_replaced_and_runs_its_queue(ray_up, spec):
    import ray

    pool = ActorPool.start(spec, 2, {"num_cpus": 1})
    try:
        assert pool.pulls
        first = pool.generate(PROMPTS, params())
        ray.kill(pool.actors[1], no_restart=True)
        again = pool.generate(PROMPTS, params())
        assert pool.replaced == 1 and tokens(again) == tokens(first)
        assert sum(pool.last_dispatch.prompts) == len(PROMPTS)
    finally:
        pool.shutdown()


def test_weights_load_by_path_and_replacements_start_current(
    ray_up, spec, qwen3_sharded_checkpoint
):
    import dataclasses

    import ray

    other = dataclasses.replace(spec, weights_path=str(qwen3_sharded_checkpoint))
    expected = in_process(other)
    assert tokens(expected) != tokens(in_process(spec))  # the two checkpoints really differ
    pool = ActorPool.start(spec, 1, {"num_cpus": 1})
    try:
        [info] = pool.load_weights(str(qwen3_sharded_checkpoint))
        assert info == str(qwen3_sharded_checkpoint)
        assert tokens(pool.generate(PROMPTS, params())) == tokens(expected)
        ray.kill(pool.actors[0], no_restart=True)
        assert tokens(pool.generate(PROMPTS, params())) == tokens(expected)
        assert pool.info()[0]["weights_path"] == str(qwen3_sharded_checkpoint)
    finally:
        pool.shutdown()


def test_a_refused_request_is_the_engines_own_error(ray_up, spec):
    from sparrow.engine import EngineError

    pool = ActorPool.start(spec, 1, {"num_cpus": 1})
    try:
        too_long = [SamplingParams(max_new_tokens=10_000, seed=1)]
        with pytest.raises(EngineError, match=r"^prompt 0: 3 prompt tokens \+ max_new_tokens"):
            pool.generate([[1, 2, 3]], too_long)
        assert pool.replaced == 0 and len(pool.generate([[1, 2, 3]], params()[:1])) == 1
    finally:
        pool.shutdown()


def test_work_items_are_contiguous_and_cover_every_prompt():
    assert work_items(5, 2, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert work_items(5, 1) == [range(0, 5)]  # one engine batches everything
    # by default one item per engine, as even as whole prompts allow
    assert work_items(17, 2) == [range(0, 8), range(8, 17)]
    assert work_items(16, 2) == [range(0, 8), range(8, 16)]
    assert work_items(10, 4) == [range(0, 2), range(2, 5), range(5, 7), range(7, 10)]
    assert work_items(3, 4) == [range(0, 1), range(1, 2), range(2, 3)]
    assert work_items(0, 2) == []
    for count in range(7):
        for actors in range(1, 4):
            for size in (0, 1, 2):
                flat = [i for item in work_items(count, actors, size) for i in item]
                assert flat == list(range(count))


@pytest.mark.parametrize("omp, threads", [(None, 2), ("", 2), ("1", 1), ("4", 2), ("x", 2)])
def test_a_cpu_engine_runs_its_cpus_threads_capped_by_omp_num_threads(monkeypatch, omp, threads):
    from sparrow.runtime.rollout.worker import cpu_threads

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert cpu_threads(2) == threads


def test_the_source_gives_each_actor_its_queue_then_what_waits_behind_a_full_one():
    from sparrow.runtime.rollout.dispatch import PromptSource

    source = PromptSource([(i, [i], None) for i in range(5)], 2)  # queues [0, 1] and [2, 3, 4]
    assert source.take(0)[0] == 0 and source.take(1)[0] == 2
    assert source.take(0)[0] == 1
    assert source.take(0) == ()  # its queue is empty; actor 1 is not full: ask again later
    source.full(1)
    assert source.take(0)[0] == 4  # from the tail of the full actor's queue
    assert source.take(1)[0] == 3  # taking again: no longer full
    assert source.take(0) is None and source.take(1) is None  # every queue empty
    # actor 1 died: what it took (2, 3) goes back to the front of its queue
    assert source.put_back(1) == 2 and [r[0] for r in source.queues[1]] == [2, 3]
    assert source.take(1)[0] == 2
    # more actors than prompts: one without a queue waits until the prompt is taken
    few = PromptSource([(0, [0], None)], 3)
    assert few.take(2) == () and few.take(0)[0] == 0 and few.take(2) is None
    # a new rollout: a call of the earlier one (cancelled, still running) takes nothing
    earlier = few.rollout
    assert few.load([(0, [0], None), (1, [1], None)], 1) == earlier + 1
    few.full(0, earlier)
    assert few.take(0, earlier) is None and not few.is_full[0]
    assert few.take(0, earlier + 1)[0] == 0


def test_an_engine_that_frees_up_takes_the_prompts_waiting_behind_a_full_one(ray_up, spec):
    """Two actors whose batch holds one prompt's samples; actor 0's own prompts stop after one
    token, actor 1's run long: actor 0 takes actor 1's second prompt while actor 1 is still on
    its first. Every prompt's samples are what one in-process engine gives."""
    import dataclasses

    batch = PROMPTS + [[5, 6, 7, 8]]
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=new, n=2, seed=7 + i)
        for i, new in enumerate((1, 1, 120, 120))
    ]
    one = dataclasses.replace(
        spec, engine=dataclasses.replace(spec.engine, max_batch_size=2, num_pages=160)
    )
    threads = torch.get_num_threads()
    try:
        expected = RolloutWorker(one).generate(batch, params)
    finally:
        torch.set_num_threads(threads)
    pool = ActorPool.start(one, 2, {"num_cpus": 1})
    try:
        got = pool.generate(batch, params)
        times = pool.last_dispatch
    finally:
        pool.shutdown()
    assert tokens(got) == tokens(expected)
    assert times.prompts == [3, 1] and times.items == [1, 1]


def test_a_native_gpu_engine_keeping_its_graphs_gets_expandable_segments(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    gpu = WorkerSpec("m", "m", None, EngineConfig(), device="cuda")
    assert engine_process_env(gpu) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert engine_process_env(replace(gpu, device="cpu")) == {}
    assert engine_process_env(replace(gpu, backend="vllm")) == {}  # vLLM's own allocator
    assert engine_process_env(replace(gpu, engine=EngineConfig(keep_graphs=False))) == {}
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert engine_process_env(gpu) == {}  # the user's setting reaches the actor as it is


def test_the_worker_counts_the_wakes_that_kept_the_graphs():
    from types import SimpleNamespace

    class Engine:  # wakes keep the graphs on the second try (the cache came back in place)
        graphs = SimpleNamespace(capture_seconds=0.0, kept_wakes=0)
        cache = SimpleNamespace(num_pages=7)
        tries = 0

        def wake(self):
            self.tries += 1
            self.graphs.kept_wakes += self.tries > 1

    worker = RolloutWorker.__new__(RolloutWorker)
    worker.engine, worker.counts = Engine(), {}
    assert worker.wake() == 7 and worker.counts["graphs_kept"] == 0
    worker.wake()
    stats = worker.rollout_stats()
    assert stats["graphs_kept"] == 1 and stats["wake_s"] >= 0 and worker.counts == {}


def test_a_process_joined_to_one_cluster_refuses_an_address_naming_another(
    ray_up, flow_environment
):
    from sparrow.runtime.rollout.actors import RayStartError, start_ray

    assert start_ray(flow_environment.ray_address) is False  # the same cluster: joined already
    assert start_ray("auto") is False and start_ray("") is False
    with pytest.raises(RayStartError, match="ray.address=127.0.0.1:1 names another cluster"):
        start_ray("127.0.0.1:1")
