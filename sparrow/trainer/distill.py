"""DistillSparse: train the sparse actor's LoRA toward the dense policy, the base frozen.

    distiller = SparseDistiller(model_path, config.algo, device="cpu", dtype="auto", seed=0,
                                trainer_config=config.trainer)
    distiller.set_base(trainer.state_dict_for_sync())   # the policy after this step's update
    metrics = distiller.distill(records, schedule, advantages)   # {"distill/loss": ..., ...}
    adapter = distiller.adapter()        # merged into the rollout engines' weights only
    distiller.save(folder); distiller = SparseDistiller.load(folder, model_path, algo, ...)

docs/method.md, DistillSparse: the student is the engine's own Decoder (base weights
from the trainer, frozen, in the compute dtype) with a peft LoRA (rl/lora.py). On each
micro-batch of the step's rollouts (scoring.micro_batches, trainer.micro_batch_tokens) it runs the
teacher-forced forward (engine/teacher_forced.py: each generated position with the page
selection its decode step made under `schedule`; the fast GPU path on CUDA) three times:
dense with the LoRA off (the target p_dense, no gradient), sparse with the LoRA off (only for
the "without LoRA" acceptance, algo.distill.measure), sparse with the LoRA (q_sparse, with
gradient). Loss = kl_coef * token mean of the divergence (distill_loss.py: k3 | full_kl)
+ ppo_coef * algo.loss on the sparse logprobs against the actor's (the rollout's policy is the
old policy there) + selector_coef * the selector term (trainer/selector_distill.py: page scores
toward the dense attention mass per page; distill/selector_loss, distill/selector_recall).
One AdamW step (lr = algo.lr * lr_scale, no weight decay) after gradients
are clipped to algo.grad_clip. Metrics: the loss, the divergences, and the exact acceptance
with and without the LoRA on the same tokens (mean, p5, and the lowest per-bin p5), all as
they were before this step's update. Departure from the reference: the dense target is the
policy after this step's update (the reference reuses the pre-update dense logprobs); that costs
one forward without gradient and gives the full distributions for full_kl and the acceptance.
Tests: tests/trainer/test_distill.py.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from sparrow.data.rollouts import RolloutRecord
from sparrow.engine.teacher.forced import teacher_forced_hidden
from sparrow.mismatch.acceptance import bin_statistics, min_p5
from sparrow.rl.aggregate import count_for
from sparrow.rl.distill_loss import DISTILL_LOSSES, acceptance, distill_token_loss, k3, token_terms
from sparrow.rl.losses import POLICY_LOSSES, PolicyLossConfig
from sparrow.sparse import Schedule
from sparrow.trainer.lora import (
    Adapter,
    LoraSpec,
    adapter_state,
    adapters_disabled,
    attach_lora,
    load_adapter_state,
    load_base,
    lora_parameters,
)
from sparrow.trainer.memory import names_out_of_memory
from sparrow.trainer.policy_trainer import (
    resolve_device,
    resolve_dtype,
    trainer_config_or_default,
)
from sparrow.trainer.scoring import effective_temperature, micro_batches
from sparrow.trainer.selector_distill import SelectorProbe

if TYPE_CHECKING:
    from sparrow.config.schema import AlgoConfig, TrainerConfig

OPTIMIZER_FILE = "distill_optimizer.pt"
STATE_FILE = "distill_state.json"


def lora_spec(algo: AlgoConfig) -> LoraSpec:
    d = algo.distill
    return LoraSpec(rank=d.lora_rank, alpha=float(d.lora_alpha), targets=tuple(d.targets))


class SparseDistiller:
    """The student (Decoder + LoRA), its AdamW, and the count of distill updates done."""

    def __init__(
        self,
        model_path: str | Path,
        algo: AlgoConfig,
        device="auto",
        dtype="auto",
        seed: int = 0,
        temperature: float = 1.0,
        centroid_dtype: str = "cache",
        trainer_config: TrainerConfig | None = None,
    ):
        from sparrow.model import load_model

        if algo.distill.loss not in DISTILL_LOSSES:
            raise ValueError(
                f"algo.distill.loss {algo.distill.loss!r} is unknown; valid: "
                f"{', '.join(DISTILL_LOSSES)}"
            )
        self.algo, self.settings = algo, algo.distill
        self.trainer_config = trainer_config_or_default(trainer_config)  # micro-batches, chunks
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.temperature = effective_temperature(temperature)
        self.centroid_dtype = centroid_dtype
        self.spec = lora_spec(algo)
        self.model = attach_lora(
            load_model(model_path, dtype=self.dtype, device=self.device), self.spec, seed
        )
        for param in lora_parameters(self.model):  # fp32 adapters whatever the base's dtype
            param.data = param.data.float()
        self.loss_config = PolicyLossConfig.from_algo(algo)
        self.optimizer = torch.optim.AdamW(
            lora_parameters(self.model), weight_decay=0.0, lr=algo.lr * self.settings.lr_scale
        )
        self.updates = 0
        self.bin_stats: dict[str, list] = {}  # the last distill()'s per-bin statistics
        self._released: dict[str, torch.Size] = {}  # base parameter -> shape, while released

    def set_base(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy the policy's weights (transformers names) into the frozen base (allocated
        again first, after release_base)."""
        params = dict(self.model.named_parameters())
        for name, shape in self._released.items():
            param = params[name]
            param.data = torch.empty(shape, dtype=param.dtype, device=param.device)
        self._released = {}
        load_base(self.model, state_dict)

    @property
    def base_released(self) -> bool:
        return bool(self._released)

    def release_base(self) -> None:
        """Free the frozen base weights (the policy in the compute dtype: 3.4 GB at 1.7B in
        bf16) while the engines roll out. Dropped rather than copied to host: the next
        distill step's set_base overwrites every one of them from the trainer anyway. The
        LoRA, its AdamW moments and the buffers stay."""
        for name, param in self.model.named_parameters():
            if ".lora_" not in name and name not in self._released:
                self._released[name] = param.shape
                param.data = torch.empty(0, dtype=param.dtype, device=param.device)

    def adapter(self) -> Adapter:
        return Adapter(self.spec, adapter_state(self.model))

    # one distill step

    @names_out_of_memory("the DistillSparse step")
    def distill(
        self,
        records: Sequence[RolloutRecord],
        schedule: Schedule,
        advantages: Sequence[float] | None = None,
        update: bool = True,
        cheaper: Schedule | None = None,
    ) -> dict[str, float]:
        """One AdamW step of the LoRA on these rollouts (none when update=False: metrics only).
        advantages: per record (needed when algo.distill.ppo_coef > 0); cheaper: also measure
        the LoRA under this schedule (one more sparse forward, no gradient; the controller's
        switch). Per-bin statistics land in `bin_stats` ("lora", "base", "cheaper")."""
        if self.settings.ppo_coef > 0 and advantages is None:
            raise ValueError("algo.distill.ppo_coef > 0 needs the rollouts' advantages")
        if self.base_released:
            raise RuntimeError("the distiller's base weights were released: set_base first")
        total = sum(len(r.output_ids) for r in records)  # the whole batch's, on every rank
        keep = [i for i in self._share(records) if records[i].output_ids]
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        tokens = {"lora": [], "base": [], "position": []}
        for batch in micro_batches(
            [records[i] for i in keep], self.trainer_config.micro_batch_tokens
        ):
            chunk = [records[keep[j]] for j in batch]
            adv = None if advantages is None else [advantages[keep[j]] for j in batch]
            loss = self._micro_batch(chunk, schedule, adv, max(total, 1), sums, tokens, cheaper)
            if update and loss.requires_grad:
                loss.backward()
        sums, tokens = self._gather(sums, tokens)
        metrics = {f"distill/{k}": v / max(total, 1) for k, v in sums.items()}
        metrics["distill/tokens"] = float(total)
        if update and total:
            self._reduce_gradients()
            metrics["distill/grad_norm"] = self._clip()
            self.optimizer.step()
            self.updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        metrics["distill/lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["distill/updates"] = float(self.updates)
        acceptance_metrics, self.bin_stats = _acceptance_metrics(tokens, schedule)
        metrics.update(acceptance_metrics)
        return metrics

    @torch.no_grad()
    def token_acceptance(
        self, records: Sequence[RolloutRecord], schedule: Schedule
    ) -> dict[str, np.ndarray]:
        """The exact acceptance of every generated token of `records`, in their order, against
        the dense policy: with the LoRA ("lora") and without ("base"); "record" and "position"
        say whose token it is and where. No gradient, no update, every record in this process
        (a group's ranks are not asked): for a fixed trajectory set measured before and after
        distillation (benchmarks/distill.py)."""
        weight = self.model.output_embedding()
        chunk_tokens = self.trainer_config.logits_chunk_tokens
        out: dict[str, list] = {"lora": [], "base": [], "record": [], "position": []}
        keep = [i for i, r in enumerate(records) if r.output_ids]
        for batch in micro_batches(
            [records[i] for i in keep], self.trainer_config.micro_batch_tokens
        ):
            chunk = [records[keep[j]] for j in batch]
            sequences = [list(r.prompt_ids) + list(r.output_ids) for r in chunk]
            prompt_lens = [len(r.prompt_ids) for r in chunk]
            with adapters_disabled(self.model):
                dense = self._hidden(sequences, prompt_lens, None, chunk)
                base = self._hidden(sequences, prompt_lens, schedule, chunk)
            sparse = self._hidden(sequences, prompt_lens, schedule, chunk)
            for name, hidden in (("lora", sparse), ("base", base)):
                alpha = acceptance(hidden, dense, weight, self.temperature, chunk_tokens)
                out[name].append(alpha.double().cpu().numpy())
            for j, r, p in zip(batch, chunk, prompt_lens):
                out["record"].append(np.full(len(r.output_ids), keep[j]))
                out["position"].append(np.arange(p, p + len(r.output_ids)))
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}

    # where a group of ranks differs (rl/sharded_distill.py): one process takes every record

    def _share(self, records: Sequence[RolloutRecord]) -> list[int]:
        return list(range(len(records)))

    def _gather(self, sums, tokens):
        return sums, tokens

    def _reduce_gradients(self) -> None:
        pass

    def _micro_batch(
        self, chunk, schedule, advantages, normalizer, sums, tokens, cheaper=None
    ) -> torch.Tensor:
        settings = self.settings
        sequences = [list(r.prompt_ids) + list(r.output_ids) for r in chunk]
        prompt_lens = [len(r.prompt_ids) for r in chunk]
        weight = self.model.output_embedding()
        probe = None  # the selector term's (trainer/selector_distill.py)
        if settings.selector_coef > 0:
            lens = [len(s) for s in sequences]
            probe = SelectorProbe(
                schedule, lens, prompt_lens, settings.selector_positions, self.centroid_dtype
            )
        with torch.no_grad(), adapters_disabled(self.model):
            dense = self._hidden(
                sequences, prompt_lens, None, chunk, probe.target if probe else None
            )
            base = (
                self._hidden(sequences, prompt_lens, schedule, chunk) if settings.measure else None
            )
        if cheaper is not None:
            with torch.no_grad():
                lora_cheaper = self._hidden(sequences, prompt_lens, cheaper, chunk)
            tokens.setdefault("cheaper", []).append(
                acceptance(
                    lora_cheaper,
                    dense,
                    weight,
                    self.temperature,
                    self.trainer_config.logits_chunk_tokens,
                ).cpu()
            )
            del lora_cheaper
        sparse = self._hidden(
            sequences, prompt_lens, schedule, chunk, probe.student if probe else None
        )
        targets = torch.tensor([t for r in chunk for t in r.output_ids], device=self.device)
        chunk_tokens = self.trainer_config.logits_chunk_tokens
        terms = token_terms(sparse, dense, weight, targets, self.temperature, chunk_tokens)
        divergence = distill_token_loss(terms, settings.loss)
        loss = settings.kl_coef * divergence.sum() / normalizer
        sums["kl_loss"] += float(divergence.detach().sum())
        sums["k3"] += float(k3(terms.dense_logprobs, terms.sparse_logprobs).detach().sum())
        sums["full_kl"] += float(terms.full_kl.detach().sum())
        if settings.ppo_coef > 0:
            ppo = self._ppo(chunk, terms.sparse_logprobs, advantages)
            sums["ppo_loss"] += float(ppo.detach()) * normalizer
            loss = loss + settings.ppo_coef * ppo
        selector = probe.loss() if probe is not None else None
        if selector is not None:  # a micro-batch's mean, weighted by its share of the tokens
            share = len(targets) / normalizer
            loss = loss + settings.selector_coef * selector * share
            sums["selector_loss"] += float(selector.detach()) * len(targets)
            sums["selector_recall"] += probe.recall() * len(targets)
        sums["loss"] += float(loss.detach()) * normalizer
        tokens["lora"].append(
            acceptance(sparse.detach(), dense, weight, self.temperature, chunk_tokens).cpu()
        )
        if base is not None:
            tokens["base"].append(
                acceptance(base, dense, weight, self.temperature, chunk_tokens).cpu()
            )
        tokens["position"] += [
            p + j for p, r in zip(prompt_lens, chunk) for j in range(len(r.output_ids))
        ]
        return loss

    def _hidden(self, sequences, prompt_lens, schedule, chunk, on_qk=None) -> torch.Tensor:
        """Final hidden states [N, H] at the positions that predict each generated token."""
        hidden = teacher_forced_hidden(
            self.model,
            sequences,
            prompt_lens,
            schedule,
            centroid_dtype=self.centroid_dtype,
            on_qk=on_qk,
        )
        return torch.cat(
            [h[p - 1 : p - 1 + len(r.output_ids)] for h, p, r in zip(hidden, prompt_lens, chunk)]
        )

    def _ppo(self, chunk, sparse_logprobs, advantages) -> torch.Tensor:
        """algo.loss on the sparse forward; the rollout's logprobs are the old policy's."""
        lengths = [len(r.output_ids) for r in chunk]
        mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
        mask = mask.to(self.device)
        logprobs = torch.zeros(mask.shape, device=self.device).masked_scatter(mask, sparse_logprobs)
        actor = torch.zeros(mask.shape, device=self.device)
        actor[mask] = torch.tensor([x for r in chunk for x in r.actor_logprobs], device=self.device)
        adv = torch.tensor(advantages, dtype=torch.float32, device=self.device)[:, None]
        loss_fn = POLICY_LOSSES.get(self.algo.loss)
        loss, _ = loss_fn(
            logprobs,
            actor,
            actor,
            adv.expand(mask.shape),
            mask,
            self.loss_config,
            normalizer=max(count_for(mask, self.loss_config.loss_agg), 1),
        )
        return loss

    def _clip(self) -> float:
        params = [p for p in lora_parameters(self.model) if p.grad is not None]
        if not params:
            return 0.0
        limit = self.algo.grad_clip if self.algo.grad_clip > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, limit))

    # state on disk

    def save(self, folder: str | Path) -> Path:
        """adapter.safetensors + adapter.json, the AdamW state, and distill_state.json."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.adapter().save(folder)
        torch.save(self.optimizer.state_dict(), folder / OPTIMIZER_FILE)
        (folder / STATE_FILE).write_text(json.dumps({"updates": self.updates}, indent=2))
        return folder

    @classmethod
    def load(
        cls,
        folder: str | Path,
        model_path: str | Path,
        algo: AlgoConfig,
        device="auto",
        dtype="auto",
        temperature: float = 1.0,
        centroid_dtype: str = "cache",
        trainer_config: TrainerConfig | None = None,
    ) -> SparseDistiller:
        """A distiller holding the adapter and optimizer state saved in `folder` (the base is
        set separately, set_base); lr comes from `algo`."""
        folder = Path(folder)
        distiller = cls(
            model_path, algo, device, dtype, 0, temperature, centroid_dtype, trainer_config
        )
        adapter = Adapter.read(folder)
        if adapter.spec != distiller.spec:
            raise ValueError(
                f"the adapter in {folder} has {adapter.spec}; algo.distill asks "
                f"for {distiller.spec}"
            )
        load_adapter_state(distiller.model, adapter.state)
        distiller.optimizer.load_state_dict(
            torch.load(folder / OPTIMIZER_FILE, map_location=distiller.device)
        )
        for group in distiller.optimizer.param_groups:
            group["lr"] = algo.lr * algo.distill.lr_scale
        distiller.updates = int(json.loads((folder / STATE_FILE).read_text())["updates"])
        return distiller


def record_advantages(
    records: Sequence[RolloutRecord], rewards: Sequence[float], group_size: int, algo: AlgoConfig
) -> list[float]:
    """Per-record advantages (algo.advantage over each prompt's group), in the records' order."""
    from sparrow.rl.advantages import ADVANTAGE_ESTIMATORS

    order = sorted(
        range(len(records)), key=lambda i: (records[i].prompt_index, records[i].sample_index)
    )
    ordered = torch.tensor([float(rewards[i]) for i in order], dtype=torch.float32)
    values = ADVANTAGE_ESTIMATORS.get(algo.advantage)(ordered, group_size, eps=algo.adv_eps)
    out = [0.0] * len(records)
    for position, index in enumerate(order):
        out[index] = float(values[position])
    return out


def _acceptance_metrics(tokens: dict[str, list], schedule: Schedule):
    """Mean, p5 and the lowest per-bin p5 of the exact acceptance, with and without the LoRA
    (and with it under the cheaper schedule), and the per-bin statistics of each."""
    out: dict[str, float] = {}
    stats_of: dict[str, list] = {}
    positions = np.asarray(tokens["position"], dtype=np.int64)
    for which in ("lora", "base", "cheaper"):
        if not tokens.get(which) or not len(positions):
            continue
        alpha = torch.cat(tokens[which]).double().numpy()
        stats = bin_statistics(positions, alpha, schedule.bin_tokens, schedule.num_bins)
        out[f"distill/acceptance_mean_{which}"] = float(alpha.mean())
        out[f"distill/p5_{which}"] = float(np.percentile(alpha, 5))
        out[f"distill/min_bin_p5_{which}"] = float(min_p5(stats))
        stats_of[which] = stats
    return out, stats_of
