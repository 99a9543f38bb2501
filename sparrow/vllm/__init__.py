"""vLLM as a rollout backend (`rollout.backend=vllm`): decode through vLLM 0.23.0.

    from sparrow.vllm import VllmEngine, vllm_available
    engine = VllmEngine(weights_path, EngineConfig(...), tokenizer=tokenizer)  # a CUDA device
    results = engine.generate(prompt_ids, sampling_params)    # [prompt][sample] SampleResult
    engine.update_weights(state_dict); engine.sleep(); engine.wake()

`VllmEngine` (engine.py) answers the native Engine's calls that the rollout actors make, so
sparrow/runtime/rollout/actors.py holds one actor class for both backends. `outputs.py` turns vLLM's
RequestOutput into the project's SampleResult (pure; tested on CPU with objects of vLLM's
shape); `worker_extension.py` is the method vLLM's worker runs to load weights in place.
The block-sparse plugin: plugin.py (the vllm.general_plugins entry point), sparse_backend.py
(vLLM's CUSTOM attention backend), sparse_decode.py (its pure parts, CPU-tested; no vllm);
an engine started with a sparse schedule uses it, one started dense refuses sparse schedules.
Only engine.py, worker_extension.py, plugin.py and sparse_backend.py import vllm, on use.
Install and state: docs/backends.md.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from sparrow.errors import SparrowError

if TYPE_CHECKING:
    from sparrow.vllm.engine import VllmEngine  # noqa: F401 - the annotations' type

INSTALL_HINT = (
    "install vLLM 0.23.0 on the GPU machine (docs/backends.md, 'Installing vLLM "
    "on the GPU machine': scripts/pack_vllm.sh packs it with its requirements)"
)


class VllmBackendError(SparrowError):
    """vLLM is missing, cannot run here, or was asked for what the dense backend lacks."""


def vllm_available() -> bool:
    """Whether `import vllm` would find the package (the module is not imported)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    if not vllm_available():
        raise VllmBackendError(
            f"rollout.backend=vllm needs the package 'vllm', which is not "
            f"importable here; {INSTALL_HINT}"
        )


def __getattr__(name: str):
    if name == "VllmEngine":  # imported on use: it needs vllm and CUDA
        from sparrow.vllm.engine import VllmEngine  # noqa: F401 - the annotations' type

        return VllmEngine
    raise AttributeError(name)
