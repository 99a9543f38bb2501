"""Probes of the sparse decode stage (scoring + top-k + attention) at the target case
(Qwen3-1.7B heads, batch 16, 32K context, the 0.86 preset's budget), all in one process.

    python3 benchmarks/sparse_stage.py --out sparse_stage.json    # on a GPU
    python3 benchmarks/sparse_stage.py --smoke                    # tiny shapes, any device

What it times, each against the default launch measured in the same run:
- scoring launches (pages per iteration, blocks per program, warps, pipeline stages) and
  top-k launches (bins per pass, warps); every variant's output is checked against the
  default's (scores: max abs difference; lists: equal);
- the top-k alone (topk_alone_us, also under --quick);
- float8 page centroids (EngineConfig.centroid_dtype; the same q, pages and budget): the
  stage and scoring alone beside the bf16 ones, whether the page lists equal the bf16
  centroids' and the fraction of pages both select (fp8_centroids, also under --quick);
- layout probes that change what the attention reads, not how: K and V of one head's page
  side by side ([P, Hkv, 2, page, D], 8 KiB contiguous per selected page and head, through
  strided views), every KV head given the same page list (the 8 heads of a page read
  together, as the dense kernel does), and scoring through an identity page table (each
  sequence's centroids contiguous);
- the whole stage with the default and with the fastest scoring and top-k launches, and
  the default after a writing L2 flush, with a warm L2 (benchmarks/common.py), and with
  programmatic dependent launch (kernels/runtime.py);
- the stage's parts alone: the sparse attention (split-K combine included), and dense
  attention over every page, beside torch SDPA (stage_parts_us, also under --quick);
- FlashInfer dense and sparse attention alone when importable (benchmarks/peers.py).

`--quick` skips the launch sweeps and probes (scoring / top-k sweeps, layouts, flush and PDL
variants) and times only the stages, the top-k alone, float8 centroids, the attention
alone, SDPA and FlashInfer.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention import HEADS, PAGE, centroids_of, lists_equal, make_layer, page_overlap  # noqa: E402
from benchmarks.common import copy_bandwidth, device_facts, target_case_args, time_graph, write_json  # noqa: E402
from benchmarks.peers import flashinfer_cases  # noqa: E402
from sparrow.kernels.page_scores import page_scores  # noqa: E402
from sparrow.kernels.page_topk import page_topk  # noqa: E402
from sparrow.kernels.paged_decode import paged_decode_attention, sparse_paged_decode_attention
from sparrow.kernels.runtime import programmatic_launch  # noqa: E402
from sparrow.sparse.presets import get_preset  # noqa: E402


def scoring_launches(smoke: bool) -> list[dict]:
    if smoke:
        return [{}, dict(block_pages=2, blocks_per_program=2, num_stages=2)]
    rows = [{}]
    for block, per_program, warps, stages in itertools.product(
        (8, 16, 32), (1, 4, 16), (4, 8), (1, 3)
    ):
        rows.append(
            dict(
                block_pages=block,
                blocks_per_program=per_program,
                num_warps=warps,
                num_stages=stages,
            )
        )
    return rows


def topk_launches(smoke: bool) -> list[dict]:
    """The digit search by bins per pass and warps."""
    if smoke:
        return [{}, dict(radix_bits=4, num_warps=4)]
    return [{}] + [
        dict(radix_bits=r, num_warps=w) for r, w in itertools.product((4, 8), (4, 8, 16, 32))
    ]


def sweep(fn_of, launches, compare, reps):
    """Time fn_of(launch)() for every launch; compare(out) says how far it is from the
    default's output."""
    rows = []
    for launch in launches:
        fn = fn_of(launch)
        try:
            rows.append(
                dict(
                    launch=launch or "default",
                    us=time_graph(fn, reps=reps),
                    differs_from_default=compare(fn()),
                )
            )
        except Exception as error:  # e.g. a launch over the shared-memory limit
            rows.append(dict(launch=launch, error=f"{type(error).__name__}: {error}"[:200]))
    return rows


def with_pdl(fn, reps):
    """fn timed with programmatic dependent launch on (captured that way). It is on by
    default, so this equals the plain figure; it differs under another default."""
    with programmatic_launch(True):
        return time_graph(fn, reps=reps)


