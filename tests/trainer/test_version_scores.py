"""tokens_of_version and stale_versions on a carried sample (rollout.finish_fraction): hand-made
records whose tokens span versions, scores whose values name the version that gave them, so the
expected merge is counted by hand.

Run: `python -m pytest tests/trainer/test_version_scores.py -q`.
"""

from __future__ import annotations

from sparrow.data.rollouts import RolloutRecord
from sparrow.trainer.scoring import TokenScores
from sparrow.trainer.version_scores import stale_versions, tokens_of_version


def _record(versions: tuple[int, ...], length: int = 5, first: int | None = None) -> RolloutRecord:
    return RolloutRecord(
        prompt_index=0,
        sample_index=0,
        dataset_row=0,
        prompt_ids=(1, 2),
        output_ids=tuple(range(10, 10 + length)),
        actor_logprobs=(-1.0,) * length,
        topk_ids=((0,),) * length,
        topk_logprobs=((-1.0,),) * length,
        pages_read=(1,) * length,
        finish_reason="stop",
        answer="0",
        policy_version=versions[0] if versions else first,
        token_versions=versions,
    )


def _scores(version: int, length: int = 5) -> TokenScores:
    """Scores under `version`: dense logprob -version, acceptance version / 10, leftover
    version / 100 at every token, so each merged token tells where it came from."""
    return TokenScores(
        (-float(version),) * length, (version / 10,) * length, (version / 100,) * length
    )


def test_each_token_takes_the_scores_of_its_own_version():
    # step 4: the step's policy is version 3; tokens 0-1 by version 1, 2-3 by 2, 4 by 3
    record = _record((1, 1, 2, 2, 3))
    merged = _scores(3)
    for version in (1, 2):
        merged = tokens_of_version(merged, _scores(version), record, version)
    assert merged.dense_logprobs == (-1.0, -1.0, -2.0, -2.0, -3.0)
    assert merged.acceptance == (0.1, 0.1, 0.2, 0.2, 0.3)
    assert merged.leftover_mass == (0.01, 0.01, 0.02, 0.02, 0.03)


def test_the_order_of_versions_does_not_matter():
    record = _record((2, 1, 1, 2, 3))
    first = tokens_of_version(
        tokens_of_version(_scores(3), _scores(1), record, 1), _scores(2), record, 2
    )
    second = tokens_of_version(
        tokens_of_version(_scores(3), _scores(2), record, 2), _scores(1), record, 1
    )
    assert first == second
    assert first.dense_logprobs == (-2.0, -1.0, -1.0, -2.0, -3.0)


def test_a_version_the_sample_does_not_hold_changes_nothing():
    record = _record((1, 1, 3, 3, 3))
    assert tokens_of_version(_scores(3), _scores(2), record, 2) == _scores(3)


def test_a_sample_of_one_version_takes_the_whole_rescore():
    record = _record((), first=1)  # no per-token versions: every token is policy_version's
    assert tokens_of_version(_scores(3), _scores(1), record, 1) == _scores(1)


def test_stale_versions_lists_a_carried_sample_under_each_older_version():
    records = [_record((1, 1, 2, 2, 2)), _record((), first=2), _record((), first=1)]
    # the step's policy is version 2: record 0 is stale for its version-1 tokens only
    assert stale_versions(records, current_version=2) == {1: [0, 2]}
    assert stale_versions(records, current_version=3) == {1: [0, 2], 2: [0, 1]}
