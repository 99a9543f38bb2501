"""Block-sparse decode: a full budget is dense, a tight one is not, and every selected page
matches a plain-loop reference that recomputes the centroids from the keys at every step."""

import numpy as np
import pytest
import torch

from sparrow.engine.config import EngineConfig, EngineError
from sparrow.engine.engine import Engine
from sparrow.engine.sampler import SamplingParams
from sparrow.sparse.schedule import Schedule

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPTS = [[1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [7, 7]]
VOCAB = 384


def tight(skip_layers=()):
    # 4-token pages; top-k 1, 2, 3 pages over 16-token bins; 1 bos + 1 recent page kept
    return Schedule(
        "tight",
        (1, 2, 3),
        page_size=4,
        bin_tokens=16,
        reserved_bos=1,
        reserved_eos=1,
        skip_layers=skip_layers,
    )


def run(model, schedule, max_new_tokens=40, record=False, **params):
    config = EngineConfig(page_size=4, num_pages=128, max_batch_size=4, record_selection=record)
    engine = Engine(model, config=config, schedule=schedule)
    params = SamplingParams(max_new_tokens=max_new_tokens, **{"temperature": 0, **params})
    return engine, engine.generate(PROMPTS, params)


def test_budget_covering_every_page_is_exactly_dense(qwen3_model):
    wide = Schedule(
        "wide", (64,), page_size=4, bin_tokens=16, reserved_bos=1, reserved_eos=1, skip_layers=()
    )
    _, dense = run(qwen3_model, None, logprobs_topk=VOCAB)
    _, sparse = run(qwen3_model, wide, logprobs_topk=VOCAB)
    for [d], [s] in zip(dense, sparse):
        assert s.output_ids == d.output_ids
        assert np.array_equal(s.topk_logprobs, d.topk_logprobs)  # the same arithmetic: bitwise
        assert s.pages_read == d.pages_read


def test_tight_budget_changes_the_output(qwen3_model):
    _, dense = run(qwen3_model, None)
    _, sparse = run(qwen3_model, tight())
    changed = [d.output_ids != s.output_ids for [d], [s] in zip(dense, sparse)]
    assert sum(changed) >= 2
    # from 6 + 40 tokens (12 pages) the tight schedule reads at most 3 + 2 pages
    assert max(sparse[0][0].pages_read) == 5 and max(dense[0][0].pages_read) == 12


@pytest.mark.parametrize("skip_layers", [(), (0,)])
def test_selected_pages_match_brute_force(qwen3_model, brute_force, skip_layers):
    schedule = tight(skip_layers)
    engine, results = run(
        qwen3_model, schedule, max_new_tokens=30, record=True, logprobs_topk=VOCAB
    )
    log = {(r.prompt_index, r.layer, r.position): r.pages for r in engine.selection_log}
    assert {layer for _, layer, _ in log} == {0, 1} - set(skip_layers)
    compared = 0
    for index, (prompt, [sample]) in enumerate(zip(PROMPTS, results)):
        tokens = prompt + list(sample.output_ids)
        logits, selected = brute_force(qwen3_model, tokens, len(prompt), schedule)
        # decode steps feed positions len(prompt) .. len(tokens) - 2
        positions = range(len(prompt), len(tokens) - 1)
        for (layer, position), pages in selected.items():
            if position in positions:
                assert log[(index, layer, position)] == pages, (index, layer, position)
                compared += 1
        # the engine's full distributions equal the loop reference's, position by position
        want = torch.log_softmax(logits[len(prompt) - 1 : len(tokens) - 1], dim=-1)
        got = torch.tensor(sample.topk_logprobs)
        got_ids = torch.tensor(sample.topk_ids)
        torch.testing.assert_close(got, want.gather(1, got_ids), atol=1e-4, rtol=0)
        # pages read per step: min(pages cached, top-k + reserved); prefill reads them all
        for step, budget in enumerate(sample.pages_read):
            cached = len(prompt) + step
            pages = -(-cached // 4)
            expect = pages if step == 0 else min(pages, schedule.topk_for_position(cached - 1) + 2)
            assert budget == expect
            if step and schedule.is_sparse_layer(1):
                recorded = log[(index, 1, cached - 1)]
                assert all(len(head) == budget for head in recorded)
    assert compared >= 40 * (2 - len(skip_layers))


def test_sampling_seeds(qwen3_model):
    def sample(seed, n=1):
        engine = Engine(
            qwen3_model, config=EngineConfig(page_size=4, num_pages=64), schedule=tight()
        )
        params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=seed, n=n)
        return [s.output_ids for s in engine.generate([PROMPTS[0]], params)[0]]

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)
    three = sample(3, n=3)
    assert three[0] == sample(3)[0] and len(set(three)) == 3


def test_schedule_page_size_must_match_the_cache(qwen3_model):
    with pytest.raises(EngineError, match="page_size 4 but the engine's KV pages hold 16"):
        Engine(qwen3_model, config=EngineConfig(num_pages=8), schedule=tight())
