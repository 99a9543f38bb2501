"""The compact decoder (Qwen3 / Qwen2 / Llama), its loader, tokenizer and tiny random models.

    from sparrow.model import load_model, causal_attention
    model = load_model(path)
    hidden = model(input_ids, positions, causal_attention(seq_lens))
    logits = model.compute_logits(hidden)

docs/model.md describes the interface; tests live in tests/model/.
"""

from sparrow.model.attention import causal_attention
from sparrow.model.config import Llama3RopeScaling, ModelArch, ModelConfigError
from sparrow.model.decoder import Decoder, WeightLoadError
from sparrow.model.fusion import FusionError
from sparrow.model.layers import AttentionFn
from sparrow.model.loader import CheckpointError, load_model, read_arch
from sparrow.model.tokenizer import Tokenizer, TokenizerError, load_tokenizer

__all__ = [
    "AttentionFn",
    "CheckpointError",
    "Decoder",
    "FusionError",
    "Llama3RopeScaling",
    "ModelArch",
    "ModelConfigError",
    "Tokenizer",
    "TokenizerError",
    "WeightLoadError",
    "causal_attention",
    "load_model",
    "load_tokenizer",
    "read_arch",
]
