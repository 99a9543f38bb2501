"""The sparse stage with the batch cut into staggered parts on parallel CUDA-graph branches.

    python3 benchmarks/sparse_overlap.py --out sparse_overlap.json    # on a GPU
    python3 benchmarks/sparse_overlap.py --smoke                      # tiny shapes, any device

The top-k of a full batch runs one program per (sequence, KV head) and leaves the memory
idle for its whole length (11.5 us of the 136.5 us stage at batch 16, 32K on an H100). Cut
the batch in parts, each part's scoring, top-k and attention on its own stream, and start
part i's scoring once part i-1's has ended: part i-1's top-k then runs while part i scores,
and its attention while part i selects. Timed here at Qwen3-1.7B heads, batch 16 and 64,
8K-32K, budget from the 0.86 preset: the serial stage, parts that start together, and
staggered parts (2 and 4), each checked against the serial stage's output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention import HEADS, PAGE, centroids_of, make_layer  # noqa: E402
from benchmarks.common import (copy_bandwidth, device_facts, target_case_args,  # noqa: E402
                               time_graph, write_json)
from sparrow_core.kernels.page_scores import page_scores  # noqa: E402
from sparrow_core.kernels.page_topk import page_topk  # noqa: E402
from sparrow_core.kernels.paged_decode import sparse_paged_decode_attention  # noqa: E402
from sparrow_core.sparse.presets import get_preset  # noqa: E402


def staged(layer, centroids, topk, bos, eos, parts: int, stagger: bool, streams):
    """The stage over `parts` slices of the batch; part i > 0 on streams[i - 1]."""
    q, kp, vp, tables, lengths = (layer[n] for n in ("q", "k_pages", "v_pages", "tables",
                                                       "lengths"))
    batch = q.shape[0]
    bounds = [batch * i // parts for i in range(parts + 1)]

    def part(lo, hi):
        s = page_scores(q[lo:hi], centroids, tables[lo:hi], lengths[lo:hi], PAGE)
        scored = torch.cuda.Event() if torch.cuda.is_available() else None
        if scored is not None:
            scored.record()
        lists, counts, _ = page_topk(s, lengths[lo:hi], topk[lo:hi], PAGE, bos, eos)
        out = sparse_paged_decode_attention(q[lo:hi], kp, vp, tables[lo:hi], lengths[lo:hi],
                                            lists, counts)
        return out, scored

    def run():
        if parts == 1:
            return part(0, batch)[0]
        if not torch.cuda.is_available():
            return [part(bounds[i], bounds[i + 1])[0] for i in range(parts)]
        main = torch.cuda.current_stream()
        outs, before = [], None
        for i in range(parts):
            stream = main if i == 0 else streams[i - 1]
            if i:
                stream.wait_stream(main) if not stagger else stream.wait_event(before)
            with torch.cuda.stream(stream):
                out, before = part(bounds[i], bounds[i + 1])
            outs.append(out)
        for stream in streams[:parts - 1]:
            main.wait_stream(stream)
        return outs
    return run


def one_case(batch, context, device, streams, reps):
    hq, hkv = HEADS["qwen3-1.7b"]
    schedule = get_preset("qwen3-1.7b-0.86")
    topk = torch.full((batch,), schedule.topk_for_position(context - 1), dtype=torch.int32,
                      device=device)
    layer = make_layer(batch, hq, hkv, context, torch.bfloat16, device)
    centroids = centroids_of(layer)
    args = (layer, centroids, topk, schedule.reserved_bos, schedule.reserved_eos)
    want = staged(*args, 1, False, streams)()
    row = dict(batch=batch, context=context, topk=int(topk[0]), us={}, max_abs_diff={})
    for name, parts, stagger in (("serial", 1, False), ("parts2_together", 2, False),
                                 ("parts2_staggered", 2, True), ("parts4_staggered", 4, True)):
        if parts > batch:
            continue
        fn = staged(*args, parts, stagger, streams)
        got = fn()
        got = torch.cat(got) if isinstance(got, list) else got
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        row["max_abs_diff"][name] = float((got.float() - want.float()).abs().max())
        row["us"][name] = time_graph(fn, reps=reps)
    q, kp, vp, tables, lengths = (layer[n] for n in ("q", "k_pages", "v_pages", "tables",
                                                       "lengths"))
    scores = page_scores(q, centroids, tables, lengths, PAGE)
    lists, counts, _ = page_topk(scores, lengths, topk, PAGE, *args[3:])
    row["us"]["scores_alone"] = time_graph(
        lambda: page_scores(q, centroids, tables, lengths, PAGE), reps=reps)
    row["us"]["topk_alone"] = time_graph(
        lambda: page_topk(scores, lengths, topk, PAGE, *args[3:]), reps=reps)
    row["us"]["attention_alone"] = time_graph(
        lambda: sparse_paged_decode_attention(q, kp, vp, tables, lengths, lists, counts),
        reps=reps)
    row["us"]["serial_again"] = time_graph(staged(*args, 1, False, streams), reps=reps)
    row["staggered2_over_serial"] = row["us"]["parts2_staggered"] / row["us"]["serial"]
    del layer
    return row


def main(argv=None) -> int:
    args, device, _, _ = target_case_args(__doc__.splitlines()[0], argv)
    streams = [torch.cuda.Stream() for _ in range(3)] if device == "cuda" else []
    # 32K twice: the first case of a process is timed on a cold GPU
    cases = [(2, 256)] if args.smoke else [(16, 32768), (16, 8192), (16, 16384),
                                           (16, 24576), (16, 32768), (64, 32768)]
    result = dict(benchmark="sparse-overlap", facts=device_facts(),
                  copy_bandwidth=copy_bandwidth(0.0625 if args.smoke else 2.0),
                  cases=[one_case(b, c, device, streams, 3 if args.smoke else 25)
                         for b, c in cases])
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
