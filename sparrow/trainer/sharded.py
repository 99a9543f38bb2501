"""PolicyTrainer sharded over the ranks of a process group with torch FSDP2 (fully_shard).

    torch.distributed.init_process_group("gloo")          # "nccl" on GPUs; one process per rank
    trainer = ShardedPolicyTrainer(model_path, config.algo, seed=0, trainer_config=config.trainer)
    scores = trainer.score(records)                       # every rank gets every record's scores
    metrics = trainer.update(records, rewards, old, group_size=8)   # the same on every rank
    weights = trainer.full_state_dict()                   # rank 0: full fp32 tensors; others: {}
    trainer.export(folder)                                # rank 0 writes a checkpoint folder

Every rank passes the whole batch. Each decoder layer is one FSDP unit, and a thin root module
around the causal LM holds the rest (embeddings, final norm, lm_head, tied or not): scoring's
token_logprobs uses lm_head outside the LM's own forward, so the root's forward is that call.
A rank takes the records of some prompts (shares(): whole groups, balanced by tokens), runs
PolicyTrainer's micro-batch loss on them with the whole batch's advantages and loss normalizer,
and FSDP sums (not averages) the gradients over ranks, so the summed gradient is the
single-process one. Gradients are clipped by the global norm over all shards, and AdamW steps
the sharded fp32 parameters. FSDP's collectives need the same number of forwards on every
rank, so a rank with fewer micro-batches runs padding ones (its first record, loss times 0).
bf16 runs through FSDP's MixedPrecisionPolicy (bf16 compute, fp32 shards and reduction),
FSDP's counterpart of rl/master_weights.py. The model is built with its parameters on the meta
device and sharded before any weight exists; then rank 0 alone reads the checkpoint, one file at
a time in fp32, and torch's set_model_state_dict broadcasts each, every rank keeping its
shards: the host holds one checkpoint file's weights at a time, not the model once per rank.
export() writes rl/checkpoint.py's folder (weights, the full optimizer state in single-process
order, RNG, trainer_state.json), so the engine loads it and PolicyTrainer.load resumes from
it on one process. save() writes the weights as HF safetensors and each rank's optimizer shards
(rl/sharded_checkpoint.py); load() resumes that, or an exported folder, on any number of ranks,
and PolicyTrainer.load resumes it in one process without a process group.
The Ray actors that host the ranks are sparrow/runtime/trainer_group/group.py. docs/trainer.md "Several GPUs";
tests: `python -m pytest tests/trainer/test_sharded_trainer.py -q`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from sparrow.data.rollouts import RolloutRecord
from sparrow.trainer.checkpoint import save_checkpoint
from sparrow.trainer.hf_model import checkpoint_parts, empty_hf_model, read_part, tied_names
from sparrow.trainer.memory import names_out_of_memory
from sparrow.trainer.policy_trainer import PolicyTrainer
from sparrow.trainer.scoring import TokenScores, micro_batches, score_rollouts, token_logprobs

PADDING = None  # a micro-batch that only keeps the ranks' collectives in step


def shares(records: Sequence[RolloutRecord], world_size: int) -> list[list[int]]:
    """Indices of `records` per rank: whole prompts, the longest prompt first to the rank
    with the fewest tokens so far (ties to the lowest rank); in the records' order."""
    tokens: dict[int, int] = {}
    for r in records:
        tokens[r.prompt_index] = tokens.get(r.prompt_index, 0) + r.total_length
    load = [0] * world_size
    owner: dict[int, int] = {}
    for prompt in sorted(tokens, key=lambda p: (-tokens[p], p)):
        rank = min(range(world_size), key=lambda k: (load[k], k))
        owner[prompt] = rank
        load[rank] += tokens[prompt]
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i, r in enumerate(records):
        out[owner[r.prompt_index]].append(i)
    return out


