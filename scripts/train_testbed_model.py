"""Train the GPU testbed model: a 104M-parameter Qwen3 (12 layers, 12 q / 4 KV heads of dim 64,
one token per character or two-letter name) on pointer_chase_long, in one run on one GPU in under 8 minutes;
or, with --model-size small / medium (6M / 12M parameters) and --variant (v1, v2, v3, v2-long,
v3-long: sparrow/experiments/testbed/data.py VARIANTS), the study's testbed (docs/testbed.md).

    python scripts/train_testbed_model.py --out /tmp/sparrow-testbed           # H100, 7.5 min
    python scripts/train_testbed_model.py --out /tmp/tb-v2 --variant v2 --model-size small \
        --max-minutes 6 --save-dtype bfloat16                                  # the study's v2
    python scripts/train_testbed_model.py --out /tmp/testbed-smoke --smoke     # any CPU, seconds

docs/testbed.md has the sizes, the FLOP estimate and what training_info.json holds.
The run: build the model from --seed; time one forward and backward per curriculum shape and
fit as many steps as the budget holds (--steps 0; a given --steps is used as it is); train
(transformers Qwen3ForCausalLM, SDPA attention over rectangular batches, so causal flash
attention; bf16 autocast over fp32 weights; fused AdamW; warmup then cosine) on short chains
first and full-length chains last (sparrow/experiments/testbed/data.py), a stage ending early when its
held-out hop accuracy reaches --advance-accuracy (sparrow/experiments/testbed/adaptive.py; checked every
--stage-eval-every steps on --stage-eval-prompts prompts, and recorded with the full-length
accuracy at each stage's end in training_info's stage_eval); the last --noise-share of
the steps (or of the time, if the clock runs out first: experiments/testbed/phases.py) train on
chains whose hops go wrong at --hop-noise ("auto": the rate that brings the teacher-forced
sampled accuracy down to --target-accuracy), so that RL has room to improve; stop when
--max-minutes less --eval-reserve-s have passed; save the model, the tokenizer and
training_info.json; then sample held-out prompts with the project's engine and add that
accuracy. --init-from DIR --noise-only runs the noisy phase alone on a kept model.

Reproducibility: data, initial weights, curriculum and wrong hops follow from --seed (and the
sizes) alone. On CPU the same arguments, torch build and --threads give the same bytes
(tests/scripts/test_train_testbed_model.py). On GPU they do not: flash attention's backward,
among other CUDA kernels, adds with atomics, so two runs differ in low bits (another sha256);
--steps 0 sizes the run by measured speed (training_info.json records the steps; pass them as
--steps to repeat the plan). --deterministic asks PyTorch for deterministic kernels (strict
torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8), slower; the run is then
bitwise repeatable if every kernel it uses has a deterministic form (PyTorch raises at the
first that has none); the engine's evaluation after saving runs without it. A run stopped by
the budget (stopped_at_budget) depends on timing.
"""

from __future__ import annotations

import time

_PROCESS_START = time.monotonic()  # the budget counts the imports too

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from sparrow.data.char_tokenizer import EOS_TOKEN, PAD_TOKEN, build_char_tokenizer
from sparrow.experiments.testbed.adaptive import AdaptiveCurriculum  # noqa: E402
from sparrow.experiments.testbed.budget import (
    fit_steps,
    hop_noise_for,
    learning_rate,
    train_flops_per_token,
)
from sparrow.experiments.testbed.data import (
    LETTER_PAIRS,
    TASK,
    VARIANTS,
    StepPlan,
    curriculum,
    derived_seed,
    held_out_examples,
    step_examples,
    vocab,
    with_wrong_hops,
)
from sparrow.experiments.testbed.evaluate import (
    sampled_accuracy,
    stage_hop_accuracy,
    stage_record,
    teacher_forced_accuracy,
)
from sparrow.experiments.testbed.phases import (  # noqa: E402
    NoisePhase,
    StartError,
    load_start,
    save_kept_model,
    write_training_info,
)
from sparrow.experiments.testbed.steps import (
    batch_shape,
    forward_backward,
    measure_step_seconds,
    sync,
    to_device,
)

