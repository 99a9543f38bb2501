"""Benchmark (a): one decode attention layer, ours against torch SDPA (and FlashInfer when
importable), with bytes moved against the copy bandwidth measured in the same process.

    python benchmarks/attention.py --out attention.json           # on a GPU
    python benchmarks/attention.py --smoke                        # tiny shapes, any device

Per model head shape (Qwen3-1.7B: 16 query / 8 KV heads; Qwen3-4B: 32 / 8; head dim 128,
bf16, 16-token head-major pages scattered through the cache), batch 16 and 64, context 4K-32K (every
sequence full): our dense split-K kernel; our sparse step (scoring + selection + attention,
budget of the model's 0.86 preset at that context); top-k alone (by 4-bit digits, the
default, and by 1-bit digits) and selection alone; the sparse step, selection and
scoring again with float8 centroids (EngineConfig.centroid_dtype; the same q, pages and
budget: `ours_*_fp8_centroids`), with whether their page lists equal the bf16 centroids' and
the fraction of pages both select (fp8_centroids_lists_equal, fp8_centroids_page_overlap);
our sparse attention alone over the same pages; torch SDPA dense over contiguous K/V
(enable_gqa); FlashInfer dense and sparse attention alone over the same cache pages when it
imports (benchmarks/peers.py). Each figure is the median of CUDA-graph replays after an L2
flush. Also: a launch-configuration sweep at the target case (1.7B heads, batch 16, 32K).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import copy_bandwidth, device_facts, fill_random_, time_graph, write_json  # noqa: E402
from benchmarks.peers import flashinfer_cases  # noqa: E402
from sparrow.kernels.kv_write import round_centroids  # noqa: E402
from sparrow.kernels.page_scores import page_scores  # noqa: E402
from sparrow.kernels.page_topk import page_topk, select_page_lists  # noqa: E402
from sparrow.kernels.paged_decode import paged_decode_attention, sparse_paged_decode_attention
from sparrow.sparse.presets import get_preset  # noqa: E402

HEADS = {"qwen3-1.7b": (16, 8), "qwen3-4b": (32, 8)}
PAGE, DIM = 16, 128


def make_layer(batch, hq, hkv, context, dtype, device, seed=0):
    """Contiguous K/V for SDPA and the same values scattered into random cache pages."""
    width = -(-context // PAGE)
    k = fill_random_(torch.empty(batch, hkv, width * PAGE, DIM, dtype=dtype, device=device), seed)
    v = fill_random_(torch.empty_like(k), seed + 1)
    q = fill_random_(torch.empty(batch, hq, DIM, dtype=dtype, device=device), seed + 2)
    pages = batch * width
    perm = torch.randperm(pages, device=device, generator=torch.Generator(device).manual_seed(seed))
    tables = perm.view(batch, width).int()
    k_pages = torch.empty(pages, hkv, PAGE, DIM, dtype=dtype, device=device)  # head-major
    v_pages = torch.empty_like(k_pages)
    for b in range(batch):  # row by row: no full-size temporary
        k_pages[tables[b].long()] = k[b].view(hkv, width, PAGE, DIM).transpose(0, 1)
        v_pages[tables[b].long()] = v[b].view(hkv, width, PAGE, DIM).transpose(0, 1)
    lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
    return dict(
        q=q,
        k=k[:, :, :context],
        v=v[:, :, :context],
        k_pages=k_pages,
        v_pages=v_pages,
        tables=tables,
        lengths=lengths,
    )


def centroids_of(layer, dtype=None):
    """Mean key of every page rounded once to `dtype` (None: the cache dtype), as KVCache
    stores them, in chunks: no full-size float32 copy of the keys."""
    pages = layer["k_pages"]
    out = torch.empty(
        pages.shape[0],
        pages.shape[1],
        pages.shape[3],
        dtype=dtype or pages.dtype,
        device=pages.device,
    )
    for i in range(0, pages.shape[0], 16384):
        out[i : i + 16384] = round_centroids(pages[i : i + 16384].float().mean(dim=2), out.dtype)
    return out


def lists_equal(got, want) -> bool:
    """Whether two selections list the same pages (entries past a row's count are free)."""
    (lists, counts), (want_lists, want_counts) = got[:2], want[:2]
    listed = torch.arange(lists.shape[-1], device=lists.device) < counts.unsqueeze(-1)
    return bool(
        torch.equal(counts, want_counts)
        and torch.equal(torch.where(listed, lists, 0), torch.where(listed, want_lists, 0))
    )


def page_overlap(got, want) -> float:
    """Of each (sequence, KV head) row's pages in `want`, the fraction `got` lists too, averaged
    over rows (1.0 when the selections agree)."""

    def mask(lists, counts):
        width = lists.shape[-1]
        listed = torch.arange(width, device=lists.device) < counts.unsqueeze(-1)
        index = torch.where(listed, lists.long(), width)  # unlisted entries: a spare column
        out = torch.zeros(*lists.shape[:-1], width + 1, dtype=torch.bool, device=lists.device)
        return out.scatter_(-1, index, torch.ones_like(index, dtype=torch.bool))[..., :width]

    shared = (mask(*got[:2]) & mask(*want[:2])).sum(-1)
    return float((shared / want[1].clamp(min=1)).mean())


def float8_rows(us, moved, fp8_lists, lists, counts) -> dict:
    """The float8-centroid figures beside the bf16 ones: bytes, speedup against SDPA (as
    sparse_speedup_vs_sdpa), and how its selection compares with the bf16 centroids'."""
    moved["ours_selection_only_fp8_centroids"] = moved["ours_selection_only"] // 2
    moved["ours_sparse_fp8_centroids"] = (
        moved["ours_sparse_attention_only"] + moved["ours_selection_only_fp8_centroids"]
    )
    return dict(
        sparse_fp8_centroids_speedup_vs_sdpa=us["sdpa_dense"] / us["ours_sparse_fp8_centroids"],
        fp8_centroids_over_bf16_sparse=us["ours_sparse_fp8_centroids"] / us["ours_sparse"],
        fp8_centroids_lists_equal=lists_equal(fp8_lists, (lists, counts)),
        fp8_centroids_page_overlap=page_overlap(fp8_lists, (lists, counts)),
    )


def relative_error(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm())


def one_case(model, batch, context, bandwidth, device):
    hq, hkv = HEADS[model]
    schedule = get_preset(f"{model}-0.86")
    topk = schedule.topk_for_position(context - 1)
    layer = make_layer(batch, hq, hkv, context, torch.bfloat16, device)
    q, kp, vp, tables, lengths = (
        layer[n] for n in ("q", "k_pages", "v_pages", "tables", "lengths")
    )
    centroids = centroids_of(layer)
    fp8 = centroids_of(layer, torch.float8_e4m3fn)  # the same means, one byte each
    topk_t = torch.full((batch,), topk, dtype=torch.int32, device=device)
    select = lambda cents=centroids: select_page_lists(
        q, cents, tables, lengths, topk_t, PAGE, schedule.reserved_bos, schedule.reserved_eos
    )
    lists, counts, _ = select()
    scores = page_scores(q, centroids, tables, lengths, PAGE)
    topk_only = lambda: page_topk(
        scores, lengths, topk_t, PAGE, schedule.reserved_bos, schedule.reserved_eos
    )
    sparse = lambda: sparse_paged_decode_attention(q, kp, vp, tables, lengths, *select()[:2])
    methods = {
        "ours_dense": lambda: paged_decode_attention(q, kp, vp, tables, lengths),
        "ours_sparse": sparse,
        "ours_sparse_attention_only": lambda: sparse_paged_decode_attention(
            q, kp, vp, tables, lengths, lists, counts
        ),
        "ours_selection_only": select,
        "ours_scores_only": lambda: page_scores(q, centroids, tables, lengths, PAGE),
        "ours_topk_only": topk_only,
        "ours_topk_only_radix1": lambda: page_topk(
            scores,
            lengths,
            topk_t,
            PAGE,
            schedule.reserved_bos,
            schedule.reserved_eos,
            radix_bits=1,
        ),
        "ours_sparse_fp8_centroids": lambda: sparse_paged_decode_attention(
            q, kp, vp, tables, lengths, *select(cents=fp8)[:2]
        ),
        "ours_selection_only_fp8_centroids": lambda: select(cents=fp8),
        "ours_scores_only_fp8_centroids": lambda: page_scores(q, fp8, tables, lengths, PAGE),
        "sdpa_dense": lambda: F.scaled_dot_product_attention(
            q.unsqueeze(2), layer["k"], layer["v"], enable_gqa=True
        ),
    }
    us = {name: time_graph(fn) for name, fn in methods.items()}
    n_pages = -(-context // PAGE)
    read = int(counts.float().mean().item())
    kv_page = PAGE * DIM * 2 * 2  # K and V of one page and head, bf16
    moved = {
        "ours_dense": batch * hkv * n_pages * kv_page,
        "sdpa_dense": batch * hkv * context * DIM * 4,
        "ours_sparse_attention_only": batch * hkv * read * kv_page,
        "ours_selection_only": batch * hkv * n_pages * DIM * 2,
    }  # bf16 centroids
    moved["ours_sparse"] = moved["ours_sparse_attention_only"] + moved["ours_selection_only"]
    float8 = float8_rows(us, moved, select(cents=fp8), lists, counts)
    dense_out = methods["ours_dense"]()
    sdpa_out = methods["sdpa_dense"]().squeeze(2)
    row = dict(
        model=model,
        batch=batch,
        context=context,
        topk=topk,
        pages_read=read,
        us=us,
        bytes=moved,
        bandwidth_fraction={k: moved[k] / (us[k] * 1e-6) / bandwidth for k in moved},
        dense_vs_sdpa_rel_error=relative_error(dense_out, sdpa_out),
        sparse_speedup_vs_sdpa=us["sdpa_dense"] / us["ours_sparse"],
        dense_ratio_vs_sdpa=us["ours_dense"] / us["sdpa_dense"],
        **float8,
    )
    row.update(
        flashinfer_cases(layer, lists, counts, dense_out, methods["ours_sparse_attention_only"]())
    )
    return row, layer


def sweep(layer, device):
    """Launch configurations of the dense and sparse-attention kernels at one case."""
    q, kp, vp, tables, lengths = (
        layer[n] for n in ("q", "k_pages", "v_pages", "tables", "lengths")
    )
    configs = [
        dict(num_splits=s, pages_per_block=p, num_warps=4, num_stages=2)
        for s in (4, 8, 16, 32)
        for p in (2, 4, 8)
    ]
    configs += [
        dict(num_splits=8, pages_per_block=4, num_warps=w, num_stages=st)
        for w, st in ((2, 2), (4, 3), (4, 4), (8, 2), (8, 3))
    ]
    rows = []
    for config in configs:
        fn = lambda: paged_decode_attention(q, kp, vp, tables, lengths, **config)
        rows.append(dict(config, us=time_graph(fn, reps=15)))
    return sorted(rows, key=lambda r: r["us"])


def sweep_sparse(layer, lists, counts, centroids):
    """Launch configurations of the sparse attention and the scoring kernels at one case."""
    q, kp, vp, tables, lengths = (
        layer[n] for n in ("q", "k_pages", "v_pages", "tables", "lengths")
    )
    attention = [
        dict(num_splits=s, pages_per_block=p, num_warps=w, num_stages=st)
        for s, p, w, st in (
            (8, 4, 4, 2),
            (8, 4, 4, 3),
            (8, 4, 4, 4),
            (8, 2, 4, 3),
            (8, 8, 4, 3),
            (8, 4, 8, 3),
            (16, 4, 4, 3),
            (16, 2, 4, 3),
            (32, 2, 4, 3),
            (4, 4, 4, 3),
            (16, 4, 4, 4),
            (32, 4, 4, 3),
        )
    ]
    rows = []
    for config in attention:
        fn = lambda: sparse_paged_decode_attention(
            q, kp, vp, tables, lengths, lists, counts, **config
        )
        rows.append(dict(config, kernel="sparse_attention", us=time_graph(fn, reps=20)))
    for block_pages in (4, 8, 16):
        for warps in (2, 4, 8):
            fn = lambda: page_scores(
                q, centroids, tables, lengths, PAGE, block_pages=block_pages, num_warps=warps
            )
            rows.append(
                dict(
                    kernel="scores",
                    block_pages=block_pages,
                    num_warps=warps,
                    us=time_graph(fn, reps=20),
                )
            )
    return sorted(rows, key=lambda r: (r["kernel"], r["us"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON here too")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (any device)")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument(
        "--sweep-only", action="store_true", help="only the configuration sweeps at the target case"
    )
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    copy = copy_bandwidth()
    bandwidth = copy["bytes_per_s"]
    batches, contexts = ((2,), (256,)) if args.smoke else ((16, 64), (4096, 8192, 16384, 32768))
    rows, target = [], None
    if args.sweep_only:
        return sweep_main(args, device)
    for model in HEADS:
        for batch in batches:
            for context in contexts:
                row, layer = one_case(model, batch, context, bandwidth, device)
                print(
                    f"{model} B={batch} ctx={context}: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in row["us"].items()),
                    flush=True,
                )
                rows.append(row)
                write_json(
                    args.out, dict(benchmark="attention", partial=True, cases=rows), quiet=True
                )
                if model == "qwen3-1.7b" and batch == batches[0] and context == contexts[-1]:
                    target = layer
                del layer
                torch.cuda.empty_cache() if device == "cuda" else None
    result = dict(benchmark="attention", facts=device_facts(), copy_bandwidth=copy, cases=rows)
    if not args.no_sweep and target is not None and not args.smoke:
        result["sweep_qwen3_1.7b_b16_32k"] = sweep(target, device)[:12]
        centroids = centroids_of(target)
        topk = torch.full((16,), 253, dtype=torch.int32, device=device)
        lists, counts, _ = select_page_lists(
            target["q"], centroids, target["tables"], target["lengths"], topk, PAGE, 1, 2
        )
        result["sweep_sparse_qwen3_1.7b_b16_32k"] = sweep_sparse(target, lists, counts, centroids)
    write_json(args.out, result)
    return 0


def sweep_main(args, device) -> int:
    layer = make_layer(16, 16, 8, 32768, torch.bfloat16, device)
    centroids = centroids_of(layer)
    topk = torch.full((16,), 253, dtype=torch.int32, device=device)
    lists, counts, _ = select_page_lists(
        layer["q"], centroids, layer["tables"], layer["lengths"], topk, PAGE, 1, 2
    )
    result = dict(
        benchmark="attention-sweep",
        facts=device_facts(),
        dense=sweep(layer, device),
        sparse=sweep_sparse(layer, lists, counts, centroids),
    )
    write_json(args.out, result)
    for row in result["dense"][:3] + result["sparse"]:
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
