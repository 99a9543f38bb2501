"""Which syncs wait for the trainer's background write: stages/sync_weights.folder_needed.

A colocated CUDA trainer hands its weights to the engine on its own GPU through CUDA IPC, which
needs no file; an engine on another GPU of the host (one trainer process on cuda:0, an actor per
GPU) reads the step's policy folder, so the sync has to wait for the write. The device uuids
are stood in for here; the GPU run is tests/flows/test_train_flow_gpu.py.
Run: `python -m pytest tests/stages/test_sync_weights.py -q`.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sparrow.engine import weight_share
from sparrow.stages.sync_weights import folder_needed


class UuidPool:
    def __init__(self, uuids):
        self.uuids = list(uuids)

    def device_uuids(self):
        return list(self.uuids)


def runtime_with(uuids, on_gpu=True):
    return SimpleNamespace(pool_on_gpu=on_gpu, pool=UuidPool(uuids))


def trainer_on(kind: str, index=0):
    return SimpleNamespace(device=SimpleNamespace(type=kind, index=index))


@pytest.fixture(autouse=True)
def gpu_uuids(monkeypatch):
    monkeypatch.setattr(weight_share, "device_uuid", lambda index=None: f"GPU-{index or 0}")


def test_every_engine_on_the_trainers_gpu_needs_no_folder():
    assert not folder_needed(runtime_with(["GPU-0"]), trainer_on("cuda", 0))
    assert not folder_needed(runtime_with(["GPU-1", "GPU-1"]), trainer_on("cuda", 1))


def test_an_engine_on_another_gpu_of_the_host_needs_the_folder():
    assert folder_needed(runtime_with(["GPU-0", "GPU-1"]), trainer_on("cuda", 0))
    assert folder_needed(runtime_with(["GPU-1"]), trainer_on("cuda", 0))


def test_without_a_colocated_cuda_trainer_every_engine_reads_the_folder():
    assert folder_needed(runtime_with(["GPU-0"]), None)
    assert folder_needed(runtime_with(["GPU-0"]), trainer_on("cpu", None))
    assert folder_needed(runtime_with([""], on_gpu=False), trainer_on("cuda", 0))
