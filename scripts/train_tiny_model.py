"""Train the embedded default model: a tiny Qwen3 that solves a synthetic task (pointer_chase) on a CPU.

    python scripts/train_tiny_model.py --out sparrow_core/assets/tiny-qwen3 --steps 3000

The model is transformers' Qwen3ForCausalLM with a character tokenizer built with the
`tokenizers` library (one token per character of the task's alphabet, plus <|pad|> and
<|endoftext|>). Supervised training on reference chains of thought (loss on the completion
only) gives a policy that RL can then improve; the checkpoint ships in the repo (a few MB)
with training_info.json recording how it was made and its greedy accuracy on held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from sparrow_core.data.char_tokenizer import build_char_tokenizer
from sparrow_core.data.synthetic import DEFAULT_TASK, make_examples



def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    build_char_tokenizer(out)
    return PreTrainedTokenizerFast.from_pretrained(out)


def build_model(tok: PreTrainedTokenizerFast, args) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tok), hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
        intermediate_size=3 * args.hidden, max_position_embeddings=1024, rope_theta=10000.0,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(config)


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


@torch.no_grad()
def greedy_accuracy(model, tok, examples) -> float:
    model.eval()
    correct = 0
    for ex in examples:
        ids = torch.tensor([tok(ex.prompt).input_ids], device=model.device)
        out = model.generate(ids, max_new_tokens=len(ex.completion) + 8, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        correct += text.strip().endswith(f"Answer: {ex.answer}")
    model.train()
    return correct / len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--task", default=DEFAULT_TASK)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-seconds", type=float, default=float("inf"),
                        help="stop training early (and still evaluate and save) after this long")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tok = build_tokenizer(args.out)
    model = build_model(tok, args).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))
    )
    held_out = make_examples(args.task, 64, seed=10_000 + args.seed)
    start, loss_recent = time.time(), None
    for step in range(args.steps):
        if time.time() - start > args.max_seconds:
            print(f"stopping at step {step}: --max-seconds reached", flush=True)
            break
        ids, target = batch(tok, make_examples(args.task, args.batch, seed=args.seed * 1_000_003 + step))
        loss = model(input_ids=ids.to(args.device), labels=target.to(args.device)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            loss_recent = loss.item() if loss_recent is None else 0.5 * loss_recent + 0.5 * loss.item()
            print(f"step {step} loss {loss_recent:.4f} {time.time() - start:.0f}s", flush=True)
        if step % 1000 == 999:
            print(f"  held-out greedy accuracy {greedy_accuracy(model, tok, held_out[:32]):.3f}", flush=True)
    accuracy = greedy_accuracy(model, tok, held_out)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.to("cpu").save_pretrained(args.out, safe_serialization=True)
    info = {"task": args.task, "steps": step + 1, "batch": args.batch, "lr": args.lr,
            "hidden": args.hidden, "layers": args.layers, "seed": args.seed,
            "final_loss": loss_recent, "held_out_greedy_accuracy": accuracy,
            "train_seconds": round(time.time() - start), "torch": torch.__version__}
    (args.out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
