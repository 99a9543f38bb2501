"""An early close (sparrow/engine/close.py): the call stops after the first step at which
enough groups have every sample finished; the others come back open with the tokens they
had, each a prefix of what the uncut call gives it; overlap does not change the cut; every
page is freed; an open sample resumes from its prompt and tokens as a new request."""

import pytest

from sparrow.engine.close import EarlyClose, groups_to_close
from sparrow.engine.config import EngineConfig
from sparrow.engine.engine import Engine
from sparrow.engine.sampler import SamplingParams
from sparrow.engine.sequence import OPEN
from tests.engine.test_engine_overlap import STOPS, prompts

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = {"page_size": 4, "num_pages": 96, "max_batch_size": 8}


def engine(model, overlap=True):
    return Engine(model, config=EngineConfig(overlap=overlap, **CONFIG))


def finished_at(group):
    """The step count at which every sample of the group had finished."""
    return max(len(s.output_ids) for s in group)


def test_groups_to_close_rounds_up_without_float_noise():
    assert [groups_to_close(f, 10) for f in (0.05, 0.3, 0.5, 1.0)] == [1, 3, 5, 10]
    assert groups_to_close(0.5, 3) == 2


def test_the_call_closes_once_enough_groups_finished(qwen3_model):
    batch = prompts(4, seed=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=STOPS, seed=11, n=2)
    full = engine(qwen3_model).generate(batch, params)
    ends = sorted(finished_at(group) for group in full)
    assert ends[1] < ends[-1], "the test needs a length spread"
    close = EarlyClose(labels=(0, 1, 2, 3), groups=2)
    cuts = []
    for overlap in (False, True):
        cut_engine = engine(qwen3_model, overlap)
        cut = cut_engine.generate(batch, params, close=close)
        assert cut_engine.block_manager.num_free == CONFIG["num_pages"]
        closed = [all(s.finish_reason != OPEN for s in group) for group in cut]
        assert sum(closed) >= 2
        for group, whole in zip(cut, full):
            for sample, reference in zip(group, whole):
                n = len(sample.output_ids)
                # the cut comes at the second group's last step: no sample runs past it
                assert n <= ends[1]
                assert sample.output_ids == reference.output_ids[:n]
                assert sample.logprobs == reference.logprobs[:n]
                if sample.finish_reason == OPEN:
                    assert n == ends[1] and reference.finish_reason != OPEN
                else:
                    assert sample.finish_reason == reference.finish_reason
        cuts.append([[s.to_dict() for s in g] for g in cut])
    assert cuts[0] == cuts[1]  # overlap launches steps ahead: the cut is the same


def test_a_required_group_holds_the_close_until_it_finished(qwen3_model):
    batch = prompts(4, seed=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=STOPS, seed=11, n=2)
    full = engine(qwen3_model).generate(batch, params)
    slowest = max(range(4), key=lambda i: finished_at(full[i]))
    close = EarlyClose(labels=(0, 1, 2, 3), groups=1, required=frozenset({slowest}))
    cut = engine(qwen3_model).generate(batch, params, close=close)
    assert all(s.finish_reason != OPEN for s in cut[slowest])
    assert [[s.to_dict() for s in g] for g in cut] == [[s.to_dict() for s in g] for g in full]


def test_an_open_sample_resumes_from_its_tokens(qwen3_model):
    batch = prompts(2, seed=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=STOPS, seed=11)
    cut = engine(qwen3_model).generate(batch, params, close=EarlyClose(labels=(0, 1), groups=1))
    [open_sample] = [g[0] for g in cut if g[0].finish_reason == OPEN]
    prefix = batch[open_sample.prompt_index] + list(open_sample.output_ids)
    rest = SamplingParams(
        temperature=1.0,
        max_new_tokens=40 - len(open_sample.output_ids),
        stop_token_ids=STOPS,
        seed=12,
    )
    [[resumed]] = engine(qwen3_model).generate([prefix], rest)
    assert resumed.finish_reason in ("stop", "length") and len(resumed.output_ids) >= 1
    assert len(open_sample.output_ids) + len(resumed.output_ids) <= 40


def test_a_close_refuses_a_feed(qwen3_model):
    from sparrow.engine.config import EngineError

    with pytest.raises(EngineError, match="early close"):
        engine(qwen3_model).generate([], [], feed=object(), close=EarlyClose((0,), 1))
