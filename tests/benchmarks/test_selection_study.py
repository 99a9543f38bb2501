"""benchmarks/selection_study.py --smoke end to end on CPU (the embedded tiny model on one
multi_chase chain), in a process without the orchestration packages: the JSON's structure,
a row for every page size x rule x budget, and the sanity of its figures (every page read:
acceptance 1 and recall 1; the oracle finds key pages at least as often as the centroid rule
at equal budget; the retrieval head it ranks first is found by the oracle). And the sampled
route through the engine on a small grid.

    python -m pytest tests/benchmarks/test_selection_study.py -q     (about 40 s)
"""

from __future__ import annotations

import csv
import json

import pytest

from tests.benchmarks.device_runner import run_benchmark

pytestmark = pytest.mark.slow
RULES = ("centroid", "centroid_maxhead", "quest", "quest_maxhead", "oracle")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("selection") / "study.json"
    plot = out.with_suffix(".png")
    done = run_benchmark("selection_study.py", "--smoke", "--out", str(out), "--plot", str(plot))
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(out.read_text())


def test_rows_cover_every_rule_and_budget(smoke):
    out, report = smoke
    assert report["benchmark"] == "selection_study" and report["facts"]["torch"]
    assert report["budgets"] == {"8": [2, 8, 21], "4": [2, 8, 42]}
    cells = {(r["page_size"], r["rule"], r["topk_pages"]) for r in report["rows"]}
    expected = {
        (int(s), rule, b) for s, grid in report["budgets"].items() for b in grid for rule in RULES
    }
    assert cells == expected and len(report["rows"]) == len(expected)
    with out.with_suffix(".csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(expected) and set(rows[0]) == set(report["rows"][0])
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_every_page_read_gives_acceptance_and_recall_one(smoke):
    _, report = smoke
    full = [r for r in report["rows"] if r["all_pages"]]
    assert len(full) == 2 * len(RULES)
    for row in full:
        assert row["pages_read_share"] == 1.0
        assert row["key_page_recall"] == 1.0 and row["key_page_recall_top_head"] == 1.0
        assert row["acceptance_all_mean"] == pytest.approx(1.0, abs=1e-5)
        assert row["acceptance_lookup_p1"] == pytest.approx(1.0, abs=1e-5)
        assert row["accuracy_estimate"] == pytest.approx(report["dense_accuracy_estimate"])


def test_sparse_cells_read_less_and_the_oracle_finds_keys(smoke):
    _, report = smoke
    rows = {(r["page_size"], r["rule"], r["topk_pages"]): r for r in report["rows"]}
    for (size, rule, topk), row in rows.items():
        assert 0 < row["pages_read_share"] <= 1
        # 2 prompts x 8 hops x 2 letters (the tiny model's tokenizer has no letter pairs)
        assert row["key_page_lookups"] == row["acceptance_lookup_n"] == 2 * 8 * 2
        assert row["acceptance_lookup_n"] + row["acceptance_rest_n"] == row["acceptance_all_n"]
        assert row["acceptance_lookup_mean_lo"] <= row["acceptance_lookup_mean"]
        assert row["acceptance_lookup_mean"] <= row["acceptance_lookup_mean_hi"]
        if not row["all_pages"]:
            assert row["pages_read_share"] < 1
            oracle = rows[(size, "oracle", topk)]
            assert oracle["key_page_recall"] >= rows[(size, "centroid", topk)]["key_page_recall"]
            assert oracle["pages_read_share"] == row["pages_read_share"]  # equal budgets
        # the cost model prices every rule that decodes, refuses the oracle
        assert (row["predicted_cost_over_dense"] is None) == (rule == "oracle")
    quest, centroid = rows[(8, "quest", 2)], rows[(8, "centroid", 2)]
    assert quest["scoring_memory_factor"] == 2 * centroid["scoring_memory_factor"] == 2


def test_head_ranking_names_the_retrieval_head(smoke):
    _, report = smoke
    for size in ("8", "4"):
        ranking = report["head_ranking"][size]
        assert len(ranking) == 4 * 2  # the tiny model's layers x KV heads
        masses = [entry["key_page_mass"] for entry in ranking]
        assert masses == sorted(masses, reverse=True) and 0 <= masses[-1] <= masses[0] <= 1
        # one head of the tiny model does the lookups: several times any other's mass
        assert masses[0] > 3 * masses[1]
    # layer 0 is dense in the tiny schedule
    assert {e["sparse_layer"] for e in ranking if e["layer"] == 0} == {False}


def test_sampled_sequences_run_through_the_engine(tmp_path):
    out = tmp_path / "sampled.json"
    done = run_benchmark(
        "selection_study.py", "--smoke", "--sequences", "sampled", "--samples", "2",
        "--rules", "centroid,oracle", "--page-sizes", "8", "--budgets", "2", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["sequences"] == 4  # 2 prompts x 2 samples; the references not counted
    # a sample may run past the reference's 21 eligible pages to max_new_tokens
    [(two, every)] = [report["budgets"]["8"]]
    assert two == 2 and every >= 21
    assert {(r["rule"], r["topk_pages"]) for r in report["rows"]} == {
        (rule, b) for rule in ("centroid", "oracle") for b in (2, every)
    }
    for row in report["rows"]:
        # a sample's lookups are counted while it follows the reference path
        assert row["key_page_lookups"] == row["acceptance_lookup_n"] <= 4 * 8 * 2
        assert row["acceptance_all_n"] == report["tokens"]


def test_reprice_recomputes_the_cost_columns_without_a_replay(smoke, tmp_path):
    out, report = smoke
    copy = tmp_path / "study.json"
    stale = json.loads(out.read_text())
    for row in stale["rows"]:
        row["predicted_speedup"] = -1.0  # what an older cost model wrote
        row.pop("predicted_speedup_pages", None)
    copy.write_text(json.dumps(stale))
    model = report["args"]["model"]
    done = run_benchmark("selection_study.py", "--reprice", str(copy), "--model", model)
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads(copy.read_text())
    assert again["repriced"]["model"] == model
    for old, new in zip(report["rows"], again["rows"]):
        assert new["predicted_speedup"] == old["predicted_speedup"]  # the same arithmetic
        if new["rule"] == "oracle":
            assert new["predicted_speedup_pages"] is None
            continue
        # one summary per prompt page instead of every prompt key: never dearer
        assert new["predicted_cost_over_dense_pages"] <= new["predicted_cost_over_dense"]
    with copy.with_suffix(".csv").open() as handle:
        assert "predicted_speedup_pages" in next(csv.DictReader(handle))
