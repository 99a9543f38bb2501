"""DistillSparse measured: p5 under a schedule one notch cheaper than the calibrated one, before
and after N LoRA steps; the rollout speedup the cheaper schedule buys; the time the LoRA step
adds to the update. Prints one JSON object (also written to --out).

    python benchmarks/distill.py --smoke                       # CPU, tiny model, seconds
    python benchmarks/distill.py --model /models/testbed --data builtin:synthetic \
        --calibrated NAME_OR_YAML --cheaper NAME_OR_YAML --steps 50 --device cuda
    python benchmarks/distill.py --random-layers 8 --calibrated qwen3-1.7b-0.86 \
        --cheaper qwen3-1.7b-0.80 --max-new-tokens 8192 --ignore-eos ...   # timing only

Needs torch, transformers, peft and safetensors only (no Ray, Prefect, MLflow, DuckDB or
OmegaConf): it drives the library directly, one engine and one trainer in this process, the way
the train flow's stages do. Each step: sample the step's prompts with the engine (cheaper
schedule, weights = merge(policy, LoRA)), score them densely and update the policy (GRPO, as
policy_update; --no-update keeps the base fixed to isolate the LoRA), then one distill step
(SparseDistiller, as distill_lora), then hand the engine merge(policy, LoRA) (as sync_weights).
Evaluation ("before" / "after"): fresh trajectories of held-out prompts sampled by the sparse
actor under the cheaper schedule with fixed seeds, replayed teacher-forced for the exact
acceptance with and without the LoRA on the same tokens (p5 over all tokens, lowest per-bin p5,
mean); "calibrated" is the same for the calibrated schedule without the LoRA (the target the
cheaper schedule plus LoRA should reach). The fixed set (`fixed_set`): the held-out prompts'
trajectories (--fixed-samples each) drawn once by the sparse actor under the cheaper schedule
before the first step, replayed teacher-forced before and after on the same tokens: p5 and
the rest with and without the LoRA, and the paired differences with 95% cluster-bootstrap
intervals over prompts (sparrow/mismatch/bootstrap.py, --resamples), so trajectory noise
cancels (docs/distill.md, "A fair test"). Every step, "before", "after" and the fixed set also
report `reward_mean` (--reward) of their trajectories: the LoRA can move which trajectories the
actor samples, and the acceptance on them does not say what they earn. Rollout speedup:
generation wall time of the eval prompts under each schedule with the same weights and seeds
(generated tokens per second, best of 3 after a warm-up, the schedules interleaved).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparrow.data.datasets import load_prompts  # noqa: E402
from sparrow.data.rewards import REWARD_FUNCTIONS  # noqa: E402
from sparrow.data.rollouts import RolloutRecord  # noqa: E402
from sparrow.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from sparrow.mismatch.bootstrap import paired_difference_intervals  # noqa: E402
from sparrow.model import load_model, load_tokenizer  # noqa: E402
from sparrow.model.builtin import resolve_model_path  # noqa: E402
from sparrow.sparse import resolve_schedule  # noqa: E402
from sparrow.trainer.distill import SparseDistiller  # noqa: E402
from sparrow.trainer.lora import merge_weights  # noqa: E402
from sparrow.trainer.policy_trainer import PolicyTrainer, resolve_device, resolve_dtype  # noqa: E402


def _schema():
    """sparrow/config/schema.py alone: the package's __init__ pulls in OmegaConf, which
    the GPU image lacks, and the dataclasses need none of it."""
    import importlib.util

    file = Path(__file__).resolve().parent.parent / "sparrow" / "config" / "schema.py"
    spec = importlib.util.spec_from_file_location("sparrow_config_schema", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:tiny")
    p.add_argument(
        "--random-layers",
        type=int,
        default=0,
        help="timing only: a random Qwen3-1.7B-shaped checkpoint of N layers",
    )
    p.add_argument("--workdir", default="/tmp/sparrow-distill")
    p.add_argument("--ignore-eos", action="store_true", help="every sample runs to the cutoff")
    p.add_argument("--data", default="builtin:synthetic")
    p.add_argument("--reward", default="exact_match")
    p.add_argument("--calibrated", default="tiny-0.86")
    p.add_argument("--cheaper", default="tiny-0.80")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--samples", type=int, default=4, help="samples per prompt")
    p.add_argument("--eval-prompts", type=int, default=16)
    p.add_argument(
        "--fixed-samples", type=int, default=4, help="per held-out prompt, in the fixed set"
    )
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap replicates (fixed set)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-6, help="actor lr (algo.lr)")
    p.add_argument("--lr-scale", type=float, default=5.0, help="algo.distill.lr_scale")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=int, default=32)
    p.add_argument("--loss", default="k3", choices=("k3", "full_kl"))
    p.add_argument("--kl-coef", type=float, default=1.0, help="algo.distill.kl_coef")
    p.add_argument(
        "--selector-coef", type=float, default=0.0, help="algo.distill.selector_coef (0: off)"
    )
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--no-update", action="store_true", help="keep the base fixed")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--memory-utilization",
        type=float,
        default=0.0,
        help="engine KV cache sized to this share of GPU memory (0: kv-cache-mib)",
    )
    p.add_argument("--kv-cache-mib", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed-repeats", type=int, default=3)
    p.add_argument("--out", default="")
    p.add_argument("--plot", default="", help="PNG of per-step p5 with and without the LoRA")
    p.add_argument("--smoke", action="store_true", help="CPU, a few tiny steps (CI)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.prompts, args.samples, args.eval_prompts = 2, 2, 2, 2
        args.max_new_tokens, args.lr_scale, args.device = 32, 1000.0, "cpu"
        args.speed_repeats, args.fixed_samples, args.resamples = 1, 2, 200
    return args


def model_path(args) -> Path:
    if not args.random_layers:
        return resolve_model_path(args.model)
    from benchmarks.rl_step import SHAPE_17B
    from sparrow.model.random_checkpoint import make_random_checkpoint

    folder = Path(args.workdir) / f"qwen3-1.7b-shape-{args.random_layers}l"
    if not list(folder.glob("*.safetensors")):
        make_random_checkpoint(
            folder, "qwen3", seed=0, **dict(SHAPE_17B, num_layers=args.random_layers)
        )
    return folder


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sample(engine, tokenizer, rows, samples, args, seed, device) -> tuple[list, float, int]:
    """(RolloutRecords, seconds, generated tokens) of the rows' prompts under the engine."""
    ids = [list(r.prompt_ids) for r in rows]
    params = [
        SamplingParams(
            n=samples,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            seed=seed * 100_003 + i,
            logprobs_topk=20,
            stop_token_ids=tuple(tokenizer.eos_token_ids),
        )
        for i in range(len(ids))
    ]
    _sync(device)
    clock = time.perf_counter()
    results = engine.generate(ids, params)
    _sync(device)
    seconds = time.perf_counter() - clock
    records = [
        RolloutRecord(
            p,
            s.sample_index,
            rows[p].row,
            tuple(ids[p]),
            tuple(s.output_ids),
            tuple(s.logprobs),
            s.topk_ids,
            s.topk_logprobs,
            tuple(s.pages_read),
            s.finish_reason,
            rows[p].answer,
            tokenizer.decode(s.output_ids, skip_special_tokens=True),
        )
        for p, group in enumerate(results)
        for s in group
    ]
    return records, seconds, sum(len(r.output_ids) for r in records)


