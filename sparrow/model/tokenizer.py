"""Tokenizers: load a checkpoint's tokenizer, and build the byte-level one of tiny models.

    tok = load_tokenizer("/models/Qwen3-1.7B")
    ids = tok.encode("2 + 2 =")            # no special tokens added unless asked
    text = tok.decode(ids)
    tok.eos_token_ids                      # from generation_config / config / tokenizer_config

tokenizer.json is read with the `tokenizers` library; a directory without one falls back to
transformers' AutoTokenizer (local files only). The byte-level tokenizer written by
build_byte_tokenizer maps byte b to token id b (0..255) and puts SPECIAL_TOKENS after them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparrow.errors import SparrowError

SPECIAL_TOKENS = {"<|endoftext|>": 256, "<|bos|>": 257, "<|im_start|>": 258, "<|im_end|>": 259}
# a Qwen-style chat format for the byte-level tokenizer
BYTE_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TokenizerError(SparrowError, FileNotFoundError):
    """No usable tokenizer in a model directory."""


class Tokenizer:
    """encode / decode / eos_token_ids over either a `tokenizers` or a transformers tokenizer."""

    def __init__(self, backend: Any, eos_token_ids: Sequence[int], fast: bool):
        self._backend = backend
        self._fast = fast
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if self._fast:
            return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        if self._fast:
            return self._backend.token_to_id(token)
        found = self._backend.convert_tokens_to_ids(token)
        return None if found == self._backend.unk_token_id else found

    @property
    def vocab_size(self) -> int:
        if self._fast:
            return self._backend.get_vocab_size(with_added_tokens=True)
        return len(self._backend)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a local model directory; TokenizerError when there is none."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise TokenizerError(f"model directory {folder} does not exist")
    tokenizer_file = folder / "tokenizer.json"
    if tokenizer_file.is_file():
        from tokenizers import Tokenizer as FastTokenizer

        backend = FastTokenizer.from_file(str(tokenizer_file))
        return Tokenizer(backend, _eos_ids(folder, backend.token_to_id), fast=True)
    slow_files = ("tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any((folder / name).is_file() for name in slow_files):
        raise TokenizerError(
            f"no tokenizer in {folder}: expected tokenizer.json (or {', '.join(slow_files)})"
        )
    try:
        from transformers import AutoTokenizer

        backend = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as err:  # transformers raises many kinds here; report one clear line
        raise TokenizerError(f"could not load the tokenizer in {folder}: {err}") from None
    lookup = backend.convert_tokens_to_ids
    return Tokenizer(backend, _eos_ids(folder, lookup), fast=False)


def _eos_ids(folder: Path, lookup) -> tuple[int, ...]:
    """End-of-sequence ids, in order of first mention across the checkpoint's files."""
    found: list[int] = []

    def add(value: Any) -> None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, dict):  # tokenizer_config's AddedToken form
                v = v.get("content")
            if isinstance(v, str):
                v = lookup(v)
            if isinstance(v, int) and v not in found:
                found.append(v)

    for name, key in (
        ("generation_config.json", "eos_token_id"),
        ("config.json", "eos_token_id"),
        ("tokenizer_config.json", "eos_token"),
    ):
        file = folder / name
        if file.is_file():
            value = json.loads(file.read_text()).get(key)
            if value is not None:
                add(value)
    return tuple(found)


def byte_to_char() -> dict[int, str]:
    """The byte-level alphabet: printable bytes stand for themselves, others shift past 255."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping, shifted = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def build_byte_tokenizer(out_dir: str | Path) -> Path:
    """Write tokenizer.json (+ tokenizer_config.json) of the byte-level tokenizer."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as FastTokenizer

    vocab = {char: b for b, char in byte_to_char().items()}
    vocab.update(SPECIAL_TOKENS)
    backend = FastTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 1 << 20,
        "chat_template": BYTE_CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out
