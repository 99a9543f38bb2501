"""Split count, pages per iteration and pipeline stages of the paged decode attention, with
the split merge in the same launch: dense and sparse at the 0.86 preset's budget.

    python3 benchmarks/attention_splits.py --out attention_splits.json    # on a GPU
    python3 benchmarks/attention_splits.py --smoke                        # any device

Round 9's question: with fewer splits (1, 2 or 4 per sequence and KV head) the last split to
finish can merge them in the same launch (fuse_combine=True), which takes the combine
kernel out of every layer; does any such launch match the default (8 splits at batch 16,
then combine_splits)? Qwen3-1.7B heads, batch 16 at 4K-32K and batch 64 at 32K; every
output is compared with the default's (max abs difference) so a wrong variant shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention import HEADS, PAGE, centroids_of, make_layer  # noqa: E402
from benchmarks.common import (device_facts, target_case_args, time_graph,  # noqa: E402
                               write_json)
from sparrow_core.kernels.page_topk import select_page_lists  # noqa: E402
from sparrow_core.kernels.paged_decode import (paged_decode_attention,  # noqa: E402
                                               sparse_paged_decode_attention)
from sparrow_core.sparse.presets import get_preset  # noqa: E402


def launches(smoke: bool) -> dict[str, dict]:
    rows = {"default": {}}
    for splits in ((1, 2) if smoke else (1, 2, 4)):
        for stages in ((2,) if smoke else (2, 3, 4)):
            for per_block in ((2,) if smoke else (4, 8)):
                rows[f"splits{splits}_stages{stages}_pages{per_block}_fused"] = dict(
                    num_splits=splits, num_stages=stages, pages_per_block=per_block,
                    fuse_combine=True)
    return rows


def timed(fn, want, variants, reps) -> dict:
    out = {}
    for name, launch in variants.items():
        try:
            err = float((fn(**launch).float() - want.float()).abs().max())
            out[name] = dict(us=time_graph(lambda: fn(**launch), reps=reps), max_abs_diff=err)
        except Exception as error:  # e.g. a launch over the shared-memory limit
            out[name] = dict(error=f"{type(error).__name__}: {error}"[:200])
    return out


def one_case(batch, context, device, smoke, reps) -> dict:
    schedule = get_preset("qwen3-1.7b-0.86")
    layer = make_layer(batch, *HEADS["qwen3-1.7b"], context, torch.bfloat16, device)
    q, kp, vp, tables, lengths = (layer[n] for n in ("q", "k_pages", "v_pages", "tables",
                                                       "lengths"))
    topk = torch.full((batch,), schedule.topk_for_position(context - 1), dtype=torch.int32,
                      device=device)
    lists, counts, _ = select_page_lists(q, centroids_of(layer), tables, lengths, topk, PAGE,
                                         schedule.reserved_bos, schedule.reserved_eos)
    sparse = lambda **kw: sparse_paged_decode_attention(q, kp, vp, tables, lengths, lists,
                                                        counts, **kw)
    dense = lambda **kw: paged_decode_attention(q, kp, vp, tables, lengths, **kw)
    row = dict(batch=batch, context=context, topk=int(topk[0]),
               sparse=timed(sparse, sparse(), launches(smoke), reps))
    if smoke or context in (4096, 32768):
        row["dense"] = timed(dense, dense(), launches(smoke), reps)
    return row


def main(argv=None) -> int:
    args, device, _, _ = target_case_args(__doc__.splitlines()[0], argv)
    cases = ([(2, 256)] if args.smoke else
             [(16, 32768), (16, 16384), (16, 8192), (16, 4096), (64, 32768)])
    write_json(args.out, dict(benchmark="attention-splits", facts=device_facts(),
                              cases=[one_case(b, c, device, args.smoke, 3 if args.smoke else 20)
                                     for b, c in cases]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
