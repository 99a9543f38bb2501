"""Scheduler admission: slots, worst-case pages, arrival order, prefill token cap."""

import pytest

from sparrow.config.schema import RolloutConfig
from sparrow.engine.block_manager import BlockManager
from sparrow.engine.config import EngineConfig, EngineError
from sparrow.engine.scheduler import Scheduler, SequenceGroup
from sparrow.engine.sequence import Sequence, Status


class Params:
    def __init__(self, max_new_tokens):
        self.max_new_tokens = max_new_tokens


def group(first_id, prompt_len, n=1, max_new_tokens=4):
    params = Params(max_new_tokens)
    return SequenceGroup(
        [
            Sequence(
                first_id + i, first_id, i, [1] * prompt_len, prompt_len, params, None, frozenset()
            )
            for i in range(n)
        ]
    )


def test_slots_turn_over_in_arrival_order():
    scheduler = Scheduler(EngineConfig(max_batch_size=3, page_size=4), BlockManager(100, 4))
    groups = [group(0, 5), group(10, 3, n=2), group(20, 2), group(30, 2)]
    for g in groups:
        scheduler.add(g)
    batch = scheduler.schedule()
    # 1 + 2 samples fill the 3 slots; the later groups wait
    assert batch.is_prefill and batch.seqs == [groups[0].leader, groups[1].leader]
    copies = scheduler.fork(batch)
    assert copies == [(groups[1].leader.page_table[0], groups[1].samples[1].page_table[0])]
    decode = scheduler.schedule()
    assert not decode.is_prefill and len(decode.seqs) == 3
    scheduler.finish(groups[0].leader)
    assert groups[0].leader.status is Status.FINISHED
    admitted = scheduler.schedule()
    assert admitted.is_prefill and admitted.seqs == [groups[2].leader]
    assert list(scheduler.waiting) == [groups[3]]


def test_worst_case_pages_gate_admission():
    # prompt 6, 11 new tokens: 16 tokens cached at most = 4 pages; 2 samples share 1 full page
    manager = BlockManager(10, 4)
    scheduler = Scheduler(EngineConfig(max_batch_size=8, page_size=4), manager)
    big = group(0, 6, n=2, max_new_tokens=11)
    assert scheduler.pages_needed(big) == 4 + 3
    scheduler.add(big)
    scheduler.add(group(10, 6, n=1, max_new_tokens=11))  # needs 4 > 10 - 7
    batch = scheduler.schedule()
    assert batch.seqs == [big.leader] and len(scheduler.waiting) == 1
    scheduler.fork(batch)
    assert manager.num_free == 10 - 2 - 1  # leader's 2 prompt pages + the copied partial one
    assert not scheduler.schedule().is_prefill  # still waiting: the worst case is claimed
    for seq in big.samples:
        scheduler.finish(seq)
    assert manager.num_free == 10 and scheduler.schedule().is_prefill


def test_prefill_token_cap_splits_batches_but_admits_a_long_prompt_alone():
    scheduler = Scheduler(
        EngineConfig(max_batch_size=8, page_size=4, max_prefill_tokens=10), BlockManager(100, 4)
    )
    long, short = group(0, 12), group(10, 4)
    scheduler.add(long)
    scheduler.add(short)
    assert scheduler.schedule().seqs == [long.leader]
    assert scheduler.schedule().seqs == [short.leader]


def test_engine_config_checks_itself_and_reads_the_rollout_group():
    config = EngineConfig.from_rollout(
        RolloutConfig(kv_cache_mib=64, max_batch_size=8, seed=3), page_size=4, max_context=512
    )
    assert (
        config.kv_cache_mib,
        config.max_batch_size,
        config.seed,
        config.page_size,
        config.max_context,
    ) == (64.0, 8, 3, 4, 512)
    with pytest.raises(EngineError, match="page_size must be a power of two, got 12"):
        EngineConfig(page_size=12)
    with pytest.raises(EngineError, match="max_batch_size must be a positive integer, got 0"):
        EngineConfig(max_batch_size=0)
    with pytest.raises(EngineError, match="kv_cache_mib must be positive"):
        EngineConfig(kv_cache_mib=0)


def test_can_admit_reports_what_the_next_schedule_does():
    # 12 pages; each group needs ceil((5 + 4 - 1) / 4) = 2 pages, 2 slots
    scheduler = Scheduler(EngineConfig(max_batch_size=2, page_size=4), BlockManager(12, 4))
    first, second, third = group(0, 5), group(10, 5), group(20, 5)
    assert not scheduler.can_admit()
    for g in (first, second, third):
        scheduler.add(g)
    assert scheduler.can_admit()
    assert scheduler.schedule().seqs == [first.leader, second.leader]
    assert not scheduler.can_admit() and not scheduler.schedule().is_prefill  # no slot
    scheduler.finish(first.leader)
    assert scheduler.can_admit() and scheduler.schedule().seqs == [third.leader]


def test_reserve_ahead_allocates_the_page_of_the_next_position():
    manager = BlockManager(20, 4)
    scheduler = Scheduler(EngineConfig(max_batch_size=4, page_size=4), manager)
    # 6 and 8 tokens: the step in flight reads position 5 / 7, the next one 6 / 8
    short, long = group(0, 6, max_new_tokens=8), group(10, 8, max_new_tokens=8)
    scheduler.add(short)
    scheduler.add(long)
    scheduler.schedule()
    batch = scheduler.schedule()
    assert [len(s.page_table) for s in batch.seqs] == [2, 2]
    scheduler.reserve_ahead(batch.seqs)
    # position 6 is still in page 1; position 8 starts page 2
    assert [len(s.page_table) for s in batch.seqs] == [2, 3]
    free = manager.num_free
    long.leader.token_ids.append(1)  # the in-flight token arrives; schedule() adds nothing
    short.leader.token_ids.append(1)
    scheduler.schedule()
    assert manager.num_free == free


def test_engine_config_overlap_flag():
    assert EngineConfig().overlap is True
    config = EngineConfig.from_rollout(RolloutConfig(overlap=False))
    assert config.overlap is False
    with pytest.raises(EngineError, match="EngineConfig.overlap must be true or false, got 'no'"):
        EngineConfig(overlap="no")
