"""Both trainers are Trainers (sparrow/trainer/protocol.py): PolicyTrainer built and checked
live, TrainerGroup (FSDP ranks on Ray) by its names and signatures, each with the
capabilities the runtime asks instead of testing its class."""

from __future__ import annotations

from sparrow.config import load_config
from sparrow.runtime.trainer_group.group import TrainerGroup
from sparrow.trainer.policy_trainer import PolicyTrainer
from sparrow.trainer.protocol import Trainer
from tests.protocol_check import mismatches


def test_the_policy_trainer_is_a_trainer(qwen3_checkpoint):
    assert mismatches(PolicyTrainer, Trainer, ("sharded",)) == []
    trainer = PolicyTrainer(qwen3_checkpoint, load_config([]).algo, device="cpu")
    assert isinstance(trainer, Trainer)
    assert (trainer.sharded, trainer.can_offload, trainer.failed) == (False, False, "")


def test_the_trainer_group_is_a_trainer():
    assert mismatches(TrainerGroup, Trainer, ("sharded",)) == []
    group = TrainerGroup.__new__(TrainerGroup)  # no ranks: the attributes __init__ sets
    TrainerGroup.__init__(group, _Spec(), [])
    assert isinstance(group, Trainer)
    assert (group.sharded, group.can_offload, group.failed) == (True, False, "")


class _Spec:
    device = "cpu"
