import json, sys, torch
sys.path.insert(0, '.')
from benchmarks.attention import HEADS, PAGE, make_layer, centroids_of
def lists_equal(got, want):
    (lists, counts), (wl, wc) = got[:2], want[:2]
    listed = torch.arange(lists.shape[-1], device=lists.device) < counts.unsqueeze(-1)
    return bool(torch.equal(counts, wc) and torch.equal(torch.where(listed, lists, 0), torch.where(listed, wl, 0)))
from benchmarks.common import time_graph, device_facts
from sparrow_core.kernels.page_scores import page_scores
from sparrow_core.kernels.page_topk import page_topk, select_page_lists
from sparrow_core.kernels.paged_decode import sparse_paged_decode_attention
from sparrow_core.sparse.presets import get_preset
out = {"facts": device_facts(), "cases": []}
for batch, context in ((16, 32768), (16, 8192), (64, 32768)):
    model = "qwen3-1.7b"; hq, hkv = HEADS[model]
    schedule = get_preset(f"{model}-0.86"); topk = schedule.topk_for_position(context - 1)
    layer = make_layer(batch, hq, hkv, context, torch.bfloat16, "cuda")
    q, kp, vp, tables, lengths = (layer[n] for n in ("q", "k_pages", "v_pages", "tables", "lengths"))
    cent = centroids_of(layer)
    topk_t = torch.full((batch,), topk, dtype=torch.int32, device="cuda")
    scores = page_scores(q, cent, tables, lengths, PAGE)
    row = {"batch": batch, "context": context}
    sel = {}
    for search in ("radix", "value"):
        sel[search] = page_topk(scores, lengths, topk_t, PAGE, schedule.reserved_bos, schedule.reserved_eos, search=search)
        row[f"topk_{search}_us"] = time_graph(lambda: page_topk(scores, lengths, topk_t, PAGE, schedule.reserved_bos, schedule.reserved_eos, search=search))
        def stage():
            l, c, _ = select_page_lists(q, cent, tables, lengths, topk_t, PAGE, schedule.reserved_bos, schedule.reserved_eos, search=search)
            return sparse_paged_decode_attention(q, kp, vp, tables, lengths, l, c)
        row[f"stage_{search}_us"] = time_graph(stage)
    row["value_lists_equal_radix"] = lists_equal(sel["value"], sel["radix"])
    out["cases"].append(row); print(row, flush=True)
    del layer, kp, vp
json.dump(out, open(sys.argv[1], "w"), indent=1)
