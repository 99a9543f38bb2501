"""The published cost formulas, checked by hand, and the model and hardware presets."""

from __future__ import annotations

import pytest

from sparrow.costmodel import (
    HARDWARE,
    MODELS,
    CostModelError,
    ModelShape,
    attended_tokens,
    dense_cost,
    get_hardware,
    get_model,
    sparse_cost,
)

# small integers for every symbol
P, N, L_IN, L_OUT, D, R, I, B, S = 10, 2, 3, 4, 5, 2, 7, 6, 2
SYMBOLS = dict(
    params=P, samples=N, prompt_len=L_IN, gen_len=L_OUT, kv_dim=D, gqa_ratio=R, intensity=I
)


def test_dense_paper_by_hand():
    # C_comp = 2 P N L_out + r (2 L_in + L_out) L_out N D = 2*10*2*4 + 2*(6+4)*4*2*5
    compute = 160 + 800
    # C_mem = 2 L_in L_out D + N L_out^2 D = 2*3*4*5 + 2*16*5
    memory = 120 + 160
    cost = dense_cost(**SYMBOLS)
    assert (cost.compute, cost.memory) == (960, 280)
    assert cost.compute == compute and cost.memory == memory
    assert cost.total == 960 + 7 * 280 == 2920


def test_sparse_paper_by_hand():
    # without scoring: 2 N P L_out + 2 r N D B L_out | memory 2 N D B L_out
    compute = 2 * 2 * 10 * 4 + 2 * 2 * 2 * 5 * 6 * 4  # 160 + 960
    memory = 2 * 2 * 5 * 6 * 4  # 480
    # scoring: 2 N L_in D L_out + r N D L_out^2 / (2S) | 2 L_in D L_out + N D L_out^2 / (2S)
    compute += 2 * 2 * 3 * 5 * 4 + 2 * 2 * 5 * 16 / 4  # 240 + 80
    memory += 2 * 3 * 5 * 4 + 2 * 5 * 16 / 4  # 120 + 40
    cost = sparse_cost(**SYMBOLS, budget_tokens=B, page_size=S)
    assert cost.compute == pytest.approx(1440) and compute == 1440
    assert cost.memory == pytest.approx(640) and memory == 640
    assert cost.total == pytest.approx(1440 + 7 * 640)


def test_appendix_by_hand():
    dense = dense_cost(**SYMBOLS, variant="appendix")
    # parameter traffic 2 P L_out = 80 joins memory; compute unchanged
    assert (dense.compute, dense.memory) == (960, 280 + 80)
    # L_dense = min(4, 6 - 3) = 3; H = (2*3 + 3)*3 + 2*6*(4 - 3) = 27 + 12 = 39
    assert attended_tokens(3, 4, 6) == 39
    sparse = sparse_cost(**SYMBOLS, budget_tokens=B, page_size=S, variant="appendix")
    # compute 2 N P L_out + r N D H + scoring = 160 + 2*2*5*39 + 240 + 80
    assert sparse.compute == pytest.approx(160 + 780 + 320)
    # memory N D H + scoring + 2 P L_out = 2*5*39 + 160 + 80
    assert sparse.memory == pytest.approx(390 + 160 + 80)
    assert sparse.total == pytest.approx(1260 + 7 * 630)


def test_attended_tokens_limits():
    # budget below the prompt: sparse from the first step, H = 2 K L_out
    assert attended_tokens(100, 50, 40) == 2 * 40 * 50
    # budget covering everything: the dense quadratic term (2 L_in + L_out) L_out
    assert attended_tokens(100, 50, 10_000) == (200 + 50) * 50
    # with H = 2 B L_out the appendix sparse cost is the paper's plus 2 P L_out of memory
    paper = sparse_cost(**{**SYMBOLS, "prompt_len": 9}, budget_tokens=B, page_size=S)
    appendix = sparse_cost(
        **{**SYMBOLS, "prompt_len": 9}, budget_tokens=B, page_size=S, variant="appendix"
    )
    assert appendix.compute == pytest.approx(paper.compute)
    assert appendix.memory == pytest.approx(paper.memory + 2 * P * L_OUT)


def test_bad_inputs_name_the_argument():
    with pytest.raises(CostModelError, match="variant 'exact'.*paper, appendix"):
        dense_cost(**SYMBOLS, variant="exact")
    with pytest.raises(CostModelError, match="gen_len"):
        dense_cost(**{**SYMBOLS, "gen_len": 0})
    with pytest.raises(CostModelError, match="budget_tokens"):
        sparse_cost(**SYMBOLS, budget_tokens=-1, page_size=S)
    with pytest.raises(CostModelError, match="qwen3-1.7b"):
        get_model("llama-7b")
    with pytest.raises(CostModelError, match="h100, h200"):
        get_hardware("a100")


def test_hardware_intensity():
    assert get_hardware("h100").intensity == pytest.approx(989.4 / 3.35)
    assert get_hardware("h200").intensity == pytest.approx(989.4 / 4.8)
    # the method quotes about 295 and 206
    assert round(HARDWARE["h100"].intensity) == 295 and round(HARDWARE["h200"].intensity) == 206


def test_model_shapes_read_D_and_r():
    m = get_model("qwen3-4b")
    assert m.kv_dim == 36 * 8 * 128 and m.gqa_ratio == 4.0
    assert get_model("qwen3-14b").gqa_ratio == 5.0
    with pytest.raises(CostModelError, match="multiple of kv_heads"):
        ModelShape("odd", 2, 64, 6, 4, 16, 128, 100, True)
    with pytest.raises(CostModelError, match="layers must be a positive integer"):
        ModelShape("zero", 0, 64, 4, 4, 16, 128, 100, True)


def _hf_count(shape: ModelShape):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.q_heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate,
        tie_word_embeddings=shape.tied_embeddings,
    )
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(config)
    # parameters() yields a tied weight once
    return sum(p.numel() for p in model.parameters()), config


# importing transformers and building the models on the meta device takes several seconds
@pytest.mark.slow
def test_parameter_count_matches_transformers_tiny():
    for tied in (True, False):
        # head_dim deliberately not hidden / heads, and q_heads * head_dim != hidden
        shape = ModelShape(
            "tiny",
            layers=3,
            hidden=24,
            q_heads=6,
            kv_heads=2,
            head_dim=8,
            intermediate=40,
            vocab=97,
            tied_embeddings=tied,
        )
        count, config = _hf_count(shape)
        assert shape.parameters == count, tied
        assert ModelShape.from_hf_config(config).parameters == count
        assert ModelShape.from_hf_config(config).kv_dim == 3 * 2 * 8


@pytest.mark.slow
def test_preset_parameter_counts_match_transformers():
    for name, shape in MODELS.items():
        count, _ = _hf_count(shape)
        assert shape.parameters == count, name
