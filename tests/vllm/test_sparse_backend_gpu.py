"""The sparse vLLM backend against the native engine's sparse decode, greedy, on one GPU (bf16).

A random Qwen3 checkpoint (sparrow/model/random_checkpoint.py, head_dim 64, 3 layers) is
decoded greedily by VllmEngine started with a sparse schedule (the plugin's CUSTOM backend:
FLASH_ATTN prefill, the project's kernels for decode) and by the native engine with the same
schedule: the same ids up to a near tie (as test_vllm_engine_gpu.py), the same pages read,
logprobs close; and every prompt runs long enough for decode steps that read fewer pages
than the cache holds (the sparse path really runs). set_schedule(None) then decodes densely
and matches the native dense engine. vLLM loads its plugins once per process, so this file
runs in a process of its own (a separate pytest call, below). Needs vllm (docs/backends.md,
'Installing vLLM on the GPU machine') and CUDA; skipped without vllm, deselected without CUDA.
Run on the device: `python -m pytest -m gpu tests/vllm/test_sparse_backend_gpu.py -q`
"""

from __future__ import annotations

import pytest

from sparrow.engine import Engine, EngineConfig, SamplingParams
from sparrow.sparse import Schedule

pytestmark = pytest.mark.gpu

# bf16 on both sides, two attention kernels: a logit of magnitude ~10 rounds by ~0.04 in bf16,
# and the two engines' logprobs differ by up to twice that (0.06 seen on an H100)
LOGPROB_ATOL = 0.1
MEDIAN_ATOL = 0.02  # the median token: bf16 rounding alone
MAX_FAR_FRACTION = 0.05  # tokens whose selection met a near tie between two pages
FAR_BOUND = 0.5
TIE_MARGIN = 0.1
SHAPE = dict(
    hidden_size=256, num_layers=3, num_q_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512
)
# top-k 2 then 4 pages per 160-token bin, 1 + 2 reserved, layer 0 dense
SCHEDULE = Schedule(
    "gpu-test",
    topk_pages=(2, 4),
    page_size=16,
    bin_tokens=160,
    reserved_bos=1,
    reserved_eos=2,
    skip_layers=(0,),
)
PROMPTS = [list(range(3, 120)), [7, 11, 13] * 40, list(range(380, 210, -1)), [5] * 33]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=96, logprobs_topk=5)
CONFIG = EngineConfig(max_batch_size=8, kv_cache_mib=64, page_size=16, seed=0, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("vllm")
    from sparrow.model.random_checkpoint import make_random_checkpoint

    return make_random_checkpoint(
        tmp_path_factory.mktemp("sparse-vllm") / "ckpt", "qwen3", seed=0, **SHAPE
    )


def native(path, schedule):
    import torch

    from sparrow.model import load_model

    model = load_model(path, dtype=torch.bfloat16, device="cuda")
    return Engine(model, None, CONFIG, schedule).generate(PROMPTS, [GREEDY] * len(PROMPTS))


def compare(want_rows, got_rows) -> int:
    """Greedy ids equal up to a near tie, pages read equal, and logprobs close: bf16 centroid
    scores can flip a near tie between two pages, which moves that token's logprob by more
    than rounding, so up to MAX_FAR_FRACTION of tokens may differ by more than LOGPROB_ATOL
    (never by more than FAR_BOUND) while the median difference stays at rounding's size."""
    diffs = []  # (|difference|, prompt, token)
    for want_row, got_row in zip(want_rows, got_rows, strict=True):
        want, got = want_row[0], got_row[0]
        for j, (a, b) in enumerate(zip(want.output_ids, got.output_ids)):
            assert got.pages_read[j] == want.pages_read[j]
            if a != b:
                margin = want.topk_logprobs[j][0] - want.topk_logprobs[j][1]
                assert margin < TIE_MARGIN, (
                    f"prompt {want.prompt_index}: token {j} is {b}, "
                    f"the native {a} leads by {margin:.3f}"
                )
                break
            diffs.append((abs(got.logprobs[j] - want.logprobs[j]), want.prompt_index, j))
    diffs.sort(reverse=True)
    far = [d for d in diffs if d[0] > LOGPROB_ATOL]
    report = f"{len(far)} of {len(diffs)} tokens beyond {LOGPROB_ATOL}; largest {diffs[:5]}"
    assert len(far) <= MAX_FAR_FRACTION * len(diffs), report
    assert diffs[0][0] <= FAR_BOUND, report
    assert diffs[len(diffs) // 2][0] <= MEDIAN_ATOL, report
    return len(diffs)


def test_sparse_vllm_matches_native_sparse_decode(checkpoint):
    from sparrow.vllm import VllmEngine

    want = native(checkpoint, SCHEDULE)
    # the sparse path runs: some step reads fewer pages than its cache holds
    for prompt, (sample,) in zip(PROMPTS, want):
        dense = [-(-(len(prompt) + j) // 16) for j in range(len(sample.output_ids))]
        assert any(p < n for p, n in zip(sample.pages_read, dense))
    engine = VllmEngine(str(checkpoint), CONFIG, None, SCHEDULE)
    got = engine.generate(PROMPTS, [GREEDY] * len(PROMPTS))
    assert compare(want, got) >= len(PROMPTS) * 48  # most tokens compared

    engine.set_schedule(None)  # the same engine, dense decode through the project's kernels
    assert (
        compare(native(checkpoint, None), engine.generate(PROMPTS, [GREEDY] * len(PROMPTS)))
        >= len(PROMPTS) * 48
    )
