"""Named schedules: the reference schedules of the Sparrow method and the embedded defaults.

    from sparrow.sparse.presets import PRESETS, get_preset
    get_preset("qwen3-1.7b-0.86").budget_tokens(10_000)   # bin 5: (157 + 1 + 2) * 16 = 2560

The reference schedules (docs/method.md, "Schedules and page selection") list top-k pages per 2,000-token bin
for Qwen3 thinking models, page size 16, with 1 leading and 2 trailing pages always read and
layers 0 and 1 dense; the number after the model in the name is the per-bin p5 acceptance
target the schedule was calibrated for. The "tiny-*" presets are starting points for the
project's tiny CPU model (sparrow/assets/tiny-qwen3), whose pointer_chase sequences are
about 250 tokens: pages of 8 tokens, bins of 64. On the embedded model tiny-0.86 reads about
19 of up to 31 pages per step, and the first train step's reward under it equals dense
decoding's (0.438; docs/schedules.md). Calibration replaces them. See docs/schedules.md; `sparrow schedule list` prints them.
"""

from __future__ import annotations

from sparrow.sparse.schedule import Schedule, ScheduleError

# top-k pages per bin, copied from the method's table (20 bins each)
_REFERENCE_TOPK: dict[str, str] = {
    "qwen3-1.7b-0.75": "29 29 45 45 61 61 77 77 93 93 93 93 93 93 93 93 93 93 93 93",
    "qwen3-1.7b-0.80": "29 45 61 77 93 93 125 125 125 157 157 157 157 157 157 157 157 157 157 157",
    "qwen3-1.7b-0.83": "29 61 77 93 125 125 157 157 189 189 189 189 189 189 189 189 189 189 189 189",
    "qwen3-1.7b-0.86": "29 61 93 93 125 157 189 221 221 253 253 253 253 253 253 253 253 253 253 253",
    "qwen3-1.7b-0.88": "45 77 125 157 157 189 221 253 253 317 317 317 317 317 317 317 317 317 317 317",
    "qwen3-1.7b-0.90": "45 93 157 189 221 253 317 317 381 381 381 381 381 381 381 381 381 381 381 381",
    "qwen3-1.7b-0.92": "61 125 189 221 253 317 381 381 445 509 509 509 509 509 509 509 509 509 509 509",
    "qwen3-1.7b-0.94": "77 157 221 317 381 445 509 509 637 765 765 765 765 765 765 765 765 765 765 765",
    "qwen3-4b-0.75": "29 29 29 29 45 61 77 93 125 125 125 125 157 157 157 157 157 157 189 189",
    "qwen3-4b-0.80": "29 29 45 61 77 93 125 157 157 157 189 221 221 221 221 221 221 221 221 221",
    "qwen3-4b-0.86": "29 45 61 77 93 125 157 221 253 253 317 317 317 317 381 381 381 381 509 509",
    "qwen3-4b-0.88": "29 61 93 125 157 189 253 317 381 445 445 509 509 509 637 637 637 637 637 637",
    "qwen3-4b-0.90": "45 77 125 157 189 253 317 445 637 765 765 765 765 765 765 893 893 893 893 893",
    "qwen3-4b-0.92": (
        "45 93 157 189 253 381 445 765 893 1021 1021 1149 1149 1149 1149 1149 1149 1149 1149 1149"
    ),
    "qwen3-8b-0.75": "29 29 29 45 45 77 77 77 93 93 93 93 125 125 125 125 125 125 157 157",
    "qwen3-8b-0.80": "29 29 45 61 77 93 125 125 157 157 189 189 189 221 221 221 221 253 253 253",
    # 385 in bin 17 is as published (the other entries are 16k + 13 pages)
    "qwen3-8b-0.86": "29 45 61 77 125 157 189 253 253 253 253 317 317 317 317 317 317 385 445 445",
    "qwen3-8b-0.87": "29 61 77 93 157 189 221 317 317 317 317 381 381 381 381 381 445 445 509 509",
    "qwen3-8b-0.92": (
        "45 93 125 189 253 445 509 637 765 765 765 893 893 893 893 893 1021 1021 1021 1021"
    ),
    "qwen3-14b-0.86": (
        "29 45 77 125 253 381 381 381 381 381 381 381 381 381 381 509 637 637 893 893"
    ),
}


def _reference(name: str, topk_pages: str) -> Schedule:
    model, target = name.rsplit("-", 1)
    return Schedule(
        name=name,
        topk_pages=tuple(int(pages) for pages in topk_pages.split()),
        page_size=16,
        bin_tokens=2000,
        reserved_bos=1,
        reserved_eos=2,
        skip_layers=(0, 1),
        target=float(target),
        description=f"reference schedule for {model}, per-bin p5 target {target} (Sparrow paper)",
    )


def _tiny() -> list[Schedule]:
    common = dict(page_size=8, bin_tokens=64, reserved_bos=1, reserved_eos=2, skip_layers=(0,))
    return [
        Schedule(
            name="tiny-0.86",
            topk_pages=(4, 8, 16, 16, 20, 24, 28, 32),
            target=0.86,
            description="embedded default for the tiny CPU model (starting point before calibration)",
            **common,
        ),
        Schedule(
            name="tiny-0.80",
            topk_pages=(4, 6, 10, 12, 14, 16, 18, 20),
            target=0.80,
            description="cheaper schedule for the tiny CPU model",
            **common,
        ),
    ]


PRESETS: dict[str, Schedule] = {
    **{name: _reference(name, topk_pages) for name, topk_pages in _REFERENCE_TOPK.items()},
    **{s.name: s for s in _tiny()},
}


def get_preset(name: str) -> Schedule:
    """The preset called `name`; an unknown name is a ScheduleError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ScheduleError(
            f"unknown schedule preset {name!r}; known presets: {', '.join(PRESETS)}"
        ) from None
