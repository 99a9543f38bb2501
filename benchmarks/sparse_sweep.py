"""Round-4 sweep of the sparse paged decode attention kernel at the target case (Qwen3-1.7B
heads, batch 16, 32K context, the 0.86 preset's page budget): launch variants against the
current default launch and torch SDPA dense, all in one process.

    python3 benchmarks/sparse_sweep.py --out sparse_sweep.json    # on a GPU
    python3 benchmarks/sparse_sweep.py --smoke                    # tiny shapes, any device

Variants: page ids loaded one block ahead (prefetch_ids), pages per loop iteration, split
count, pipeline stages and warps. Every variant's output is compared with the default
launch's (max abs difference) so a fast but wrong variant shows. Times: median CUDA-graph
replays after an L2 flush (benchmarks/common.py), the split combine included.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention import HEADS, PAGE, DIM, centroids_of, make_layer  # noqa: E402
from benchmarks.common import (copy_bandwidth, device_facts, target_case_args,  # noqa: E402
                               time_graph, write_json)
from sparrow_core.kernels.page_topk import select_page_lists  # noqa: E402
from sparrow_core.kernels.paged_decode import sparse_paged_decode_attention  # noqa: E402
from sparrow_core.sparse.presets import get_preset  # noqa: E402


def variants(smoke: bool) -> list[dict]:
    """The launch configurations timed besides the default (an empty dict)."""
    if smoke:
        return [{}, dict(prefetch_ids=True, num_splits=2, pages_per_block=2)]
    rows = [{}]
    for prefetch, splits, per_block, stages in itertools.product(
            (False, True), (3, 4, 8, 16), (4, 8), (2, 3)):
        rows.append(dict(prefetch_ids=prefetch, num_splits=splits, pages_per_block=per_block,
                         num_stages=stages, num_warps=4))
    for prefetch, splits in itertools.product((False, True), (4, 8)):
        rows.append(dict(prefetch_ids=prefetch, num_splits=splits, pages_per_block=8,
                         num_stages=2, num_warps=8))
    rows += [dict(prefetch_ids=True, num_splits=6, pages_per_block=4, num_stages=3),
             dict(prefetch_ids=True, num_splits=2, pages_per_block=8, num_stages=3),
             dict(prefetch_ids=True, num_splits=8, pages_per_block=2, num_stages=4)]
    return rows


def main(argv=None) -> int:
    args, device, batch, context = target_case_args(__doc__.splitlines()[0], argv)
    model = "qwen3-1.7b"
    hq, hkv = HEADS[model]
    schedule = get_preset(f"{model}-0.86")
    topk = schedule.topk_for_position(context - 1)
    copy = copy_bandwidth(0.0625 if args.smoke else 2.0)
    layer = make_layer(batch, hq, hkv, context, torch.bfloat16, device)
    q, kp, vp, tables, lengths = (layer[n] for n in ("q", "k_pages", "v_pages", "tables",
                                                       "lengths"))
    topk_t = torch.full((batch,), topk, dtype=torch.int32, device=device)
    lists, counts, _ = select_page_lists(q, centroids_of(layer), tables, lengths, topk_t, PAGE,
                                         schedule.reserved_bos, schedule.reserved_eos)
    moved = int(counts.sum().item()) * PAGE * DIM * 2 * 2  # K and V, bf16
    sdpa_us = time_graph(lambda: F.scaled_dot_product_attention(
        q.unsqueeze(2), layer["k"], layer["v"], enable_gqa=True))
    base = sparse_paged_decode_attention(q, kp, vp, tables, lengths, lists, counts).float()
    rows = []
    for config in variants(args.smoke):
        fn = lambda: sparse_paged_decode_attention(q, kp, vp, tables, lengths, lists, counts,
                                                   **config)
        diff = float((fn().float() - base).abs().max())
        us = time_graph(fn, reps=25)
        rows.append(dict(config=config or "default", us=us, max_abs_diff_vs_default=diff,
                         bytes_per_s=moved / (us * 1e-6),
                         bandwidth_fraction=moved / (us * 1e-6) / copy["bytes_per_s"]))
        print(f"{config or 'default'}: {us:.1f} us, diff {diff:.2e}", flush=True)
    default_us = rows[0]["us"]
    rows.sort(key=lambda r: r["us"])
    result = dict(benchmark="sparse-attention-sweep", facts=device_facts(),
                  command="python3 benchmarks/sparse_sweep.py --out sparse_sweep.json",
                  case=dict(model=model, batch=batch, context=context, topk=topk,
                            pages_read_mean=float(counts.float().mean()), bytes=moved),
                  copy_bandwidth=copy, sdpa_dense_us=sdpa_us, default_us=default_us,
                  best=rows[0], sdpa_over_default=sdpa_us / default_us,
                  sdpa_over_best=sdpa_us / rows[0]["us"], variants=rows)
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
