"""One RL step on 1 GPU against 2 GPUs: a trainer group (FSDP2 ranks as Ray actors) with one
colocated rollout engine per GPU; rollout, scoring, update and weight sync timed per step.

    python benchmarks/multi_gpu.py --out results/multi_gpu.json          # 2 GPUs of one host
    python benchmarks/multi_gpu.py --gpus 1,2 --layers 8 --new-tokens 1024
    python benchmarks/multi_gpu.py --smoke          # the same code on CPU (gloo), tiny model

Model: random weights of Qwen3-1.7B's shapes (hidden 2048, 16 q / 8 kv heads, head dim 128,
MLP 6144, tied embeddings, vocabulary 151,936) with --layers decoder layers (8 by default, so
both arms fit in about 8 minutes with the model written once). Batch: --prompts random prompts
of --prompt-tokens tokens x --samples samples, eos off so every sample runs to --new-tokens.
Each arm is a child process with its own local Ray holding --gpus GPUs (rollout.placement
colocated: trainer rank i and engine i share GPU i; the engine's KV cache is freed while the
trainer works). The first step is warm-up; the JSON holds every step and the mean of the rest.
Needs ray (no Prefect, DuckDB or MLflow).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE_17B = dict(vocab_size=151_936, hidden_size=2048, num_q_heads=16, num_kv_heads=8,
                 head_dim=128, intermediate_size=6144, tie_word_embeddings=True,
                 rope_theta=1_000_000.0, max_position_embeddings=40_960)
SMOKE = dict(vocab_size=384, hidden_size=64, num_q_heads=4, num_kv_heads=2, head_dim=16,
             intermediate_size=128)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU ranks (gloo)")
    parser.add_argument("--gpus", default="1,2", help="arms: GPUs (CPU ranks with --smoke)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3, help="steps per arm; the first warms up")
    parser.add_argument("--kv-cache-mib", type=int, default=16384)
    parser.add_argument("--bucket-mib", type=int, default=256)
    parser.add_argument("--workdir", default="/tmp/sparrow-multi-gpu")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.layers, args.prompts, args.samples = 2, 4, 2
        args.prompt_tokens, args.new_tokens, args.steps, args.kv_cache_mib = 8, 16, 2, 64
    return args


def build_model(args) -> Path:
    from sparrow_core.model.random_checkpoint import make_random_checkpoint

    shape = SMOKE if args.smoke else SHAPE_17B
    folder = Path(args.workdir) / f"model-{args.layers}-{shape['vocab_size']}"
    if not (folder / "config.json").is_file():
        make_random_checkpoint(folder, "qwen3", num_layers=args.layers, **shape)
    return folder


def records_of(prompts, results):
    from sparrow_core.data.rollouts import RolloutRecord

    return [RolloutRecord(p, s.sample_index, p, tuple(prompt), tuple(s.output_ids),
                          tuple(s.logprobs), tuple(s.topk_ids), tuple(s.topk_logprobs),
                          tuple(s.pages_read), s.finish_reason, "0")
            for p, (prompt, samples) in enumerate(zip(prompts, results)) for s in samples]


def one_step(group, pool, prompts, params, args) -> dict[str, float]:
    from runtime.weight_sync import sync_group_to_pool

    times: dict[str, float] = {}
    clock = time.perf_counter()
    group.free_gradients()
    pool.wake()
    results = pool.generate(prompts, params)
    pool.sleep()
    times["rollout_s"] = time.perf_counter() - clock
    records = records_of(prompts, results)
    clock = time.perf_counter()
    scores = group.score(records)
    times["score_s"] = time.perf_counter() - clock
    rewards = [random.Random(i).random() for i in range(len(records))]
    clock = time.perf_counter()
    metrics = group.update(records, rewards, [s.dense_logprobs for s in scores], args.samples)
    times["update_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    modes = sync_group_to_pool(group, pool, str(group.spec.model_path), args.bucket_mib << 20)
    times["sync_s"] = time.perf_counter() - clock
    times["step_s"] = sum(times.values())
    times["generated_tokens"] = float(sum(len(r.output_ids) for r in records))
    times["loss"] = metrics["actor/loss"]
    times["sync_modes"] = modes
    return times


def run_arm(args, ranks: int) -> dict:
    import ray

    from runtime.placement import plan_placement
    from runtime.rollout_actors import ActorPool, WorkerSpec
    from runtime.trainer_group import TrainerGroup, TrainerSpec
    from sparrow_core.config.schema import AlgoConfig, RolloutConfig
    from sparrow_core.engine import EngineConfig, SamplingParams

    model = build_model(args)
    use_gpu = not args.smoke
    ray.init(num_gpus=ranks if use_gpu else 0, include_dashboard=False, log_to_driver=False)
    plan = plan_placement(ranks, "colocated", ranks, use_gpu)  # one engine per rank
    dtype = "bfloat16" if use_gpu else "float32"
    rollout = RolloutConfig(kv_cache_mib=args.kv_cache_mib, ignore_eos=True, max_batch_size=256)
    engine = EngineConfig.from_rollout(rollout, max_context=args.prompt_tokens + args.new_tokens)
    worker = WorkerSpec(str(model), str(model), None, engine, device=plan.device, dtype=dtype)
    pool = ActorPool.start(worker, len(plan.engines), plan.engines[0], plan.engines)
    algo = AlgoConfig(lr=1e-6, micro_batch_tokens=16384)
    group = TrainerGroup.start(TrainerSpec(str(model), algo, dtype="auto", device=plan.device),
                               ranks, plan.trainer)
    rng = random.Random(0)
    vocab = (SMOKE if args.smoke else SHAPE_17B)["vocab_size"]
    prompts = [[rng.randrange(300) for _ in range(args.prompt_tokens)]
               for _ in range(args.prompts)]
    params = [SamplingParams(max_new_tokens=args.new_tokens, n=args.samples, seed=i)
              for i in range(args.prompts)]
    steps = [one_step(group, pool, prompts, params, args) for _ in range(args.steps)]
    group.shutdown()
    pool.shutdown()
    timed = steps[1:] or steps
    keys = ("rollout_s", "score_s", "update_s", "sync_s", "step_s")
    mean = {k: sum(s[k] for s in timed) / len(timed) for k in keys}
    return {"ranks": ranks, "device": plan.device, "vocab": vocab, "steps": steps, "mean": mean}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_arm(args, args.child)))
        return {}
    build_model(args)  # once, before the arms
    arms = []
    for ranks in [int(g) for g in args.gpus.split(",")]:
        command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
                   "--child", str(ranks)]
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
        if done.returncode != 0:
            arms.append({"ranks": ranks, "error": done.stderr[-4000:]})
            continue
        arms.append(json.loads(done.stdout.strip().splitlines()[-1]))
    report = {"benchmark": "multi_gpu", "layers": args.layers, "prompts": args.prompts,
              "samples": args.samples, "prompt_tokens": args.prompt_tokens,
              "new_tokens": args.new_tokens, "arms": arms}
    ok = [a for a in arms if "mean" in a]
    if len(ok) >= 2:
        report["step_speedup"] = ok[0]["mean"]["step_s"] / ok[-1]["mean"]["step_s"]
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main()
