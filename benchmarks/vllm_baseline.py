"""Dense vLLM against the native engine, dense and block-sparse, on one rollout workload:
seconds and tokens/s per case, and native tokens/s over vLLM's.

    python benchmarks/vllm_baseline.py --out vllm_baseline.json                 # GPU, 4 cases
    python benchmarks/vllm_baseline.py --cases 16x32768 --skip-native --out a.json
    python benchmarks/vllm_baseline.py --cases 16x32768 --skip-vllm --native-arms sparse
    python benchmarks/vllm_baseline.py --merge a.json b.json --out both.json    # one table
    python benchmarks/vllm_baseline.py --smoke --skip-vllm                      # CPU, tiny model

Workload (the rollout benchmark's, benchmarks/generation.py): random weights of Qwen3-1.7B's
shapes with the real vocabulary (rl_step.py's SHAPE_17B), written once under --workdir as HF
safetensors with config.json and make_random_checkpoint's byte-level tokenizer; per case B
distinct prompts of --prompt-len random ids over the whole vocabulary, N new tokens each, eos
ignored, temperature 1, no top-p / top-k. Both backends get the same ids. Each backend runs in
a child process of its own (a fresh GPU): vLLM (`LLM(...).generate`, bf16, no prefix caching,
the FLASH_ATTN backend and VLLM_USE_FLASHINFER_SAMPLER=0 since scripts/pack_vllm.sh leaves
FlashInfer out, ids without detokenizing, no logprobs unless --vllm-logprobs) and the native
engine (dense, then --schedule; it returns top-20 logprobs per token). Every case is warmed up
with 8 new tokens first. The native figure leaves out the CUDA-graph captures that fall inside
the timed run (vLLM captures at start-up). A case whose KV does not fit at once runs in waves
(native admission) or with preemption (vLLM); each backend's capacity in tokens is recorded.
A child rewrites --workdir/<backend>-rows.json after every case, so a run cut short keeps what
it finished; runs of separate calls (a case longer than one device call) join with --merge.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARMS = ("vllm_dense", "native_dense", "native_sparse")
WARMUP_TOKENS = 8


def parse_cases(text: str) -> list[tuple[int, int]]:
    """ "16x8192,64x32768" -> [(16, 8192), (64, 32768)]: (batch, new tokens) pairs."""
    cases = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(
                f"a case is BATCHxNEW_TOKENS, e.g. 16x8192; got {item!r}"
            )
        cases.append((int(parts[0]), int(parts[1])))
    return cases


def native_arms(text: str) -> tuple[str, ...]:
    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    if not arms or not set(arms) <= {"dense", "sparse"}:
        raise argparse.ArgumentTypeError(f"native arms are dense and/or sparse; got {text!r}")
    return arms


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        type=parse_cases,
        default=None,
        help="BATCHxNEW_TOKENS list (default 16x8192,16x32768,64x8192,64x32768)",
    )
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (1024)")
    parser.add_argument("--schedule", default=None, help="native sparse preset (qwen3-1.7b-0.86)")
    parser.add_argument(
        "--native-arms",
        type=native_arms,
        default=("dense", "sparse"),
        help="native arms to run: dense,sparse or one of them",
    )
    parser.add_argument("--skip-native", action="store_true", help="vLLM only")
    parser.add_argument("--skip-vllm", action="store_true", help="native engine only")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of GPU memory each backend may fill (weights + KV cache)",
    )
    parser.add_argument(
        "--vllm-logprobs",
        type=int,
        default=None,
        help="top logprobs vLLM returns per token (20: the native engine's work)",
    )
    parser.add_argument(
        "--workdir",
        default="/tmp/sparrow-vllm-baseline",
        help="the random checkpoint is written here once",
    )
    parser.add_argument("--seed", type=int, default=0, help="prompt ids seed")
    parser.add_argument("--smoke", action="store_true", help="tiny model, short case (CPU)")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="combine earlier runs' JSON into one table instead of running",
    )
    parser.add_argument("--out", default=None, help="write the JSON here too")
    parser.add_argument("--child", choices=("vllm", "native"), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    smoke = dict(cases=[(2, 48)], prompt_len=48, schedule="tiny-0.86")
    full = dict(
        cases=parse_cases("16x8192,16x32768,64x8192,64x32768"),
        prompt_len=1024,
        schedule="qwen3-1.7b-0.86",
    )
    for key, value in (smoke if args.smoke else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def model_dir(args) -> Path:
    """The random checkpoint both backends load, written on first use."""
    from benchmarks.rl_step import SHAPE_17B
    from sparrow.model.random_checkpoint import make_random_checkpoint

    name = "tiny-3l" if args.smoke else "qwen3-1.7b-shape"
    folder = Path(args.workdir) / name
    if not (folder / "config.json").exists() or not list(folder.glob("*.safetensors")):
        shape = dict(num_layers=3) if args.smoke else dict(SHAPE_17B)
        make_random_checkpoint(folder, "qwen3", seed=0, **shape)
    return folder


def vllm_requests(
    prompts: list[list[int]], new_tokens: int, logprobs: int | None = None
) -> tuple[list[dict], dict[str, Any]]:
    """vLLM's prompts (token ids, no text) and SamplingParams keywords for one case."""
    params = dict(max_tokens=new_tokens, temperature=1.0, ignore_eos=True, detokenize=False)
    if logprobs is not None:
        params.update(logprobs=logprobs, flat_logprobs=True)  # as the vLLM backend asks
    return [{"prompt_token_ids": list(p)} for p in prompts], params


