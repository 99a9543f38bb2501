"""The trainer's out-of-memory as one error naming the settings (sparrow/trainer/memory.py)."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch

from sparrow.errors import SparrowError
from sparrow.trainer.memory import TrainerMemoryError, names_out_of_memory
from sparrow.trainer.policy_trainer import PolicyTrainer
from tests.trainer.test_policy_trainer import ALGO, SYSTEM, make_records

DEVICE_SAID = (
    "CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of "
    "79.18 GiB of which 2.28 GiB is free. Including non-PyTorch memory, ..."
)


def out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError(DEVICE_SAID)


def test_scoring_and_the_update_name_the_settings_that_lower_their_memory(
    qwen3_checkpoint, monkeypatch
):
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", seed=0, trainer_config=SYSTEM)
    records = make_records()
    monkeypatch.setattr(trainer, "_token_logprobs", out_of_memory)
    with pytest.raises(TrainerMemoryError) as err:
        trainer.score(records)
    text = str(err.value)
    assert isinstance(err.value, SparrowError) and "\n" not in text
    assert text.startswith(
        "dense scoring ran out of GPU memory on cpu: CUDA out of memory. "
        "Tried to allocate 2.32 GiB. To fit: lower trainer.micro_batch_tokens "
        "(now 10000)"
    )
    assert "rollout.release_memory" in text and "trainer.num_workers" in text
    assert "gradient_checkpointing" not in text  # scoring keeps no activations
    assert err.value.__context__ is None  # the failed call's frames are not held

    monkeypatch.setattr(trainer, "_one_pass", out_of_memory)
    scores = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", seed=0, trainer_config=SYSTEM
    ).score(records)
    old = [s.dense_logprobs for s in scores]
    with pytest.raises(
        TrainerMemoryError,
        match=r"^the policy update ran out of GPU memory.*"
        r"set trainer\.gradient_checkpointing=true",
    ):
        trainer.update(records, [0.0, 1.0] * 3, old, 3)
    trainer.trainer_config = dataclasses.replace(SYSTEM, gradient_checkpointing=True)
    with pytest.raises(TrainerMemoryError) as err:
        trainer.update(records, [0.0, 1.0] * 3, old, 3)
    assert "gradient_checkpointing" not in str(err.value)  # already on


def test_the_failed_calls_tensors_are_let_go_before_the_error():
    class Trainer:
        trainer_config, device = SYSTEM, torch.device("cpu")

        @names_out_of_memory("a stage")
        def run(self):
            held = torch.zeros(1024)
            Trainer.held = weakref.ref(held)
            raise torch.OutOfMemoryError(DEVICE_SAID)

    with pytest.raises(TrainerMemoryError) as err:
        Trainer().run()
    assert Trainer.held() is None and err.value is not None  # the error alive, the tensor not


def test_other_errors_pass_through():
    class Trainer:
        trainer_config, device = SYSTEM, torch.device("cpu")

        @names_out_of_memory("a stage")
        def run(self):
            raise RuntimeError("not memory")

    with pytest.raises(RuntimeError, match="^not memory$"):
        Trainer().run()
