"""scripts/train_testbed_model.py --smoke end to end on CPU: the files and training_info.json
fields it writes, the same bytes from the same seed, and the budget-fitted step count."""

import hashlib
import importlib.util
import json
import math
from pathlib import Path

import pytest

from sparrow.experiments.testbed.data import vocab
from sparrow.model import load_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_testbed_model.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return _load("train_testbed_model")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_smoke_run_writes_a_checkpoint_and_its_record(script, tmp_path):
    info = script.main(["--out", str(tmp_path / "a"), "--smoke", "--device", "cpu"])
    out = tmp_path / "a"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "training_info.json",
    ):
        assert (out / name).is_file(), name
    assert set(info["held_out_argmax_by_role"]) == {"answer", "local", "lookup"}
    by_role = _load("testbed_by_role").main([str(out), "--sizes", "8:2:1,8:1:4", "--prompts", "2"])
    assert [(row["names"], row["chains"]) for row in by_role] == [(8, 1), (8, 4)]
    assert all(0.0 <= row["argmax_by_role"]["lookup"] <= 1.0 for row in by_role)
    assert json.loads((out / "training_info.json").read_text()) == info
    assert info["model_safetensors_sha256"] == _sha(out / "model.safetensors")
    assert info["seed"] == 0 and info["steps_planned"] == info["steps_done"] == 8
    stages = info["stages"]
    assert stages[-1]["num_defs"] == 8 and stages[-1]["num_hops"] == 12
    assert info["sequence_tokens"] == stages[-1]["length"]
    # 8 steps, 2 noisy at full length; each step about batch_tokens (1024) tokens
    assert 8 * 512 <= info["tokens_seen"] <= 8 * 2048
    assert info["hop_noise"] == 0.05 and math.isfinite(info["final_loss"])
    for key in (
        "held_out_greedy_accuracy",
        "held_out_sampled_accuracy",
        "held_out_sampled_accuracy_estimate",
        "held_out_hop_accuracy",
    ):
        assert 0.0 <= info[key] <= 1.0, key
    assert info["sampled_eval"]["prompts"] == 2 and info["sampled_eval"]["samples"] == 2
    by_hops = info["held_out_sampled_estimate_by_hops"]
    assert list(by_hops) == ["2", "3", "6", "9", "12"]
    assert 0.0 <= by_hops["12"] <= by_hops["6"] <= by_hops["2"] <= 1.0  # longer, no likelier
    # SMOKE stages of 4, 1, 1 and 1 of the 7 clean steps (the first two curriculum stages are
    # one size at 8 names: caps at 60%, 75%, 85%, all), one
    # record at each stage's end and one after the noisy tail
    stage_eval = info["stage_eval"]
    assert [(r["stage"], r["steps_done"], r["reason"]) for r in stage_eval] == [
        (1, 4, "steps"),
        (2, 5, "steps"),
        (3, 6, "steps"),
        (4, 7, "steps"),
        ("end", 8, "end"),
    ]
    assert [r["num_hops"] for r in stage_eval] == [1, 2, 6, 12, 12]
    for record in stage_eval:
        assert 0.0 <= record["hop_accuracy_stage_length"] <= 1.0
        assert 0.0 <= record["hop_accuracy_full_length"] <= 1.0
        assert math.isfinite(record["loss"])
    assert stage_eval[-1]["loss"] == pytest.approx(info["final_loss"], abs=1e-4)
    # the last stage is the full length: its two accuracies are one measurement
    assert stage_eval[3]["hop_accuracy_stage_length"] == stage_eval[3]["hop_accuracy_full_length"]
    assert [c["steps_done"] for c in info["stage_checks"]] == [2, 4, 5, 6, 7]
    assert info["device"] == "cpu" and info["torch"] and info["transformers"]
    assert info["wall_seconds"] > 0 and info["stopped_at_budget"] is False
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["num_attention_heads"] > config["num_key_value_heads"]
    text = "def ab=cd\nfrom ab hops 3\n"
    ids = vocab()
    tokens = [
        "de",
        "f",
        " ",
        "ab",
        "=",
        "cd",
        "\n",
        "fr",
        "om",
        " ",
        "ab",
        " ",
        "ho",
        "ps",
        " ",
        "3",
        "\n",
    ]
    assert load_tokenizer(out).encode(text) == [ids[t] for t in tokens]
    assert config["vocab_size"] == len(ids) == 43 + 26 * 26