def case_prompts(args, batch: int, vocab_size: int) -> list[list[int]]:
    from benchmarks.generation import random_prompts

    return random_prompts(batch, args.prompt_len, vocab_size, seed=args.seed)


def vocab_of(folder: Path) -> int:
    return int(json.loads((folder / "config.json").read_text())["vocab_size"])


def run_vllm(args, folder: Path, result: dict[str, Any], save) -> None:
    """vLLM child: one LLM for every case, each case warmed up, then timed; result gets a row
    per case, saved as it comes."""
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    import vllm

    result.update(
        version=vllm.__version__, attention_backend="FLASH_ATTN", logprobs=args.vllm_logprobs
    )

    longest = max(n for _, n in args.cases) + args.prompt_len
    llm = vllm.LLM(
        model=str(folder),
        dtype="bfloat16",
        seed=0,
        enable_prefix_caching=False,
        max_model_len=longest + 16,
        max_num_seqs=max(b for b, _ in args.cases),
        gpu_memory_utilization=args.gpu_memory_utilization,
        attention_config={"backend": "FLASH_ATTN"},
    )
    cache = llm.llm_engine.vllm_config.cache_config
    for batch, new in args.cases:
        prompts, params = vllm_requests(
            case_prompts(args, batch, vocab_of(folder)), new, args.vllm_logprobs
        )
        warm = dict(params, max_tokens=WARMUP_TOKENS)
        llm.generate(prompts, vllm.SamplingParams(**warm), use_tqdm=False)
        start = time.perf_counter()
        outputs = llm.generate(prompts, vllm.SamplingParams(**params), use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        result["rows"].append(
            arm_row(
                "vllm_dense",
                batch,
                new,
                wall,
                0.0,
                tokens,
                (cache.num_gpu_blocks or 0) * cache.block_size,
            )
        )
        save()
    llm.llm_engine.engine_core.shutdown()  # its engine process frees the GPU before we exit


def run_native(args, folder: Path, result: dict[str, Any], save) -> None:
    """Native child: the checkpoint (bf16 on GPU), one engine per case, dense then sparse;
    result gets a row per case and arm, saved as it comes."""
    import gc

    import torch

    from benchmarks.generation import timed_generate
    from sparrow.engine import Engine, EngineConfig, SamplingParams
    from sparrow.model import load_model
    from sparrow.sparse.presets import get_preset

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(
        folder, dtype=torch.bfloat16 if device == "cuda" else torch.float32, device=device
    )
    schedule = get_preset(args.schedule)
    result.update(schedule=schedule.name, logprobs_topk=SamplingParams().logprobs_topk)
    for batch, new in args.cases:
        prompts = case_prompts(args, batch, model.arch.vocab_size)
        engine = Engine(
            model,
            None,
            EngineConfig(
                max_batch_size=batch,
                page_size=schedule.page_size,
                ignore_eos=True,
                max_context=args.prompt_len + new + 16,
                memory_utilization=args.gpu_memory_utilization if device == "cuda" else 0.0,
            ),
        )
        engine.generate(prompts, SamplingParams(max_new_tokens=WARMUP_TOKENS, seed=0))
        capacity = engine.cache.num_pages * engine.cache.page_size
        for arm in args.native_arms:
            engine.set_schedule(schedule if arm == "sparse" else None)
            run = timed_generate(engine, prompts, new)
            result["rows"].append(
                arm_row(
                    f"native_{arm}",
                    batch,
                    new,
                    run["wall_s"] - run["capture_s"],
                    run["capture_s"],
                    run["tokens"],
                    capacity,
                )
            )
            save()
        del engine
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def arm_row(
    arm: str, batch: int, new: int, seconds: float, capture_s: float, tokens: int, capacity: int
) -> dict[str, Any]:
    return dict(
        arm=arm,
        batch=batch,
        new_tokens=new,
        seconds=seconds,
        capture_s=capture_s,
        tokens=tokens,
        tokens_per_s=tokens / seconds if seconds > 0 else None,
        kv_capacity_tokens=capacity,
    )


def run_child(argv: list[str], backend: str, folder: Path, workdir: Path) -> dict[str, Any]:
    """One backend in its own process, its log on ours. Its rows are read back from
    workdir/<backend>-rows.json, which it rewrites after every case (a run cut short keeps
    the cases it finished); a failure is recorded there instead of raised."""
    out = workdir / f"{backend}-rows.json"
    out.unlink(missing_ok=True)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        *argv,
        "--child",
        backend,
        "--child-out",
        str(out),
        "--model-dir",
        str(folder),
    ]
    done = subprocess.run(command, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    result = json.loads(out.read_text()) if out.exists() else {"rows": []}
    if done.returncode and "error" not in result:
        result["error"] = f"exit status {done.returncode}"
    return result


def child_main(args) -> int:
    """--child: run one backend, saving its result as it grows."""
    result: dict[str, Any] = {"rows": []}
    out = Path(args.child_out)

    def save() -> None:
        out.write_text(json.dumps(result))

    run = run_vllm if args.child == "vllm" else run_native
    try:
        run(args, Path(args.model_dir), result, save)
    except Exception as err:
        result["error"] = f"{type(err).__name__}: {err}"
        save()
        raise
    save()
    return 0


def cases_table(rows: list[dict[str, Any]], cases=()) -> list[dict[str, Any]]:
    """Per (batch, new tokens), the requested cases and any others rows hold: each arm's row
    (None when not run) and native tokens/s over vLLM dense's."""
    table = {(b, n): {"batch": b, "new_tokens": n, **dict.fromkeys(ARMS)} for b, n in cases}
    for row in rows:
        key = (row["batch"], row["new_tokens"])
        table.setdefault(key, {"batch": key[0], "new_tokens": key[1], **dict.fromkeys(ARMS)})
        table[key][row["arm"]] = row
    for case in table.values():
        base = (case["vllm_dense"] or {}).get("tokens_per_s")
        for arm in ("native_sparse", "native_dense"):
            mine = (case[arm] or {}).get("tokens_per_s")
            case[f"{arm}_over_vllm_dense"] = mine / base if mine and base else None
    return [table[key] for key in sorted(table)]


def merge(paths: list[str]) -> dict[str, Any]:
    """Several runs' JSON as one table (a later file's arm replaces an earlier one's); a merged
    file counts as the runs it holds; runs of other prompt lengths do not mix."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    if len({run["prompt_len"] for run in runs}) > 1:
        raise SystemExit(
            f"--merge: the runs have different prompt lengths: "
            f"{[run['prompt_len'] for run in runs]}"
        )
    rows = [
        row for run in runs for case in run["cases"] for row in (case[arm] for arm in ARMS) if row
    ]

    def each(run: dict, key: str) -> list:  # one run's entry, or a merged file's list
        return run[key] if "merged_from" in run else [run[key]]

    facts = [f for run in runs for f in each(run, "facts")]
    gpus = sorted({str(f.get("gpu")) for f in facts})
    return {
        "benchmark": "vllm_baseline",
        "merged_from": [
            m
            for run, p in zip(runs, paths)
            for m in (run["merged_from"] if "merged_from" in run else [p])
        ],
        "facts": facts,
        "gpus": gpus,
        "same_gpu_model": len(gpus) == 1,
        "prompt_len": runs[-1]["prompt_len"],
        "model": runs[-1]["model"],
        "vllm": [v for run in runs for v in each(run, "vllm")],
        "native": [n for run in runs for n in each(run, "native")],
        "cases": cases_table(rows),
    }


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from benchmarks.common import device_facts, write_json

    if args.merge:
        write_json(args.out, merge(args.merge))
        return 0
    if args.child:
        return child_main(args)
    folder = model_dir(args)
    skipped = {"skipped": True, "rows": []}
    vllm_run = skipped if args.skip_vllm else run_child(argv, "vllm", folder, folder.parent)
    native_run = skipped if args.skip_native else run_child(argv, "native", folder, folder.parent)
    payload = {
        "benchmark": "vllm_baseline",
        "facts": device_facts(),
        "model": str(folder),
        "prompt_len": args.prompt_len,
        "vllm": {k: v for k, v in vllm_run.items() if k != "rows"},
        "native": {k: v for k, v in native_run.items() if k != "rows"},
        "cases": cases_table(vllm_run["rows"] + native_run["rows"], args.cases),
    }
    write_json(args.out, payload)
    return 1 if "error" in vllm_run or "error" in native_run else 0


if __name__ == "__main__":
    raise SystemExit(main())
