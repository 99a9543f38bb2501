"""EngineConfig.centroid_dtype: float8 page centroids in the engine's cache, counted in its
memory, and the decode path and the teacher-forced replay selecting the same pages with
them (as they do with the cache dtype)."""

from types import SimpleNamespace

import pytest
import torch

from sparrow.config.schema import CHOICES, RolloutConfig
from sparrow.engine.config import CENTROID_DTYPES, EngineConfig, EngineError
from sparrow.engine.engine import Engine
from sparrow.engine.kv_cache import KVCache, bytes_per_page, centroid_torch_dtype, pages_for_budget
from sparrow.engine.sampler import SamplingParams
from sparrow.engine.teacher.forced import teacher_forced_logits
from sparrow.sparse.schedule import Schedule

pytestmark = pytest.mark.usefixtures("single_thread")

F8 = torch.float8_e4m3fn
SCHEDULE = Schedule(
    "tight", (1, 2, 3), page_size=4, bin_tokens=16, reserved_bos=1, reserved_eos=1, skip_layers=()
)
PROMPTS = [[1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [7, 7]]


def test_config_refuses_an_unknown_centroid_dtype():
    assert EngineConfig().centroid_dtype == "cache"
    with pytest.raises(
        EngineError,
        match=r"EngineConfig\.centroid_dtype must be one of "
        r"cache, float8_e4m3fn, got 'fp8'",
    ):
        EngineConfig(centroid_dtype="fp8")
    with pytest.raises(EngineError, match="centroid_dtype"):
        EngineConfig(centroid_dtype="bfloat16")
    # the configuration schema offers the same values, and from_rollout passes them on
    assert CHOICES["rollout.centroid_dtype"] == CENTROID_DTYPES
    rollout = RolloutConfig(centroid_dtype="float8_e4m3fn")
    assert EngineConfig.from_rollout(rollout).centroid_dtype == "float8_e4m3fn"
    assert centroid_torch_dtype("cache", torch.bfloat16) == torch.bfloat16
    assert centroid_torch_dtype("float8_e4m3fn", torch.bfloat16) == F8


def test_update_centroids_stores_the_float32_mean_rounded_once_to_float8():
    arch = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=8)
    cache = KVCache.allocate(
        arch, num_pages=5, page_size=4, dtype=torch.float32, device="cpu", centroid_dtype=F8
    )
    gen = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen) * 3)
    # page 2: every key 1.0625 + 2^-10, which rounds to 1.125 in float8 directly but to 1.0
    # through bf16 (1.0625, a tie, to even)
    cache.k[1, 2] = 1.0625 + 2**-10
    cache.update_centroids(1, torch.tensor([3, 0, 2]))
    # by hand: float32 sums over the page's 4 keys, / 4, then one rounding
    for page in (0, 2, 3):
        keys = cache.k[1, page]  # [Hkv, page_size, D]
        mean = (keys[:, 0] + keys[:, 1] + keys[:, 2] + keys[:, 3]) / 4
        want = mean.to(F8).view(torch.uint8)
        assert torch.equal(cache.centroids[1, page].view(torch.uint8), want)
    assert torch.all(cache.centroids[1, 2].float() == 1.125)
    untouched = cache.centroids.view(torch.uint8)
    assert not untouched[0].any() and not untouched[1, [1, 4]].any()


def test_float8_centroids_cost_one_byte_per_element():
    arch = SimpleNamespace(num_layers=3, num_kv_heads=2, head_dim=64)
    per_element = 3 * 2 * 64
    assert bytes_per_page(arch, 16, torch.bfloat16) == per_element * (2 * 16 * 2 + 2)
    assert bytes_per_page(arch, 16, torch.bfloat16, F8) == per_element * (2 * 16 * 2 + 1)
    assert bytes_per_page(arch, 16, torch.float32, F8) == per_element * (2 * 16 * 4 + 1)
    mib = 1.0
    assert pages_for_budget(arch, 16, torch.bfloat16, mib, F8) == 2**20 // (per_element * 65)
    assert pages_for_budget(arch, 16, torch.bfloat16, mib, F8) > pages_for_budget(
        arch, 16, torch.bfloat16, mib
    )


def selections(model, centroid_dtype):
    """(decode log, teacher-forced picks, sequences): the pages read by every sparse layer at
    every generated position, by the engine and by the teacher-forced replay."""
    config = EngineConfig(
        page_size=4, num_pages=64, record_selection=True, centroid_dtype=centroid_dtype
    )
    engine = Engine(model, config=config, schedule=SCHEDULE)
    results = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=36))
    assert engine.cache.centroids.dtype == (F8 if centroid_dtype != "cache" else torch.float32)
    decoded = {(r.prompt_index, r.layer, r.position): r.pages for r in engine.selection_log}
    sequences = [p + list(r[0].output_ids) for p, r in zip(PROMPTS, results)]
    replayed = {}

    def record(layer, index, mask):
        for position in range(len(PROMPTS[index]), mask.shape[0]):
            replayed[(index, layer, position)] = tuple(
                tuple(torch.nonzero(head).flatten().tolist()) for head in mask[position]
            )

    with torch.no_grad():
        teacher_forced_logits(
            model,
            sequences,
            [len(p) for p in PROMPTS],
            SCHEDULE,
            on_selection=record,
            centroid_dtype=centroid_dtype,
        )
    return decoded, replayed


@pytest.mark.parametrize("centroid_dtype", ["cache", "float8_e4m3fn"])
def test_decode_and_teacher_forced_select_the_same_pages(qwen3_model, centroid_dtype):
    decoded, replayed = selections(qwen3_model, centroid_dtype)
    # decode steps feed positions prompt_len .. length - 2; the replay has one more
    assert len(decoded) > 150
    for key, pages in decoded.items():
        assert replayed[key] == pages, key


def test_float8_centroids_change_some_selections(qwen3_model):
    """The option is in effect: replayed with float8 centroids, some positions of the same
    sequences pick other pages than with the cache dtype."""
    config = EngineConfig(page_size=4, num_pages=64)
    engine = Engine(qwen3_model, config=config, schedule=SCHEDULE)
    results = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=60))
    sequences = [p + list(r[0].output_ids) for p, r in zip(PROMPTS, results)]
    picks = {}
    for centroid_dtype in CENTROID_DTYPES:
        masks = []
        with torch.no_grad():
            teacher_forced_logits(
                qwen3_model,
                sequences,
                [len(p) for p in PROMPTS],
                SCHEDULE,
                on_selection=lambda layer, index, mask: masks.append(mask),
                centroid_dtype=centroid_dtype,
            )
        picks[centroid_dtype] = torch.cat([m.flatten() for m in masks])
    changed = (picks["cache"] != picks["float8_e4m3fn"]).sum()
    assert 0 < changed < 0.2 * picks["cache"].sum()


def test_teacher_forced_refuses_an_unknown_centroid_dtype(qwen3_model):
    with pytest.raises(EngineError, match="centroid_dtype must be one of"):
        teacher_forced_logits(
            qwen3_model, [[1, 2, 3, 4, 5]], [2], SCHEDULE, centroid_dtype="float8"
        )
