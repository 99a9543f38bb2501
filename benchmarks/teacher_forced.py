"""Teacher-forced replay under one budget against a dense packed forward of the same tokens.

    python benchmarks/teacher_forced.py --out results/teacher_forced.json   # GPU, 1.7B shape
    python benchmarks/teacher_forced.py --cases 8192x16 --skip-model        # attention only
    python benchmarks/teacher_forced.py --backends triton --cases 8192x16  # one path
    python benchmarks/teacher_forced.py --smoke                             # CPU, seconds
    python benchmarks/teacher_forced.py --backward --skip-model --cases 8192x4   # with grads

Per case (T tokens per sequence x sequences; a prompt of --prompt tokens, the rest replayed
as generated), in one process, for each replay path of --backends ("triton": the kernels of
engine/teacher_kernel.py; "flex": FlexAttention over a page bitmap, engine/teacher_flex.py):
(1) the attention of one layer at Qwen3-1.7B heads (16 q / 8 kv, head dim 128, bf16, random
q, k, v): the page selection alone (<path>_selection_s), the attention alone on those pages
(triton_attention_s; Flex builds its bitmap inside its layer), the sparse replay of a layer
(<path>_layer_s: selection plus attention), and dense causal SDPA, with the sums over the
model's layers (1.7B: 2 dense skip_layers plus 26 sparse, against 28 dense); (2) the whole
model (random weights, Qwen3-1.7B shapes, model/decoder.py) as teacher_forced_hidden: the
dense forward (schedule None: SDPA per sequence) against the replay under --schedule through
each path, no grad, and their ratio (target: at most 2). Times are medians of wall-clock
runs between device syncs, after a warm-up run (which compiles FlexAttention and the Triton
kernels; its time is reported as *_first_s); peak memory per arm. --smoke runs tiny shapes
on the CPU through the same code (FlexAttention eager, the kernels' PyTorch references).
--backward adds (3): one sparse layer's forward and backward (DistillSparse's replay with
gradients) per path, against dense SDPA's, with the largest relative difference of the
paths' dq, dk, dv (<path>_fwd_bwd_layer_s, dense_fwd_bwd_layer_s, grad_rel_diff).
Imports neither ray, prefect nor omegaconf: it runs with torch, triton and transformers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_facts, write_json  # noqa: E402
from benchmarks.decode_step import model_arch, random_model  # noqa: E402
from sparrow.engine.teacher.flex import selection_rows  # noqa: E402
from sparrow.engine.teacher.forced import TeacherForcedAttention, teacher_forced_hidden
from sparrow.engine.teacher.kernel import selection_bits  # noqa: E402
from sparrow.engine.teacher.selection import select_chunks  # noqa: E402
from sparrow.kernels.prefill import prefill_attention_sdpa  # noqa: E402
from sparrow.kernels.teacher_attention import teacher_sparse_attention  # noqa: E402
from sparrow.sparse.presets import get_preset  # noqa: E402

SPARSE_LAYER = 5  # any layer outside skip_layers
# launches of the attention kernel timed beside its default (kernels/teacher_attention.py)
LAUNCHES = {
    "default": {},
    "tile_skip": {"skip_empty": True},
    "m128_n128": {"block_m": 128, "block_n": 128},
    "m64_n64": {"block_m": 64, "block_n": 64, "num_warps": 4},
    "stages2": {"num_stages": 2},
    "tile_skip_stages2": {"skip_empty": True, "num_stages": 2},
}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int) -> dict[str, float]:
    """First call (compiles) and the median of `reps` more, seconds; peak memory GiB."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps + 1):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    return {"first_s": times[0], "s": statistics.median(times[1:]), "peak_gib": peak}


