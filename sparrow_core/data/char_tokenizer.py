"""The character tokenizer of the embedded default model: one token per character of the
synthetic tasks' alphabet.

    from sparrow_core.data.char_tokenizer import build_char_tokenizer
    build_char_tokenizer("/tmp/tiny")           # writes tokenizer.json + tokenizer_config.json
    load_tokenizer("/tmp/tiny").encode("def")   # three ids

Ids: 0 <|pad|>, 1 <|endoftext|> (the end of sequence), then every character of
sparrow_core.data.synthetic.ALPHABET in sorted order. A character outside the alphabet has no
id and is dropped by the encoder (the tiny model only ever reads its own tasks). Both the
script that trains the embedded model (scripts/train_tiny_model.py) and the untrained
stand-in of sparrow_core.model.builtin use this one definition, so their ids agree.
"""

from __future__ import annotations

import json
from pathlib import Path

from sparrow_core.data.synthetic import ALPHABET

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
SPECIALS = (PAD_TOKEN, EOS_TOKEN)


def char_vocab() -> dict[str, int]:
    """token -> id: the special tokens first, then the alphabet's characters sorted."""
    return {token: i for i, token in enumerate([*SPECIALS, *sorted(set(ALPHABET))])}


def build_char_tokenizer(out_dir: str | Path) -> Path:
    """Write tokenizer.json and tokenizer_config.json into out_dir (created); returns it.

    The folder then loads with sparrow_core.model.load_tokenizer and with transformers'
    PreTrainedTokenizerFast.from_pretrained / AutoTokenizer.
    """
    from tokenizers import Tokenizer, decoders, models

    core = Tokenizer(models.BPE(vocab=char_vocab(), merges=[], unk_token=None, fuse_unk=False))
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIALS))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    core.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
