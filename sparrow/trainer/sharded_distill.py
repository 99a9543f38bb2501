"""DistillSparse's LoRA step on the ranks of a trainer group (data parallel, LoRA replicated).

    distiller = ShardedDistiller(model_path, algo, device, dtype, seed=0)   # on every rank
    distiller.set_base_from(trainer)        # a ShardedPolicyTrainer: the policy after its update
    metrics = distiller.distill(records, schedule, advantages)   # the whole batch on every rank
    distiller.save(folder)                  # rank 0 writes SparseDistiller's folder

Every rank holds the whole student (rl/distill.py: the engine's Decoder, frozen base in the
compute dtype, fp32 LoRA) and the same AdamW. set_base_from gathers the trainer's FSDP shards
one tensor at a time (DTensor.full_tensor, a collective) straight into the frozen base, so no
rank holds a second full copy of the policy. distill() runs SparseDistiller's step on this
rank's records (sharded.shares: whole prompts, balanced by tokens) with the whole batch's token
count as the normaliser, then sums the LoRA gradients over the ranks (one all_reduce of a flat
buffer: the single-process gradient), so the clip and the AdamW step are the same on every rank
and the LoRA stays replicated; the loss sums and the per-token acceptance are gathered, so
every rank returns one process's metrics and per-bin statistics. The base is not sharded: the
LoRA's optimizer state is a few MB, and the teacher-forced replay (engine/teacher_forced.py)
calls the Decoder's layers outside their forward, which FSDP's hooks would not see. The folder
rank 0 saves is the single-process one, so either resumes from it. With algo.distill.ppo_coef
> 0 the PPO term is normalised per micro-batch, as in one process, so it matches one process
only where the micro-batches do. Tests: tests/trainer/test_sharded_distill.py (gloo).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from sparrow.data.rollouts import RolloutRecord
from sparrow.trainer.distill import SparseDistiller
from sparrow.trainer.lora import lora_parameters
from sparrow.trainer.sharded import shares


class GatheredWeights(Mapping[str, torch.Tensor]):
    """An FSDP model's state dict with each sharded tensor gathered whole on access (a
    collective: every rank must read the same names in the same order)."""

    def __init__(self, model: torch.nn.Module):
        self.state = model.state_dict()

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self.state[name]
        return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor

    def __iter__(self):
        return iter(self.state)

    def __len__(self) -> int:
        return len(self.state)


class ShardedDistiller(SparseDistiller):
    """SparseDistiller whose step is shared by the ranks of a process group (module doc)."""

    def __init__(self, *args, group=None, **kwargs):
        if not dist.is_initialized():
            raise RuntimeError("ShardedDistiller needs torch.distributed.init_process_group")
        super().__init__(*args, **kwargs)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def set_base_from(self, trainer) -> None:
        """The trainer's current weights as the frozen base (a collective)."""
        self.set_base(GatheredWeights(trainer.model))

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend(self.group) == "nccl" else torch.device("cpu")

    def _share(self, records: Sequence[RolloutRecord]) -> list[int]:
        return shares(records, self.world_size)[self.rank]

    def _gather(self, sums, tokens):
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, (dict(sums), tokens), group=self.group)
        total: dict[str, float] = defaultdict(float)
        merged: dict[str, list] = defaultdict(list)
        for rank_sums, rank_tokens in gathered:  # rank order: every rank merges alike
            for key, value in rank_sums.items():
                total[key] += value
            for key, values in rank_tokens.items():
                merged[key] += values
        return total, dict(merged)

    def _reduce_gradients(self) -> None:
        """The sum of the ranks' LoRA gradients on every rank; a parameter no rank has a
        gradient for keeps none (one process would skip it in the step)."""
        params = lora_parameters(self.model)
        device = self._comm_device()
        has = torch.tensor([float(p.grad is not None) for p in params], device=device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX, group=self.group)
        used = [p for p, flag in zip(params, has.tolist()) if flag]
        for p in used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if not used:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in used]).to(device)
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for p in used:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def save(self, folder: str | Path) -> Path:
        """Rank 0 writes the folder (every rank holds the same LoRA and moments); the others
        only return its path. Not a collective."""
        return super().save(folder) if self.rank == 0 else Path(folder)
