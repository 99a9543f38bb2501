"""The character tokenizer of the embedded default model: one token per character of the
synthetic tasks' alphabet.

    from sparrow.data.char_tokenizer import build_char_tokenizer
    build_char_tokenizer("/tmp/tiny")           # writes tokenizer.json + tokenizer_config.json
    load_tokenizer("/tmp/tiny").encode("def")   # three ids

Ids: 0 <|pad|>, 1 <|endoftext|> (the end of sequence), then every character of
sparrow.data.synthetic.ALPHABET in sorted order. The GPU testbed's tokenizer (letter_pairs=True) also
has one id per two-letter name after those. A character outside the alphabet has no
id and is dropped by the encoder (the tiny model only ever reads its own tasks). Both the
script that trains the embedded model (scripts/train_tiny_model.py) and the untrained
stand-in of sparrow.model.builtin use this one definition, so their ids agree.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from sparrow.data.synthetic import ALPHABET, NAMES

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
SPECIALS = (PAD_TOKEN, EOS_TOKEN)


def char_vocab(letter_pairs: bool = False) -> dict[str, int]:
    """token -> id: the special tokens first, then the alphabet's characters sorted; with
    letter_pairs, then every two-letter name of the synthetic tasks (aa, ab, ..., zz)."""
    tokens = [*SPECIALS, *sorted(set(ALPHABET))]
    if letter_pairs:
        tokens += NAMES
    return {token: i for i, token in enumerate(tokens)}


@lru_cache(maxsize=2)
def char_tokenizer(letter_pairs: bool = False):
    """The tokenizers.Tokenizer that build_char_tokenizer saves (one per setting, cached).

    letter_pairs adds one BPE merge per two-letter name, so every name of the synthetic
    tasks (always written between non-letters) is one token: the testbed model's lookups
    then match a single key token, as an induction head does, instead of a two-character
    key (its second GPU run, docs/testbed.md, learnt the two-character match only in part,
    worse the more names shared a letter). Runs of letters in the task's words (def, from,
    hops, Answer) split into pairs by merge rank, the same way every time.
    """
    from tokenizers import Tokenizer, decoders, models

    merges = [(name[0], name[1]) for name in NAMES] if letter_pairs else []
    core = Tokenizer(
        models.BPE(vocab=char_vocab(letter_pairs), merges=merges, unk_token=None, fuse_unk=False)
    )
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIALS))
    return core


def build_char_tokenizer(out_dir: str | Path, letter_pairs: bool = False) -> Path:
    """Write tokenizer.json and tokenizer_config.json into out_dir (created); returns it.

    The folder then loads with sparrow.model.load_tokenizer and with transformers'
    PreTrainedTokenizerFast.from_pretrained / AutoTokenizer.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    char_tokenizer(letter_pairs).save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
