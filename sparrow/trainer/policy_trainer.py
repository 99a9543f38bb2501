"""The trainer side of an RL step: dense scoring and the policy update, on a transformers model.

    trainer = PolicyTrainer("builtin:tiny", config.algo, device="cpu", dtype="auto", seed=0,
                            trainer_config=config.trainer)
    scores = trainer.score(records)                          # list[TokenScores], per record
    old = [s.dense_logprobs for s in scores]
    metrics = trainer.update(records, rewards, old, group_size=8)   # {"actor/loss": ..., ...}
    engine.update_weights(trainer.state_dict_for_sync())
    trainer.save(folder); trainer = PolicyTrainer.load(folder, config.algo, "cpu", "auto", config.trainer)
    # load() also resumes a trainer group's folder (rl/sharded_checkpoint.py), in this process

The model is the checkpoint's AutoModelForCausalLM with SDPA attention. `dtype` is the compute
dtype: fp32 ("auto" on CPU) runs plainly. bf16 ("auto" on GPU) holds the model's parameters in
bf16 and lets AdamW step fp32 master copies (rl/master_weights.py; trainer.master_weights), so
no weight is cast and no elementwise work runs in fp32 per step, while updates at the
reference lr of 1e-6 still land; with trainer.master_weights=false the parameters stay fp32 and
the forward runs under autocast. Checkpoints hold the fp32 weights either way.

update(): records are ordered by (prompt_index, sample_index) and cut into groups of
group_size samples of one prompt; the algo.advantage estimator gives per-sample advantages,
spread over each sample's tokens; the algo.loss policy loss (PolicyLossConfig.from_algo) runs
per micro-batch (scoring.micro_batches, trainer.micro_batch_tokens) with the whole batch's
normalizer, so the accumulated gradient is the full batch's; then gradients are clipped to
algo.grad_clip (0: no clip, the norm is still reported) and AdamW steps once. That is one
pass; algo.ppo_epochs passes run per call. Metrics are averaged over the passes.
On CPU the same inputs give the same weights; a checkpoint holds everything needed for a
resumed run to end equal to an uninterrupted one. docs/trainer.md; tests in tests/rl/.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sparrow.data.rollouts import RolloutRecord
from sparrow.model.builtin import resolve_model_path
from sparrow.rl.advantages import ADVANTAGE_ESTIMATORS, per_token_advantages
from sparrow.rl.aggregate import count_for
from sparrow.rl.checks import RLInputError
from sparrow.rl.losses import POLICY_LOSSES, PolicyLossConfig
from sparrow.rl.overlong import kept_samples
from sparrow.trainer.checkpoint import (
    SHARDED_STATE,
    read_checkpoint_state,
    restore_rng_state,
    save_checkpoint,
)
from sparrow.trainer.compiled_layers import compile_layers
from sparrow.trainer.fused_norms import fuse_rms_norms
from sparrow.trainer.hf_model import (
    enable_checkpointing,
    load_hf_model,
    move_state,
    resolve_device,
    resolve_dtype,
    state_slots,
)
from sparrow.trainer.host_stash import HostStash
from sparrow.trainer.master_weights import MasterWeights
from sparrow.trainer.memory import names_out_of_memory
from sparrow.trainer.offload import HostOffload
from sparrow.trainer.scoring import (
    TokenScores,
    micro_batches,
    pad_batch,
    score_rollouts,
    token_logprobs,
)
from sparrow.trainer.sharded_checkpoint import read_full_optimizer

if TYPE_CHECKING:  # the library's config types, without importing the config loader
    from sparrow.config.schema import AlgoConfig, TrainerConfig


class PolicyTrainer(HostOffload):
    """The dense policy, its AdamW optimizer, and the step counter (see the module doc); a
    Trainer (sparrow/trainer/protocol.py)."""

    # one process holds the whole model, and it never stops on its own
    sharded = False
    failed = ""

    def __init__(
        self,
        model_path: str | Path,
        algo: AlgoConfig,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        seed: int = 0,
        temperature: float = 1.0,
        trainer_config: TrainerConfig | None = None,
    ):
        """`algo`: the RL algorithm (loss, advantages, optimizer); `trainer_config`: how the
        trainer runs it (micro-batches, memory savers, compilation; None: the defaults)."""
        self.model_path = resolve_model_path(str(model_path))
        self.algo = algo
        self.trainer_config = trainer_config_or_default(trainer_config)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.seed = seed
        self.temperature = temperature
        self.loss_config = PolicyLossConfig.from_algo(algo)
        self.loss_fn = POLICY_LOSSES.get(algo.loss)
        self.advantage_fn = ADVANTAGE_ESTIMATORS.get(algo.advantage)
        self.step = 0  # update() calls completed
        self.optimizer_steps = 0
        torch.manual_seed(seed)
        self.model = self._load_model()
        if self.trainer_config.gradient_checkpointing:
            enable_checkpointing(self.model)
        if self.trainer_config.fused_norms:
            fuse_rms_norms(self.model)
        if self.compiles("compile_layers"):
            compile_layers(self.model)
        self.masters = None
        if self.dtype != torch.float32 and self.trainer_config.master_weights:
            self.masters = MasterWeights(self.model, self.dtype)
        trained = self.masters.parameters() if self.masters else list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(trained, lr=algo.lr, weight_decay=algo.weight_decay)
        self.offloaded = False
        self._stash: HostStash | None = None  # the offload's host buffer (rl/host_stash.py)
        self._reserve_host()
        self._saver = None  # rl/async_save.BackgroundSaver, made on the first background save

    def _load_model(self) -> torch.nn.Module:
        return load_hf_model(self.model_path, self.device)

    @property
    def can_offload(self) -> bool:
        return self.device.type == "cuda"

    def compiles(self, option: str) -> bool:
        """trainer.compile_layers / compile_logprobs: true or false as set; null (the default)
        is on where this trainer runs on CUDA."""
        value = getattr(self.trainer_config, option)
        return self._compiles_by_default() if value is None else bool(value)

    def _compiles_by_default(self) -> bool:
        return self.device.type == "cuda"

    # scoring

    def _autocast(self):
        if self.dtype == torch.float32 or self.masters is not None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @names_out_of_memory("dense scoring")
    def score(self, records: Sequence[RolloutRecord]) -> list[TokenScores]:
        """Dense logprob, acceptance lower bound and leftover mass per generated token."""
        with self._autocast():
            return score_rollouts(
                self.model,
                records,
                self.trainer_config.micro_batch_tokens,
                self.temperature,
                self.trainer_config.logits_chunk_tokens,
                forward=self._token_logprobs,
            )

    # update

    @names_out_of_memory("the policy update", checkpointing=True)
    def update(
        self,
        records: Sequence[RolloutRecord],
        rewards: Sequence[float],
        old_logprobs: Sequence[Sequence[float]],
        group_size: int,
    ) -> dict[str, float]:
        """algo.ppo_epochs optimizer steps on these rollouts; returns "actor/..." metrics."""
        ordered, old, advantages = self._prepare(records, rewards, old_logprobs, group_size)
        batches = self._micro_batches(ordered)
        lengths = torch.tensor([len(r.output_ids) for r in ordered])
        full_mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
        full_mask &= self._kept(ordered)[:, None]
        # the whole batch's denominator, handed to every micro-batch (aggregate.py)
        normalizer = count_for(full_mask, self.loss_config.loss_agg)
        passes = [
            self._one_pass(ordered, old, advantages, batches, normalizer)
            for _ in range(self.algo.ppo_epochs)
        ]
        self.step += 1
        metrics = {key: sum(p[key] for p in passes) / len(passes) for key in passes[0]}
        metrics["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["actor/advantage_abs_mean"] = float(advantages.abs().mean())
        return metrics

    def _micro_batches(self, ordered) -> list[list[int]]:
        """Indices of `ordered` per micro-batch (rl/sharded.py takes this rank's share)."""
        return micro_batches(ordered, self.trainer_config.micro_batch_tokens)

    def _token_logprobs(self, batch, extra_ids=None):
        """scoring.token_logprobs on this trainer's model (rl/sharded.py calls its FSDP root)."""
        return token_logprobs(
            self.model,
            batch,
            self.temperature,
            self.trainer_config.logits_chunk_tokens,
            extra_ids,
            compiled=self.compiles("compile_logprobs"),
        )

    def _prepare(self, records, rewards, old_logprobs, group_size):
        """Records, old logprobs and per-sample advantages in (prompt, sample) order."""
        if not len(records) == len(rewards) == len(old_logprobs):
            raise RLInputError(
                f"update needs one reward and one old_logprobs list per record; got "
                f"{len(records)} records, {len(rewards)} rewards, "
                f"{len(old_logprobs)} old_logprobs"
            )
        if not records:
            raise RLInputError("update got no rollout records")
        order = sorted(
            range(len(records)), key=lambda i: (records[i].prompt_index, records[i].sample_index)
        )
        ordered = [records[i] for i in order]
        _check_groups(ordered, group_size)
        old = []
        for i in order:
            if len(old_logprobs[i]) != len(records[i].output_ids):
                r = records[i]
                raise RLInputError(
                    f"rollout ({r.prompt_index}, {r.sample_index}) has "
                    f"{len(r.output_ids)} generated tokens but "
                    f"{len(old_logprobs[i])} old logprobs"
                )
            old.append(old_logprobs[i])
        reward_tensor = torch.tensor([float(rewards[i]) for i in order], dtype=torch.float32)
        advantages = self.advantage_fn(reward_tensor, group_size, eps=self.algo.adv_eps)
        return ordered, old, advantages

    def _one_pass(self, ordered, old, advantages, batches, normalizer) -> dict[str, float]:
        """One optimizer step over all micro-batches. With no generated token at all the
        loss is 0 and the weights stay put (an AdamW step would still move them)."""
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        loss_total, tokens_total = 0.0, 0
        for indices in batches:
            loss, metrics, tokens = self._micro_batch(
                ordered, old, advantages, indices, max(normalizer, 1)
            )
            loss.backward()
            loss_total += float(loss.detach())
            tokens_total += tokens
            for key, value in metrics.items():
                sums[key] += value * tokens
        grad_norm = self._clip_gradients()
        if normalizer:
            self.optimizer.step()
            self.optimizer_steps += 1
            if self.masters is not None:
                self.masters.publish()
        # the loss's masked means, token-weighted over micro-batches, are the full batch's means
        metrics = {key: value / max(tokens_total, 1) for key, value in sums.items()}
        metrics.update(
            {
                "actor/pg_loss": loss_total,
                "actor/loss": loss_total,
                "actor/tokens": float(tokens_total),
                "actor/grad_norm": grad_norm,
            }
        )
        return metrics

    def _kept(self, records) -> torch.Tensor:
        """bool [batch]: the samples the loss sees (algo.mask_truncated drops cut ones)."""
        return kept_samples([r.finish_reason for r in records], self.algo.mask_truncated)

    def _micro_batch(self, ordered, old, advantages, indices, normalizer):
        chunk = [ordered[i] for i in indices]
        batch = pad_batch(chunk, self.device)
        with self._autocast():
            flat = self._token_logprobs(batch)
        logprobs = torch.zeros(batch.mask.shape, dtype=flat.dtype, device=flat.device)
        logprobs = logprobs.masked_scatter(batch.mask, flat)
        mask = batch.mask & self._kept(chunk).to(batch.mask.device)[:, None]
        old_t = _padded([old[i] for i in indices], mask.shape).to(self.device)
        actor_t = _padded([r.actor_logprobs for r in chunk], mask.shape).to(self.device)
        adv_t = per_token_advantages(advantages[indices].to(self.device), mask)
        loss, metrics = self.loss_fn(
            logprobs, old_t, actor_t, adv_t, mask, self.loss_config, normalizer=normalizer
        )
        return loss, metrics, int(mask.sum())

    def _clip_gradients(self) -> float:
        params = [
            p
            for group in self.optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        if not params:
            return 0.0
        limit = self.algo.grad_clip if self.algo.grad_clip > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, limit))

    # memory (one GPU shared with the rollout engine)

    def free_gradients(self) -> None:
        """Drop the last update's gradients (a full fp32 copy of the weights)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)

    def _offload_tensors(self) -> list[torch.Tensor]:
        """What an offload moves (rl/offload.py; rl/sharded.py: this rank's shards)."""
        return [tensor for tensor, _ in state_slots(self.model, self.optimizer)]

    def _move_state(self, device: torch.device, stash: HostStash | None) -> None:
        move_state(self.model, self.optimizer, device, stash)

    # weights and checkpoints

    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """Transformers-named tensors (detached views of the live weights: bf16 with master
        weights, else fp32) for
        Engine.update_weights / Decoder.load_hf_state_dict, which convert dtype and device.
        Copy them before the next update() if they must outlive it."""
        return {name: tensor.detach() for name, tensor in self.model.state_dict().items()}

    def shared_weights(self, dtype: torch.dtype):
        """The weights cast into one CUDA buffer for colocated engines (weight_share.py)."""
        from sparrow.engine.weight_share import SharedWeights

        self.onload()
        return SharedWeights.pack(self.state_dict_for_sync(), dtype)

    def _meta(self) -> dict:
        return {
            "step": self.step,
            "optimizer_steps": self.optimizer_steps,
            "seed": self.seed,
            "temperature": self.temperature,
            "dtype": str(self.dtype).replace("torch.", ""),
            "master_weights": self.masters is not None,
            "algo": asdict(self.algo),
            "trainer": asdict(self.trainer_config),
            "source_model": str(self.model_path),
        }

    def save(self, folder: str | Path) -> Path:
        """Write a checkpoint folder (sparrow/trainer/checkpoint.py) that load() resumes."""
        with self._exact_weights() as model:
            return save_checkpoint(folder, model, self.optimizer, self.model_path, self._meta())

    def _exact_weights(self):
        """The model showing the weights the optimizer steps (the fp32 masters if any)."""
        if self.masters is None:
            return contextlib.nullcontext(self.model)
        return self.masters.swapped_in()

    def save_in_background(self, folder: str | Path):
        """The same folder as save(), written by a worker thread from a host snapshot
        (rl/async_save.py); returns a Future. wait_for_save() joins it."""
        from sparrow.trainer.async_save import BackgroundSaver

        if self._saver is None:
            self._saver = BackgroundSaver()
        with self._exact_weights() as model:  # the snapshot is taken before save() returns
            return self._saver.save(folder, model, self.optimizer, self.model_path, self._meta())

    def wait_for_save(self) -> None:
        if self._saver is not None:
            self._saver.wait()

    @classmethod
    def load(
        cls,
        folder: str | Path,
        algo: AlgoConfig,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        trainer_config: TrainerConfig | None = None,
    ) -> PolicyTrainer:
        """The trainer saved in `folder` (save(), or a trainer group's save() or export()),
        ready for its next update. lr and weight_decay come from `algo` (a resumed run may
        change them), the system settings from `trainer_config`; the moments and step counts
        from disk."""
        state = read_checkpoint_state(folder)
        trainer = cls(
            folder,
            algo,
            device,
            dtype,
            seed=int(state.meta.get("seed", 0)),
            temperature=float(state.meta.get("temperature", 1.0)),
            trainer_config=trainer_config,
        )
        optimizer_state = state.optimizer
        if optimizer_state is None:  # a group's shards, read whole without a process group
            optimizer_state = read_full_optimizer(
                Path(folder) / SHARDED_STATE, trainer.model, trainer.optimizer
            )
        trainer.optimizer.load_state_dict(optimizer_state)
        for group in trainer.optimizer.param_groups:
            group["lr"], group["weight_decay"] = algo.lr, algo.weight_decay
        trainer.step = int(state.meta["step"])
        trainer.optimizer_steps = int(state.meta.get("optimizer_steps", 0))
        restore_rng_state(state.rng)
        return trainer


def trainer_config_or_default(trainer_config: TrainerConfig | None) -> TrainerConfig:
    """`trainer_config`, or the schema's defaults for None (imported only then: the config
    package's import brings its loader, which the library does without)."""
    if trainer_config is not None:
        return trainer_config
    from sparrow.config.schema import TrainerConfig

    return TrainerConfig()


def _check_groups(ordered: Sequence[RolloutRecord], group_size: int) -> None:
    """Every prompt has exactly group_size samples, with distinct sample indices."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise RLInputError(f"group_size must be an integer >= 1, got {group_size!r}")
    counts: dict[int, list[int]] = defaultdict(list)
    for r in ordered:
        counts[r.prompt_index].append(r.sample_index)
    for prompt, samples in counts.items():
        if len(samples) != group_size or len(set(samples)) != len(samples):
            raise RLInputError(
                f"prompt {prompt} has samples {samples}; each prompt needs "
                f"group_size={group_size} distinct samples"
            )


def _padded(rows: Sequence[Sequence[float]], shape: torch.Size) -> torch.Tensor:
    out = torch.zeros(shape, dtype=torch.float32)
    for i, row in enumerate(rows):
        if len(row):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out