def attention_case(length, count, prompt, schedule, backends, device, arch, reps):
    """One layer's attention: per path selection, attention, the layer; dense SDPA; and
    the sums over the model's layers."""
    q_heads, kv_heads, dim = arch.num_q_heads, arch.num_kv_heads, arch.head_dim
    gen = torch.Generator(device).manual_seed(0)
    total = length * count
    q, k, v = (
        torch.randn(total, h, dim, generator=gen, device=device, dtype=torch.bfloat16)
        for h in (q_heads, kv_heads, kv_heads)
    )
    lens, prompts = [length] * count, [prompt] * count
    row = {}
    with torch.no_grad():
        dense = timed(lambda: prefill_attention_sdpa(q, k, v, lens), reps)
        row["dense_layer_s"] = dense["s"]
        outputs = {}
        for backend in backends:
            row.update(_path_case(backend, q, k, v, lens, prompts, schedule, reps))
            outputs[backend] = TeacherForcedAttention(lens, prompts, schedule, backend=backend)(
                SPARSE_LAYER, q, k, v
            )
        # the paths must agree on the same inputs (bf16 rounding apart)
        names = list(outputs)
        for other in names[1:]:
            row[f"{names[0]}_vs_{other}_max_abs"] = float(
                (outputs[names[0]].float() - outputs[other].float()).abs().max()
            )
        del outputs
    dense_layers = len([i for i in schedule.skip_layers if i < arch.num_layers])
    sparse_layers = arch.num_layers - dense_layers
    row["dense_attention_all_layers_s"] = arch.num_layers * dense["s"]
    for backend in backends:
        replay = sparse_layers * row[f"{backend}_layer_s"] + dense_layers * dense["s"]
        row[f"{backend}_attention_all_layers_s"] = replay
        row[f"{backend}_attention_ratio"] = replay / row["dense_attention_all_layers_s"]
    return row


def _path_case(backend, q, k, v, lens, prompts, schedule, reps):
    """Selection alone, attention alone (triton), selection plus attention, of one path."""
    length, count, kv_heads = lens[0], len(lens), k.shape[1]
    attention = TeacherForcedAttention(lens, prompts, schedule, backend=backend)
    out = {}
    if backend == "triton":
        select = lambda: selection_bits(q, k, lens, prompts, schedule, "cache")  # noqa: E731
        bits = select()
        starts = torch.arange(count, dtype=torch.int32, device=q.device) * length
        seq_lens = torch.full((count,), length, dtype=torch.int32, device=q.device)
        variants = {}
        for name, launch in LAUNCHES.items():
            attend = timed(
                lambda: teacher_sparse_attention(
                    q, k, v, bits, starts, seq_lens, schedule.page_size, max_len=length, **launch
                ),
                reps,
            )
            variants[name] = attend["s"]
            if name == "default":
                out.update(
                    triton_attention_s=attend["s"], triton_attention_first_s=attend["first_s"]
                )
        out["triton_attention_launches_s"] = variants
        out["triton_pages_read_share"] = _share_read(bits, lens, schedule.page_size)
        del bits
    else:
        rows = selection_rows(kv_heads, length, schedule.page_size)

        def select():
            for index in range(count):
                span = slice(index * length, (index + 1) * length)
                for _ in select_chunks(q[span], k[span], prompts[index], schedule, "cache", rows):
                    pass

    selection = timed(select, reps)
    layer = timed(lambda: attention(SPARSE_LAYER, q, k, v), reps)
    out.update(
        {
            f"{backend}_selection_s": selection["s"],
            f"{backend}_layer_s": layer["s"],
            f"{backend}_layer_first_s": layer["first_s"],
            f"{backend}_layer_peak_gib": layer["peak_gib"],
        }
    )
    return out


def backward_case(length, count, prompt, schedule, backends, device, arch, reps):
    """One sparse layer's forward and backward per path, dense SDPA's, and how far apart
    the paths' gradients are."""
    gen = torch.Generator(device).manual_seed(2)
    total, lens, prompts = length * count, [length] * count, [prompt] * count
    leaves = [
        torch.randn(
            total, h, arch.head_dim, generator=gen, device=device, dtype=torch.bfloat16
        ).requires_grad_()
        for h in (arch.num_q_heads, arch.num_kv_heads, arch.num_kv_heads)
    ]
    grad_out = torch.randn(
        total, arch.num_q_heads, arch.head_dim, generator=gen, device=device, dtype=torch.bfloat16
    )

    def run(attend):
        for leaf in leaves:
            leaf.grad = None
        attend().backward(grad_out)

    row = {
        "dense_fwd_bwd_layer_s": timed(
            lambda: run(lambda: prefill_attention_sdpa(*leaves, lens)), reps
        )["s"]
    }
    grads = {}
    # torch has no FlexAttention backward on CPU (a --smoke run times the others)
    for backend in [b for b in backends if device == "cuda" or b != "flex"]:
        attention = TeacherForcedAttention(lens, prompts, schedule, backend=backend)
        result = timed(lambda: run(lambda: attention(SPARSE_LAYER, *leaves)), reps)
        row.update(
            {
                f"{backend}_fwd_bwd_layer_s": result["s"],
                f"{backend}_fwd_bwd_layer_first_s": result["first_s"],
                f"{backend}_fwd_bwd_peak_gib": result["peak_gib"],
            }
        )
        grads[backend] = [leaf.grad.float() for leaf in leaves]
    names = list(grads)
    for other in names[1:]:
        row[f"{names[0]}_vs_{other}_grad_rel_diff"] = max(
            float((a - b).norm() / b.norm()) for a, b in zip(grads[names[0]], grads[other])
        )
    return row


