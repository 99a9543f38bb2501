"""sparrow/experiments/async_check.py: the one-step-off check's equivalence test, learning
phase and verdict (docs/async.md), on numbers worked by hand."""

from __future__ import annotations

import pytest

from sparrow.experiments.async_check import equivalence, learning_phase, verdict


def test_gaps_close_to_zero_track_and_the_interval_is_the_t_interval():
    got = equivalence([0.01, -0.01, 0.0])
    # mean 0, sd 0.01, 90% two-sided t with 2 df: 2.919986 x 0.01 / sqrt(3)
    assert got["mean"] == pytest.approx(0.0)
    assert got["interval"] == pytest.approx([-0.016859, 0.016859], abs=1e-6)
    assert got["seeds"] == 3 and got["verdict"] == "tracks"


@pytest.mark.parametrize(
    ("gaps", "expected"),
    [
        ([-0.10, -0.11, -0.09], "refuted"),  # wholly below -0.05
        ([0.00, -0.08, 0.03], "inconclusive"),  # crosses the bound
        ([0.0], "inconclusive"),  # one seed: no interval
        ([], "inconclusive"),
    ],
)
def test_an_interval_outside_the_band_refutes_one_across_it_is_inconclusive(gaps, expected):
    assert equivalence(gaps)["verdict"] == expected


def test_the_learning_phase_is_the_mean_eval_of_steps_10_to_50():
    evals = {10: 0.4, 20: 0.5, 50: 0.6, 60: 0.9, 100: 1.0}
    assert learning_phase(evals) == pytest.approx(0.5)
    assert learning_phase({60: 0.9}) is None


def test_every_pair_must_track_and_no_unit_fall():
    tracks, unsure = {"verdict": "tracks"}, {"verdict": "inconclusive"}
    both = {"async-0.86": tracks, "async-dense": tracks}
    assert verdict(both, destabilized=[]) == "tracks"
    assert verdict(both, destabilized=["async-0.86 seed 1"]) == "refuted"
    assert verdict({"async-0.86": tracks, "async-dense": unsure}, []) == "inconclusive"
    assert verdict({"async-0.86": tracks}, []) == "inconclusive"  # a pair never measured
