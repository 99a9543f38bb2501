"""Model paths as users write them: "builtin:tiny" or a local Hugging Face directory.

    from sparrow.model.builtin import resolve_model_path
    path = resolve_model_path("builtin:tiny")          # the embedded default checkpoint
    path = resolve_model_path("~/models/Qwen3-1.7B")    # checked: a folder with config.json

"builtin:tiny" is the tiny Qwen3 the project trains on its synthetic task
(scripts/train_tiny_model.py), shipped in sparrow/assets/tiny-qwen3. While that folder
is absent (a checkout from before the model landed), a random model of the same shape and the
same character tokenizer stands in: it is built once, seeded, into
$SPARROW_CACHE_DIR/tiny-qwen3-random (default ~/.cache/sparrow), with a warning, so that the
whole pipeline still runs; its rewards are at chance.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

from sparrow.cache import cache_dir
from sparrow.errors import SparrowError
from sparrow.scratch import scratch_dir

BUILTIN_PREFIX = "builtin:"
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
# name after "builtin:" -> folder under ASSETS_DIR
BUILTIN_MODELS = {"tiny": "tiny-qwen3"}
RANDOM_STANDIN_NAME = "tiny-qwen3-random"
# the shape scripts/train_tiny_model.py trains (its defaults)
TINY_SHAPE = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=384,
    max_position_embeddings=1024,
    rope_theta=10000.0,
)
STANDIN_SEED = 0

_warned = False


class ModelPathError(SparrowError, FileNotFoundError):
    """A model path that names no usable checkpoint (the message names the path)."""


def resolve_model_path(spec: str) -> Path:
    """The checkpoint directory that `spec` (model.path) names; ModelPathError if there is none."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelPathError(f"model path must be a non-empty string, got {spec!r}")
    if spec.startswith(BUILTIN_PREFIX):
        return _builtin(spec[len(BUILTIN_PREFIX) :])
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise ModelPathError(f"model directory {folder} does not exist")
    if not (folder / "config.json").is_file():
        raise ModelPathError(f"model directory {folder} has no config.json")
    return folder


def _builtin(name: str) -> Path:
    if name not in BUILTIN_MODELS:
        raise ModelPathError(
            f"unknown built-in model {BUILTIN_PREFIX}{name}; valid: "
            + ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_MODELS))
        )
    shipped = ASSETS_DIR / BUILTIN_MODELS[name]
    if (shipped / "config.json").is_file():
        return shipped
    _warn_standin(shipped)
    return random_standin(cache_dir() / RANDOM_STANDIN_NAME)


def _warn_standin(shipped: Path) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"the trained embedded model is missing ({shipped}); using an untrained random "
            "model of the same shape instead (rewards will be at chance)",
            stacklevel=3,
        )


def random_standin(folder: Path) -> Path:
    """A seeded random tiny Qwen3 with the character tokenizer in `folder`, built if absent.

    Built in a scratch folder beside it and renamed into place, so processes that start at
    once (rollout actors) never see half a checkpoint; the loser of that race drops its copy.
    """
    if (folder / "config.json").is_file():
        return folder
    scratch = scratch_dir(folder)  # makes folder's parent too
    try:
        _write_random_tiny(scratch)
        try:
            os.rename(scratch, folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _write_random_tiny(out: Path) -> None:
    import transformers
    from transformers.utils import logging as hf_logging

    from sparrow.data.char_tokenizer import EOS_TOKEN, PAD_TOKEN, build_char_tokenizer, char_vocab
    from sparrow.model.random_checkpoint import randomize_weights

    vocab = char_vocab()
    config = transformers.Qwen3Config(
        vocab_size=len(vocab),
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        eos_token_id=vocab[EOS_TOKEN],
        pad_token_id=vocab[PAD_TOKEN],
        bos_token_id=None,
        **TINY_SHAPE,
    )
    hf_logging.disable_progress_bar()
    model = transformers.Qwen3ForCausalLM(config).eval()
    randomize_weights(model, STANDIN_SEED)
    model.save_pretrained(out)
    build_char_tokenizer(out)