class LogprobRoot(torch.nn.Module):
    """The causal LM behind one forward: token_logprobs(model, batch, ...)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self, batch, temperature: float, chunk_tokens: int, extra_ids=None, compiled: bool = False
    ):
        return token_logprobs(
            self.model, batch, temperature, chunk_tokens, extra_ids, compiled=compiled
        )


class ShardedPolicyTrainer(PolicyTrainer):
    """PolicyTrainer's update and scoring on this rank's shard (see the module doc)."""

    sharded = True  # this rank holds a shard; the runtime sees the ranks as a TrainerGroup

    def __init__(
        self,
        model_path: str | Path,
        algo,
        dtype: str | torch.dtype = "auto",
        seed: int = 0,
        temperature: float = 1.0,
        group=None,
        trainer_config=None,
    ):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from sparrow.trainer.policy_trainer import resolve_dtype

        if not dist.is_initialized():
            raise RuntimeError("ShardedPolicyTrainer needs torch.distributed.init_process_group")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend(group) == "nccl"
            else torch.device("cpu")
        )
        # fp32 parameters on the meta device (_load_model): FSDP shards them, then
        # _materialize gives them memory and the checkpoint's values; bf16 compute is FSDP's
        super().__init__(
            model_path,
            algo,
            device="cpu",
            dtype=torch.float32,
            seed=seed,
            temperature=temperature,
            trainer_config=trainer_config,
        )
        tied = tied_names(self.model)
        self.compute_dtype = resolve_dtype(dtype, device)
        policy = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        if group is None:
            mesh = init_device_mesh(device.type, (self.world_size,))
        else:
            from torch.distributed.device_mesh import DeviceMesh

            mesh = DeviceMesh.from_group(group, device.type)
        for layer in self.model.get_decoder().layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        self.root = fully_shard(LogprobRoot(self.model), mesh=mesh, mp_policy=policy)
        for module in self.root.modules():
            if hasattr(module, "set_gradient_divide_factor"):
                # a sum over ranks, not a mean; plain SUM collectives (gloo has no PREMUL_SUM)
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        self.device = device
        self._materialize(device, tied)
        self.optimizer = torch.optim.AdamW(
            list(self.model.parameters()), lr=algo.lr, weight_decay=algo.weight_decay
        )
        self._reserve_host()  # the offload's page-locked buffer, with offload on (rl/offload.py)

    def _load_model(self) -> torch.nn.Module:
        return empty_hf_model(self.model_path)

    def _materialize(self, device: torch.device, tied: dict[str, str]) -> None:
        """The sharded meta parameters get memory on `device` and the checkpoint's values:
        rank 0 reads the checkpoint file by file, set_model_state_dict broadcasts each and every
        rank keeps its shards. Buffers (rotary frequencies) keep the values they were built with
        (to_empty wipes them); tied parameters (the output embedding) are pointed at one
        sharded tensor again in case to_empty split them (FSDP2 keeps them in torch 2.13), so
        its gradient stays the sum of both uses."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
        self.model.to_empty(device=device)
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                b.copy_(buffers[name])
        for name, target in tied.items():
            owner, _, leaf = name.rpartition(".")
            setattr(self.model.get_submodule(owner), leaf, self.model.get_parameter(target))
        # one checkpoint file at a time: rank 0 holds one file's tensors in fp32, not the model
        # (the parts cover every key, checked by checkpoint_parts, so strict=False drops none)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        for file, names in checkpoint_parts(self.model_path, self.model.state_dict(), tied):
            part = read_part(self.model_path, file, names) if self.rank == 0 else {}
            set_model_state_dict(self.model, part, options=options)

    def _compiles_by_default(self) -> bool:
        """trainer.compile_* left null is off in a group: the compiled paths are measured and
        GPU-tested in one process, not yet under FSDP on GPUs."""
        return False

    # collectives

    def _max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t)

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend(self.group) == "nccl" else torch.device("cpu")

    # forwards through the FSDP root

    def _token_logprobs(self, batch, extra_ids=None):
        return self.root(
            batch,
            self.temperature,
            self.trainer_config.logits_chunk_tokens,
            extra_ids,
            self.compiles("compile_logprobs"),
        )

    @names_out_of_memory("dense scoring")
    def score(self, records: Sequence[RolloutRecord]) -> list[TokenScores]:
        """Each rank scores its share (shares()); every rank returns all records' scores."""
        mine = shares(records, self.world_size)[self.rank]
        local = [records[i] for i in mine]
        # score_rollouts runs a forward per micro-batch with a generated token; the count is
        # agreed before any forward, as collectives pair up in the order they are called
        forwards = sum(
            1
            for batch in micro_batches(local, self.trainer_config.micro_batch_tokens)
            if any(len(local[i].output_ids) for i in batch)
        )
        padding = self._max(forwards) - forwards
        local_scores = score_rollouts(
            self.model,
            local,
            self.trainer_config.micro_batch_tokens,
            self.temperature,
            self.trainer_config.logits_chunk_tokens,
            forward=self._token_logprobs,
        )
        with torch.no_grad():
            for _ in range(padding):
                self._padding_forward(records[0])
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, (mine, local_scores), group=self.group)
        scores: list[TokenScores | None] = [None] * len(records)
        for indices, rank_scores in gathered:
            for i, s in zip(indices, rank_scores):
                scores[i] = s
        return scores  # type: ignore[return-value]

    def _padding_forward(self, record: RolloutRecord):
        from sparrow.trainer.scoring import pad_batch

        return self._token_logprobs(pad_batch([record], self.device))

    # update: PolicyTrainer.update with this rank's micro-batches

    def _micro_batches(self, ordered) -> list:
        mine = shares(ordered, self.world_size)[self.rank]
        batches = [
            [mine[j] for j in batch]
            for batch in micro_batches(
                [ordered[i] for i in mine], self.trainer_config.micro_batch_tokens
            )
        ]
        return batches + [PADDING] * (self._max(len(batches)) - len(batches))

    def _micro_batch(self, ordered, old, advantages, indices, normalizer):
        if indices is PADDING:
            loss, metrics, _ = super()._micro_batch(ordered, old, advantages, [0], normalizer)
            return loss * 0.0, metrics, 0
        return super()._micro_batch(ordered, old, advantages, indices, normalizer)

    def _one_pass(self, ordered, old, advantages, batches, normalizer) -> dict[str, float]:
        metrics = super()._one_pass(ordered, old, advantages, batches, normalizer)
        # token-weighted means and sums over ranks (grad_norm is already global)
        tokens = metrics["actor/tokens"]
        keys = sorted(k for k in metrics if k != "actor/grad_norm")
        summed = [
            metrics[k]
            if k in ("actor/loss", "actor/pg_loss", "actor/tokens")
            else metrics[k] * tokens
            for k in keys
        ]
        t = torch.tensor(summed, dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, group=self.group)
        total = dict(zip(keys, t.tolist()))
        out = {
            k: total[k]
            if k in ("actor/loss", "actor/pg_loss", "actor/tokens")
            else total[k] / max(total["actor/tokens"], 1)
            for k in keys
        }
        out["actor/grad_norm"] = metrics["actor/grad_norm"]
        return out

    def _clip_gradients(self) -> float:
        """torch's clip_grad_norm_ over the global gradient: per-parameter norms from the
        shards' squared sums, then their norm; every rank scales its shard alike."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        squares = torch.stack([l.float().pow(2).sum() for l in local])
        squares = squares.to(self._comm_device())
        dist.all_reduce(squares, group=self.group)
        total = torch.linalg.vector_norm(squares.sqrt())
        if self.algo.grad_clip > 0:
            coefficient = torch.clamp(self.algo.grad_clip / (total + 1e-6), max=1.0)
            for l in local:
                l.mul_(coefficient.to(l.device, l.dtype))
        return float(total)

    # weights

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Transformers-named full fp32 tensors on the host: rank 0 gets them, others {}.
        A collective: every rank calls it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        return self.full_state_dict()

    def full_optimizer_state(self) -> dict:
        """The optimizer's state_dict as one process's PolicyTrainer holds it (parameters
        numbered in the model's order), on rank 0; {} elsewhere. A collective."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        if self.rank != 0:
            return {}
        number = {name: i for i, (name, _) in enumerate(self.model.named_parameters())}
        groups = [{**g, "params": [number[n] for n in g["params"]]} for g in state["param_groups"]]
        return {"state": {number[n]: s for n, s in state["state"].items()}, "param_groups": groups}

    def export(self, folder: str | Path) -> Path:
        """rl/checkpoint.py's folder, written by rank 0 (a collective: every rank calls it)."""
        weights = self.full_state_dict()
        optimizer_state = self.full_optimizer_state()
        if self.rank == 0:
            save_checkpoint(
                folder,
                self.model,
                self.optimizer,
                self.model_path,
                self._meta(),
                state_dict=weights,
                optimizer_state=optimizer_state,
            )
        dist.barrier(group=self.group)
        return Path(folder)

    def save(self, folder: str | Path) -> Path:
        """The full weights as HF safetensors plus each rank's optimizer shards
        (rl/sharded_checkpoint.py); load() resumes it on any number of ranks. A collective."""
        from sparrow.trainer.sharded_checkpoint import save_sharded

        return save_sharded(self, folder)

    def save_in_background(self, folder: str | Path):
        raise NotImplementedError("ShardedPolicyTrainer saves with save() or export()")

    # offload (rl/offload.py): this rank's shards and moments, through its page-locked buffer

    def _offloads(self) -> bool:
        """A CPU rank copies too (the tests hold the round trip there)."""
        return True

    def _offload_tensors(self) -> list[torch.Tensor]:
        from sparrow.trainer.sharded_offload import shard_tensors

        return shard_tensors(self.root, self.optimizer)

    def _move_state(self, device: torch.device, stash) -> None:
        from sparrow.trainer.sharded_offload import offload_shards, onload_shards

        if stash is not None:
            offload_shards(self.root, self.optimizer, stash)
        else:
            onload_shards(self.root, self.optimizer, device)

    @classmethod
    def load(
        cls,
        folder: str | Path,
        algo,
        dtype: str | torch.dtype = "auto",
        group=None,
        trainer_config=None,
    ) -> ShardedPolicyTrainer:
        """The trainer saved in `folder` (save(), export() or PolicyTrainer.save), on this
        group's ranks, whatever number of ranks wrote it. lr and weight_decay come from
        `algo`, the system settings from `trainer_config`. A collective: every rank calls
        it."""
        from sparrow.trainer.sharded_checkpoint import read_meta, restore

        meta = read_meta(folder)
        trainer = cls(
            folder,
            algo,
            dtype,
            seed=int(meta.get("seed", 0)),
            temperature=float(meta.get("temperature", 1.0)),
            group=group,
            trainer_config=trainer_config,
        )
        restore(trainer, folder, meta)
        return trainer
