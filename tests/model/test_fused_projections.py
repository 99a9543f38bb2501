"""Decoder.fuse_projections: one GEMM for q/k/v and one for gate/up, same numbers and names.

Every fused model is compared with an unfused copy loaded from the same checkpoint (the plain
reference: seven nn.Linear calls per layer). Each output element reduces over the same hidden
dimension either way, but a GEMM of another width may take another kernel: on CPU the
prefill shapes here come out bitwise equal, while 4- and 5-row GEMMs (decode batches) differ
in the last bit, which grows through the layers to about 1e-6 of the logits' scale; the
tolerance is 1e-5 of it (float32). Each test also counts F.linear calls, so a silent
fallback to the unfused path (which would pass any equality test) fails.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from sparrow.model import causal_attention, load_model, stream
from sparrow.model.builtin import resolve_model_path
from sparrow.model.fusion import FusionError

# builtin: the tiny Qwen3 (q/k norm, tied); qwen2: q/k/v bias, untied; llama: no q/k norm,
# untied; qwen3_checkpoint: tied, GQA 2
MODELS = ("builtin", "qwen2_checkpoint", "llama_checkpoint", "qwen3_checkpoint")
DTYPES = (torch.float32, torch.bfloat16)
# of the largest |logit|
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def checkpoint_path(request, name):
    if name == "builtin":
        return resolve_model_path("builtin:tiny")
    return request.getfixturevalue(name)


def pair(request, name, dtype=torch.float32):
    """(unfused, fused) decoders holding the same weights."""
    path = checkpoint_path(request, name)
    fused = load_model(path, dtype=dtype)
    fused.fuse_projections()
    return load_model(path, dtype=dtype), fused


def token_ids(model, count=19, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.arch.vocab_size, (count,), generator=generator)


def assert_same_logits(got, want, dtype=torch.float32):
    torch.testing.assert_close(got, want, atol=TOLERANCE[dtype] * want.abs().max().item(), rtol=0)


def logits(model, ids, lens=None):
    lens = lens or [len(ids)]
    positions = torch.cat([torch.arange(n) for n in lens]).to(ids.device)
    with torch.no_grad():
        return model.compute_logits(model(ids, positions, causal_attention(lens)))


class LinearCalls:
    """Counts projections (the decode kernel's launcher, or F.linear outside it) and the
    output width of each while installed."""

    def __init__(self, monkeypatch):
        self.widths: list[int] = []
        inside = [False]
        real, real_skinny = nn.functional.linear, stream.skinny_linear

        def counting(x, weight, bias=None):
            if not inside[0]:
                self.widths.append(weight.shape[0])
            return real(x, weight, bias)

        def counting_skinny(x, weight, *args, **kwargs):
            self.widths.append(weight.shape[0])
            inside[0] = True  # its fallback's F.linear is the same projection
            try:
                return real_skinny(x, weight, *args, **kwargs)
            finally:
                inside[0] = False

        monkeypatch.setattr(nn.functional, "linear", counting)
        monkeypatch.setattr(stream, "skinny_linear", counting_skinny)


def assert_runs_fused(model, monkeypatch):
    """One forward makes four GEMMs per layer: q/k/v together, o, gate/up together, down."""
    arch = model.arch
    calls = LinearCalls(monkeypatch)
    device = model.output_embedding().device
    with torch.no_grad():
        model(token_ids(model, 3).to(device), torch.arange(3, device=device), causal_attention([3]))
    monkeypatch.undo()
    qkv = (arch.num_q_heads + 2 * arch.num_kv_heads) * arch.head_dim
    per_layer = [qkv, arch.hidden_size, 2 * arch.intermediate_size, arch.hidden_size]
    assert calls.widths == per_layer * arch.num_layers
    assert model.projections_fused


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", MODELS)
def test_fused_forward_equals_unfused(request, monkeypatch, name, dtype):
    unfused, fused = pair(request, name, dtype)
    ids = token_ids(fused, 23)
    want = logits(unfused, ids, [9, 14])
    assert_same_logits(logits(fused, ids, [9, 14]), want, dtype)
    assert_runs_fused(fused, monkeypatch)
    assert not unfused.projections_fused


@pytest.mark.parametrize("name", MODELS)
def test_state_dict_and_parameters_are_unchanged(request, name):
    unfused, fused = pair(request, name)
    before = dict(unfused.named_parameters())
    unfused.fuse_projections()
    after = dict(unfused.named_parameters())
    assert list(after) == list(before)
    assert all(after[n] is before[n] for n in before)  # same Parameter objects (optimizers)
    state, reference = unfused.state_dict(), load_model(checkpoint_path(request, name)).state_dict()
    assert list(state) == list(reference)
    for key in reference:
        assert torch.equal(state[key], reference[key]), key
    assert list(fused.state_dict()) == list(reference)


def perturbed(state, seed):
    generator = torch.Generator().manual_seed(seed)
    return {k: v + torch.randn(v.shape, generator=generator).to(v.dtype) for k, v in state.items()}


@pytest.mark.parametrize("name", MODELS)
def test_loading_by_name_updates_the_fused_weights(request, monkeypatch, name):
    unfused, fused = pair(request, name)
    ids = token_ids(fused)
    before = logits(fused, ids)
    new = perturbed(unfused.state_dict(), seed=7)
    unfused.load_hf_state_dict(new)
    fused.load_hf_state_dict(new)
    after = logits(fused, ids)
    assert_same_logits(after, logits(unfused, ids))
    assert (after - before).abs().max() > 0.1
    # a partial update of one k projection (the middle rows) reaches the fused q/k/v weight;
    # flipped columns, not a scale, which q/k norm would cancel
    key = "model.layers.1.self_attn.k_proj.weight"
    partial = {key: new[key].flip(1)}
    unfused.load_hf_state_dict(partial, strict=False)
    fused.load_hf_state_dict(partial, strict=False)
    changed = logits(fused, ids)
    assert_same_logits(changed, logits(unfused, ids))
    assert (changed - after).abs().max() > 1e-3
    assert_runs_fused(fused, monkeypatch)


@pytest.mark.parametrize("name", ["builtin", "qwen2_checkpoint"])
def test_casting_a_fused_model_fuses_again(request, monkeypatch, name):
    unfused, fused = pair(request, name)
    weight = fused.model.layers[0].mlp.up_proj.weight
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to unfused would warn
        fused.to(torch.bfloat16)
        unfused.to(torch.bfloat16)
        ids = token_ids(fused)
        assert_same_logits(logits(fused, ids), logits(unfused, ids), torch.bfloat16)
        assert_runs_fused(fused, monkeypatch)
        assert fused.model.layers[0].mlp.up_proj.weight is weight
        assert weight.dtype == torch.bfloat16
        # weight sync after the cast still reaches the (new) fused tensors
        new = perturbed(load_model(checkpoint_path(request, name)).state_dict(), seed=3)
        fused.load_hf_state_dict(new)
        unfused.load_hf_state_dict(new)
        assert_same_logits(logits(fused, ids), logits(unfused, ids), torch.bfloat16)
        fused.float()
        unfused.float()
        assert_same_logits(logits(fused, ids), logits(unfused, ids))
    assert_runs_fused(fused, monkeypatch)


def test_fusing_twice_keeps_the_fused_tensors(request, monkeypatch):
    unfused, fused = pair(request, "qwen2_checkpoint")
    attention = fused.model.layers[0].self_attn
    pointers = [p.data_ptr() for p in attention.parameters()]
    fused.fuse_projections()
    assert [p.data_ptr() for p in attention.parameters()] == pointers
    ids = token_ids(fused)
    assert_same_logits(logits(fused, ids), logits(unfused, ids))
    assert_runs_fused(fused, monkeypatch)


def test_gradients_reach_the_named_parameters(request, monkeypatch):
    unfused, fused = pair(request, "qwen2_checkpoint")
    ids = token_ids(fused, 11)
    grads = []
    for model in (unfused, fused):
        hidden = model(ids, torch.arange(11), causal_attention([11]))
        torch.log_softmax(model.compute_logits(hidden), -1)[:, 5].sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, want in grads[0].items():
        assert grads[1][name] is not None, name
        torch.testing.assert_close(grads[1][name], want, atol=1e-5, rtol=1e-5)
    # an optimizer step on the named parameters moves the fused forward with them
    for model in (unfused, fused):
        torch.optim.SGD(model.parameters(), lr=0.01).step()
    assert_same_logits(logits(fused, ids), logits(unfused, ids))
    assert_runs_fused(fused, monkeypatch)


def test_replaced_parameter_runs_unfused_with_a_warning(request, monkeypatch):
    unfused, fused = pair(request, "llama_checkpoint")
    for model in (unfused, fused):
        gate = model.model.layers[1].mlp.gate_proj
        gate.weight.data = gate.weight.data * 2  # new storage: the view into the fusion breaks
    ids = token_ids(fused)
    with pytest.warns(RuntimeWarning, match="gate_proj/up_proj no longer view"):
        got = logits(fused, ids)
    assert_same_logits(got, logits(unfused, ids))
    assert not fused.projections_fused
    fused.fuse_projections()
    assert_same_logits(logits(fused, ids), logits(unfused, ids))
    assert_runs_fused(fused, monkeypatch)


def test_a_wrapped_projection_is_refused_by_name(request):
    model = load_model(checkpoint_path(request, "builtin"))
    mlp = model.model.layers[2].mlp
    mlp.up_proj = nn.Sequential(mlp.up_proj)
    with pytest.raises(FusionError, match="up_proj is a Sequential"):
        model.fuse_projections()


def test_projections_of_different_dtypes_are_refused_by_name(request):
    model = load_model(checkpoint_path(request, "builtin"))
    v_proj = model.model.layers[0].self_attn.v_proj
    v_proj.weight.data = v_proj.weight.data.to(torch.bfloat16)
    with pytest.raises(FusionError, match=r"differ in.*v_proj \('torch.bfloat16'"):
        model.fuse_projections()


def test_kernels_take_the_strided_halves(request):
    """The Triton kernels (interpreted on CPU where triton is installed, else the launchers'
    references) read q/k/v and gate/up as strided views."""
    from sparrow.kernels.runtime import cpu_interpreter

    unfused, fused = pair(request, "qwen3_checkpoint")
    ids = token_ids(fused, 6)
    want = logits(unfused, ids)
    with cpu_interpreter():
        got = logits(fused, ids)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_decode_kernels_in_bfloat16(request, monkeypatch):
    """bf16 on CPU in the interpreter: every projection of a decode-sized batch runs in the
    skinny linear kernel, which also applies the RMSNorms before q/k/v and gate/up (all but
    the first layer's, whose input no kernel wrote) and the residual adds after o and down
    (down_proj with the gate read in); the logits stay as close to the float32 model's as
    bf16 PyTorch's own (the interpreter truncates where a GPU rounds, in every kernel, so it
    may sit up to 3x further off; a wrong product or norm is far off)."""
    from sparrow.kernels import linear, rms_norm
    from sparrow.kernels.runtime import HAS_TRITON, cpu_interpreter

    path = checkpoint_path(request, "qwen3_checkpoint")
    exact, fused = load_model(path), load_model(path, dtype=torch.bfloat16)
    fused.fuse_projections()
    ids = token_ids(fused, 6)
    want = logits(exact, ids)
    torch_error = (logits(fused, ids) - want).abs().max()
    launches = []
    monkeypatch.setattr(
        linear,
        "_skinny_linear_kernel",
        Recording(linear._skinny_linear_kernel, launches, ("NORM", "RESIDUAL", "GATED")),
    )
    monkeypatch.setattr(
        rms_norm, "_rms_norm_kernel", Recording(rms_norm._rms_norm_kernel, launches, ("HAS_RES",))
    )
    with cpu_interpreter():
        got = logits(fused, ids)
    assert (got - want).abs().max() <= 3 * torch_error
    # (NORM, RESIDUAL, GATED) per skinny launch, (HAS_RES,) per norm launch
    layer = [(True, False, False), (False, True, False), (True, False, False), (False, True, True)]
    first = [(False,), (False, False, False)] + layer[1:]
    expected = first + layer * (fused.arch.num_layers - 1) + [(False,), (False, False, False)]
    assert launches == (expected if HAS_TRITON else [])  # no triton: all in PyTorch


class Recording:
    """Stands in for a Triton kernel: records the named constexpr flags of each launch."""

    def __init__(self, kernel, launches, flags):
        self.kernel, self.launches, self.flags = kernel, launches, flags

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(tuple(kwargs[flag] for flag in self.flags))
            return self.kernel[grid](*args, **kwargs)

        return launch


def test_engine_generates_the_same_samples_fused(request):
    from sparrow.engine import Engine, EngineConfig, SamplingParams

    unfused, fused = pair(request, "builtin")
    prompts = [token_ids(fused, n, seed=n).tolist() for n in (3, 17)]
    params = SamplingParams(temperature=0.8, max_new_tokens=12, seed=5, n=2)
    config = EngineConfig(page_size=4, num_pages=64, max_batch_size=4)
    results = [Engine(m, config=config).generate(prompts, params) for m in (unfused, fused)]
    for want, got in zip(*results):
        for a, b in zip(want, got):
            assert list(a.output_ids) == list(b.output_ids)
            torch.testing.assert_close(
                torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=2e-4, rtol=0
            )


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_fused_forward_equals_unfused(request, monkeypatch, dtype):
    """cuBLAS GEMMs of both widths and the Triton kernels on the strided views."""
    path = checkpoint_path(request, "qwen2_checkpoint")
    unfused = load_model(path, dtype=dtype, device="cuda")
    fused = load_model(path, dtype=dtype, device="cuda")
    fused.fuse_projections()
    ids = token_ids(fused, 23).cuda()
    assert_same_logits(logits(fused, ids, [9, 14]), logits(unfused, ids, [9, 14]), dtype)
    assert_runs_fused(fused, monkeypatch)


@pytest.mark.gpu
@cuda
def test_cuda_engine_generates_the_same_samples_fused(request):
    """Decode through CUDA graphs captured on the fused weights."""
    from sparrow.engine import Engine, EngineConfig, SamplingParams

    path = checkpoint_path(request, "builtin")
    models = [load_model(path, device="cuda") for _ in range(2)]
    models[1].fuse_projections()
    prompts = [token_ids(models[0], n, seed=n).tolist() for n in (3, 17, 40)]
    params = SamplingParams(temperature=0, max_new_tokens=24)
    config = EngineConfig(page_size=16, num_pages=64, max_batch_size=4)
    results = [Engine(m, config=config).generate(prompts, params) for m in models]
    for [want], [got] in zip(*results):
        assert list(got.output_ids) == list(want.output_ids)
        torch.testing.assert_close(
            torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=2e-4, rtol=0
        )
