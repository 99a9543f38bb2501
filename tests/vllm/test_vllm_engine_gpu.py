"""The vLLM rollout actor against the native engine, dense, greedy, on one GPU (bf16): the
same token ids, logprobs within LOGPROB_ATOL, the same top-1, pages read and finish reasons;
after sleep, a weight load of other weights and wake, the outputs are those of the new
weights (the native engine built from them), and no longer the old ones.

Both actors (sparrow/runtime/rollout/actors.py RolloutWorker, in this process) load a random Qwen3
checkpoint of head_dim 64 (sparrow/model/random_checkpoint.py). Greedy ids may part at a
near tie (different bf16 kernels): a sample is compared token by token up to its first
difference, which must fall where the native engine's top two logprobs are within
TIE_MARGIN; after it the two continuations are different texts and are not compared.
Needs vllm (docs/backends.md, 'Installing vLLM on the GPU machine') and CUDA; skipped
without vllm, deselected without CUDA.
Run on the device: `python -m pytest -m gpu tests/vllm/test_vllm_engine_gpu.py -q`
"""

from __future__ import annotations

import pytest

from sparrow.engine import EngineConfig, SamplingParams
from sparrow.runtime.rollout.worker import RolloutWorker, WorkerSpec
from sparrow.sparse import Schedule
from sparrow.vllm import VllmBackendError

pytestmark = pytest.mark.gpu

# bf16 weights and activations, two attention kernels: a logit of magnitude ~10 rounds by
# ~0.04 in bf16, and the two engines' logprobs differ by up to twice that (0.06 seen on an H100)
LOGPROB_ATOL = 0.1
TIE_MARGIN = 0.1  # top-1 minus top-2 logprob below which greedy may pick either
SHAPE = dict(
    hidden_size=256, num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512
)
PROMPTS = [[72, 101, 108, 108, 111], list(range(30, 70)), [7] * 17, list(range(200, 100, -3))]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24, logprobs_topk=5)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("vllm")
    from sparrow.model.random_checkpoint import make_random_checkpoint

    root = tmp_path_factory.mktemp("vllm-checkpoints")
    return [
        make_random_checkpoint(root / f"seed{seed}", "qwen3", seed=seed, **SHAPE) for seed in (0, 1)
    ]


@pytest.fixture(scope="module")
def vllm_actor(checkpoints):
    """One vLLM actor for the module (one vLLM engine per process), on the first weights."""
    return worker(checkpoints[0], "vllm")


def worker(path, backend: str) -> RolloutWorker:
    config = EngineConfig(max_batch_size=8, kv_cache_mib=64, page_size=16, seed=0)
    return RolloutWorker(
        WorkerSpec(
            str(path), str(path), None, config, device="cuda", dtype="bfloat16", backend=backend
        )
    )


def assert_same_greedy(native, other) -> int:
    """Compare [prompt][sample] results; returns how many tokens were compared."""
    compared = 0
    for native_row, other_row in zip(native, other, strict=True):
        for want, got in zip(native_row, other_row, strict=True):
            for j, (a, b) in enumerate(zip(want.output_ids, got.output_ids)):
                if a != b:
                    margin = want.topk_logprobs[j][0] - want.topk_logprobs[j][1]
                    assert margin < TIE_MARGIN, (
                        f"prompt {want.prompt_index}: token {j} is {b}, the native engine's "
                        f"{a} leads by {margin:.3f} (more than a near tie)"
                    )
                    break
                assert got.logprobs[j] == pytest.approx(want.logprobs[j], abs=LOGPROB_ATOL)
                assert got.topk_ids[j][0] == want.topk_ids[j][0]
                assert got.pages_read[j] == want.pages_read[j]
                compared += 1
            else:
                assert len(got.output_ids) == len(want.output_ids)
                assert got.finish_reason == want.finish_reason
    return compared


def test_vllm_actor_seeded_samples_repeat_and_differ_by_sample(vllm_actor):
    params = [SamplingParams(temperature=1.0, max_new_tokens=16, n=2, seed=5, logprobs_topk=20)]
    one = vllm_actor.generate(PROMPTS[:1], params)[0]
    two = vllm_actor.generate(PROMPTS[:1], params)[0]
    assert [s.output_ids for s in one] == [s.output_ids for s in two]
    assert one[0].output_ids != one[1].output_ids
    assert all(len(row) == 20 for s in one for row in s.topk_ids)
    vllm_actor.set_schedule(None)
    with pytest.raises(VllmBackendError, match="started with dense attention"):
        vllm_actor.set_schedule(Schedule("sparse", topk_pages=(2,), page_size=16, skip_layers=()))


def test_vllm_actor_matches_native_dense_and_follows_a_weight_sync(checkpoints, vllm_actor):
    first, second = checkpoints  # the actor holds `first` (this test runs last: it loads `second`)
    native = worker(first, "native").generate(PROMPTS, [GREEDY] * len(PROMPTS))
    before = vllm_actor.generate(PROMPTS, [GREEDY] * len(PROMPTS))
    assert assert_same_greedy(native, before) >= len(PROMPTS) * 12  # most tokens compared

    vllm_actor.sleep()
    vllm_actor.load_weights(str(second))  # asleep: vLLM's weights come back for the copy
    assert vllm_actor.wake() > 0
    native_second = worker(second, "native").generate(PROMPTS, [GREEDY] * len(PROMPTS))
    after = vllm_actor.generate(PROMPTS, [GREEDY] * len(PROMPTS))
    assert assert_same_greedy(native_second, after) >= len(PROMPTS) * 12
    assert [s.output_ids for row in after for s in row] != [
        s.output_ids for row in before for s in row
    ]
