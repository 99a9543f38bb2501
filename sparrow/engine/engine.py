"""The rollout engine: continuous-batching generation, dense or block-sparse decode.

    engine = Engine(load_model(path), load_tokenizer(path), EngineConfig(), schedule)
    results = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=64, n=8))
    results[prompt][sample].output_ids / .logprobs / .topk_ids / .pages_read / .finish_reason
    results = engine.generate([], [], feed=source)   # requests pulled while it runs
    engine.update_weights(state_dict); engine.set_schedule(other_schedule or None)

With schedule=None every decode step is dense; with a Schedule, decode is block-sparse in
the layers outside skip_layers (prefill is always dense). The loop: the scheduler picks a
prefill batch (new prompt groups) or the decode batch, the runner gives last-token logits,
the sampler draws one token per sample, finished samples free their pages at once.
Overlap (EngineConfig.overlap, on by default): in steady decode step t+1 is queued from step
t's device-side tokens before the host reads step t's outputs, so the host's bookkeeping runs
while the GPU computes. A step launched ahead is kept only if the synchronous loop would
have run the same batch (no sample stopped at step t); otherwise it is dropped whole, so
results never depend on overlap. A `feed` lets the engine pull requests while it runs:
whenever its batch has room (at the start, and after a sample stops) it calls feed.take()
until the batch has no room for one more like the last; take() returns a request `(label,
prompt, params)`, an empty tuple for "none now, ask again" (the engine keeps decoding, or,
with nothing to run, asks again after a short sleep) or None for "no more". When the engine
stops taking for lack of room it calls feed.full(). Several engines sharing one source each
take work as they free up (sparrow/runtime/rollout/dispatch.py). Run `python -m pytest
tests/engine -q`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from sparrow.cuda_memory import own_stream, return_cached_blocks, segment_anchor
from sparrow.engine.block_manager import BlockManager
from sparrow.engine.close import EarlyClose
from sparrow.engine.config import EngineConfig, EngineError
from sparrow.engine.cuda_graphs import DecodeGraphs
from sparrow.engine.feed import POLL_S, FeedPull
from sparrow.engine.kv_cache import (
    KVCache,
    centroid_torch_dtype,
    pages_for_budget,
    pages_from_memory,
)
from sparrow.engine.runner import ModelRunner, StepOutputs
from sparrow.engine.sampler import SamplingBatch, SamplingParams, sample
from sparrow.engine.scheduler import Batch, Scheduler, SequenceGroup, pages_needed
from sparrow.engine.sequence import OPEN, SampleResult, SelectionRecord, Sequence
from sparrow.engine.validate import check_fits, check_request, params_per_prompt, sample_seed
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import get_rule

# counts of the last generate(): steps run, decode steps launched ahead of the previous step's
# host work, and steps launched ahead then dropped because a sample stopped
STATS = ("prefill_steps", "decode_steps", "overlapped_steps", "discarded_steps")


@dataclass(eq=False)
class LaunchedStep:
    """A step whose forward pass and draw are queued on the device; outputs not yet read."""

    seqs: list[Sequence]
    pages_read: list[int]
    sampling: SamplingBatch
    token_ids: torch.Tensor  # [B] on the device: the input of a step launched ahead
    outputs: StepOutputs


@dataclass(eq=False)
class CachedSampling:
    """The sampler's per-row tensors, kept while the running batch stays the same."""

    seqs: list[Sequence]
    batch: SamplingBatch