def interleaved_pages(layer):
    """The same K/V values in [P, Hkv, 2, page, D]: k and v as strided views."""
    kp, vp = layer["k_pages"], layer["v_pages"]
    both = torch.empty(kp.shape[0], kp.shape[1], 2, *kp.shape[2:], dtype=kp.dtype, device=kp.device)
    both[:, :, 0].copy_(kp)
    both[:, :, 1].copy_(vp)
    return both[:, :, 0], both[:, :, 1]


def main(argv=None) -> int:
    args, device, batch, context = target_case_args(
        __doc__.splitlines()[0], argv, flags=(("--quick", "skip the launch sweeps and probes"),)
    )
    model = "qwen3-1.7b"
    reps = 3 if args.smoke else 25
    hq, hkv = HEADS[model]
    schedule = get_preset(f"{model}-0.86")
    bos, eos = schedule.reserved_bos, schedule.reserved_eos
    topk = torch.full(
        (batch,), schedule.topk_for_position(context - 1), dtype=torch.int32, device=device
    )
    copy = copy_bandwidth(0.0625 if args.smoke else 2.0)
    layer = make_layer(batch, hq, hkv, context, torch.bfloat16, device)
    q, kp, vp, tables, lengths = (
        layer[n] for n in ("q", "k_pages", "v_pages", "tables", "lengths")
    )
    centroids = centroids_of(layer)
    scores = page_scores(q, centroids, tables, lengths, PAGE)
    lists, counts, _ = page_topk(scores, lengths, topk, PAGE, bos, eos)
    result = dict(
        benchmark="sparse-stage",
        facts=device_facts(),
        copy_bandwidth=copy,
        case=dict(
            model=model,
            batch=batch,
            context=context,
            topk=int(topk[0]),
            pages_read_mean=float(counts.float().mean()),
        ),
    )
    max_diff = lambda want: lambda got: float((got - want).abs().nan_to_num(0).max())

    def lists_differ(got):
        got_lists, got_counts = got[0], got[1]
        listed = torch.arange(lists.shape[-1], device=device) < counts.unsqueeze(-1)
        return bool((got_counts != counts).any() or (got_lists != lists)[listed].any())

    sdpa = lambda: F.scaled_dot_product_attention(
        q.unsqueeze(2), layer["k"], layer["v"], enable_gqa=True
    )

    def stage(score_launch, topk_launch, k=kp, v=vp, cents=centroids, **attention_launch):
        def run():
            s = page_scores(q, cents, tables, lengths, PAGE, **score_launch)
            l, c, _ = page_topk(s, lengths, topk, PAGE, bos, eos, **topk_launch)
            return sparse_paged_decode_attention(q, k, v, tables, lengths, l, c, **attention_launch)

        return run

    best = lambda rows: next(
        (
            r["launch"]
            for r in sorted(
                (r for r in rows if "us" in r and not r["differs_from_default"]),
                key=lambda r: r["us"],
            )
            if r["launch"] != "default"
        ),
        {},
    )
    default_stage = time_graph(stage({}, {}), reps=reps)
    # the top-k alone, also under --quick
    result["topk_alone_us"] = time_graph(
        lambda: page_topk(scores, lengths, topk, PAGE, bos, eos), reps=reps
    )
    # float8 centroids: the same means rounded to one byte each, also under --quick
    fp8 = centroids_of(layer, torch.float8_e4m3fn)
    fp8_lists = page_topk(page_scores(q, fp8, tables, lengths, PAGE), lengths, topk, PAGE, bos, eos)
    fp8_stage = time_graph(stage({}, {}, cents=fp8), reps=reps)
    result["fp8_centroids"] = {
        "stage_us": fp8_stage,
        "stage_bf16_us": default_stage,
        "scores_alone_us": time_graph(
            lambda: page_scores(q, fp8, tables, lengths, PAGE), reps=reps
        ),
        "scores_alone_bf16_us": time_graph(
            lambda: page_scores(q, centroids, tables, lengths, PAGE), reps=reps
        ),
        "lists_equal_bf16": lists_equal(fp8_lists, (lists, counts)),
        "page_overlap_with_bf16": page_overlap(fp8_lists, (lists, counts)),
    }
    result["stage_parts_us"] = {
        "stage": default_stage,
        "attention_alone": time_graph(
            lambda: sparse_paged_decode_attention(q, kp, vp, tables, lengths, lists, counts),
            reps=reps,
        ),
        "dense_attention": time_graph(
            lambda: paged_decode_attention(q, kp, vp, tables, lengths), reps=reps
        ),
        "sdpa_dense": time_graph(sdpa, reps=reps),
    }
    result["fp8_centroids"]["sdpa_over_stage"] = result["stage_parts_us"]["sdpa_dense"] / fp8_stage
    if args.quick:
        ours_sparse = sparse_paged_decode_attention(q, kp, vp, tables, lengths, lists, counts)
        dense_out = paged_decode_attention(q, kp, vp, tables, lengths)
        result.update(flashinfer_cases(layer, lists, counts, dense_out, ours_sparse))
        write_json(args.out, result)
        return 0
    # scoring and top-k launches
    result["scores"] = sweep(
        lambda launch: lambda: page_scores(q, centroids, tables, lengths, PAGE, **launch),
        scoring_launches(args.smoke),
        max_diff(scores),
        reps,
    )
    result["topk"] = sweep(
        lambda launch: lambda: page_topk(scores, lengths, topk, PAGE, bos, eos, **launch),
        topk_launches(args.smoke),
        lists_differ,
        reps,
    )
    # layout probes
    sparse = lambda k, v, l=lists, c=counts: (
        lambda: sparse_paged_decode_attention(q, k, v, tables, lengths, l, c)
    )
    ours_sparse = sparse(kp, vp)()
    k_int, v_int = interleaved_pages(layer)
    shared_lists = lists[:, :1].expand_as(lists).contiguous()
    shared_counts = counts[:, :1].expand_as(counts).contiguous()
    identity = torch.arange(tables.numel(), device=device, dtype=torch.int32).view_as(tables)
    ordered_centroids = centroids[tables.long().flatten()]
    probes = {
        "attention_default": sparse(kp, vp),
        "attention_kv_interleaved": sparse(k_int, v_int),
        "attention_same_list_every_head": sparse(kp, vp, shared_lists, shared_counts),
        "scores_default": lambda: page_scores(q, centroids, tables, lengths, PAGE),
        "scores_centroids_in_sequence_order": lambda: page_scores(
            q, ordered_centroids, identity, lengths, PAGE
        ),
        "dense_attention": lambda: paged_decode_attention(q, kp, vp, tables, lengths),
        "dense_attention_kv_interleaved": lambda: paged_decode_attention(
            q, k_int, v_int, tables, lengths
        ),
        "sdpa_dense": sdpa,
    }
    result["probes_us"] = {name: time_graph(fn, reps=reps) for name, fn in probes.items()}
    for name in ("attention_default", "scores_default", "dense_attention", "sdpa_dense"):
        result["probes_us"][name + "_after_writing_flush"] = time_graph(
            probes[name], reps=reps, flush="write"
        )
    for name in ("attention_default", "dense_attention"):
        result["probes_us"][name + "_with_programmatic_launch"] = with_pdl(probes[name], reps)
    result["interleaved_max_abs_diff"] = float(
        (probes["attention_kv_interleaved"]().float() - ours_sparse.float()).abs().max()
    )
    # the whole stage, default and best launches
    best_scores, best_topk = best(result["scores"]), best(result["topk"])
    result["stage_us"] = {
        "default": time_graph(stage({}, {}), reps=reps),
        "default_after_writing_flush": time_graph(stage({}, {}), reps=reps, flush="write"),
        "default_warm_l2": time_graph(stage({}, {}), reps=reps, flush=False),
        "default_with_programmatic_launch": with_pdl(stage({}, {}), reps),
        "best_launches": time_graph(stage(best_scores, best_topk), reps=reps),
        "best_launches_kv_interleaved": time_graph(
            stage(best_scores, best_topk, k_int, v_int), reps=reps
        ),
        "best_scores": best_scores,
        "best_topk": best_topk,
    }
    sdpa = result["probes_us"]["sdpa_dense"]
    result["sdpa_over_stage"] = {
        k: sdpa / v for k, v in result["stage_us"].items() if isinstance(v, float)
    }
    dense_out = probes["dense_attention"]()
    result.update(flashinfer_cases(layer, lists, counts, dense_out, ours_sparse))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
