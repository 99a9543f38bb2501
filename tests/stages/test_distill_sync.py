"""DistillSparse's sync: the engines hold merge(policy, LoRA), the trainer keeps the policy.

sync_weights' body runs with a real trainer and an in-process rollout worker standing in for
the Ray pool (no Ray): after it, the worker's engine weights equal merge(base, LoRA) computed
independently here, and the trainer's equal the policy folder's (the base), by value. A worker
built with an adapter (a new or replacement actor) starts from the same merged weights.
Run: `python -m pytest tests/stages/test_distill_sync.py -q`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from sparrow.config.schema import AlgoConfig
from sparrow.engine import EngineConfig
from sparrow.model.builtin import resolve_model_path
from sparrow.runtime.rollout.worker import RolloutWorker, WorkerSpec
from sparrow.sparse import get_preset
from sparrow.stages.sync_weights import sync
from sparrow.trainer.lora import PROJECTIONS, Adapter, LoraSpec
from sparrow.trainer.policy_trainer import PolicyTrainer


class InProcessPool:
    """The part of ActorPool that sync() uses, over one in-process worker."""

    def __init__(self, spec: WorkerSpec):
        self.spec, self.worker = spec, RolloutWorker(spec)
        self.actors = [self.worker]

    def load_weights(self, path: str, adapter_path: str = "") -> list:
        self.spec = replace(self.spec, weights_path=path, adapter_path=adapter_path)
        return [self.worker.load_weights(path, adapter_path)]

    def info(self) -> list:
        return [self.worker.info()]


def random_adapter(model_dir: Path) -> Adapter:
    """A LoRA on every projection with nonzero A and B (a fresh B is 0 and merges to nothing)."""
    weights = load_file(str(model_dir / "model.safetensors"))
    spec, gen, state = LoraSpec(rank=2, alpha=4), torch.Generator().manual_seed(0), {}
    for name, tensor in weights.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS:
            out_features, in_features = tensor.shape
            state[f"{module}.lora_A.weight"] = torch.randn(2, in_features, generator=gen) * 0.1
            state[f"{module}.lora_B.weight"] = torch.randn(out_features, 2, generator=gen) * 0.1
    return Adapter(spec, state)


@pytest.fixture
def setup(tmp_path):
    torch.set_num_threads(1)
    model_dir = resolve_model_path("builtin:tiny")
    trainer = PolicyTrainer(model_dir, AlgoConfig(), "cpu", "float32", seed=0)
    with torch.no_grad():  # a policy that differs from the starting checkpoint
        for param in trainer.model.parameters():
            param.add_(1e-3)
    policy = trainer.save(tmp_path / "policy")
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    adapter = random_adapter(model_dir)
    adapter.save(adapter_dir)
    spec = WorkerSpec(
        model_path=str(model_dir),
        weights_path=str(model_dir),
        schedule=get_preset("tiny-0.86"),
        engine=EngineConfig(page_size=8),
    )
    # one trainer process (trainer.num_workers=0): the group's broadcast is test_trainer_group's
    runtime = SimpleNamespace(
        cfg=SimpleNamespace(trainer=SimpleNamespace(num_workers=0)),
        trainer_after=lambda step: trainer,
        pool_on_gpu=False,
        pool=InProcessPool(spec),
        policy_state=lambda folder, wait=True: Path(folder),
        rollout_in_flight=None,  # no one-step-off rollout holds the engines
        engine_version=0,
    )
    return runtime, trainer, Path(policy), adapter_dir, adapter


def engine_state(worker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.engine.model.state_dict().items()}


def test_engines_get_the_merged_lora_and_the_trainer_keeps_the_base(setup, tmp_path):
    runtime, trainer, policy, adapter_dir, adapter = setup
    out = tmp_path / "sync"
    out.mkdir()
    sync(runtime, 1, str(policy), out, str(adapter_dir))
    base = load_file(str(policy / "model.safetensors"))
    engine = engine_state(runtime.pool.worker)
    merged_names = {f"{m}.weight" for m in adapter.modules}
    assert merged_names and merged_names <= set(engine)
    for name, value in engine.items():
        expected = base[name]
        if name in merged_names:  # merge(base, LoRA) = W + (alpha / rank) B A, computed here
            a = adapter.state[name.replace(".weight", ".lora_A.weight")]
            b = adapter.state[name.replace(".weight", ".lora_B.weight")]
            expected = base[name] + (adapter.spec.alpha / adapter.spec.rank) * (b @ a)
            assert not torch.allclose(value, base[name], atol=1e-4)
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-6, msg=name)
    trained = trainer.state_dict_for_sync()
    assert set(base) <= set(trained)  # (a tied model repeats lm_head.weight in the state)
    for name, value in base.items():
        assert torch.equal(trained[name], value), name  # the trainer never sees the adapter
    assert runtime.pool.spec.adapter_path == str(adapter_dir)
    # a replacement (or resumed) actor built from the pool's spec starts merged too
    fresh = engine_state(RolloutWorker(runtime.pool.spec))
    assert all(torch.equal(fresh[k], engine[k]) for k in engine)


def test_without_an_adapter_the_engines_get_the_policy(setup, tmp_path):
    runtime, _, policy, _, _ = setup
    out = tmp_path / "sync"
    out.mkdir()
    sync(runtime, 1, str(policy), out)
    base = load_file(str(policy / "model.safetensors"))
    for name, value in engine_state(runtime.pool.worker).items():
        assert torch.equal(value, base[name]), name
