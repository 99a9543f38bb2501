"""Continuous batching: more prompts than slots, shared prefill for n samples, page release,
and requests that can never fit."""

import pytest
import torch

from sparrow.engine.config import EngineConfig, EngineError
from sparrow.engine.engine import Engine
from sparrow.engine.sampler import SamplingParams
from sparrow.engine.teacher.forced import teacher_forced_logits
from sparrow.sparse.schedule import Schedule

pytestmark = pytest.mark.usefixtures("single_thread")

SCHEDULE = Schedule(
    "tight", (1, 2), page_size=4, bin_tokens=16, reserved_bos=1, reserved_eos=1, skip_layers=(0,)
)


def prompts(count=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (int(n),), generator=gen).tolist()
        for n in torch.randint(1, 14, (count,), generator=gen)
    ]


@pytest.mark.parametrize("schedule", [None, SCHEDULE], ids=["dense", "sparse"])
def test_more_prompts_than_slots_equals_one_at_a_time(qwen3_model, schedule):
    batch = prompts()
    # varied lengths so that sequences finish at different steps and slots turn over
    params = [SamplingParams(temperature=0, max_new_tokens=6 + 3 * i) for i in range(len(batch))]
    engine = Engine(
        qwen3_model,
        config=EngineConfig(page_size=4, num_pages=48, max_batch_size=3),
        schedule=schedule,
    )
    together = engine.generate(batch, params)
    assert engine.block_manager.num_free == 48
    for prompt, p, [sample] in zip(batch, params, together):
        [[alone]] = engine.generate([prompt], p)
        assert sample.output_ids == alone.output_ids
        torch.testing.assert_close(
            torch.tensor(sample.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0
        )
        assert sample.pages_read == alone.pages_read


def test_n_samples_share_the_prefill_and_free_every_page(qwen3_model):
    batch = prompts(4, seed=1) + [[9, 8, 7, 6, 5, 4, 3, 2]]  # the last one is page-aligned
    params = SamplingParams(temperature=1.0, max_new_tokens=12, n=3, seed=11)
    engine = Engine(
        qwen3_model,
        config=EngineConfig(page_size=4, num_pages=64, max_batch_size=6),
        schedule=SCHEDULE,
    )
    results = engine.generate(batch, params)
    assert engine.block_manager.num_free == 64
    assert all(engine.block_manager.refcount(p) == 0 for p in range(64))
    for prompt, samples in zip(batch, results):
        assert [s.sample_index for s in samples] == [0, 1, 2]
        # each sample's logprobs (temperature 1, no truncation: the model's own distribution)
        # equal a teacher-forced replay of its tokens: its shared and copied pages held the
        # right keys and values
        sequences = [prompt + list(s.output_ids) for s in samples]
        replay = teacher_forced_logits(qwen3_model, sequences, [len(prompt)] * 3, SCHEDULE)
        for sample, logits in zip(samples, replay):
            steps = len(sample.output_ids)
            rows = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + steps], dim=-1)
            want = rows.gather(1, torch.tensor(sample.output_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(sample.logprobs), want, atol=1e-4, rtol=0)
    # a seeded group draws the same samples alone as beside the others
    alone = engine.generate([batch[2]], params)[0]
    assert [s.output_ids for s in alone] == [s.output_ids for s in results[2]]


def test_greedy_samples_of_one_prompt_agree(qwen3_model):
    engine = Engine(
        qwen3_model,
        config=EngineConfig(page_size=4, num_pages=40, max_batch_size=4),
        schedule=SCHEDULE,
    )
    [group] = engine.generate(
        [[3, 1, 4, 1, 5, 9]], SamplingParams(temperature=0, max_new_tokens=20, n=4)
    )
    [[single]] = engine.generate(
        [[3, 1, 4, 1, 5, 9]], SamplingParams(temperature=0, max_new_tokens=20)
    )
    assert all(s.output_ids == single.output_ids for s in group)
    assert engine.block_manager.num_free == 40


def test_waiting_for_pages_gives_the_same_results(qwen3_model):
    # 20 pages: each request needs ceil((10 + 16 - 1) / 4) = 7, so at most two run at once
    batch = [list(range(10 + i, 20 + i)) for i in range(5)]
    params = SamplingParams(temperature=0, max_new_tokens=16)
    small = Engine(qwen3_model, config=EngineConfig(page_size=4, num_pages=20))
    large = Engine(qwen3_model, config=EngineConfig(page_size=4, num_pages=200))
    in_use = []
    allocate = small.block_manager.allocate

    def spy():
        page = allocate()
        in_use.append(20 - small.block_manager.num_free)
        return page

    small.block_manager.allocate = spy
    got = small.generate(batch, params)
    want = large.generate(batch, params)
    assert [s[0].output_ids for s in got] == [s[0].output_ids for s in want]
    # two requests ran at once (more than one worst case in use), never a third
    assert 7 < max(in_use) <= 14
    assert small.block_manager.num_free == 20


def test_requests_that_can_never_fit_are_refused_with_numbers(qwen3_model):
    engine = Engine(
        qwen3_model,
        config=EngineConfig(page_size=4, num_pages=10, max_batch_size=4, max_context=64),
    )
    with pytest.raises(
        EngineError,
        match=r"prompt 1 can never fit: 2 sample\(s\) of 10 prompt "
        r"\+ 20 new tokens need 14 KV pages of 4 tokens, "
        r"the cache holds 10",
    ):
        engine.generate([[1], list(range(10))], SamplingParams(max_new_tokens=20, n=2))
    with pytest.raises(
        EngineError,
        match="60 prompt tokens \\+ max_new_tokens 5 = 65 exceed the context of 64 tokens",
    ):
        engine.generate([[1] * 60], SamplingParams(max_new_tokens=5))
    with pytest.raises(EngineError, match="n=5 samples but .* max_batch_size=4"):
        engine.generate([[1]], SamplingParams(max_new_tokens=2, n=5))
    with pytest.raises(EngineError, match="prompt 0 is empty"):
        engine.generate([[]], SamplingParams(max_new_tokens=2))
    with pytest.raises(EngineError, match=r"outside \[0, 384\): \[384\]"):
        engine.generate([[1, 384]], SamplingParams(max_new_tokens=2))
    with pytest.raises(EngineError, match="got 1 SamplingParams for 2 prompts"):
        engine.generate([[1], [2]], [SamplingParams(max_new_tokens=2)])
    assert engine.block_manager.num_free == 10


class Feed:
    """A feed over (label, prompt, params) requests; `later` answers "none now" that many
    times first; `taken` records each request with the engine's decode steps so far."""

    def __init__(self, engine, requests, later=0):
        self.engine, self.requests, self.later = engine, list(requests), later
        self.taken, self.fulls = [], 0

    def take(self):
        if self.later:
            self.later -= 1
            return ()
        if not self.requests:
            return None
        request = self.requests.pop(0)
        self.taken.append((request[0], self.engine.stats["decode_steps"]))
        return request

    def full(self):
        self.fulls += 1


@pytest.mark.parametrize("overlap", [True, False])
def test_requests_pulled_from_a_feed_while_it_runs_give_the_same_samples(qwen3_model, overlap):
    """A feed hands requests one at a time; the engine takes them whenever its batch has room
    (at the start and as samples stop), labels them as the feed does, and its samples equal
    those of one call holding every request."""
    batch = prompts(7, seed=3)
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=4 + 3 * i, n=2, seed=40 + i, logprobs_topk=3)
        for i in range(len(batch))
    ]
    engine = Engine(
        qwen3_model,
        config=EngineConfig(page_size=4, num_pages=64, max_batch_size=5, overlap=overlap),
        schedule=SCHEDULE,
    )
    want = engine.generate(batch, params)
    order = [4, 0, 6, 2, 1, 5, 3]  # labels need not come in order
    # "none now" three times first: with nothing to run the engine asks again
    feed = Feed(engine, [(i, batch[i], params[i]) for i in order], later=3)
    got = engine.generate([], [], feed=feed)
    assert [label for label, _ in feed.taken] == order and feed.later == 0
    # two requests (4 samples) filled the batch of 5 at the start (the engine said it was
    # full); the rest came as samples stopped, after decoding had begun
    steps = [s for _, s in feed.taken]
    assert steps[:2] == [0, 0] and all(s > 0 for s in steps[2:]) and feed.fulls >= 1
    assert engine.block_manager.num_free == 64
    for label, samples in zip(order, got):
        assert [s.prompt_index for s in samples] == [label, label]
        for a, b in zip(samples, want[label]):
            assert a.output_ids == b.output_ids and a.pages_read == b.pages_read
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0
            )
    # a request the engine can never hold is refused with the feed's label
    with pytest.raises(EngineError, match="prompt 9: 2 prompt tokens"):
        engine.generate(
            [], [], feed=Feed(engine, [(9, [1, 2], SamplingParams(max_new_tokens=10**4))])
        )
    assert engine.block_manager.num_free == 64
