"""Teacher-forced forward: dense equals transformers, sparse equals the decode path position
by position, selections equal the brute-force loop, and gradients flow."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from sparrow.engine.config import EngineConfig
from sparrow.engine.engine import Engine
from sparrow.engine.sampler import SamplingParams
from sparrow.engine.teacher.forced import teacher_forced_logits
from sparrow.kernels.runtime import cpu_interpreter
from sparrow.model import causal_attention, load_model
from sparrow.sparse.schedule import Schedule

pytestmark = pytest.mark.usefixtures("single_thread")

SCHEDULE = Schedule(
    "tight", (1, 2, 3), page_size=4, bin_tokens=16, reserved_bos=1, reserved_eos=1, skip_layers=()
)


@pytest.mark.parametrize("checkpoint", ["qwen3_checkpoint", "qwen2_checkpoint", "llama_checkpoint"])
def test_dense_equals_transformers_forward(checkpoint, request):
    path = request.getfixturevalue(checkpoint)
    model = load_model(path)
    hf = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    )
    gen = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, 384, (n,), generator=gen) for n in (9, 23)]
    with torch.no_grad():
        got = teacher_forced_logits(model, sequences)
        for ids, logits in zip(sequences, got):
            torch.testing.assert_close(logits, hf(ids[None]).logits[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "centroid_dtype,backend", [("cache", "auto"), ("float8_e4m3fn", "auto"), ("cache", "triton")]
)
def test_sparse_equals_decode_path_position_by_position(qwen3_model, centroid_dtype, backend):
    prompts = [[1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [7, 7]]
    config = EngineConfig(page_size=4, num_pages=64, centroid_dtype=centroid_dtype)
    engine = Engine(qwen3_model, config=config, schedule=SCHEDULE)
    # logprobs_topk = the vocabulary: every decode step's full distribution comes back
    results = engine.generate(
        prompts, SamplingParams(temperature=0, max_new_tokens=36, logprobs_topk=384)
    )
    sequences = [p + list(r[0].output_ids) for p, r in zip(prompts, results)]
    with torch.no_grad(), cpu_interpreter():  # backend "triton": the kernels, interpreted
        replay = teacher_forced_logits(
            qwen3_model,
            sequences,
            [len(p) for p in prompts],
            SCHEDULE,
            query_chunk=7,
            centroid_dtype=centroid_dtype,
            backend=backend,
        )
        dense = teacher_forced_logits(qwen3_model, sequences)
    for prompt, [sample], logits, dense_logits in zip(prompts, results, replay, dense):
        first, last = len(prompt) - 1, len(prompt) - 1 + len(sample.output_ids)
        want = torch.log_softmax(logits[first:last], dim=-1)
        got = torch.full_like(want, float("nan")).scatter(
            1, torch.tensor(sample.topk_ids), torch.tensor(sample.topk_logprobs)
        )
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        # prompt positions are dense; generated ones (beyond a few pages) are not
        torch.testing.assert_close(logits[: len(prompt)], dense_logits[: len(prompt)])
        assert (logits[-8:] - dense_logits[-8:]).abs().max() > 1e-2


def test_selection_equals_brute_force_and_chunks_do_not_matter(qwen3_model, brute_force):
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 256, (41,), generator=gen).tolist()
    picks = {}
    with torch.no_grad():
        (whole,) = teacher_forced_logits(
            qwen3_model,
            [tokens],
            [9],
            SCHEDULE,
            on_selection=lambda l, i, m: picks.__setitem__(l, m),
        )
        (chunked,) = teacher_forced_logits(qwen3_model, [tokens], [9], SCHEDULE, query_chunk=5)
    want_logits, want_picks = brute_force(qwen3_model, tokens, 9, SCHEDULE)
    torch.testing.assert_close(whole, want_logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=0)
    for (layer, position), pages in want_picks.items():
        got = tuple(
            tuple(torch.nonzero(head).flatten().tolist()) for head in picks[layer][position]
        )
        assert got == pages, (layer, position)


def test_gradients_flow_and_a_full_budget_matches_dense_gradients(qwen3_model):
    wide = Schedule(
        "wide", (64,), page_size=4, bin_tokens=16, reserved_bos=1, reserved_eos=1, skip_layers=()
    )
    tokens = list(range(30, 60))
    weight = qwen3_model.model.layers[1].self_attn.q_proj.weight

    def grad(fn):
        qwen3_model.zero_grad()
        fn().sum().backward()
        return weight.grad.clone()

    ids, positions = torch.tensor(tokens), torch.arange(len(tokens))
    dense = grad(
        lambda: qwen3_model.compute_logits(
            qwen3_model(ids, positions, causal_attention([len(tokens)]))
        ).logsumexp(-1)
    )
    full = grad(lambda: teacher_forced_logits(qwen3_model, [tokens], [4], wide)[0].logsumexp(-1))
    sparse = grad(
        lambda: teacher_forced_logits(qwen3_model, [tokens], [4], SCHEDULE)[0].logsumexp(-1)
    )
    qwen3_model.zero_grad()
    torch.testing.assert_close(full, dense, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(sparse).all() and (sparse - dense).abs().max() > 1e-4


def test_bad_prompt_lengths_are_refused(qwen3_model):
    with pytest.raises(ValueError, match="1 <= prompt_len <= length"):
        teacher_forced_logits(qwen3_model, [[1, 2, 3]], [4], SCHEDULE)
    with pytest.raises(ValueError, match="needs prompt_lens"):
        teacher_forced_logits(qwen3_model, [[1, 2, 3]], None, SCHEDULE)


def test_triton_backend_gradients_equal_the_reference_backend(qwen3_model):
    """With gradients, backend="triton" runs the kernels' autograd Function (forward saving
    lse, dK/dV and dQ kernels; interpreted when triton is installed): the weights' gradients
    equal those of the float32 reference path."""
    gen = torch.Generator().manual_seed(4)
    sequences = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (37, 5, 22)]
    prompts = [8, 5, 3]
    params = [p for p in qwen3_model.parameters() if p.requires_grad]
    grads = {}
    for backend in ("triton", "reference"):
        with cpu_interpreter():
            logits = teacher_forced_logits(
                qwen3_model, sequences, prompts, SCHEDULE, backend=backend
            )
            loss = sum((x.logsumexp(-1) * torch.linspace(0.5, 1.5, len(x))).sum() for x in logits)
            grads[backend] = torch.autograd.grad(loss, params, allow_unused=True)
    checked = 0
    for got, want in zip(grads["triton"], grads["reference"]):
        if want is not None:
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)
            checked += 1
    assert checked > 4


@pytest.mark.parametrize("centroid_dtype", ["cache", "float8_e4m3fn"])
def test_triton_backend_equals_the_reference_backend_and_its_pages(
    qwen3_model, brute_force, centroid_dtype
):
    """backend="triton" (the kernels in Triton's interpreter when triton is installed, their
    PyTorch references otherwise) against the float32 reference path: the same pages at
    every position and layer, the same logits; and the brute-force loop's pages."""
    gen = torch.Generator().manual_seed(9)
    sequences = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (41, 6, 29)]
    prompts = [9, 6, 3]  # the second is all prompt: dense through the same launch
    picks = {}
    logits = {}
    for backend in ("triton", "reference"):
        hook = lambda layer, index, pages, b=backend: picks.__setitem__((b, layer, index), pages)
        with cpu_interpreter(), torch.no_grad():
            logits[backend] = teacher_forced_logits(
                qwen3_model,
                sequences,
                prompts,
                SCHEDULE,
                on_selection=hook,
                backend=backend,
                centroid_dtype=centroid_dtype,
            )
    for got, want in zip(logits["triton"], logits["reference"]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    reference_keys = [key for key in picks if key[0] == "reference"]
    assert reference_keys
    for _, layer, index in reference_keys:
        assert torch.equal(picks[("triton", layer, index)], picks[("reference", layer, index)])
    if centroid_dtype == "cache":
        _, want_picks = brute_force(qwen3_model, sequences[0], prompts[0], SCHEDULE)
        for (layer, position), pages in want_picks.items():
            got = tuple(
                tuple(torch.nonzero(head).flatten().tolist())
                for head in picks[("triton", layer, 0)][position]
            )
            assert got == pages, (layer, position)
