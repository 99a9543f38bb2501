"""The compact decoder (Qwen3 / Qwen2 / Llama), its loader, tokenizer and tiny random models.

    from sparrow_core.model import load_model, causal_attention
    model = load_model(path)
    hidden = model(input_ids, positions, causal_attention(seq_lens))
    logits = model.compute_logits(hidden)

docs/model.md describes the interface; tests live in tests/sparrow_core/model/.
"""

from sparrow_core.model.attention import causal_attention
from sparrow_core.model.config import Llama3RopeScaling, ModelArch, ModelConfigError
from sparrow_core.model.decoder import Decoder, WeightLoadError
from sparrow_core.model.fusion import FusionError
from sparrow_core.model.layers import AttentionFn
from sparrow_core.model.loader import CheckpointError, load_model, read_arch
from sparrow_core.model.tokenizer import Tokenizer, TokenizerError, load_tokenizer

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
