"""VllmEngine's own logic on CPU, around a stand-in for vLLM's LLM (no vllm, no GPU): one
request per sample with the native engine's per-sample seed, results back per prompt,
sleep / wake / weight loads in the order vLLM's sleep mode needs, sparse schedules refused by
a dense-started engine and handed to the worker by one started sparse,
and the rollout actor's errors on a machine that cannot run the backend. The real backend
is held against the native engine by test_vllm_engine_gpu.py.
Run: `python -m pytest tests/vllm/test_vllm_engine.py -q`.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

import sparrow.vllm as backend
from sparrow.engine import EngineConfig, SamplingParams
from sparrow.engine.validate import sample_seed
from sparrow.model.builtin import resolve_model_path
from sparrow.runtime.rollout.worker import RolloutWorker, WorkerSpec
from sparrow.sparse import Schedule
from sparrow.sparse.presets import get_preset
from sparrow.vllm import VllmBackendError
from sparrow.vllm import engine as engine_module

TINY = str(resolve_model_path("builtin:tiny"))  # 4 layers, eos 1


class FakeLLM:
    """Records the calls; generate answers each request with tokens drawn from its seed."""

    def __init__(self):
        self.calls: list[tuple] = []
        cache = SimpleNamespace(num_gpu_blocks=100, block_size=16)
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache))

    def generate(self, requests, params, use_tqdm=False):
        self.calls.append(("generate", len(requests)))
        outputs = []
        for request, p in zip(requests, params):
            ids = [(p.seed + j) % 40 + 2 for j in range(p.max_tokens)]
            positions = [{t: SimpleNamespace(logprob=-0.5, rank=1)} for t in ids]
            completion = SimpleNamespace(token_ids=ids, logprobs=positions, finish_reason="length")
            outputs.append(
                SimpleNamespace(
                    prompt_token_ids=request["prompt_token_ids"], outputs=[completion], params=p
                )
            )
        self.last = outputs
        return outputs

    def collective_rpc(self, *args, **kwargs):
        self.calls.append(("collective_rpc", args, kwargs))
        return [4] if args[0] == "sparrow_set_schedule" else [None]  # tiny: 4 layers

    def __getattr__(self, name):  # sleep, wake_up, reset_prefix_cache
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(backend, "vllm_available", lambda: True)
    started = []
    monkeypatch.setattr(
        engine_module, "_start_llm", lambda *args: started.append(args) or FakeLLM()
    )
    return started


class Tokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return ",".join(map(str, ids))


def make_engine(**config):
    return engine_module.VllmEngine(TINY, EngineConfig(page_size=8, **config), Tokenizer())


def test_generate_sends_one_request_per_sample_with_its_seed(fake_vllm):
    engine = make_engine(max_batch_size=8)
    prompts = [[5, 6, 7], [9, 10]]
    params = [
        SamplingParams(
            temperature=1.0, max_new_tokens=4, n=2, seed=11, logprobs_topk=1, stop_token_ids=(7,)
        ),
        SamplingParams(temperature=0.0, max_new_tokens=3, n=1, seed=None, logprobs_topk=1),
    ]
    results = engine.generate(prompts, params)
    sent = [output.params for output in engine.llm.last]
    assert [p.seed for p in sent] == [
        sample_seed(params[0], 0, ()),
        sample_seed(params[0], 1, ()),
        sample_seed(params[1], 0, (0, 1, 1)),
    ]
    assert sent[0].stop_token_ids == [1, 7] and sent[2].stop_token_ids == [1]  # + the eos
    assert [[(s.prompt_index, s.sample_index) for s in row] for row in results] == [
        [(0, 0), (0, 1)],
        [(1, 0)],
    ]
    first = results[0][1]
    assert first.output_ids == tuple((sent[1].seed + j) % 40 + 2 for j in range(4))
    assert first.pages_read == (1, 1, 1, 1)  # 3..6 tokens in pages of 8
    assert first.text == ",".join(map(str, first.output_ids))
    assert results[1][0].topk_ids.tolist() == [[t] for t in results[1][0].output_ids]


def test_generate_checks_requests_like_the_native_engine(fake_vllm):
    with pytest.raises(Exception, match="exceed the context of 1024 tokens"):
        make_engine().generate([[3] * 1000], SamplingParams(max_new_tokens=100))


def test_sleep_update_and_wake_follow_vllm_sleep_mode(fake_vllm):
    engine = make_engine()
    llm = engine.llm
    assert engine.cache == engine_module.KVCapacity(100, 16)
    engine.sleep()
    assert llm.calls[-1] == ("sleep", (), {"level": 1}) and engine.cache is None
    engine.update_weights({"w": 1}, strict=False)  # asleep: the weights come back first
    assert [c[0] for c in llm.calls[-3:]] == ["wake_up", "collective_rpc", "reset_prefix_cache"]
    assert llm.calls[-3][2] == {"tags": ["weights"]}
    assert llm.calls[-2][1] == ("sparrow_load_weights",) and llm.calls[-2][2] == {
        "args": ({"w": 1}, False)
    }
    engine.wake()
    assert llm.calls[-2] == ("wake_up", (), {"tags": ["kv_cache"]})
    assert engine.cache is not None
    count = len(llm.calls)
    engine.wake()  # awake: nothing to do
    assert len(llm.calls) == count
    engine.sleep()
    engine.sleep()  # asleep: nothing to do
    assert [c[0] for c in llm.calls[count:]] == ["sleep"]


def test_dense_started_engine_refuses_a_sparse_schedule(fake_vllm):
    engine = make_engine()
    assert fake_vllm[-1][-1] is False  # FLASH_ATTN
    engine.set_schedule(None)
    with pytest.raises(VllmBackendError, match="started with dense attention"):
        engine.set_schedule(get_preset("tiny-0.86"))
    every_layer_dense = Schedule(
        "dense-all", topk_pages=(1,), page_size=8, bin_tokens=64, skip_layers=(0, 1, 2, 3)
    )
    engine.set_schedule(every_layer_dense)
    assert engine.schedule is None
    assert not [c for c in engine.llm.calls if c[0] == "collective_rpc"]
    with pytest.raises(VllmBackendError, match="needs page_size 16"):
        engine_module.VllmEngine(
            TINY,
            EngineConfig(page_size=8),
            None,
            Schedule("s8", topk_pages=(2,), page_size=8, skip_layers=()),
        )


def test_sparse_started_engine_hands_schedules_to_the_worker(fake_vllm):
    sparse = Schedule("s16", topk_pages=(2, 3), page_size=16, skip_layers=(0,))
    engine = engine_module.VllmEngine(TINY, EngineConfig(page_size=16), Tokenizer(), sparse)
    assert fake_vllm[-1][-1] is True  # the sparse backend
    assert engine.schedule == sparse
    engine.set_schedule(None)
    assert engine.schedule is None
    rpc = [(c[1][0], *c[2]["args"]) for c in engine.llm.calls if c[0] == "collective_rpc"]
    assert rpc == [("sparrow_set_schedule", sparse), ("sparrow_set_schedule", None)]
    engine.set_schedule(sparse)
    # pages read follow the schedule: a 40-token prompt, then top-k 2 + 3 reserved of 3+ pages
    result = engine.generate(
        [list(range(2, 42))], SamplingParams(temperature=0.0, max_new_tokens=12)
    )[0][0]
    assert result.pages_read[:3] == (3, 3, 3) and result.pages_read[-1] == 4


def test_kv_bytes_leave_room_for_the_centroids():
    kv = engine_module.kv_bytes_beside_centroids(33 * 2**20, 16)
    assert kv == 32 * 2**20  # K and V: 32 rows per block and layer, the centroid one more


def test_memory_shares_leave_what_others_hold(monkeypatch):
    """rollout.gpu_memory_utilization means the device's used memory, as for the native
    engine: vLLM's own share is the target less what is in use at the start; with kv_cache_mib
    vLLM's start-up check asks for half of what is free."""
    import torch

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (60 * gib, 80 * gib))  # 20 in use
    assert engine_module._instance_share(0.88) == pytest.approx(0.88 - 0.25)
    assert engine_module._free_fraction(default=0.92) == pytest.approx(0.5 * 60 / 80)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (10 * gib, 80 * gib))  # 70 in use
    with pytest.raises(VllmBackendError, match=r"70\.0 of 80\.0 GiB.*offload_during_rollout"):
        engine_module._instance_share(0.88)
    assert engine_module._free_fraction(default=0.92) == pytest.approx(0.5 * 10 / 80)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_module._instance_share(0.88) == 0.88


