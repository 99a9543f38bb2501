"""Page-scoring rules against plain loops, the single-key spike the centroid rule misses, the
registry's refusals, and dense heads."""

import math

import numpy as np
import pytest
import torch

from sparrow.sparse.schedule import Schedule, ScheduleError
from sparrow.sparse.scoring import SCORING_RULES, PageSummary, get_rule, page_bounds
from sparrow.sparse.selection import read_every_page, select_from_scores

DECODING = ("centroid", "centroid_maxhead", "quest", "quest_maxhead")


def loop_score(rule, q, keys_of_page):
    """One query [Hq, D] (float64 lists) and per KV head the keys of each page
    [Hkv][P][page_size][D]: the rule's scores [Hkv][P] by plain loops."""
    kv_heads = len(keys_of_page)
    group = len(q) // kv_heads
    out = []
    for h in range(kv_heads):
        heads = [q[h * group + g] for g in range(group)]
        mean = [sum(col) / group for col in zip(*heads)]
        row = []
        for keys in keys_of_page[h]:
            centroid = [sum(col) / len(keys) for col in zip(*keys)]
            low = [min(col) for col in zip(*keys)]
            high = [max(col) for col in zip(*keys)]

            def bound(query, low=low, high=high):
                return sum(max(a * lo, a * hi) for a, lo, hi in zip(query, low, high))

            def dot(query, centroid=centroid):
                return sum(a * c for a, c in zip(query, centroid))

            row.append(
                {
                    "centroid": dot(mean),
                    "centroid_maxhead": max(dot(x) for x in heads),
                    "quest": bound(mean),
                    "quest_maxhead": max(bound(x) for x in heads),
                }[rule]
            )
        out.append(row)
    return out


def summary(keys, rule_name):
    """PageSummary of pages' keys [B, P, page_size, Hkv, D] as the KV cache keeps it."""
    rule = get_rule(rule_name)
    if rule.bounds:
        return PageSummary(bounds=page_bounds(keys))
    return PageSummary(centroids=keys.mean(dim=2))


@pytest.mark.parametrize("rule_name", DECODING)
def test_each_rule_equals_its_plain_loop(rule_name):
    gen = torch.Generator().manual_seed(3)
    batch, pages, size, kv_heads, group, dim = 3, 5, 4, 2, 3, 6
    keys = torch.randn(batch, pages, size, kv_heads, dim, generator=gen, dtype=torch.float64)
    q = torch.randn(batch, kv_heads * group, dim, generator=gen, dtype=torch.float64)
    got = get_rule(rule_name).score(q.float(), summary(keys.float(), rule_name))
    assert got.shape == (batch, kv_heads, pages) and got.dtype == torch.float32
    for b in range(batch):
        per_head = [[keys[b, p, :, h].tolist() for p in range(pages)] for h in range(kv_heads)]
        want = loop_score(rule_name, q[b].tolist(), per_head)
        np.testing.assert_allclose(got[b].numpy(), np.array(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule_name", DECODING)
def test_shared_pages_score_as_per_row_pages(rule_name):
    """The teacher-forced form (pages shared by every row) gives the decode form's scores."""
    gen = torch.Generator().manual_seed(4)
    keys = torch.randn(1, 6, 4, 2, 8, generator=gen)
    q = torch.randn(5, 4, 8, generator=gen)
    rule = get_rule(rule_name)
    shared = summary(keys, rule_name)
    shared = PageSummary(
        centroids=None if shared.centroids is None else shared.centroids[0],
        bounds=None if shared.bounds is None else shared.bounds[0],
    )
    per_row = summary(keys.expand(5, -1, -1, -1, -1), rule_name)
    torch.testing.assert_close(rule.score(q, shared), rule.score(q, per_row))


def spike_case():
    """One query head matches one key exactly; page 2 holds that key among 15 unrelated keys,
    the other pages hold keys mildly aligned with the query on every channel."""
    gen = torch.Generator().manual_seed(0)
    dim, size, pages = 16, 16, 6
    target = torch.zeros(dim)
    target[3] = 8.0
    keys = 0.3 * torch.randn(1, pages, size, 1, dim, generator=gen)
    keys[0, :, :, 0] += 0.5  # every other key a little along every channel
    keys[0, 2, 7, 0] = target  # the spike
    q = torch.full((1, 2, dim), 0.5)  # GQA group of two query heads over one KV head
    q[0, 0] = target  # the looking-up head
    q[0, 1] = -target + 0.5  # its group partner looks elsewhere: the mean dilutes the spike
    return q, keys


@pytest.mark.parametrize("rule_name", ["centroid_maxhead", "quest", "quest_maxhead"])
def test_a_single_spike_key_is_found_where_the_centroid_rule_misses_it(rule_name):
    q, keys = spike_case()
    num_pages, topk = torch.tensor([keys.shape[1]]), 1

    def chosen(name):
        scores = get_rule(name).score(q, summary(keys, name))
        mask = select_from_scores(scores, num_pages, topk, 0, 1)
        return torch.nonzero(mask[0, 0]).flatten().tolist()

    last = keys.shape[1] - 1
    assert 2 not in chosen("centroid")
    assert chosen(rule_name) == [2, last]


def test_oracle_is_the_attention_mass_of_each_page():
    gen = torch.Generator().manual_seed(2)
    length, kv_heads, group, dim, size = 11, 2, 2, 4, 4
    keys = torch.randn(length, kv_heads, dim, generator=gen)
    q = torch.randn(3, kv_heads * group, dim, generator=gen)
    positions = torch.tensor([4, 9, 10])
    rule = get_rule("oracle")
    got = rule.score(q, PageSummary(keys=keys, positions=positions, page_size=size))
    assert got.shape == (3, kv_heads, 3)
    for r, t in enumerate(positions.tolist()):
        for h in range(kv_heads):
            mass = [0.0, 0.0, 0.0]
            for g in range(group):
                logits = [
                    float(q[r, h * group + g] @ keys[j, h]) / math.sqrt(dim) for j in range(t + 1)
                ]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                for j, w in enumerate(weights):
                    mass[j // size] += w / sum(weights) / group
            np.testing.assert_allclose(got[r, h].numpy(), mass, rtol=1e-5, atol=1e-6)
    assert not rule.decodes


def test_unknown_rule_names_are_refused_with_the_valid_list():
    with pytest.raises(ValueError, match="valid: centroid, centroid_maxhead, oracle, quest"):
        get_rule("nope")
    with pytest.raises(ScheduleError, match="selection.*valid: centroid"):
        Schedule("s", (2,), selection="nope")
    assert set(SCORING_RULES.names()) == {*DECODING, "oracle"}
    assert [get_rule(n).summary_vectors for n in DECODING] == [1, 1, 2, 2]


def test_dense_heads_read_every_present_page():
    schedule = Schedule("s", (2,), dense_heads=[[3, 1], (2, 0), [3, 0]])
    assert schedule.dense_heads == ((2, 0), (3, 0), (3, 1))
    assert schedule.dense_heads_of(3) == (0, 1) and schedule.dense_heads_of(5) == ()
    mask = torch.zeros(2, 2, 6, dtype=torch.bool)
    got = read_every_page(mask, torch.tensor([4, 6]), (1,))
    assert got[:, 0].sum() == 0
    assert got[0, 1].tolist() == [True] * 4 + [False] * 2 and got[1, 1].all()
    with pytest.raises(ScheduleError, match="dense_heads"):
        Schedule("s", (2,), dense_heads=[[1, 2, 3]])
    with pytest.raises(ScheduleError, match="dense_heads"):
        Schedule("s", (2,), dense_heads=[[1, -1]])