# --smoke: a model and task small enough for a CPU test to train end to end in seconds
SMOKE = dict(
    layers=2,
    hidden=32,
    heads=4,
    kv_heads=2,
    head_dim=8,
    intermediate=64,
    max_positions=512,
    num_defs=8,
    num_hops=12,
    steps=8,
    batch_tokens=1024,
    micro_tokens=512,
    eval_prompts=4,
    sample_prompts=2,
    samples=2,
    hop_noise="0.05",
    eval_reserve_s=0.0,
    stage_eval_every=2,
    stage_eval_prompts=2,
)
# --model-size: the study's small testbeds (docs/testbed.md); "base" is the first testbed's
MODEL_SIZES = {
    "base": dict(layers=12, hidden=768, heads=12, kv_heads=4, head_dim=64, intermediate=3072),
    "small": dict(layers=6, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=1024),
    "medium": dict(layers=8, hidden=320, heads=5, kv_heads=1, head_dim=64, intermediate=1280),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (SMOKE) for a CPU test")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12, help="query heads")
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=3072, help="MLP width")
    p.add_argument("--max-positions", type=int, default=32768)
    p.add_argument("--rope-theta", type=float, default=1_000_000.0)
    p.add_argument("--num-defs", type=int, default=256, help="names in the cycle (full size)")
    p.add_argument("--num-hops", type=int, default=600, help="hops of a full-length chain")
    p.add_argument("--chains", type=int, default=1, help="interleaved chains (multi_chase)")
    p.add_argument("--tags", type=int, default=0, choices=(0, 1), help="benign tag per line")
    p.add_argument("--variant", choices=sorted(VARIANTS), help="the four sizes above at once")
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), help="the six model dims at once")
    p.add_argument("--save-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--steps", type=int, default=0, help="0: as many as fit the budget")
    p.add_argument("--batch-tokens", type=int, default=16384, help="tokens per step")
    p.add_argument("--micro-tokens", type=int, default=16384, help="tokens per forward")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-share", type=float, default=0.05)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--hop-noise", default="auto", help="wrong-hop rate of the last phase, or auto")
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=0.4,
        help="auto hop noise: teacher-forced sampled accuracy to aim at",
    )
    p.add_argument("--noise-share", type=float, default=0.15, help="share of steps with noise")
    p.add_argument(
        "--advance-accuracy",
        type=float,
        default=0.98,
        help="stage-length hop accuracy that ends a stage early; > 1: fixed shares",
    )
    p.add_argument("--stage-eval-every", type=int, default=50, help="steps between checks")
    p.add_argument("--stage-eval-prompts", type=int, default=8, help="prompts a check")
    p.add_argument("--max-minutes", type=float, default=7.5, help="the whole run's wall clock")
    p.add_argument(
        "--eval-reserve-s",
        type=float,
        default=60.0,
        help="seconds kept after training for evaluation and saving",
    )
    p.add_argument("--eval-prompts", type=int, default=64, help="teacher-forced, full length")
    p.add_argument("--sample-prompts", type=int, default=8, help="sampled with the engine")
    p.add_argument("--samples", type=int, default=4, help="engine samples per prompt")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (CPU bytes depend on it)")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--init-from", type=Path, help="a kept testbed model folder to start from")
    p.add_argument("--noise-only", action="store_true", help="the noisy phase alone (lr 1e-4)")
    args = p.parse_args(argv)
    given = {
        a.lstrip("-").replace("-", "_").split("=")[0]
        for a in (sys.argv[1:] if argv is None else argv)
        if a.startswith("--")
    }
    presets = [
        MODEL_SIZES.get(args.model_size, {}),
        VARIANTS[args.variant].sizes() if args.variant else {},
        SMOKE if args.smoke else {},
    ]
    for preset in presets:  # a flag given on the command line wins over every preset
        for key, value in preset.items():
            if key not in given:
                setattr(args, key, value)
    if args.noise_only and "lr" not in given:  # the rate the full run's tail trains at
        args.lr = 1e-4
    check_args(p, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before anything runs, what would fail minutes into the run."""
    if args.hop_noise != "auto":
        try:
            rate = float(args.hop_noise)
        except ValueError:
            rate = -1.0
        if not 0 <= rate < 1:
            parser.error(f"--hop-noise must be auto or a rate in [0, 1), got {args.hop_noise!r}")
    if not 0 <= args.noise_share < 1 or not 0 < args.target_accuracy < 1:
        parser.error("--noise-share must be in [0, 1) and --target-accuracy in (0, 1)")
    if args.steps < 0 or args.heads % args.kv_heads:
        parser.error("--steps must be >= 0 and --heads a multiple of --kv-heads")
    if args.stage_eval_every < 1 or args.stage_eval_prompts < 1:
        parser.error("--stage-eval-every and --stage-eval-prompts must be >= 1")
    if args.noise_only and args.init_from is None:
        parser.error("--noise-only needs --init-from (a kept model to add the noisy phase to)")
    if args.noise_only and args.noise_share == 0:
        parser.error("--noise-only with --noise-share 0 would train nothing")


def build_model(args) -> Qwen3ForCausalLM:
    ids = vocab()
    config = Qwen3Config(
        vocab_size=len(ids),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        intermediate_size=args.intermediate,
        max_position_embeddings=args.max_positions,
        rope_theta=args.rope_theta,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=ids[EOS_TOKEN],
        pad_token_id=ids[PAD_TOKEN],
        bos_token_id=None,
        use_cache=True,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(config)


def make_optimizer(model, args, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on the block matrices only: the (tied) embedding of the
    characters and names is read at every position, and decaying it shrinks the very vectors the
    lookup has to match and copy, for no regularising gain at this vocabulary."""
    embedding = model.get_input_embeddings().weight
    decay = [p for p in model.parameters() if p.ndim >= 2 and p is not embedding]
    rest = [p for p in model.parameters() if p.ndim < 2 or p is embedding]
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda"
    )


