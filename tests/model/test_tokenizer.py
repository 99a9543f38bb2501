"""The byte-level tokenizer of tiny checkpoints, the transformers fallback, and errors."""

from __future__ import annotations

import json
import shutil

import pytest

from sparrow.model import TokenizerError, load_tokenizer
from sparrow.model.tokenizer import SPECIAL_TOKENS, byte_to_char

TEXTS = ["2 + 2 = 4", "héllo wörld\n\ttabs", "emoji 🙂 and 中文", "  leading spaces", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_the_utf8_bytes_and_round_trip(qwen3_checkpoint, text):
    tokenizer = load_tokenizer(qwen3_checkpoint)
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_special_tokens(qwen3_checkpoint):
    tokenizer = load_tokenizer(qwen3_checkpoint)
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|><|endoftext|>")
    assert ids == [258, *b"user\nhi", 259, 256]
    assert tokenizer.eos_token_ids == (256,)
    assert tokenizer.token_to_id("<|bos|>") == 257
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert tokenizer.vocab_size == 256 + len(SPECIAL_TOKENS)


def test_byte_alphabet_is_a_bijection():
    mapping = byte_to_char()
    assert sorted(mapping) == list(range(256))
    assert len(set(mapping.values())) == 256
    assert mapping[ord("A")] == "A" and mapping[ord(" ")] != " "


def test_fallback_to_transformers_without_tokenizer_json(tmp_path):
    # a GPT-2 style vocab.json + merges.txt describing the same byte alphabet
    vocab = {char: b for b, char in byte_to_char().items()}
    vocab.update(SPECIAL_TOKENS)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "GPT2Tokenizer",
                "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
            }
        )
    )
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.encode("héllo") == list("héllo".encode())
    assert tokenizer.decode(tokenizer.encode("héllo")) == "héllo"
    assert tokenizer.eos_token_ids == (256,)


def test_eos_ids_gather_generation_config_first(tmp_path, qwen3_checkpoint):
    shutil.copy(qwen3_checkpoint / "tokenizer.json", tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [259, 256]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 256}))
    assert load_tokenizer(tmp_path).eos_token_ids == (259, 256)


def test_no_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TokenizerError, match="no tokenizer in .*tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
