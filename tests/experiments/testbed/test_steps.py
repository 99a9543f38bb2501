"""A testbed training step: batch shapes, the completion-only loss, and timing that leaves the
model as it was."""

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from sparrow.experiments.testbed.data import Stage, encode, step_examples, vocab
from sparrow.experiments.testbed.steps import batch_shape, forward_backward, measure_step_seconds


def _model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(vocab()),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(config)


def test_batch_shape_fills_the_token_budget_with_whole_rows():
    stage = Stage(32, 30, 1.0)  # 360 tokens an example
    assert stage.length == 360
    assert batch_shape(stage, 32768, 32768) == (91, 1)
    assert batch_shape(stage, 32768, 8192) == (22, 4)
    assert batch_shape(Stage(256, 600, 1.0), 1000, 1000) == (1, 1)  # one row at least


def test_loss_reads_the_completion_only():
    model = _model()
    examples = step_examples(Stage(6, 5, 1.0), 2, seed=0, step=0)
    ids, mask = encode(examples)
    loss = forward_backward(model, ids, mask, 1.0)
    logits = model(input_ids=ids).logits[:, :-1]
    per_token = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
    ).view(2, -1)
    assert torch.allclose(loss, per_token[mask[:, 1:]].mean(), atol=1e-6)
    # the prompt tokens are context, not targets: the mean over every token differs
    assert not torch.allclose(loss, per_token.mean())


def test_measuring_leaves_weights_and_gradients_clear():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seconds = measure_step_seconds(
        model, [Stage(4, 3, 0.5), Stage(6, 5, 0.5)], 512, 256, seed=0, device=torch.device("cpu")
    )
    assert len(seconds) == 2 and all(value > 0 for value in seconds.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