def train_step(
    model, optimizer, plan: StepPlan, step: int, stage_noisy, noise: float, args, device
):
    """One optimizer step on (stage, noisy); returns (mean loss tensor, tokens read)."""
    stage, noisy = stage_noisy
    rows, forwards = batch_shape(stage, args.batch_tokens, args.micro_tokens)
    warmup = max(1, round(args.warmup_share * plan.steps))
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, plan.steps, args.lr, warmup, args.min_lr_ratio)
    loss = torch.zeros((), device=device)
    for micro in range(forwards):
        examples = step_examples(stage, rows, args.seed, step, micro)
        if noisy and noise > 0:
            rng = random.Random(derived_seed(args.seed, "noise", step, micro))
            examples = [with_wrong_hops(example, noise, rng) for example in examples]
        ids, mask = to_device(examples, device)
        loss += forward_backward(model, ids, mask, 1.0 / forwards) / forwards
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, rows * forwards * stage.length


def teacher_forced(model, examples) -> dict:
    """teacher_forced_accuracy with the by-hops keys as text, as JSON will write them."""
    result = teacher_forced_accuracy(model, examples)
    result["sampled_estimate_by_hops"] = {
        str(hops): value for hops, value in result["sampled_estimate_by_hops"].items()
    }
    return result


def auto_noise(model, held_out, args) -> tuple[float, dict]:
    """(--hop-noise, or for auto the rate that brings the model's teacher-forced sampled
    accuracy now to --target-accuracy; that accuracy, on 16 held-out prompts)."""
    before = teacher_forced(model, held_out[:16])
    if args.hop_noise != "auto":
        return float(args.hop_noise), before
    rate = hop_noise_for(before["sampled_estimate"], args.target_accuracy, args.num_hops)
    return rate, before


def train(model, optimizer, plan: StepPlan, held_out, args, device, deadline: float) -> dict:
    """The step loop; stops at `deadline` (monotonic seconds) whatever the plan says."""
    log = {
        "steps_done": 0,
        "tokens_seen": 0,
        "flops": 0.0,
        "stopped_at_budget": False,
        "hop_noise": 0.0,
        "before_noise": None,
        "final_loss": None,
        "stage_eval": [],
    }
    q_width, params = args.heads * args.head_dim, sum(p.numel() for p in model.parameters())
    walk = AdaptiveCurriculum(plan, args.advance_accuracy, args.stage_eval_every)

    def probe(stage) -> float:
        return stage_hop_accuracy(model, stage, args.stage_eval_prompts, args.seed)

    recent, began = None, time.monotonic()
    phase = NoisePhase(plan.clean_steps, plan.noise_share, began, deadline)
    for step in range(plan.steps):
        if time.monotonic() > deadline:
            log["stopped_at_budget"] = True
            print(f"stopping at step {step} of {plan.steps}: the time budget is spent", flush=True)
            break
        if phase.started_at is None and phase.noisy(step):
            log["hop_noise"], log["before_noise"] = auto_noise(model, held_out, args)
            print(
                f"step {step}: hop noise {log['hop_noise']:.5f} from {log['before_noise']}"
                + (" (the clean phase's time is spent)" if phase.cut_by_time else ""),
                flush=True,
            )
        noisy = phase.started_at is not None
        stage_noisy = (plan.stages[-1], True) if noisy else walk.stage_at(step)
        loss, tokens = train_step(
            model, optimizer, plan, step, stage_noisy, log["hop_noise"], args, device
        )
        stage = stage_noisy[0]
        log["tokens_seen"] += tokens
        log["flops"] += tokens * train_flops_per_token(params, args.layers, q_width, stage.length)
        log["steps_done"] = step + 1
        recent = loss if recent is None else 0.9 * recent + 0.1 * loss
        if step % 50 == 0 or step == plan.steps - 1:
            print(
                f"step {step} length {stage.length} loss {float(recent):.4f} "
                f"{time.monotonic() - began:.0f}s",
                flush=True,
            )
        if not noisy and (ended := walk.after_step(step + 1, probe)):
            log["stage_eval"].append(
                stage_record(
                    model, ended, step + 1, recent, plan.stages, args.stage_eval_prompts, args.seed
                )
            )
    sync(device)
    log["stage_eval"].append(
        stage_record(
            model, None, log["steps_done"], recent, plan.stages, args.stage_eval_prompts, args.seed
        )
    )
    log["stage_checks"] = [check | {"stage": check["stage"] + 1} for check in walk.checks]
    log |= phase.record(log["steps_done"])
    log["final_loss"] = None if recent is None else float(recent)
    log["train_seconds"] = round(time.monotonic() - began, 1)
    return log