def _share_read(bits, lens, page_size):
    """Pages read over pages present, summed over positions and KV heads (1.0: dense)."""
    shifts = torch.arange(32, device=bits.device, dtype=torch.int32)
    read = sum(
        int(((words.unsqueeze(-1) >> shifts) & 1).sum()) for words in bits.split(4096, dim=1)
    )
    present = sum(sum(t // page_size + 1 for t in range(n)) for n in lens) * bits.shape[0]
    return read / present


def model_case(model, length, count, prompt, schedule, backends, device, vocab, reps):
    """The whole model: dense packed forward against the replay under the schedule."""
    gen = torch.Generator(device).manual_seed(1)
    sequences = [
        torch.randint(0, vocab, (length,), generator=gen, device=device) for _ in range(count)
    ]
    prompts = [prompt] * count
    with torch.no_grad():
        dense = timed(lambda: teacher_forced_hidden(model, sequences), reps)
        row = {"dense_forward_s": dense["s"], "dense_forward_peak_gib": dense["peak_gib"]}
        for backend in backends:
            replay = timed(
                lambda: teacher_forced_hidden(model, sequences, prompts, schedule, backend=backend),
                reps,
            )
            row.update(
                {
                    f"{backend}_replay_s": replay["s"],
                    f"{backend}_replay_first_s": replay["first_s"],
                    f"{backend}_replay_peak_gib": replay["peak_gib"],
                    f"{backend}_replay_over_dense": replay["s"] / dense["s"],
                }
            )
    return row


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON here too")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    parser.add_argument(
        "--cases", default="8192x16,32768x16", help="comma-separated TOKENSxSEQUENCES"
    )
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens per sequence")
    parser.add_argument("--schedule", default="qwen3-1.7b-0.86")
    parser.add_argument("--reps", type=int, default=2, help="timed runs after the first")
    parser.add_argument("--skip-model", action="store_true", help="attention layer only")
    parser.add_argument(
        "--backward",
        action="store_true",
        help="also time one sparse layer's forward + backward per path",
    )
    parser.add_argument(
        "--backends",
        default="triton,flex",
        help="comma-separated replay paths to time: triton, flex, reference",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    schedule = get_preset(args.schedule)
    cases = [tuple(int(x) for x in case.split("x")) for case in args.cases.split(",")]
    backends, prompt = args.backends.split(","), args.prompt
    if args.smoke:
        schedule, cases, prompt = get_preset("tiny-0.86"), [(320, 2)], 40
    arch = model_arch("qwen3-1.7b", args.smoke)
    model = None if args.skip_model else random_model(arch, device)
    if model is not None and device == "cpu":
        model = model.float()  # CPU matmuls in bf16 are slow and not what is measured
    rows = []
    for length, count in cases:
        row = {"tokens_per_sequence": length, "sequences": count, "prompt": prompt}
        row.update(
            attention_case(length, count, prompt, schedule, backends, device, arch, args.reps)
        )
        if args.backward:
            row.update(
                backward_case(length, count, prompt, schedule, backends, device, arch, args.reps)
            )
        if model is not None:
            row.update(
                model_case(
                    model,
                    length,
                    count,
                    prompt,
                    schedule,
                    backends,
                    device,
                    arch.vocab_size,
                    args.reps,
                )
            )
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        rows.append(row)
    write_json(
        args.out,
        dict(
            benchmark="teacher_forced",
            facts=device_facts(),
            schedule=schedule.name,
            backends=backends,
            rows=rows,
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