class Engine:
    # capabilities (sparrow/engine/protocol.py): requests pulled while running, decode graphs
    # kept through sleep, CPU as well as CUDA
    takes_feed = True
    keeps_graphs = True
    needs_cuda = False

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        config: EngineConfig | None = None,
        schedule: Schedule | None = None,
    ):
        self.model = model
        # one GEMM for q/k/v and one for gate/up (model/decoder.py), before any graph capture
        if hasattr(model, "fuse_projections"):
            model.fuse_projections()
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        arch = model.arch
        self.cache: KVCache | None = None
        self._graphs_asleep: DecodeGraphs | None = None  # kept through sleep (keep_graphs)
        self._anchor: torch.Tensor | None = None  # keeps the cache's address range (wake)
        self._cache_stream: torch.cuda.Stream | None = None  # the stream the cache is allocated on
        self._sized_pages = 0  # the last cache's pages when sized from memory_utilization
        self.schedule: Schedule | None = None
        self.set_schedule(schedule)  # before the cache: a quest rule sizes it with bounds
        self.wake()
        self.max_context = self.config.max_context or arch.max_position_embeddings
        self.selection_log: list[SelectionRecord] = []
        self._calls = 0
        self._next_seq_id = 0
        self._sampling: CachedSampling | None = None
        self.stats = dict.fromkeys(STATS, 0)

    @classmethod
    def from_checkpoint(
        cls,
        weights_path: str,
        config: EngineConfig,
        tokenizer: Any,
        schedule: Schedule | None,
        dtype: str,
        device: str,
    ) -> Engine:
        """The engine over the model of a checkpoint folder (the rollout actors' way)."""
        from sparrow.model import load_model

        model = load_model(weights_path, dtype=getattr(torch, dtype), device=device)
        return cls(model, tokenizer, config, schedule)

    # memory: the cache exists between wake() and sleep()

    @property
    def asleep(self) -> bool:
        return self.cache is None

    def wake(self) -> None:
        """Allocate the KV cache (sized now: see EngineConfig.memory_utilization) and the
        runner; a no-op when awake. generate() wakes a sleeping engine by itself."""
        if self.cache is not None:
            return
        weight = next(self.model.parameters())
        centroids = centroid_torch_dtype(self.config.centroid_dtype, weight.dtype)
        if self._anchor is None and weight.device.type == "cuda":
            # the cache's own stream, so its expandable segment holds this engine's anchor and
            # cache alone: other allocations (another engine's freed cache) leave no hole there
            # that could fit the next cache better than its own range
            self._cache_stream = torch.cuda.Stream(weight.device)
            with own_stream(self._cache_stream):
                self._anchor = segment_anchor(weight.device)
        bounds = self._needs_bounds()
        self._sized_pages = pages_from_memory(
            self.model.arch, self.config, weight, centroids, bounds, self._sized_pages
        )
        num_pages = (
            self.config.num_pages
            or self._sized_pages
            or pages_for_budget(
                self.model.arch,
                self.config.page_size,
                weight.dtype,
                self.config.kv_cache_mib,
                centroids,
                bounds,
            )
        )
        with own_stream(self._cache_stream):
            self.cache = KVCache.allocate(
                self.model.arch,
                num_pages,
                self.config.page_size,
                weight.dtype,
                weight.device,
                centroids,
                bounds,
            )
        self.block_manager = BlockManager(num_pages, self.config.page_size)
        graphs, self._graphs_asleep = self._graphs_asleep, None
        if graphs is not None:
            graphs.attach(self.cache)
        self.runner = ModelRunner(
            self.model, self.cache, self.block_manager, self.config.kernel_options(), graphs
        )

    def sleep(self) -> None:
        """Free the KV cache (the weights stay, so update_weights works while asleep); on
        CUDA the memory goes back to the device. The decode graphs stay for the next wake
        with keep_graphs (engine/cuda_graphs.py, DecodeGraphs), else they go too."""
        if self.cache is None:
            return
        if self.config.keep_graphs and self.runner.graphs is not None:
            self._graphs_asleep = self.runner.graphs
            self._graphs_asleep.release_cache()
        if self._cache_stream is not None:  # the blocks go back to the cache's own stream
            torch.cuda.current_stream(self._cache_stream.device).synchronize()
        self.cache = None
        self.runner = None  # type: ignore[assignment]
        self._sampling = None
        return_cached_blocks()

    @property
    def graphs(self) -> DecodeGraphs | None:
        """The decode graphs, awake or asleep (None off CUDA or after a sleep without
        keep_graphs)."""
        return self._graphs_asleep if self.runner is None else self.runner.graphs

    def _needs_bounds(self) -> bool:
        """Whether the schedule's scoring rule reads per-page key bounds (quest rules)."""
        return self.schedule is not None and get_rule(self.schedule.selection).bounds

    # trainer hooks

    def set_schedule(self, schedule: Schedule | None) -> None:
        """Decode with this schedule from the next generate() on (None: dense decode)."""
        if schedule is not None and schedule.page_size != self.config.page_size:
            raise EngineError(
                f"schedule {schedule.name!r} has page_size {schedule.page_size} but "
                f"the engine's KV pages hold {self.config.page_size} tokens"
            )
        if schedule is not None and not get_rule(schedule.selection).decodes:
            raise EngineError(
                f"schedule {schedule.name!r}: page-scoring rule {schedule.selection!r} needs "
                f"every key of the sequence and cannot decode (teacher-forced replay only)"
            )
        self.schedule = schedule
        self._sparse_layers = schedule is not None and any(
            schedule.is_sparse_layer(i) for i in range(self.model.arch.num_layers)
        )
        if self.cache is not None and self._needs_bounds() and self.cache.bounds is None:
            # generate() leaves no sequence behind: a new cache, sized with bounds, loses none
            self.sleep()
            self.wake()

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Replace the model's weights in place (transformers names); the cache is unaffected
        because generate() leaves no sequence behind. strict=False takes a part of them (one
        bucket of rl/weight_broadcast.py)."""
        self.model.load_hf_state_dict(state_dict, strict=strict)

    # generation

    def generate(
        self,
        prompts: Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams],
        progress: bool = False,
        feed: Any = None,
        close: EarlyClose | None = None,
    ) -> list[list[SampleResult]]:
        """Samples for every prompt: outer list per prompt, inner per sample (params.n); with
        a `feed`, then for every request it gave, in the order taken (see the module doc).
        `close` stops the call once enough groups of requests finished; the rest come back
        open (sparrow/engine/close.py)."""
        if close is not None and feed is not None:
            raise EngineError("an early close needs every request up front, not a feed")
        per_prompt = params_per_prompt(prompts, params)
        self.wake()
        self._calls += 1
        groups = [
            self._make_group(i, list(p), sp) for i, (p, sp) in enumerate(zip(prompts, per_prompt))
        ]
        scheduler = Scheduler(self.config, self.block_manager)
        for group in groups:
            scheduler.add(group)
        # the bar counts token budgets: a sample that stops early fills in its unused part
        total = sum(len(g.samples) * g.leader.params.max_new_tokens for g in groups)
        bar = tqdm(
            total=total,
            desc="generate",
            unit="tok",
            file=sys.stderr,
            disable=not progress,
            leave=False,
        )
        self.stats = dict.fromkeys(STATS, 0)
        pull = FeedPull(feed, self._make_group, groups, bar) if feed is not None else None
        closed = None if close is None else (lambda: close.reached(groups))
        try:
            self._loop(scheduler, bar, pull, closed)
            if closed is not None:  # what the close cut keeps its tokens, marked open
                for seq in (s for group in groups for s in group.samples):
                    seq.finish_reason = seq.finish_reason or OPEN
        finally:
            bar.close()
            self._sampling = None
            for seq in list(scheduler.running):  # an exception or a close: free everything
                scheduler.finish(seq)
        return [[self._result(seq) for seq in group.samples] for group in groups]

    def _loop(
        self,
        scheduler: Scheduler,
        bar: tqdm,
        pull: FeedPull | None = None,
        closed: Callable[[], bool] | None = None,
    ) -> None:
        """Steps until every sample has finished (and the feed, if any, has no more), or
        `closed()` says so after a step (a step launched ahead is then dropped). In
        steady decode the next step is launched before the host reads the current one's
        tokens (see docs/engine.md, overlap). Requests are pulled only on the synchronous
        path: a sample that stops drops the step launched ahead, so room always comes here."""
        launched: LaunchedStep | None = None
        step = 0
        while launched is not None or not scheduler.is_finished or (pull and pull.open):
            if launched is None:
                if pull is not None:
                    pull.fill(scheduler)
                    if scheduler.is_finished:
                        if not pull.open:
                            break  # the feed has no more and nothing is left to run
                        time.sleep(POLL_S)  # none for now, nothing to run: ask again
                        continue
                batch = scheduler.schedule()
                if batch.is_prefill:
                    bar.update(self._finish(scheduler, self._prefill(scheduler, batch)))
                    if closed is not None and closed():
                        break
                else:
                    launched = self._decode(batch.seqs, step)
                step += 1
                continue
            ahead = self._decode_ahead(scheduler, launched)
            bar.update(self._finish(scheduler, launched))
            if closed is not None and closed():
                break  # the step launched ahead (if any) is dropped with the loop
            if ahead is not None and ahead.seqs != scheduler.running:
                # a sample stopped: the synchronous loop runs another batch next, so the step
                # launched ahead is dropped whole and the next one runs from the host's state
                self.stats["discarded_steps"] += 1
                ahead = None
            step += ahead is not None
            launched = ahead

    # launching steps (queued on the device; nothing here waits for it)

    def _prefill(self, scheduler: Scheduler, batch: Batch) -> LaunchedStep:
        self.stats["prefill_steps"] += 1
        logits = self.runner.prefill(batch.seqs)
        self.cache.copy_pages(scheduler.fork(batch))
        seqs = [seq for group in batch.groups for seq in group.samples]
        counts = torch.tensor([len(g.samples) for g in batch.groups], device=logits.device)
        logits = logits.repeat_interleave(counts, dim=0, output_size=len(seqs))
        # the first token comes from the dense prefill: every prompt page was read
        pages_read = [self.block_manager.pages_for_tokens(s.prompt_len) for s in seqs]
        sampling = SamplingBatch.build(
            [s.params for s in seqs], [s.seed for s in seqs], logits.device
        )
        return self._launch(seqs, logits, pages_read, sampling, [0] * len(seqs))

    def _decode(self, seqs: list[Sequence], step: int) -> LaunchedStep:
        """A decode step of the running batch from the host's tokens (synchronous entry)."""
        self.stats["decode_steps"] += 1
        hook = self._recorder(seqs, step) if self.config.record_selection else None
        logits = self.runner.decode(seqs, self.schedule, hook)
        if self._sampling is None or self._sampling.seqs != seqs:
            self._sampling = CachedSampling(
                list(seqs),
                SamplingBatch.build(
                    [s.params for s in seqs], [s.seed for s in seqs], logits.device
                ),
            )
        return self._launch(
            seqs,
            logits,
            self._decode_pages_read(seqs, 0),
            self._sampling.batch,
            [s.num_generated for s in seqs],
        )

    def _decode_ahead(self, scheduler: Scheduler, launched: LaunchedStep):
        """The step after `launched`, queued before its tokens reach the host; None when the
        batch must change first (a sample's last step, a prompt that can enter, prefill)."""
        seqs = launched.seqs
        if not self.config.overlap or self.config.record_selection:
            return None  # the selection hook reads host positions: recording stays synchronous
        if seqs != scheduler.running or scheduler.can_admit():
            return None
        if any(s.num_generated + 1 >= s.params.max_new_tokens for s in seqs):
            return None  # a sample's last step is in flight: the next batch is smaller
        self.stats["decode_steps"] += 1
        self.stats["overlapped_steps"] += 1
        scheduler.reserve_ahead(seqs)
        logits = self.runner.decode(seqs, self.schedule, pending_ids=launched.token_ids)
        return self._launch(
            seqs,
            logits,
            self._decode_pages_read(seqs, 1),
            launched.sampling,
            [s.num_generated + 1 for s in seqs],
        )

    def _launch(self, seqs, logits, pages_read, sampling, counters) -> LaunchedStep:
        """Draw (counters: each row's draw number) and start the outputs' copy to the host."""
        out = sample(logits, sampling, counters)
        return LaunchedStep(list(seqs), pages_read, sampling, out.token_ids, StepOutputs(out))

    # host work of a step

    def _finish(self, scheduler: Scheduler, launched: LaunchedStep) -> int:
        """Append each sample's token; finish those that stop. Returns the progress in
        tokens (one per sample, plus the unused budget of each sample that stopped)."""
        ids, logprobs, topk_ids, topk_logprobs = launched.outputs.read()
        progress = 0
        for i, seq in enumerate(launched.seqs):
            k = seq.params.logprobs_topk
            seq.append(
                ids[i], logprobs[i], topk_ids[i, :k], topk_logprobs[i, :k], launched.pages_read[i]
            )
            progress += 1
            if seq.finish_reason is not None:
                scheduler.finish(seq)
                progress += seq.params.max_new_tokens - seq.num_generated
        return progress

    def _decode_pages_read(self, seqs: list[Sequence], ahead: int) -> list[int]:
        """Pages read per KV head in sparse layers at this step: min(n, top-k + reserved), all
        n pages when dense (Schedule.pages_read, in plain integers: host work per step); the
        input token sits at position num_tokens - 1 + ahead."""
        pages = self.block_manager.pages_for_tokens
        positions = [s.num_tokens - 1 + ahead for s in seqs]
        schedule = self.schedule
        if schedule is None or not self._sparse_layers:
            return [pages(p + 1) for p in positions]
        return [schedule.pages_read(p, num_pages=pages(p + 1)) for p in positions]

    def _recorder(self, seqs: list[Sequence], step: int):
        def record(layer: int, page_mask: torch.Tensor) -> None:
            for row, seq in enumerate(seqs):
                pages = tuple(
                    tuple(torch.nonzero(head).flatten().tolist()) for head in page_mask[row]
                )
                self.selection_log.append(
                    SelectionRecord(
                        step, layer, seq.prompt_index, seq.sample_index, seq.num_tokens - 1, pages
                    )
                )

        return record

    # requests

    def _make_group(self, index: int, prompt: list[int], params: SamplingParams) -> SequenceGroup:
        check_request(
            index,
            prompt,
            params,
            self.model.arch.vocab_size,
            self.max_context,
            self.config.max_batch_size,
        )
        prompt = [int(t) for t in prompt]
        stop = set(params.stop_token_ids)
        if not self.config.ignore_eos:
            stop |= set(self.model.arch.eos_token_ids)
        samples = []
        for i in range(params.n):
            self._next_seq_id += 1
            seed = sample_seed(params, i, (self.config.seed, self._calls, index))
            samples.append(
                Sequence(
                    self._next_seq_id,
                    index,
                    i,
                    list(prompt),
                    len(prompt),
                    params,
                    seed,
                    frozenset(stop),
                )
            )
        group = SequenceGroup(samples)
        check_fits(
            index,
            params,
            len(prompt),
            pages_needed(group, self.config.page_size),
            self.config.page_size,
            self.block_manager.num_pages,
        )
        return group

    def _result(self, seq: Sequence) -> SampleResult:
        text = None
        if self.tokenizer is not None:
            # the stop token ends the sample; it is not part of the text a verifier reads
            text = self.tokenizer.decode(
                list(seq.token_ids[seq.prompt_len :]), skip_special_tokens=True
            )
        return seq.to_result(text)
