"""`sparrow export` read by vLLM: a trainer's saved policy exported as a bf16 folder, loaded by
the vLLM rollout actor, generates what the trainer's own forward predicts.

The trainer holds a random Qwen3 of head_dim 64 with untied embeddings (so the export's lm_head
is read too), moved well off its starting weights and off bf16's grid, saved the way a run
saves it (runs/<run>/step-2/policy_update) and exported as `sparrow export` does. vLLM greedy-decodes the export; at each generated
token the trainer's model (its weights rounded to bf16, run in fp32 on the GPU) must give
vLLM's token the top logit, up to a near tie, and vLLM's logprob within LOGPROB_ATOL of the
trainer's. The starting weights must not fit as well: vLLM read the export, not the
checkpoint the trainer started from. Needs vllm (docs/backends.md, 'Installing vLLM on the
GPU machine') and CUDA; skipped without vllm, deselected without CUDA.
Run on the device: `python -m pytest -m gpu tests/vllm/test_export_vllm_gpu.py -q`
"""

from __future__ import annotations

import copy

import pytest
import torch

from sparrow.config.schema import AlgoConfig
from sparrow.engine import EngineConfig, SamplingParams
from sparrow.runtime.rollout.worker import RolloutWorker, WorkerSpec
from sparrow.trainer.export import export_policy, find_policy_folder
from sparrow.trainer.policy_trainer import PolicyTrainer

pytestmark = pytest.mark.gpu

LOGPROB_ATOL = 0.1  # bf16 activations in vLLM against an fp32 forward (see test_vllm_engine_gpu)
TIE_MARGIN = 0.1
SHAPE = dict(
    hidden_size=256, num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512
)
PROMPTS = [[72, 101, 108, 108, 111], list(range(30, 70)), [7] * 17, list(range(200, 100, -3))]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24, logprobs_topk=5)
RUN = "run-export"


def token_logprobs(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), vocab] log-probabilities the model gives each output position."""
    ids = torch.tensor([list(prompt) + list(output)], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1)


def test_the_export_loads_in_vllm_with_the_trainers_logprobs(tmp_path):
    pytest.importorskip("vllm")
    from sparrow.model.random_checkpoint import make_random_checkpoint

    start = make_random_checkpoint(
        tmp_path / "start", "qwen3", seed=0, tie_word_embeddings=False, **SHAPE
    )
    trainer = PolicyTrainer(start, AlgoConfig(), device="cpu", dtype="float32")
    original = copy.deepcopy(trainer.model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # "trained": every weight moved by about its own spread
        for parameter in trainer.model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.add_(noise * parameter.float().std().clamp_min(1e-3))
    workdir = tmp_path / "work"
    trainer.save(workdir / "runs" / RUN / "step-2" / "policy_update")
    out = tmp_path / "exported"
    export_policy(find_policy_folder(workdir, RUN, 2), out)  # what `sparrow export` runs

    config = EngineConfig(max_batch_size=8, kv_cache_mib=64, page_size=16, seed=0)
    spec = WorkerSpec(
        str(out), str(out), None, config, device="cuda", dtype="bfloat16", backend="vllm"
    )
    rows = RolloutWorker(spec).generate(PROMPTS, [GREEDY] * len(PROMPTS))

    rounded = copy.deepcopy(trainer.model).float()
    with torch.no_grad():
        for parameter in rounded.parameters():  # the trainer's weights as bf16 holds them
            parameter.copy_(parameter.to(torch.bfloat16).float())
    rounded = rounded.cuda().eval()
    original = original.float().cuda().eval()
    compared, worst, worst_original = 0, 0.0, 0.0
    for prompt, row in zip(PROMPTS, rows, strict=True):
        sample = row[0]
        want = token_logprobs(rounded, prompt, sample.output_ids)
        before = token_logprobs(original, prompt, sample.output_ids)
        for j, token in enumerate(sample.output_ids):
            top2 = want[j].topk(2)
            if int(top2.indices[0]) != token:
                margin = float(top2.values[0] - top2.values[1])
                assert margin < TIE_MARGIN, (
                    f"prompt {prompt[:4]}...: token {j} is {token} in vLLM, the trainer's top "
                    f"{int(top2.indices[0])} leads by {margin:.3f} (more than a near tie)"
                )
                break  # the continuations part here; what follows is not comparable
            assert sample.logprobs[j] == pytest.approx(float(want[j, token]), abs=LOGPROB_ATOL)
            worst = max(worst, abs(sample.logprobs[j] - float(want[j, token])))
            worst_original = max(worst_original, abs(sample.logprobs[j] - float(before[j, token])))
            compared += 1
    print(
        f"compared {compared} tokens: |vLLM - trainer| <= {worst:.4f}, "
        f"|vLLM - starting weights| up to {worst_original:.3f}"
    )
    assert compared >= len(PROMPTS) * 12  # most tokens compared
    assert worst_original > 5 * LOGPROB_ATOL, "vLLM's logprobs fit the starting weights too"
