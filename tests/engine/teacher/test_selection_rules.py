"""Every page-scoring rule: teacher-forced selection equals the decode path's, page for page
(both replay backends); dense heads read every page; the oracle replays but never decodes."""

import dataclasses

import pytest
import torch

from sparrow.engine.config import EngineConfig, EngineError
from sparrow.engine.engine import Engine
from sparrow.engine.kv_cache import bytes_per_page
from sparrow.engine.sampler import SamplingParams
from sparrow.engine.teacher.forced import teacher_forced_logits
from sparrow.kernels.runtime import cpu_interpreter
from sparrow.sparse.schedule import Schedule

pytestmark = pytest.mark.usefixtures("single_thread")

SCHEDULE = Schedule(
    "tight", (1, 2, 3), page_size=4, bin_tokens=16, reserved_bos=1, reserved_eos=1, skip_layers=()
)
PROMPTS = [[1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]


def decode_picks(model, schedule):
    """Greedy generation with the selection recorded: the sequences and
    {(prompt, layer, position): pages per KV head}."""
    config = EngineConfig(page_size=4, num_pages=64, record_selection=True)
    engine = Engine(model, config=config, schedule=schedule)
    results = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=30))
    picks = {(r.prompt_index, r.layer, r.position): r.pages for r in engine.selection_log}
    return [p + list(r[0].output_ids) for p, r in zip(PROMPTS, results)], picks, engine


def replay_picks(model, sequences, schedule, backend):
    picks = {}

    def keep(layer, index, pages):
        for position in range(len(PROMPTS[index]), pages.shape[0]):
            picks[(index, layer, position)] = tuple(
                tuple(torch.nonzero(head).flatten().tolist()) for head in pages[position]
            )

    with torch.no_grad(), cpu_interpreter():
        teacher_forced_logits(
            model,
            sequences,
            [len(p) for p in PROMPTS],
            schedule,
            query_chunk=7,
            on_selection=keep,
            backend=backend,
        )
    return picks


@pytest.mark.parametrize(
    "selection,dense_heads",
    [
        ("centroid", ()),
        ("centroid_maxhead", ()),
        ("quest", ()),
        ("quest_maxhead", ()),
        ("centroid", ((1, 0),)),
    ],
)
def test_teacher_forced_selection_equals_decode_selection(qwen3_model, selection, dense_heads):
    schedule = dataclasses.replace(SCHEDULE, selection=selection, dense_heads=dense_heads)
    sequences, decoded, engine = decode_picks(qwen3_model, schedule)
    assert (engine.cache.bounds is not None) == selection.startswith("quest")
    # the decode's last token is sampled, never fed: positions up to len - 2 were decoded
    assert len(decoded) > 40
    for backend in ("reference", "triton"):
        replayed = replay_picks(qwen3_model, sequences, schedule, backend)
        for key, pages in decoded.items():
            assert replayed[key] == pages, (backend, key)
    for (_, layer, position), pages in decoded.items():
        for head in schedule.dense_heads_of(layer):
            assert pages[head] == tuple(range(position // 4 + 1))


def test_rules_choose_differently_on_the_same_tokens(qwen3_model):
    """The rules are not one rule under other names: replayed on the same sequences, each
    pair of decoding rules disagrees somewhere."""
    sequences, _, _ = decode_picks(qwen3_model, SCHEDULE)
    picks = {
        name: replay_picks(
            qwen3_model, sequences, dataclasses.replace(SCHEDULE, selection=name), "reference"
        )
        for name in ("centroid", "centroid_maxhead", "quest", "quest_maxhead", "oracle")
    }
    names = list(picks)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert picks[a] != picks[b], (a, b)


def test_oracle_replays_but_is_refused_in_decode(qwen3_model):
    oracle = dataclasses.replace(SCHEDULE, selection="oracle")
    with pytest.raises(EngineError, match="oracle.*teacher-forced replay only"):
        Engine(qwen3_model, config=EngineConfig(page_size=4, num_pages=64), schedule=oracle)
    sequences, _, _ = decode_picks(qwen3_model, SCHEDULE)
    reference = replay_picks(qwen3_model, sequences, oracle, "reference")
    assert replay_picks(qwen3_model, sequences, oracle, "triton") == reference


def test_quest_cache_keeps_bounds_and_accounts_for_them(qwen3_model):
    arch = qwen3_model.arch
    plain = bytes_per_page(arch, 4, torch.float32)
    with_bounds = bytes_per_page(arch, 4, torch.float32, bounds=True)
    assert with_bounds - plain == arch.num_layers * arch.num_kv_heads * arch.head_dim * 2 * 4
    engine = Engine(qwen3_model, config=EngineConfig(page_size=4, num_pages=64), schedule=SCHEDULE)
    assert engine.cache.bounds is None
    engine.set_schedule(dataclasses.replace(SCHEDULE, selection="quest"))
    assert engine.cache.bounds is not None
    results = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=12))
    assert len(results[0][0].output_ids) == 12
