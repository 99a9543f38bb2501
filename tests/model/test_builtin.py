"""resolve_model_path: built-in names, the random stand-in, and local directories.

python -m pytest tests/model/test_builtin.py -q
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest

from sparrow.data.synthetic import ALPHABET, make_examples
from sparrow.errors import SparrowError
from sparrow.model import builtin, load_tokenizer
from sparrow.model.builtin import ModelPathError, resolve_model_path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def no_shipped_model(tmp_path, monkeypatch):
    """Pretend the trained model is absent; the stand-in goes to a cache in tmp_path."""
    monkeypatch.setattr(builtin, "ASSETS_DIR", tmp_path / "assets")
    monkeypatch.setattr(builtin, "_warned", False)
    monkeypatch.setenv("SPARROW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / builtin.RANDOM_STANDIN_NAME


def test_standin_is_built_once_with_one_warning(no_shipped_model):
    with pytest.warns(UserWarning, match="trained embedded model is missing"):
        first = resolve_model_path("builtin:tiny")
    assert first == no_shipped_model
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise here
        again = resolve_model_path("builtin:tiny")
    assert again == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    config = json.loads((first / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["hidden_size"] == 128 and config["num_hidden_layers"] == 4
    assert config["vocab_size"] == len(set(ALPHABET)) + 2
    assert config["eos_token_id"] == 1
    # the engine's loader reads it
    from sparrow.model import load_model

    assert load_model(first).arch.vocab_size == config["vocab_size"]
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]  # no scratch left


def test_shipped_model_wins_over_standin(tmp_path, monkeypatch):
    monkeypatch.setattr(builtin, "ASSETS_DIR", tmp_path)
    shipped = tmp_path / "tiny-qwen3"
    shipped.mkdir()
    (shipped / "config.json").write_text("{}")
    assert resolve_model_path("builtin:tiny") == shipped


def test_char_tokenizer_ids_follow_the_sorted_alphabet(no_shipped_model, tmp_path):
    from sparrow.data.char_tokenizer import build_char_tokenizer

    tok = load_tokenizer(build_char_tokenizer(tmp_path / "tok"))
    chars = sorted(set(ALPHABET))
    assert [tok.encode(c) for c in chars] == [[2 + i] for i in range(len(chars))]
    assert tok.eos_token_ids == (1,)
    example = make_examples("lookup_sum", 1, seed=3)[0]
    text = example.prompt + example.completion
    assert len(tok.encode(text)) == len(text)
    assert tok.decode(tok.encode(text)) == text


def test_char_tokenizer_matches_the_training_script(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "train_tiny", REPO / "scripts" / "train_tiny_model.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    from sparrow.data.char_tokenizer import build_char_tokenizer

    theirs = script.build_tokenizer(tmp_path / "script")
    ours = load_tokenizer(build_char_tokenizer(tmp_path / "ours"))
    text = make_examples("lookup_sum", 1, seed=5)[0].prompt
    assert ours.encode(text) == theirs(text).input_ids
    assert ours.eos_token_ids == (theirs.eos_token_id,)


def test_local_directory_is_checked(tmp_path):
    with pytest.raises(ModelPathError, match=str(tmp_path / "nope")):
        resolve_model_path(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SparrowError, match=r"empty has no config\.json"):
        resolve_model_path(str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path / "empty")) == tmp_path / "empty"


def test_unknown_builtin_lists_the_valid_ones():
    with pytest.raises(ModelPathError, match="builtin:huge.*valid: builtin:tiny"):
        resolve_model_path("builtin:huge")
    with pytest.raises(ModelPathError, match="non-empty"):
        resolve_model_path("")
