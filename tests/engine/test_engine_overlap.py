"""Overlapped decode equals the synchronous loop exactly: token ids, logprobs, top-K lists,
budgets and finish reasons, across stops at different steps, mixed lengths, n > 1, waiting
prompts, sparse decode and fixed lengths; every step writes only pages its sample owns."""

import pytest
import torch

from sparrow.engine.config import EngineConfig
from sparrow.engine.cuda_graphs import DecodeGraphs
from sparrow.engine.engine import Engine
from sparrow.engine.sampler import SamplingParams
from sparrow.engine.sequence import Status
from sparrow.sparse.schedule import Schedule

pytestmark = pytest.mark.usefixtures("single_thread")

SCHEDULE = Schedule(
    "tight", (1, 2), page_size=4, bin_tokens=16, reserved_bos=1, reserved_eos=1, skip_layers=(0,)
)
# about one token in sixteen stops a sample: stops land at many different steps
STOPS = tuple(range(3, 384, 16))


def prompts(count, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (int(n),), generator=gen).tolist()
        for n in torch.randint(1, 14, (count,), generator=gen)
    ]


def both(model, batch, params, schedule=None, kernel_path=False, **config):
    """(synchronous results, overlapped results, overlapped engine). kernel_path: decode
    through DecodeGraphs (on CPU: its kernels' fallbacks, no graphs) as on a GPU."""
    config = {"page_size": 4, "num_pages": 96, "max_batch_size": 8, **config}
    sync = Engine(model, config=EngineConfig(overlap=False, **config), schedule=schedule)
    overlapped = Engine(model, config=EngineConfig(overlap=True, **config), schedule=schedule)
    if kernel_path and next(model.parameters()).device.type == "cpu":
        for engine in (sync, overlapped):
            engine.runner.graphs = DecodeGraphs(model, engine.cache, use_graphs=False)
    want = sync.generate(batch, params)
    assert sync.stats["overlapped_steps"] == 0
    got = overlapped.generate(batch, params)
    for engine in (sync, overlapped):
        assert engine.block_manager.num_free == config["num_pages"]
    return want, got, overlapped


def assert_same(want, got):
    assert [[s.to_dict() for s in group] for group in got] == [
        [s.to_dict() for s in group] for group in want
    ]


def lengths(results):
    return [len(s.output_ids) for group in results for s in group]


def test_stops_at_different_steps(qwen3_model):
    params = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=STOPS, seed=5)
    want, got, engine = both(qwen3_model, prompts(6), params)
    assert_same(want, got)
    reasons = [s.finish_reason for group in want for s in group]
    assert reasons.count("stop") >= 3 and len(set(lengths(want))) >= 4
    assert engine.stats["overlapped_steps"] > 20
    # a sample that stopped had the next step computed anyway; that token was dropped
    assert engine.stats["discarded_steps"] >= 1


def test_different_max_new_tokens_and_greedy_rows(qwen3_model):
    batch = prompts(5, seed=1)
    params = [
        SamplingParams(
            temperature=0 if i == 2 else 0.9,
            top_k=0 if i % 2 else 20,
            max_new_tokens=5 + 7 * i,
            seed=i,
        )
        for i in range(5)
    ]
    want, got, engine = both(qwen3_model, batch, params, ignore_eos=True)
    assert_same(want, got)
    assert lengths(want) == [5 + 7 * i for i in range(5)]
    assert engine.stats["overlapped_steps"] > 15


def test_n_samples_and_more_prompts_than_slots(qwen3_model):
    # 3 slots, 2 samples per prompt: groups wait and enter as others finish
    params = SamplingParams(
        temperature=1.0, top_p=0.9, max_new_tokens=24, n=2, stop_token_ids=STOPS, logprobs_topk=5
    )
    want, got, engine = both(qwen3_model, prompts(6, seed=2), params, max_batch_size=3)
    assert_same(want, got)
    assert engine.stats["prefill_steps"] == 6 and engine.stats["overlapped_steps"] > 10
    assert len({s.output_ids for group in want for s in group}) == 12


