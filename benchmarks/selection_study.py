"""The offline page-selection study (issue 36, item 2): chase sequences of a model replayed
teacher-forced under every page-scoring rule x a fine grid of top-k budgets, one device, no RL.

    python benchmarks/selection_study.py --model /tmp/tb-v2 \
        --task builtin:multi_chase:num_defs=256,num_hops=63,chains=4,tags=0 --prompts 32 \
        --sequences sampled --page-sizes 16,8 --out results/selection_v2.json --plot sel.png
    python benchmarks/selection_study.py --smoke --out /tmp/sel.json   # CPU, seconds

Sequences (--sequences): `reference`, each prompt's reference completion (chase_completion,
eos last), or `sampled`, the model's own samples at temperature 1 from the project's engine
(dense decode); the references are then replayed too, for the accuracy estimate only. Each
sequence is run densely once and then under a flat schedule (the --schedule template at each
page size: reserved pages and dense layers as there; one bin of k top-k pages) of each rule x
budget; the grid is --budgets below the widest sequence's eligible page count, plus that count
("all": every page, so acceptance and recall are 1 there). Per cell a row (docs/selection.md,
"The offline study", explains the columns): acceptance by token role (mean, p5, p1, share
below 0.5; lookup bounds from a cluster bootstrap over sequences), key-page recall, pages read,
the sparse actor's step-0 accuracy estimate on the references, and the cost model's predicted
cost with the rule's scoring bytes. Beside the rows, the retrieval-head ranking: per (layer,
KV head) the dense attention mass on the lookups' key pages. Output: the JSON (--out, also
printed), a CSV of the rows beside it (same stem), and with --plot a figure of lookup
acceptance against pages read per rule. --smoke: the embedded tiny model (trained on
pointer_chase, whose lookups carry over to one multi_chase chain), 16 names x 8 hops,
2 prompts, page sizes 8 and 4, budgets 2, 8 and all.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_facts, write_json  # noqa: E402
from sparrow.control.calibration import flat_schedule, model_shape  # noqa: E402
from sparrow.costmodel.presets import get_hardware  # noqa: E402
from sparrow.data.datasets import synthetic_spec  # noqa: E402
from sparrow.data.multi_chase import MultiChaseTask  # noqa: E402
from sparrow.experiments.testbed import selection_summary as summary  # noqa: E402
from sparrow.experiments.testbed.data import derived_seed, held_out_examples  # noqa: E402
from sparrow.experiments.testbed.selection_replay import (  # noqa: E402
    dense_pass,
    reference_sequence,
    sampled_sequence,
    sparse_pass,
)
from sparrow.sparse.presets import get_preset  # noqa: E402
from sparrow.sparse.scoring import SCORING_RULES  # noqa: E402

EMBEDDED = Path(__file__).resolve().parents[1] / "sparrow" / "assets" / "tiny-qwen3"
GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
SMOKE = dict(
    model=str(EMBEDDED),
    task="builtin:multi_chase:num_defs=16,num_hops=8,chains=1,tags=0",
    prompts=2,
    schedule="tiny-0.86",
    page_sizes="8,4",
    budgets="2,8",
)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model folder (transformers Qwen3 with tokenizer.json)")
    p.add_argument("--task", default="builtin:multi_chase:num_defs=256,num_hops=63,chains=4")
    p.add_argument("--prompts", type=int, default=16, help="held-out prompts")
    p.add_argument("--seed", type=int, default=0, help="held-out stream and sampling seed")
    p.add_argument("--sequences", choices=("reference", "sampled"), default="reference")
    p.add_argument("--samples", type=int, default=1, help="samples per prompt (sampled)")
    p.add_argument("--rules", default=",".join(SCORING_RULES.names()))
    p.add_argument("--budgets", default=",".join(map(str, GRID)), help="top-k pages")
    p.add_argument("--page-sizes", default="16,8")
    p.add_argument("--schedule", default="qwen3-1.7b-0.86", help="template schedule preset")
    p.add_argument("--centroid-dtype", default="cache", help="EngineConfig.centroid_dtype")
    p.add_argument("--hardware", default="h100", help="cost model hardware preset")
    p.add_argument("--batch-sequences", type=int, default=8, help="sequences per forward")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="the JSON; the CSV goes beside it")
    p.add_argument(
        "--plot",
        default=None,
        help="PNG: lookup acceptance and the accuracy estimate vs pages read",
    )
    p.add_argument("--smoke", action="store_true", help="embedded tiny model, CPU seconds")
    p.add_argument(
        "--reprice",
        default=None,
        help="a study JSON: recompute its cost columns with today's cost model (no replay)",
    )
    args = p.parse_args(argv)
    given = {a.lstrip("-").replace("-", "_").split("=")[0] for a in argv or sys.argv[1:]}
    for key, value in (SMOKE if args.smoke else {}).items():
        if key not in given:  # a flag on the command line wins over --smoke's
            setattr(args, key, value)
    if not args.model:
        p.error("--model is required (or --smoke)")
    return args


def prompts_of(args) -> tuple[list, dict]:
    task, sizes = synthetic_spec(args.task)
    if task != "multi_chase":
        raise SystemExit(f"the study reads chase lookups: need builtin:multi_chase, got {task}")
    full = {**vars(MultiChaseTask()), **sizes}
    examples = held_out_examples(
        full["num_defs"], full["num_hops"], args.prompts, args.seed, "held-out",
        full["chains"], full["tags"],
    )  # fmt: skip
    return examples, full


def build_sequences(args, model, tokenizer, examples) -> list:
    refs = [
        reference_sequence(e.prompt, tokenizer, j, completion=e.completion)
        for j, e in enumerate(examples)
    ]
    if args.sequences == "reference":
        return refs
    from sparrow.engine import EngineConfig, SamplingParams
    from sparrow.engine.engine import Engine

    longest = max(len(s.ids) for s in refs) + 8
    count = len(examples) * args.samples
    config = EngineConfig(max_batch_size=count, num_pages=count * (longest // 16 + 2),
                          max_context=longest, seed=args.seed)  # fmt: skip
    params = [
        SamplingParams(
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            n=args.samples,
            logprobs_topk=1,
            max_new_tokens=longest - s.prompt_len,
            seed=derived_seed(args.seed, "selection-study", j),
        )
        for j, s in enumerate(refs)
    ]
    results = Engine(model, tokenizer, config).generate(
        [list(s.ids[: s.prompt_len]) for s in refs], params
    )
    sampled = [
        sampled_sequence(e.prompt, tokenizer, sample.output_ids, j)
        for j, (e, group) in enumerate(zip(examples, results))
        for sample in group
        if sample.output_ids
    ]
    return sampled + [reference_sequence(e.prompt, tokenizer, j, False, e.completion)
                      for j, e in enumerate(examples)]  # fmt: skip


def grids(args, template, seqs) -> dict[int, tuple[list[int], int]]:
    """page size -> (budgets, the "all" budget: every eligible page of the widest sequence)."""
    longest = max(len(s.ids) for s in seqs)
    out = {}
    for size in (int(x) for x in args.page_sizes.split(",")):
        schedule = template.at_page_size(size)
        every = max(1, -(-longest // size) - schedule.reserved_pages())
        budgets = sorted({int(b) for b in args.budgets.split(",") if 0 < int(b) < every})
        out[size] = (budgets + [every], every)
    return out


def cell_schedule(template, page_size: int, rule: str, topk: int):
    """The template at the page size, one bin of `topk` pages, scored by `rule`."""
    return dataclasses.replace(
        flat_schedule(template.at_page_size(page_size), topk), selection=rule
    )


def run(args) -> dict:
    from sparrow.model import load_model, load_tokenizer

    started = time.monotonic()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = load_model(args.model, dtype=dtype, device=device).eval()
    tokenizer = load_tokenizer(args.model)
    examples, sizes = prompts_of(args)
    seqs = build_sequences(args, model, tokenizer, examples)
    template = get_preset(args.schedule)
    page_grids = grids(args, template, seqs)
    rules = args.rules.split(",")
    cells: dict[tuple, list] = {}
    dense_logps, key_mass, lookups = [], {}, 0
    for first in range(0, len(seqs), args.batch_sequences):
        batch = seqs[first : first + args.batch_sequences]
        dense = dense_pass(model, batch, list(page_grids))
        dense_logps += dense.logps
        lookups += dense.lookups
        for size, mass in dense.key_mass.items():
            key_mass[size] = key_mass.get(size, 0) + mass
        for size, (budgets, _) in page_grids.items():
            for rule in rules:
                for topk in budgets:
                    schedule = cell_schedule(template, size, rule, topk)
                    tokens = sparse_pass(model, batch, schedule, dense.logits, args.centroid_dtype)
                    cells.setdefault((size, rule, topk), []).extend(tokens)
        print(f"replayed {first + len(batch)}/{len(seqs)} sequences", flush=True)
    newline = tokenizer.encode("\n")[0]
    shape, hardware = model_shape(args.model), get_hardware(args.hardware)
    measured = [s for s in seqs if s.measured]
    prompt_len = int(statistics.median(s.prompt_len for s in measured))
    gen_len = int(statistics.median(len(s.ids) - s.prompt_len for s in measured))
    rankings = {size: summary.head_ranking(v, lookups, template) for size, v in key_mass.items()}
    rows = []
    for (size, rule, topk), tokens in cells.items():
        schedule = cell_schedule(template, size, rule, topk)
        row = {"page_size": size, "rule": rule, "topk_pages": topk,
               "all_pages": topk == page_grids[size][1]}  # fmt: skip
        top = summary.top_sparse_head(rankings[size], template)
        row.update(summary.cell_row(seqs, tokens, top))
        logps = [t.logps for t in tokens]
        row["accuracy_estimate"] = summary.accuracy_estimate(seqs, logps, newline, sizes["chains"])
        row.update(summary.predicted_cost(shape, hardware, schedule, prompt_len, gen_len))
        rows.append(
            {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
        )
    dense_accuracy = summary.accuracy_estimate(seqs, dense_logps, newline, sizes["chains"])
    return dict(
        benchmark="selection_study",
        facts=device_facts(),
        args=vars(args),
        task_sizes=sizes,
        sequences=len(measured),
        tokens=sum(len(s.roles) for s in measured),
        prompt_len_median=prompt_len,
        generated_median=gen_len,
        dense_accuracy_estimate=dense_accuracy,
        budgets={str(k): v[0] for k, v in page_grids.items()},
        rows=rows,
        head_ranking={
            str(k): summary.head_ranking(v, lookups, template) for k, v in key_mass.items()
        },
        seconds=round(time.monotonic() - started, 1),
    )


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(path: str, rows: list[dict]) -> None:
    """Against pages read, a line per rule, a column per page size: lookup acceptance (mean
    solid, p5 dashed) on top, the step-0 accuracy estimate below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["page_size"] for r in rows}, reverse=True)
    figure, axes = plt.subplots(2, len(sizes), figsize=(5 * len(sizes), 7.5), squeeze=False)
    for column, size in enumerate(sizes):
        top, bottom = axes[0][column], axes[1][column]
        for index, rule in enumerate(dict.fromkeys(r["rule"] for r in rows)):
            cell = sorted((r for r in rows if r["rule"] == rule and r["page_size"] == size),
                          key=lambda r: r["pages_read_share"])  # fmt: skip
            x = [r["pages_read_share"] for r in cell]
            color = f"C{index}"
            top.plot(x, [r["acceptance_lookup_mean"] for r in cell], "-o", ms=3, color=color,
                     label=rule)  # fmt: skip
            top.plot(x, [r["acceptance_lookup_p5"] for r in cell], "--", color=color)
            bottom.plot(x, [r["accuracy_estimate"] for r in cell], "-o", ms=3, color=color)
        top.set(xscale="log", ylim=(0, 1.02), title=f"pages of {size} tokens",
                ylabel="lookup acceptance")  # fmt: skip
        bottom.set(xscale="log", ylim=(0, 1.02), xlabel="pages read (share of dense)",
                   ylabel="step-0 accuracy estimate")  # fmt: skip
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    axes[0][0].legend(title="mean (solid), p5 (dashed)", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def reprice(path: str, model: str) -> dict:
    """The cost columns of a study's JSON (and its CSV) again from the cost model, which is
    arithmetic on the schedule, the checkpoint's shape and the median lengths: no replay."""
    result = json.loads(Path(path).read_text())
    args = result["args"]
    template = get_preset(args["schedule"])
    shape, hardware = model_shape(model), get_hardware(args["hardware"])
    for row in result["rows"]:
        schedule = cell_schedule(template, row["page_size"], row["rule"], row["topk_pages"])
        row.update(
            summary.predicted_cost(
                shape, hardware, schedule, result["prompt_len_median"], result["generated_median"]
            )
        )
    result["repriced"] = {"date": time.strftime("%Y-%m-%d"), "model": model}
    write_json(path, result, quiet=True)
    write_csv(Path(path).with_suffix(".csv"), result["rows"])
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reprice:
        result = reprice(args.reprice, args.model)
        print(f"repriced {args.reprice} and {Path(args.reprice).with_suffix('.csv')}")
        if args.plot:
            plot(args.plot, result["rows"])
        return 0
    result = run(args)
    write_json(args.out, result, quiet=args.out is not None)
    if args.out:
        write_csv(Path(args.out).with_suffix(".csv"), result["rows"])
        print(f"wrote {args.out} and {Path(args.out).with_suffix('.csv')}")
    if args.plot:
        plot(args.plot, result["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
