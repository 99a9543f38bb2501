"""The project's vLLM general plugin: registers the block-sparse attention backend, when asked.

    # pyproject.toml, [project.entry-points."vllm.general_plugins"]:
    sparrow_sparse = "sparrow.vllm.plugin:register"
    SPARROW_VLLM_SPARSE=1  ->  register() makes AttentionBackendEnum.CUSTOM the sparse backend

vLLM calls every general plugin in each of its processes before it builds a model
(vllm/plugins/__init__.py load_general_plugins, once per process). Without
SPARROW_VLLM_SPARSE=1 register() does nothing, so an installed project leaves every other vLLM
run alone; VllmEngine (engine.py) sets the variable and calls register() itself when its
schedule is sparse (vLLM loads plugins once per process, maybe before the variable was set),
then asks for attention_config={"backend": "CUSTOM"}. Registering twice is harmless.
"""

from __future__ import annotations

import os

ENV = "SPARROW_VLLM_SPARSE"
BACKEND = "sparrow.vllm.sparse_backend.SparseAttentionBackend"  # sparse_backend.BACKEND


def active() -> bool:
    """Whether this process asked for the sparse backend (SPARROW_VLLM_SPARSE=1)."""
    return os.environ.get(ENV) == "1"


def register() -> bool:
    """Register the sparse backend as vLLM's CUSTOM attention backend when active; returns
    whether it did. The backend's module (and so torch and triton) loads only when vLLM
    resolves CUSTOM."""
    if not active():
        return False
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)
    return True