def test_sparse_schedule_with_engine_seeds(qwen3_model):
    params = SamplingParams(temperature=1.0, max_new_tokens=36, stop_token_ids=STOPS[:8])
    want, got, engine = both(qwen3_model, prompts(4, seed=3), params, schedule=SCHEDULE, seed=17)
    assert_same(want, got)
    assert max(b for group in want for s in group for b in s.pages_read) < 12
    assert engine.stats["overlapped_steps"] > 20


def test_fixed_lengths_ignoring_eos(qwen3_model):
    params = SamplingParams(temperature=1.0, max_new_tokens=30, seed=9)
    want, got, engine = both(qwen3_model, prompts(4, seed=4), params, ignore_eos=True)
    assert_same(want, got)
    assert lengths(got) == [30] * 4
    # 29 decode steps (the first token comes from the prefill): all but the first launched
    # ahead, none dropped
    assert engine.stats["decode_steps"] == 29 and engine.stats["overlapped_steps"] == 28
    assert engine.stats["discarded_steps"] == 0


def test_every_step_writes_only_pages_its_sample_owns(qwen3_model):
    engine = Engine(qwen3_model, config=EngineConfig(page_size=4, num_pages=64, max_batch_size=4))
    decode = engine.runner.decode
    checked = []

    def spy(seqs, schedule, on_selection=None, pending_ids=None):
        for seq in seqs:
            assert seq.status is Status.RUNNING
            position = seq.num_tokens - 1 + (pending_ids is not None)
            page = seq.page_table[position // 4]
            assert engine.block_manager.refcount(page) == 1  # its own page, not shared
            checked.append(pending_ids is not None)
        return decode(seqs, schedule, on_selection, pending_ids)

    engine.runner.decode = spy
    params = SamplingParams(temperature=1.0, max_new_tokens=30, stop_token_ids=STOPS, n=2, seed=1)
    engine.generate(prompts(5, seed=6), params)
    assert any(checked) and not all(checked)
    assert engine.stats["discarded_steps"] >= 1
    assert engine.block_manager.num_free == 64


def test_recording_selection_keeps_steps_synchronous(qwen3_model):
    config = EngineConfig(page_size=4, num_pages=32, record_selection=True)
    engine = Engine(qwen3_model, config=config, schedule=SCHEDULE)
    engine.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0, max_new_tokens=12))
    assert engine.stats["overlapped_steps"] == 0 and engine.stats["decode_steps"] == 11
    positions = sorted({r.position for r in engine.selection_log})
    assert positions == list(range(5, 16))


def test_decode_graphs_path_takes_the_ids_from_the_device_tensor(qwen3_model):
    params = SamplingParams(temperature=1.0, max_new_tokens=20, n=2, stop_token_ids=STOPS, seed=3)
    want, got, engine = both(
        qwen3_model,
        prompts(5, seed=7),
        params,
        schedule=SCHEDULE,
        kernel_path=True,
        max_batch_size=4,
    )
    assert_same(want, got)
    assert engine.stats["overlapped_steps"] > 10


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("schedule", [None, SCHEDULE], ids=["dense", "sparse"])
def test_cuda_graphs_overlapped_equals_synchronous(qwen3_checkpoint, schedule):
    from sparrow.model import load_model

    model = load_model(qwen3_checkpoint, dtype=torch.bfloat16, device="cuda")
    params = SamplingParams(
        temperature=1.0, max_new_tokens=120, n=2, stop_token_ids=STOPS[:4], seed=11
    )
    want, got, engine = both(
        model, prompts(9, seed=8), params, schedule=schedule, num_pages=512, max_batch_size=8
    )
    assert engine.runner.graphs is not None and engine.runner.graphs.graphs
    assert_same(want, got)
    assert engine.stats["overlapped_steps"] > 100 and engine.stats["discarded_steps"] >= 1
