"""Train the embedded default model: a tiny Qwen3 for a synthetic task (pointer_chase) on a CPU.

    python scripts/train_tiny_model.py --out /tmp/tiny-sft --steps 3000                # stage 1
    python scripts/train_tiny_model.py --out sparrow/assets/tiny-qwen3 --init /tmp/tiny-sft \
        --hop-noise 0.06 --steps 300 --batch 32 --lr 3e-4 --seed 0 --threads 1          # stage 2

The model is transformers' Qwen3ForCausalLM with a character tokenizer built with the
`tokenizers` library (one token per character of the task's alphabet, plus <|pad|> and
<|endoftext|>). Supervised training on reference chains of thought (loss on the completion
only) gives a policy that solves the task; stage 2 goes on from it (--init) on chains whose
hops go wrong at the rate --hop-noise, so the shipped model is partly right when sampled and
RL has something to improve. The checkpoint ships in the repo (a few MB) with
training_info.json recording how it was made and its greedy and sampled (temperature 1)
accuracy on held-out prompts; sparrow/assets/tiny-qwen3/README.md has the exact commands.
Same seed, threads and torch build: the same weights.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from sparrow.data.char_tokenizer import build_char_tokenizer
from sparrow.data.synthetic import DEFAULT_TASK, Example, make_examples


def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    build_char_tokenizer(out)
    return PreTrainedTokenizerFast.from_pretrained(out)


def build_model(tok: PreTrainedTokenizerFast, args) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=args.hidden // 4,
        intermediate_size=3 * args.hidden,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(config)


def with_hop_noise(example: Example, rate: float, rng: random.Random) -> Example:
    """The pointer_chase example with each hop, at probability `rate`, sent to a wrong defined
    name (the chain goes on from there), so a model trained on it errs per hop at that rate."""
    if rate <= 0:
        return example
    head, query = example.prompt.rstrip("\n").split("\n")
    targets = dict(item.split("=") for item in head.split()[1:])
    _, current, _, hops = query.split()
    lines = []
    for _ in range(int(hops)):
        nxt = targets[current]
        if rng.random() < rate:
            nxt = rng.choice([n for n in sorted(targets) if n not in (current, nxt)])
        lines.append(f"{current}={nxt}\n")
        current = nxt
    return Example(example.prompt, "".join(lines) + f"Answer: {current}", example.answer)


def batch(tok, examples) -> tuple[torch.Tensor, torch.Tensor]:
    rows, labels = [], []
    for ex in examples:
        prompt = tok(ex.prompt).input_ids
        completion = tok(ex.completion).input_ids + [tok.eos_token_id]
        rows.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    target = torch.full((len(rows), width), -100)
    for i, (r, l) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        target[i, : len(l)] = torch.tensor(l)
    return ids, target


def _answered(tok, ids: torch.Tensor, prompt_len: int, answer: str) -> bool:
    text = tok.decode(ids[prompt_len:], skip_special_tokens=True)
    return text.strip().endswith(f"Answer: {answer}")


@torch.no_grad()
def greedy_accuracy(model, tok, examples) -> float:
    model.eval()
    correct = 0
    for ex in examples:
        ids = torch.tensor([tok(ex.prompt).input_ids], device=model.device)
        out = model.generate(
            ids,
            max_new_tokens=len(ex.completion) + 8,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        correct += _answered(tok, out[0], ids.shape[1], ex.answer)
    model.train()
    return correct / len(examples)


@torch.no_grad()
def sampled_accuracy(model, tok, examples, samples: int, seed: int) -> float:
    """Share of samples at temperature 1 (the RL reward's mean) that end at the answer."""
    model.eval()
    torch.manual_seed(seed)
    correct = 0
    for ex in examples:
        ids = torch.tensor([tok(ex.prompt).input_ids], device=model.device)
        out = model.generate(
            ids,
            max_new_tokens=len(ex.completion) + 8,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=samples,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        correct += sum(_answered(tok, row, ids.shape[1], ex.answer) for row in out)
    model.train()
    return correct / (len(examples) * samples)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--task", default=DEFAULT_TASK)
    parser.add_argument(
        "--init",
        type=Path,
        default=None,
        help="start from this checkpoint (its shape and tokenizer) instead of random weights",
    )
    parser.add_argument(
        "--hop-noise",
        type=float,
        default=0.0,
        help="pointer_chase: share of reference hops sent to a wrong name",
    )
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=float("inf"),
        help="stop training early (and still evaluate and save) after this long",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args()


def start_model(args) -> tuple[PreTrainedTokenizerFast, Qwen3ForCausalLM]:
    if args.init is None:
        tok = build_tokenizer(args.out)
        return tok, build_model(tok, args)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if args.init.resolve() != args.out.resolve():
            shutil.copyfile(args.init / name, args.out / name)
    tok = PreTrainedTokenizerFast.from_pretrained(args.out)
    model = Qwen3ForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    args.hidden, args.layers = model.config.hidden_size, model.config.num_hidden_layers
    return tok, model


def evaluate(model, tok, examples, seed: int) -> dict[str, float]:
    return {
        "greedy": greedy_accuracy(model, tok, examples),
        "sampled": sampled_accuracy(model, tok, examples, samples=8, seed=seed),
    }


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tok, model = start_model(args)
    model = model.to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))
        ),
    )
    held_out = make_examples(args.task, 64, seed=10_000 + args.seed)
    start, loss_recent, step = time.time(), None, 0
    for step in range(args.steps):
        if time.time() - start > args.max_seconds:
            print(f"stopping at step {step}: --max-seconds reached", flush=True)
            break
        noise = random.Random(args.seed * 1_000_003 + step)
        examples = [
            with_hop_noise(ex, args.hop_noise, noise)
            for ex in make_examples(args.task, args.batch, seed=args.seed * 1_000_003 + step)
        ]
        ids, target = batch(tok, examples)
        loss = model(input_ids=ids.to(args.device), labels=target.to(args.device)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps - 1:
            loss_recent = (
                loss.item() if loss_recent is None else 0.5 * loss_recent + 0.5 * loss.item()
            )
            print(f"step {step} loss {loss_recent:.4f} {time.time() - start:.0f}s", flush=True)
        if step % args.eval_every == args.eval_every - 1:
            print(
                f"  held-out accuracy {evaluate(model, tok, held_out[:16], args.seed)}", flush=True
            )
    accuracy = evaluate(model, tok, held_out, args.seed)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.to("cpu").save_pretrained(args.out, safe_serialization=True)
    info = {
        "task": args.task,
        "init": str(args.init) if args.init else None,
        "hop_noise": args.hop_noise,
        "steps": step + 1,
        "batch": args.batch,
        "lr": args.lr,
        "hidden": args.hidden,
        "layers": args.layers,
        "seed": args.seed,
        "final_loss": loss_recent,
        "held_out_greedy_accuracy": accuracy["greedy"],
        "held_out_sampled_accuracy": accuracy["sampled"],
        "train_seconds": round(time.time() - start),
        "torch": torch.__version__,
    }
    (args.out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