def test_rollout_actor_on_cpu_or_without_vllm_says_why(monkeypatch):
    spec = WorkerSpec(TINY, TINY, None, EngineConfig(page_size=8), backend="vllm")
    monkeypatch.setattr(backend, "vllm_available", lambda: False)
    with pytest.raises(VllmBackendError, match="package 'vllm'.*docs/backends.md"):
        RolloutWorker(spec)
    monkeypatch.setattr(backend, "vllm_available", lambda: True)
    with pytest.raises(VllmBackendError, match="needs a CUDA GPU"):
        RolloutWorker(spec)


def test_wake_says_when_a_colocated_trainer_kept_the_memory(fake_vllm, monkeypatch):
    """vLLM takes back at wake what it gave at sleep (less the weights a load brought back);
    with less free on the device, one error names the numbers and the fix instead of an
    out-of-memory inside vLLM."""
    import torch

    gib = 2**30
    free = [10 * gib]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (free[0], 80 * gib))
    engine = make_engine()
    llm = engine.llm

    def sleeping(*args, **kwargs):  # vLLM frees 60 GiB: cache 56.6, weights 3.4
        llm.calls.append(("sleep", args, kwargs))
        free[0] += 60 * gib

    llm.sleep = sleeping

    def waking(tags):
        llm.calls.append(("wake_up", (), {"tags": tags}))
        free[0] -= int(3.4 * gib) if tags == ["weights"] else 0

    llm.wake_up = waking

    engine.sleep()
    engine.update_weights({"w": 1}, strict=False)  # the weights back: 56.6 GiB still out
    free[0] -= 30 * gib  # the trainer's moments and gradients, kept on the GPU
    with pytest.raises(
        VllmBackendError,
        match=r"kv_cache need 56.6 GiB .* but 36.6 GiB are "
        r"free.*offload_during_rollout=true",
    ):
        engine.wake()
    assert llm.calls[-1][0] != "wake_up"  # vLLM was not asked
    free[0] += 30 * gib  # offloaded: the wake goes ahead
    engine.wake()
    assert llm.calls[-2] == ("wake_up", (), {"tags": ["kv_cache"]})