def rewards_of(records, args) -> list[float]:
    """`args.reward` of each sampled record."""
    reward = REWARD_FUNCTIONS.get(args.reward)
    return [reward(r.text, r.answer) for r in records]


def reward_mean(records, args) -> float:
    """The mean reward of the sampled records: what the sparse actor's trajectories earn (the
    LoRA moves which trajectories it samples, so this is read beside acceptance)."""
    return sum(rewards_of(records, args)) / max(len(records), 1)


def evaluate(engine, tokenizer, distiller, rows, schedule, args, device) -> dict:
    """Acceptance with and without the LoRA on fresh sparse-actor trajectories, their reward,
    and their token count."""
    engine.set_schedule(schedule)
    records, seconds, tokens = sample(engine, tokenizer, rows, 1, args, 10**6, device)
    metrics = distiller.distill(records, schedule, update=False)
    keep = (
        "p5_lora",
        "p5_base",
        "min_bin_p5_lora",
        "min_bin_p5_base",
        "acceptance_mean_lora",
        "acceptance_mean_base",
        "full_kl",
        "k3",
    )
    out = {k: metrics.get(f"distill/{k}") for k in keep}
    out.update(schedule=schedule.name, tokens=tokens, reward_mean=reward_mean(records, args))
    return out


def rollout_speed(engine, tokenizer, rows, schedules, args, device, repeats=3) -> dict:
    """Generated tokens per second per schedule (same weights and seeds), best of `repeats`
    after one warm-up each, the schedules interleaved."""
    best = {s.name: 0.0 for s in schedules}
    for repeat in range(repeats + 1):
        for schedule in schedules:
            engine.set_schedule(schedule)
            _, seconds, tokens = sample(engine, tokenizer, rows, 1, args, 10**6, device)
            if repeat:
                best[schedule.name] = max(best[schedule.name], tokens / max(seconds, 1e-9))
    return best


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    path = model_path(args)
    tokenizer = load_tokenizer(path)
    calibrated, cheaper = resolve_schedule(args.calibrated), resolve_schedule(args.cheaper)
    train = load_prompts(args.data, "prompt", "answer", tokenizer, 4096, "train", args.seed)
    held_out = load_prompts(args.data, "prompt", "answer", tokenizer, 4096, "eval", args.seed)
    eval_rows = held_out.batch(0, args.eval_prompts)
    schema = _schema()
    trainer_config = schema.TrainerConfig(micro_batch_tokens=args.micro_batch_tokens)
    algo = schema.AlgoConfig(
        lr=args.lr,
        distill=schema.DistillConfig(
            enabled=True,
            lora_rank=args.rank,
            lora_alpha=args.alpha,
            loss=args.loss,
            lr_scale=args.lr_scale,
            kl_coef=args.kl_coef,
            selector_coef=args.selector_coef,
        ),
    )
    config = EngineConfig(
        page_size=cheaper.page_size,
        kv_cache_mib=args.kv_cache_mib,
        memory_utilization=args.memory_utilization,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    engine = Engine(load_model(path, dtype=dtype, device=device), tokenizer, config, cheaper)
    trainer = (
        None
        if args.no_update
        else PolicyTrainer(
            path,
            algo,
            device,
            args.dtype,
            args.seed,
            args.temperature or 1.0,
            trainer_config=trainer_config,
        )
    )
    distiller = SparseDistiller(
        path,
        algo,
        device,
        args.dtype,
        args.seed,
        args.temperature or 1.0,
        trainer_config=trainer_config,
    )
    base = trainer.state_dict_for_sync() if trainer else load_model(path).state_dict()
    distiller.set_base(base)
    report = {
        "args": vars(args),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    report["calibrated"] = evaluate(
        engine, tokenizer, distiller, eval_rows, calibrated, args, device
    )
    report["before"] = evaluate(engine, tokenizer, distiller, eval_rows, cheaper, args, device)
    engine.set_schedule(cheaper)
    fixed, _, _ = sample(engine, tokenizer, eval_rows, args.fixed_samples, args, 10**6 + 1, device)
    fixed_before = distiller.token_acceptance(fixed, cheaper)
    steps = []
    for step in range(args.steps):
        engine.set_schedule(cheaper)
        records, rollout_s, tokens = sample(
            engine, tokenizer, train.batch(step, args.prompts), args.samples, args, step + 1, device
        )
        rewards = rewards_of(records, args)
        row = {
            "step": step + 1,
            "tokens": tokens,
            "rollout_s": rollout_s,
            "reward_mean": sum(rewards) / max(len(rewards), 1),
        }
        if trainer is not None:
            _sync(device)
            clock = time.perf_counter()
            old = [s.dense_logprobs for s in trainer.score(records)]
            row["score_s"] = time.perf_counter() - clock
            clock = time.perf_counter()
            trainer.update(records, rewards, old, args.samples)
            _sync(device)
            row["update_s"] = time.perf_counter() - clock
            base = trainer.state_dict_for_sync()
            distiller.set_base(base)
        _sync(device)
        clock = time.perf_counter()
        metrics = distiller.distill(records, cheaper)
        _sync(device)
        row["distill_s"] = time.perf_counter() - clock
        row.update(
            {
                k.split("/", 1)[1]: v
                for k, v in metrics.items()
                if k.split("/", 1)[1]
                in (
                    "loss",
                    "p5_lora",
                    "p5_base",
                    "min_bin_p5_lora",
                    "min_bin_p5_base",
                    "full_kl",
                    "selector_loss",
                    "selector_recall",
                )
            }
        )
        engine.update_weights(merge_weights(base, distiller.adapter()))
        steps.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    report["steps"] = steps
    report["after"] = evaluate(engine, tokenizer, distiller, eval_rows, cheaper, args, device)
    report["fixed_set"] = fixed_set_report(
        fixed, fixed_before, distiller.token_acceptance(fixed, cheaper), args
    )
    report["tokens_per_s"] = rollout_speed(
        engine, tokenizer, eval_rows, (calibrated, cheaper), args, device, args.speed_repeats
    )
    report["summary"] = summarize(report, steps)
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    if args.plot:
        plot(report, args.plot)
    print(text)
    return report


def plot(report: dict, path: str) -> None:
    """Lowest per-bin p5 per step on the step's own rollouts, with and without the LoRA, and
    the held-out figures before/after against the calibrated schedule's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report["steps"]
    x = [s["step"] for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [s["min_bin_p5_lora"] for s in steps], "o-", label="cheaper schedule + LoRA")
    ax.plot(x, [s["min_bin_p5_base"] for s in steps], "s--", label="cheaper schedule, no LoRA")
    ax.axhline(
        report["calibrated"]["min_bin_p5_base"],
        color="gray",
        linestyle=":",
        label=f"calibrated ({report['calibrated']['schedule']}), held out",
    )
    ax.scatter(
        [0, x[-1] + 1],
        [report["before"]["min_bin_p5_lora"], report["after"]["min_bin_p5_lora"]],
        marker="*",
        s=120,
        color="black",
        zorder=3,
        label="held out, before / after",
    )
    ax.set_xlabel("step")
    ax.set_ylabel("lowest per-bin p5 of acceptance")
    ax.set_title(f"DistillSparse: {report['after']['schedule']} on {report['device']}")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _levels(alpha) -> dict:
    return {
        "mean": float(np.mean(alpha)),
        "p1": float(np.percentile(alpha, 1)),
        "p5": float(np.percentile(alpha, 5)),
        "share_below_half": float(np.mean(alpha < 0.5)),
    }


def fixed_set_report(records, before: dict, after: dict, args) -> dict:
    """The fixed set (the sparse actor's trajectories of the held-out prompts under the cheaper
    schedule, sampled once before any step) replayed before and after: the levels, and two
    paired differences on the same tokens with cluster-bootstrap intervals over prompts
    (every sample of a prompt resampled together): lora_after_minus_before (the LoRA's and the
    policy's moves together; with --no-update the LoRA's alone) and lora_minus_base_after
    (the LoRA alone, against the same final dense policy)."""
    prompts = np.array([records[i].prompt_index for i in after["record"]])

    def intervals(first, second) -> dict:
        paired = paired_difference_intervals(
            first, second, prompts, resamples=args.resamples, seed=args.seed
        )
        return {
            name: dict(zip(("delta", "low", "high"), paired[name]))
            for name in ("mean", "p1", "p5", "share_below_half")
        }

    return {
        "trajectories": len(records),
        "prompts": int(len(set(prompts.tolist()))),
        "tokens": int(len(prompts)),
        "reward_mean": reward_mean(records, args),
        "level": 0.95,
        "before_lora": _levels(before["lora"]),
        "after_lora": _levels(after["lora"]),
        "after_base": _levels(after["base"]),
        "lora_after_minus_before": intervals(before["lora"], after["lora"]),
        "lora_minus_base_after": intervals(after["base"], after["lora"]),
    }


def summarize(report: dict, steps: list[dict]) -> dict:
    """The figures docs/distill.md quotes."""
    timed = steps[1:] or steps  # the first step compiles and warms up
    mean = lambda key: sum(s.get(key, 0.0) for s in timed) / max(len(timed), 1)  # noqa: E731
    update = mean("score_s") + mean("update_s")
    return {
        "min_bin_p5": {
            "calibrated": report["calibrated"]["min_bin_p5_base"],
            "cheaper_before": report["before"]["min_bin_p5_lora"],
            "cheaper_after_lora": report["after"]["min_bin_p5_lora"],
            "cheaper_after_base": report["after"]["min_bin_p5_base"],
        },
        "rollout_speedup_cheaper_over_calibrated": (
            report["tokens_per_s"][report["after"]["schedule"]]
            / report["tokens_per_s"][report["calibrated"]["schedule"]]
        ),
        "fixed_set_p5": {
            "lora_after_minus_before": report["fixed_set"]["lora_after_minus_before"]["p5"],
            "lora_minus_base_after": report["fixed_set"]["lora_minus_base_after"]["p5"],
        },
        "distill_s_per_step": mean("distill_s"),
        "update_s_per_step": update,
        "distill_over_update": mean("distill_s") / update if update else None,
    }


if __name__ == "__main__":
    main()
