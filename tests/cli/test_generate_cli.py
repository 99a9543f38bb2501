"""`sparrow generate`: JSON output against transformers and the engine, schedules, errors."""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from sparrow.cli.main import main
from sparrow.model import load_tokenizer
from sparrow.sparse import Schedule, save_schedule_yaml


@pytest.fixture(autouse=True)
def single_thread():
    # many tiny ops: torch's intra-op threads only slow them down on a busy 2-core machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def generate_json(capsys, *args):
    assert main(["generate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_greedy_json_equals_transformers(qwen3_checkpoint, capsys):
    out = generate_json(
        capsys,
        "--model",
        str(qwen3_checkpoint),
        "--prompt",
        "The cat",
        "--max-new-tokens",
        "12",
        "--greedy",
        "--logprobs-topk",
        "3",
    )
    tokenizer = load_tokenizer(qwen3_checkpoint)
    assert out["prompt_ids"] == tokenizer.encode("The cat") and out["schedule"] is None
    [sample] = out["samples"]
    hf = AutoModelForCausalLM.from_pretrained(
        qwen3_checkpoint, attn_implementation="eager", dtype=torch.float32
    )
    ids = torch.tensor([out["prompt_ids"]])
    want = hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, pad_token_id=0
    )[0, ids.shape[1] :].tolist()
    assert sample["output_ids"] == want
    assert sample["text"] == tokenizer.decode(want)
    assert sample["finish_reason"] == ("stop" if len(want) < 12 else "length")
    assert len(sample["logprobs"]) == len(want) and all(lp <= 0 for lp in sample["logprobs"])
    assert [row[0] for row in sample["topk_ids"]] == want  # greedy: the top-1 is the token
    # dense pages read: every 16-token page holding the prompt and the i tokens before
    prompt_len = len(out["prompt_ids"])
    assert sample["pages_read"] == [-(-(prompt_len + i) // 16) for i in range(len(want))]


def test_seeded_samples_repeat_and_a_schedule_file_bounds_the_budget(
    qwen3_checkpoint, capsys, tmp_path
):
    args = [
        "--model",
        str(qwen3_checkpoint),
        "--prompt-ids",
        "5,6,7,8,9",
        "--n",
        "3",
        "--seed",
        "4",
        "--max-new-tokens",
        "30",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
    ]
    first = generate_json(capsys, *args)
    assert first == generate_json(capsys, *args)
    assert len(first["samples"]) == 3
    assert len({tuple(s["output_ids"]) for s in first["samples"]}) == 3
    path = save_schedule_yaml(
        Schedule(
            "cli-test",
            (1,),
            page_size=4,
            bin_tokens=64,
            reserved_bos=1,
            reserved_eos=1,
            skip_layers=(),
        ),
        tmp_path / "tight.yaml",
    )
    sparse = generate_json(capsys, *args, "--schedule", str(path))
    assert sparse["schedule"] == "cli-test"
    budgets = [b for s in sparse["samples"] for b in s["pages_read"][1:]]
    assert max(budgets) == 3 and min(budgets) >= 2  # top-1 + bos + newest, once 3+ pages


def test_text_output_and_ids_without_a_tokenizer(qwen3_checkpoint, capsys, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(qwen3_checkpoint, bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink(missing_ok=True)
    out = generate_json(
        capsys, "--model", str(bare), "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--greedy"
    )
    assert out["samples"][0]["text"] is None and len(out["samples"][0]["output_ids"]) == 3
    assert main(["generate", "--model", str(bare), "--prompt", "hi"]) == 2
    assert "--prompt needs a tokenizer" in capsys.readouterr().err
    assert (
        main(
            [
                "generate",
                "--model",
                str(qwen3_checkpoint),
                "--prompt-ids",
                "1,2",
                "--max-new-tokens",
                "4",
                "--greedy",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("[sample 0] 4 tokens, finish_reason=length")


def test_missing_model_directory(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope does not exist" in err


def test_bad_prompts_are_one_clear_error(qwen3_checkpoint, capsys):
    model = str(qwen3_checkpoint)
    assert main(["generate", "--model", model, "--prompt-ids", "1,x"]) == 2
    assert "--prompt-ids must be comma-separated integers, got '1,x'" in capsys.readouterr().err
    # the tiny checkpoints hold 4096 positions
    assert (
        main(
            [
                "generate",
                "--model",
                model,
                "--prompt-ids",
                ",".join(["1"] * 4000),
                "--max-new-tokens",
                "100",
            ]
        )
        == 2
    )
    assert (
        "4000 prompt tokens + max_new_tokens 100 = 4100 exceed the context of 4096 tokens"
        in capsys.readouterr().err
    )
    assert main(["generate", "--model", model, "--prompt-ids", "1", "--schedule", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown schedule 'nope'" in err and "calibrate.name=nope" in err


def test_a_chat_template_renders_the_prompt_shown_in_json(qwen3_checkpoint, capsys):
    model = str(qwen3_checkpoint)
    args = ["--model", model, "--prompt", "hi", "--greedy", "--max-new-tokens", "2"]
    out = generate_json(
        capsys, *args, "--chat-template", "builtin:qwen3", "--enable-thinking", "false"
    )
    rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert out["prompt"] == rendered
    assert out["prompt_ids"] == load_tokenizer(qwen3_checkpoint).encode(rendered)
    # auto: the checkpoint's own ChatML template; none (the default): the text as given
    assert generate_json(capsys, *args, "--chat-template", "auto")["prompt"].endswith(
        "<|im_start|>assistant\n"
    )
    assert generate_json(capsys, *args)["prompt"] == "hi"
    bad = ["generate", "--model", model, "--prompt-ids", "1", "--chat-template", "auto"]
    assert main(bad) == 2
    assert "--chat-template needs --prompt" in capsys.readouterr().err