def test_same_seed_same_bytes_other_seed_other_bytes(script, tmp_path):
    runs = {
        name: script.main(
            [
                "--out",
                str(tmp_path / name),
                "--smoke",
                "--device",
                "cpu",
                "--seed",
                str(seed),
                "--steps",
                "3",
            ]
        )
        for name, seed in (("a", 1), ("b", 1), ("c", 2))
    }
    assert runs["a"]["model_safetensors_sha256"] == runs["b"]["model_safetensors_sha256"]
    assert runs["a"]["model_safetensors_sha256"] != runs["c"]["model_safetensors_sha256"]
    assert runs["a"]["final_loss"] == runs["b"]["final_loss"]
    assert runs["a"]["stage_eval"] == runs["b"]["stage_eval"]


def test_the_embedding_is_not_decayed(script):
    args = script.parse_args(["--out", "unused", "--smoke", "--device", "cpu"])
    model = script.build_model(args)
    optimizer = script.make_optimizer(model, args, script.torch.device("cpu"))
    decayed, plain = optimizer.param_groups
    embedding = model.get_input_embeddings().weight
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert any(p is embedding for p in plain["params"])
    assert not any(p is embedding for p in decayed["params"])
    assert all(p.ndim == 2 for p in decayed["params"]) and decayed["params"]
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_steps_zero_fits_the_run_to_the_budget(script, tmp_path):
    info = script.main(
        [
            "--out",
            str(tmp_path / "fit"),
            "--smoke",
            "--device",
            "cpu",
            "--steps",
            "0",
            "--max-minutes",
            "0.05",
        ]
    )
    assert info["steps_planned"] >= 1
    assert info["steps_done"] <= info["steps_planned"]


def test_a_study_variant_trains_on_cpu_and_the_small_sizes_hold_5_to_15m(script, tmp_path):
    info = script.main(["--out", str(tmp_path / "v3"), "--smoke", "--variant", "v3"])
    assert info["task"] == "multi_chase"
    assert info["task_sizes"] == {"num_defs": 8, "num_hops": 12, "chains": 4, "tags": 1}
    assert info["stages"][-1]["chains"] == 4 and 0.0 <= info["held_out_sampled_accuracy"] <= 1.0
    for size, low, high in (("small", 5e6, 8e6), ("medium", 10e6, 15e6)):
        args = script.parse_args(["--out", str(tmp_path), "--model-size", size, "--variant", "v2"])
        assert (args.num_defs, args.num_hops, args.chains, args.tags) == (256, 63, 4, 0)
        parameters = sum(p.numel() for p in script.build_model(args).parameters())
        assert low <= parameters <= high, (size, parameters)
    args = script.parse_args(["--out", "x", "--variant", "v3", "--num-hops", "9"])
    assert (args.num_hops, args.chains, args.tags, args.layers) == (9, 4, 1, 12)


def test_a_run_out_of_time_still_trains_its_noisy_phase(script, tmp_path):
    # far more steps than 12 s hold: the clock, not the plan, begins the noisy phase
    args = ["--smoke", "--device", "cpu", "--steps", "100000", "--max-minutes", "0.2"]
    info = script.main(["--out", str(tmp_path / "slow"), *args, "--eval-reserve-s", "0"])
    assert info["stopped_at_budget"] and info["steps_done"] < 100000
    assert info["curriculum_cut_by_time"] and info["hop_noise"] == 0.05
    assert info["noise_steps_done"] > 0 and info["before_noise"] is not None
    assert info["clean_steps_done"] + info["noise_steps_done"] == info["steps_done"]


def test_noise_only_from_a_kept_model(script, tmp_path):
    script.main(["--out", str(tmp_path / "kept"), "--smoke", "--device", "cpu"])
    kept_sha = _sha(tmp_path / "kept" / "model.safetensors")
    info = script.main(
        ["--out", str(tmp_path / "rl"), "--smoke", "--device", "cpu", "--steps", "3"]
        + ["--init-from", str(tmp_path / "kept"), "--noise-only"]
    )
    assert info["init_from"] == {
        "path": str(tmp_path / "kept"),
        "model_safetensors_sha256": kept_sha,
    }
    assert info["noise_steps_done"] == info["steps_done"] == 3 and info["clean_steps_done"] == 0
    assert info["args"]["lr"] == 1e-4 and info["hop_noise"] == 0.05
    assert [s["num_hops"] for s in info["stages"]] == [12]  # full length only
    assert info["model_safetensors_sha256"] != kept_sha  # the weights moved


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--noise-only"], "--noise-only needs --init-from"),
        (["--noise-only", "--init-from", "x", "--noise-share", "0"], "would train nothing"),
    ],
)
def test_noise_only_refuses_what_cannot_run(script, tmp_path, capsys, extra, says):
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path / "x"), "--smoke", *extra])
    assert says in capsys.readouterr().err


def test_init_from_a_folder_without_weights_is_one_line(script, tmp_path):
    with pytest.raises(SystemExit, match="no model.safetensors there"):
        script.main(["--out", str(tmp_path / "x"), "--smoke", "--init-from", str(tmp_path)])