def plan_steps(
    model, stages, args, device, started: float, deadline: float
) -> tuple[StepPlan, list[float] | None]:
    """The step plan: --steps, or as many steps as fit before the deadline at the measured
    speed; with the measured seconds per step of each stage (None when not measured)."""
    noise_share = 1.0 if args.noise_only else args.noise_share
    if args.steps > 0:
        return StepPlan(stages, args.steps, noise_share), None
    seconds = measure_step_seconds(
        model, stages, args.batch_tokens, args.micro_tokens, args.seed, device
    )
    shares = StepPlan(stages, 1_000_000, noise_share).step_shares()
    if args.advance_accuracy <= 1:  # stages may end early: plan at the slowest step's time
        shares = [(max(seconds, key=seconds.get), 1.0)]
    steps = fit_steps(shares, seconds, deadline - time.monotonic())
    measured = [round(value, 4) for value in seconds.values()]
    print(
        f"measured seconds per step {measured}: {steps} steps fit "
        f"({time.monotonic() - started:.0f}s spent so far)",
        flush=True,
    )
    return StepPlan(stages, steps, noise_share), measured


def describe(args, model, device, plan: StepPlan) -> dict:
    return {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "seed": args.seed,
        "task": TASK,
        "task_sizes": plan.stages[-1].sizes(),
        "sequence_tokens": plan.stages[-1].length,
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps_planned": plan.steps,
        "stages": [vars(stage) | {"length": stage.length} for stage in plan.stages],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "deterministic": args.deterministic,
    }


def main(argv: list[str] | None = None) -> dict:
    # the CLI counts from process start; a caller (a test) from its call
    started = _PROCESS_START if argv is None else time.monotonic()
    args = parse_args(argv)
    device = torch.device(args.device)
    deadline = started + 60 * args.max_minutes - args.eval_reserve_s
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(args.threads)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    try:
        return run(args, device, started, deadline)
    finally:  # a caller in the same process gets its settings back
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def run(args, device: torch.device, started: float, deadline: float) -> dict:
    torch.manual_seed(args.seed)
    build_char_tokenizer(args.out, letter_pairs=LETTER_PAIRS)
    source = None
    if args.init_from is None:
        model = build_model(args)
    else:
        try:
            model, source = load_start(args.init_from, vars(args))
        except StartError as err:
            raise SystemExit(f"train_testbed_model: {err}") from None
    model = model.to(device).train()
    optimizer = make_optimizer(model, args, device)
    held_out = held_out_examples(
        args.num_defs,
        args.num_hops,
        args.eval_prompts,
        args.seed,
        chains=args.chains,
        tags=args.tags,
    )
    stages = curriculum(args.num_defs, args.num_hops, args.chains, args.tags)
    if args.noise_only:  # the kept model has walked the curriculum: full length only
        stages = stages[-1:]
    plan, measured = plan_steps(model, stages, args, device, started, deadline)
    info = describe(args, model, device, plan) | {"measured_step_seconds": measured}
    info["init_from"] = source
    info |= train(model, optimizer, plan, held_out, args, device, deadline)
    tf = teacher_forced(model, held_out)
    info |= {
        "held_out_prompts": len(held_out),
        "held_out_greedy_accuracy": tf["greedy"],
        "held_out_sampled_accuracy_estimate": tf["sampled_estimate"],
        "held_out_hop_accuracy": tf["hop"],
        "held_out_argmax_by_role": tf["argmax_by_role"],
        "held_out_sampled_estimate_by_hops": tf["sampled_estimate_by_hops"],
    }
    info["tflops_per_s"] = round(info["flops"] / max(1e-9, info["train_seconds"]) / 1e12, 2)
    save_kept_model(model, args.out, args.save_dtype, info)
    del model, optimizer
    # --deterministic is for the weights; the engine's kernels need not have such forms
    torch.use_deterministic_algorithms(False)
    sampled = sampled_accuracy(
        args.out, held_out[: args.sample_prompts], args.samples, args.seed, device
    )
    info |= {
        "held_out_sampled_accuracy": sampled["accuracy"],
        "sampled_eval": sampled,
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    write_training_info(args.out, info)
    print(json.dumps({k: v for k, v in info.items() if k not in ("args", "stages")}), flush=True)
    return info


if __name__ == "__main__":
    main()
