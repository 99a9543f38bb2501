"""Continuous batching: admit prompt groups into free slots, prefill them, decode the rest.

    scheduler = Scheduler(config, block_manager)
    scheduler.add(group)                 # one prompt and its n samples, waiting
    batch = scheduler.schedule()         # a prefill batch of new groups, else a decode batch
    copies = scheduler.fork(batch)       # after prefill: samples share the prompt's pages
    scheduler.finish(seq)                # pages freed at once; the next group can enter
    scheduler.can_admit()                # would the next schedule() prefill a waiting group?
    scheduler.reserve_ahead(seqs)        # pages for the step after one still in flight

Admission rule (instead of preemption): a group enters only when its worst case fits, i.e.
free pages minus the pages every running sequence may still claim cover the group's pages at
max_new_tokens (prompt full pages once, the rest once per sample). A running sequence
therefore never runs out of pages, nothing is recomputed, and a sparse sample never has to
be rebuilt by a dense prefill. The cost is concurrency when max_new_tokens is far above the
lengths actually reached. Groups enter in arrival order (the first that does not fit
blocks the queue). The n samples of a group enter together (n slots), and the prompt is
prefilled once: full pages are shared by reference count, the partial page copied.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sparrow.engine.block_manager import BlockManager
from sparrow.engine.config import EngineConfig
from sparrow.engine.sequence import Sequence, Status


@dataclass(eq=False)
class SequenceGroup:
    """A prompt's n samples; samples[0] (the leader) is the one prefilled."""

    samples: list[Sequence]

    @property
    def leader(self) -> Sequence:
        return self.samples[0]


def pages_needed(group: SequenceGroup, page_size: int) -> int:
    """Worst-case pages of a group: the tokens ever cached are prompt + max_new - 1 per
    sample; the prompt's full pages are held once, shared by the samples."""
    leader = group.leader
    per_sample = -(-(leader.max_tokens - 1) // page_size)
    shared = leader.prompt_len // page_size
    return per_sample + (len(group.samples) - 1) * (per_sample - shared)


@dataclass(frozen=True)
class Batch:
    is_prefill: bool
    seqs: list[Sequence]
    groups: tuple[SequenceGroup, ...] = ()


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[Sequence] = []

    def pages_needed(self, group: SequenceGroup) -> int:
        return pages_needed(group, self.block_manager.page_size)

    def _claimable(self, seq: Sequence) -> int:
        """Pages a running sequence may still allocate before it reaches max_new_tokens."""
        return self.block_manager.pages_for_tokens(seq.max_tokens - 1) - len(seq.page_table)

    def add(self, group: SequenceGroup) -> None:
        for seq in group.samples:
            seq.status = Status.WAITING
        self.waiting.append(group)

    @property
    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def _room(self) -> tuple[int, int]:
        """Free slots, and free pages beyond what the running sequences may still claim."""
        slots = self.config.max_batch_size - len(self.running)
        return slots, self.block_manager.num_free - sum(map(self._claimable, self.running))

    def room_after_waiting(self) -> tuple[int, int]:
        """Slots and pages left once every waiting group is admitted (what an engine pulling
        requests from a feed may still take)."""
        slots, available = self._room()
        return (
            slots - sum(len(g.samples) for g in self.waiting),
            available - sum(map(self.pages_needed, self.waiting)),
        )

    def can_admit(self) -> bool:
        """Whether the first waiting group fits now, so that schedule() would prefill it."""
        if not self.waiting:
            return False
        slots, available = self._room()
        group = self.waiting[0]
        return len(group.samples) <= slots and self.pages_needed(group) <= available

    def schedule(self) -> Batch:
        """New groups that fit, as one prefill batch; otherwise the running batch decodes."""
        admitted: list[SequenceGroup] = []
        slots, available = self._room()
        tokens = 0
        while self.waiting:
            group = self.waiting[0]
            size = len(group.samples)
            needed = self.pages_needed(group)
            prompt = group.leader.num_tokens
            too_many_tokens = admitted and tokens + prompt > self.config.max_prefill_tokens
            if size > slots or needed > available or too_many_tokens:
                break
            self.waiting.popleft()
            self.block_manager.allocate_prompt(group.leader)
            for seq in group.samples:
                seq.status = Status.RUNNING
                self.running.append(seq)
            admitted.append(group)
            slots -= size
            available -= needed
            tokens += prompt
        if admitted:
            return Batch(True, [g.leader for g in admitted], tuple(admitted))
        if not self.running:
            raise RuntimeError(
                "nothing runs and the first waiting group does not fit "
                "(the engine refuses such requests up front)"
            )
        for seq in self.running:
            self.block_manager.append_slot(seq)
        return Batch(False, list(self.running))

    def reserve_ahead(self, seqs: list[Sequence]) -> None:
        """Pages for the step after the one in flight: its input token (not yet appended)
        sits at position num_tokens. Within each sequence's worst case, so never short."""
        for seq in seqs:
            self.block_manager.append_slot(seq, ahead=1)

    def fork(self, batch: Batch) -> list[tuple[int, int]]:
        """After a prefill: every other sample takes the leader's cached prompt.
        Returns the (source, destination) partial pages to copy in the KV cache."""
        copies = []
        for group in batch.groups:
            for seq in group.samples[1:]:
                copy = self.block_manager.fork(group.leader, seq)
                if copy is not None:
                    copies.append(copy)
        return copies

    def finish(self, seq: Sequence) -> None:
        self.block_manager.release(seq)
        seq.status = Status.FINISHED
        self.running.remove(seq)
