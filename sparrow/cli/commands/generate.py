"""`sparrow generate`: run the rollout engine on one prompt, dense or block-sparse.

    python scripts/make_tiny_model.py /tmp/tiny
    sparrow generate --model /tmp/tiny --prompt "2 + 2 =" --max-new-tokens 32 --greedy
    sparrow generate --model /tmp/tiny --prompt-ids "1,2,3" --n 4 --seed 7 --json
    sparrow generate --model /tmp/tiny --prompt "..." --schedule tiny-0.86 --json
    sparrow generate --model /models/Qwen3-1.7B --prompt "2 + 2 = ?" --chat-template auto \
        --enable-thinking false --json          # "prompt": the rendered chat prompt

--schedule takes a preset name or a schedule file (sparrow schedule list); without it every
decode step is dense. The KV page size follows the schedule (16 without one). With
--chat-template, --prompt is a user message rendered by that template (sparrow/data/chat.py)
with the generation prompt; JSON's "prompt" is the text the model saw. JSON prints
one object per sample: output_ids, text (when the model directory has a tokenizer),
logprobs, pages_read (pages read per KV head at each step), finish_reason, and top-K ids
and logprobs when --logprobs-topk K > 0. A progress bar goes to stderr on long generations.
"""

from __future__ import annotations

import argparse

from sparrow.cli.output import print_json
from sparrow.errors import SparrowError

# generations of at least this many tokens (n x max_new_tokens) show a progress bar
PROGRESS_TOKENS = 256


class GenerateArgumentError(SparrowError, ValueError):
    """A bad `sparrow generate` argument; the message names it."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate from a model, dense or block-sparse")
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="a Hugging Face model directory, or builtin:tiny",
    )
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument(
        "--prompt", metavar="TEXT", help="prompt text (needs the model's tokenizer)"
    )
    prompt.add_argument("--prompt-ids", metavar="IDS", help='prompt token ids, e.g. "1,2,3"')
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="argmax decoding (temperature 0)")
    mode.add_argument("--temperature", type=float, default=1.0, metavar="T")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P")
    parser.add_argument("--top-k", type=int, default=0, metavar="K", help="0 keeps every token")
    parser.add_argument("--n", type=int, default=1, metavar="K", help="samples of the prompt")
    parser.add_argument("--schedule", metavar="NAME|FILE", help="sparsity schedule; omit for dense")
    parser.add_argument("--seed", type=int, default=None, metavar="S")
    parser.add_argument(
        "--logprobs-topk",
        type=int,
        default=0,
        metavar="K",
        help="also print the top-K ids and logprobs of every token",
    )
    parser.add_argument("--kv-cache-mib", type=float, default=256.0, metavar="MIB")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument(
        "--chat-template",
        default="none",
        metavar="auto|none|builtin:NAME|FILE",
        help="render --prompt as a user message with this chat template (auto: the model's)",
    )
    parser.add_argument(
        "--enable-thinking",
        choices=("true", "false"),
        default=None,
        help="the chat template's enable_thinking (Qwen3's switch); omit for its default",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparrow.engine import Engine, EngineConfig, SamplingParams
    from sparrow.model import load_model
    from sparrow.model.builtin import resolve_model_path

    args.model = str(resolve_model_path(args.model))
    schedule = _schedule(args.schedule)
    device, dtype = _device_dtype(args.device, args.dtype)
    model = load_model(args.model, dtype=dtype, device=device)
    tokenizer = _tokenizer(args.model, required=args.prompt is not None)
    prompt = _rendered(args)
    prompt_ids = tokenizer.encode(prompt) if prompt is not None else _ids(args.prompt_ids)
    params = SamplingParams(
        temperature=0.0 if args.greedy else args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        n=args.n,
        logprobs_topk=args.logprobs_topk,
    )
    config = EngineConfig(
        max_batch_size=max(args.n, 1),
        kv_cache_mib=args.kv_cache_mib,
        page_size=schedule.page_size if schedule else 16,
    )
    engine = Engine(model, tokenizer, config, schedule)
    progress = args.n * args.max_new_tokens >= PROGRESS_TOKENS
    [samples] = engine.generate([prompt_ids], params, progress=progress)
    rows = [_row(sample, args.logprobs_topk) for sample in samples]
    if args.json:
        print_json(
            {
                "prompt": prompt,
                "prompt_ids": prompt_ids,
                "schedule": schedule.name if schedule else None,
                "samples": rows,
            }
        )
        return 0
    for row in rows:
        shown = row["text"] if row["text"] is not None else " ".join(map(str, row["output_ids"]))
        budget = row["pages_read"]
        print(
            f"[sample {row['sample_index']}] {len(row['output_ids'])} tokens, "
            f"finish_reason={row['finish_reason']}, pages read per step "
            f"{min(budget)}-{max(budget)}"
        )
        print(shown)
    return 0


def _row(sample, logprobs_topk: int) -> dict:
    row = sample.to_dict()
    row.pop("prompt_index")
    if logprobs_topk <= 0:
        row.pop("topk_ids")
        row.pop("topk_logprobs")
    return row


def _rendered(args: argparse.Namespace) -> str | None:
    """--prompt as the model sees it: through the chat template unless that is none."""
    if args.chat_template == "none":
        return args.prompt
    if args.prompt is None:
        raise GenerateArgumentError("--chat-template needs --prompt, not --prompt-ids")
    from sparrow.data.chat import ChatTemplateError, chat_renderer

    thinking = None if args.enable_thinking is None else args.enable_thinking == "true"
    try:
        chat = chat_renderer(args.model, args.chat_template, thinking)
        return chat.render((("user", args.prompt),))
    except ChatTemplateError as err:
        raise GenerateArgumentError(f"--chat-template: {err}") from None


def _ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise GenerateArgumentError(
            f"--prompt-ids must be comma-separated integers, got {text!r}"
        ) from None
    if not ids:
        raise GenerateArgumentError("--prompt-ids holds no token id")
    return ids


def _schedule(spec: str | None):
    if spec is None:
        return None
    from sparrow.sparse import resolve_schedule

    return resolve_schedule(spec)


def _tokenizer(path: str, required: bool):
    from sparrow.model import TokenizerError, load_tokenizer

    try:
        return load_tokenizer(path)
    except TokenizerError as err:
        if required:
            raise GenerateArgumentError(f"--prompt needs a tokenizer: {err}") from None
        return None


def _device_dtype(device: str, dtype: str):
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return device, torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in dtypes:
        raise GenerateArgumentError(
            f"--dtype must be auto or one of {', '.join(dtypes)}, got {dtype!r}"
        )
    return device, dtypes[dtype]
