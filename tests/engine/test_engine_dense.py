"""Dense decode: greedy generation equals transformers' greedy generate, token for token."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from sparrow.engine.config import EngineConfig
from sparrow.engine.engine import Engine
from sparrow.engine.sampler import SamplingParams
from sparrow.model import load_model
from sparrow.sparse.schedule import Schedule

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPT_LENGTHS = (1, 6, 13)
NEW_TOKENS = 20


def prompts_for(vocab_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def hf_greedy(path, prompts, max_new_tokens):
    hf = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    )
    outs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        got = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        new = got.sequences[0, len(prompt) :].tolist()
        logprobs = torch.log_softmax(torch.cat(got.logits).float(), dim=-1)
        outs.append((new, logprobs))
    return outs


@pytest.mark.parametrize(
    "checkpoint",
    ["qwen3_checkpoint", "qwen3_gqa3_checkpoint", "qwen2_checkpoint", "llama_checkpoint"],
)
def test_greedy_dense_equals_transformers(checkpoint, request):
    path = request.getfixturevalue(checkpoint)
    model = load_model(path)
    prompts = prompts_for(model.arch.vocab_size)
    # page size 4 and 2 slots: pages fill and sequences wait for a slot
    engine = Engine(model, config=EngineConfig(page_size=4, num_pages=64, max_batch_size=2))
    results = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS))
    for prompt, [sample], (want, hf_logprobs) in zip(
        prompts, results, hf_greedy(path, prompts, NEW_TOKENS)
    ):
        assert list(sample.output_ids) == want
        steps = len(want)
        rows = torch.arange(steps)
        want_logprobs = hf_logprobs[rows, torch.tensor(want)]
        torch.testing.assert_close(torch.tensor(sample.logprobs), want_logprobs, atol=2e-4, rtol=0)
        # top-20 ids of the first step (prefill) and the last (decode) agree with transformers
        for step in (0, steps - 1):
            assert list(sample.topk_ids[step]) == hf_logprobs[step].topk(20).indices.tolist()
        # dense decode reads every page: ceil(tokens cached / page size)
        assert list(sample.pages_read) == [-(-(len(prompt) + i) // 4) for i in range(steps)]
    assert engine.block_manager.num_free == 64


def test_finish_reasons_and_stop_tokens(qwen3_model):
    prompt = [5, 6, 7, 8, 9]
    engine = Engine(qwen3_model, config=EngineConfig(page_size=4, num_pages=32))
    [[free]] = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=12))
    assert free.finish_reason == "length" and len(free.output_ids) == 12
    stop = free.output_ids[4]
    first = free.output_ids.index(stop)
    [[stopped]] = engine.generate(
        [prompt], SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=(stop,))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.output_ids == free.output_ids[: first + 1]
    [[one]] = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=1))
    assert one.output_ids == free.output_ids[:1] and one.finish_reason == "length"


def test_model_eos_stops_unless_ignored(qwen3_model):
    prompt = [5, 6, 7, 8, 9]
    engine = Engine(qwen3_model, config=EngineConfig(page_size=4, num_pages=32))
    [[free]] = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=10))
    eos = free.output_ids[3]
    arch = qwen3_model.arch
    patched = type(arch)(**{**arch.__dict__, "eos_token_ids": (eos,)})
    qwen3_model.arch = patched
    try:
        [[stopped]] = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=10))
        ignoring = Engine(
            qwen3_model, config=EngineConfig(page_size=4, num_pages=32, ignore_eos=True)
        )
        [[kept]] = ignoring.generate([prompt], SamplingParams(temperature=0, max_new_tokens=10))
    finally:
        qwen3_model.arch = arch
    assert stopped.finish_reason == "stop"
    assert stopped.output_ids == free.output_ids[: free.output_ids.index(eos) + 1]
    assert kept.output_ids == free.output_ids and kept.finish_reason == "length"


def test_text_is_decoded_with_the_tokenizer(qwen3_model, qwen3_tokenizer):
    engine = Engine(qwen3_model, qwen3_tokenizer, EngineConfig(page_size=4, num_pages=32))
    [[sample]] = engine.generate(
        [qwen3_tokenizer.encode("ab")], SamplingParams(temperature=0, max_new_tokens=5)
    )
    assert sample.text == qwen3_tokenizer.decode(list(sample.output_ids))


def test_update_weights_and_set_schedule(qwen3_checkpoint, qwen3_sharded_checkpoint):
    # the sharded fixture has the same shape and other weights
    prompt, params = [[11, 12, 13, 14, 15]], SamplingParams(temperature=0, max_new_tokens=16)
    config = EngineConfig(page_size=4, num_pages=32)
    other = Engine(load_model(qwen3_sharded_checkpoint), config=config).generate(prompt, params)
    engine = Engine(load_model(qwen3_checkpoint), config=config)
    before = engine.generate(prompt, params)
    hf = AutoModelForCausalLM.from_pretrained(qwen3_sharded_checkpoint, dtype=torch.float32)
    engine.update_weights(hf.state_dict())
    after = engine.generate(prompt, params)
    assert after[0][0].output_ids == other[0][0].output_ids != before[0][0].output_ids
    tight = Schedule(
        "t", (1,), page_size=4, bin_tokens=64, reserved_bos=1, reserved_eos=1, skip_layers=()
    )
    engine.set_schedule(tight)
    assert max(engine.generate(prompt, params)[0][0].pages_read) == 3
    engine.set_schedule(None)
    assert engine.generate(prompt, params)[0][0].output_ids == after[0][0].output_ids
