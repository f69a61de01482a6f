"""The benchmark's statistics against rliable's definitions (Agarwal et al., 2021) on fixed
inputs: hand-computed interquartile means, bootstrap intervals against the exact bootstrap
distribution, stratification, the probability of improvement against the Mann-Whitney U
statistic, sample efficiency from evaluation curves, targets, normalisation."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from conftest import ROOT
from scipy import stats

sys.path.insert(0, str(ROOT))  # the package, when the project is not pip-installed
from benchmark.aggregate import (
    check_target,
    crossing_step,
    eval_iqm_curve,
    holds,
    iqm,
    iqm_ci,
    normalise,
    probability_of_improvement,
    run_metric,
    score_stats,
    stays_above_step,
)
from benchmark.manifest import Target

# full-v1's naf-pendulum final evaluations, seeds 1..5.
NAF = [-144.7, -129.5, -147.3, -123.3, -140.5]


def test_iqm_is_rliables_whole_score_trimmed_mean():
    assert iqm([7.0]) == 7.0
    assert iqm([1, 2, 100]) == pytest.approx(103 / 3)  # n < 4: nothing trimmed
    assert iqm([4, 1, 3, 2]) == pytest.approx(2.5)  # the middle two
    assert iqm([1, 2, 3, 4, 100]) == pytest.approx(3.0)  # drop 1 and 100 whole
    assert iqm(range(1, 9)) == pytest.approx(4.5)  # drop two each side
    # naf-pendulum: the middle three of five, -138.2 (a fractional trim gave -138.4).
    assert iqm(NAF) == pytest.approx((-144.7 - 140.5 - 129.5) / 3) and f"{iqm(NAF):.1f}" == "-138.2"


def exact_bootstrap_quantiles(scores: list[float], q: list[float]) -> np.ndarray:
    """Quantiles of the IQM of five scores (the middle three sorted) over every one of the
    5^5 equally likely resamples."""
    resamples = np.asarray(scores)[np.array(list(itertools.product(range(5), repeat=5)))]
    return np.quantile(np.sort(resamples, axis=1)[:, 1:4].mean(axis=1), q)


def test_interval_matches_the_exact_bootstrap_distribution():
    low, high = iqm_ci(NAF)
    exact_low, exact_high = exact_bootstrap_quantiles(NAF, [0.025, 0.975])
    # 50,000 resamples estimate the exact percentiles to well within a tenth of a point here.
    assert low == pytest.approx(exact_low, abs=0.3) and high == pytest.approx(exact_high, abs=0.3)
    assert low < iqm(NAF) < high
    assert iqm_ci(NAF) == (low, high)  # fixed seed: reproducible


def test_no_interval_under_three_seeds():
    assert iqm_ci([5.0]) is None and iqm_ci([1.0, 2.0]) is None
    assert score_stats([2336.6])["iqm_ci95"] is None  # not "2,336.6 [2,336.6, 2,336.6]"
    assert iqm_ci([1.0, 2.0, 3.0]) is not None
    assert iqm_ci([1.0, 2.0, 3.0], [4.0, 5.0]) is None  # any preset under three seeds
    assert score_stats([]) == {"n": 0, "mean": None, "std": None, "iqm": None, "iqm_ci95": None}


def test_pooled_interval_is_stratified_by_preset():
    # Each preset's seeds are resampled on their own: every resample holds three 0s and three 10s,
    # whose IQM is 5, so the interval has no width. Pooled resampling would vary.
    assert iqm_ci([0.0, 0.0, 0.0], [10.0, 10.0, 10.0]) == (5.0, 5.0)
    low, high = iqm_ci([0.0, 1.0, 2.0], [10.0, 11.0, 12.0])
    assert 4.0 < low < 6.0 < high < 7.5


def rliable_poi(x: np.ndarray, y: np.ndarray) -> float:
    """rliable's per-task probability of improvement: Mann-Whitney U / (n m)."""
    if np.array_equal(x, y):
        return 0.5
    return stats.mannwhitneyu(x, y, alternative="greater").statistic / (len(x) * len(y))


def test_probability_of_improvement_against_mann_whitney():
    rng = np.random.default_rng(1)
    tasks = [
        (rng.integers(0, 5, 4).astype(float), rng.integers(0, 5, 6).astype(float)) for _ in range(3)
    ]  # ties
    poi = probability_of_improvement(tasks)
    assert poi["p"] == pytest.approx(np.mean([rliable_poi(b, a) for b, a in tasks]))
    assert probability_of_improvement([([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])])["p"] == 0.5
    assert probability_of_improvement([([3.0, 4.0, 5.0], [0.0, 1.0, 2.0])]) == {
        "p": 1.0,
        "ci95": (1.0, 1.0),
    }
    low, high = poi["ci95"]
    assert low <= poi["p"] <= high
    assert probability_of_improvement([([1.0, 2.0], [0.0, 1.0, 2.0])])["ci95"] is None


def test_sample_efficiency_from_evaluation_curves():
    seeds = [
        [(100, -300.0), (200, -150.0), (300, -250.0), (400, -140.0), (500, -130.0)],
        [(100, -280.0), (200, -180.0), (300, -170.0), (400, -150.0), (500, -120.0)],
        [(100, -900.0), (200, -160.0), (300, -190.0), (400, -145.0), (500, -110.0), (600, 0.0)],
    ]
    curve = eval_iqm_curve(seeds)
    # Only the steps every seed evaluated at; three seeds: the plain mean.
    assert [s for s, _ in curve] == [100, 200, 300, 400, 500]
    assert curve[2] == (300, pytest.approx((-250 - 170 - 190) / 3))
    # The IQM reaches -200 at step 200, dips below at 300, and stays above from 400 on.
    assert stays_above_step(curve, -200) == 400
    assert stays_above_step(curve, -100) is None
    assert stays_above_step(curve, -1000) == 100
    assert eval_iqm_curve([]) == [] and stays_above_step([], 0) is None
    assert eval_iqm_curve([[(10, 1.0), (10, 3.0)]]) == [
        (10, 3.0)
    ]  # a step logged twice: the last value


def test_training_crossing_hand_computed():
    curve = [(10 * i, float(v)) for i, v in enumerate([0, 0, 10, 10, 10, 10, 0, 20], start=1)]
    # 3-episode averages from episode 3 on: 3.3, 6.7, 10, 10, 6.7, 10 (at steps 30..80)
    assert crossing_step(curve, 10, 3) == 50
    assert crossing_step(curve, 6, 3) == 40
    assert crossing_step(curve, 11, 3) is None
    assert crossing_step(curve[:2], -1e9, 3) is None  # fewer episodes than the window


def test_target_counts_a_failed_seed_as_a_miss():
    target = Target(
        metric="eval_mean", threshold=-200, strict=False, at_least=4, of=5, text="t", mean_min=-160
    )
    scores = [-150.0, -190.0, -210.0, -170.0, -180.0]  # 4 pass, mean -180
    assert check_target(target, scores, None)["status"] == "missed"
    assert check_target(target, [-150.0, -150.0, -210.0, -150.0, -140.0], None)["status"] == "met"
    loose = Target(metric="eval_mean", threshold=-200, strict=False, at_least=4, of=5, text="t")
    result = check_target(loose, scores, None)
    assert (result["status"], result["passed_seeds"], result["mean"]) == ("met", 4, -180.0)
    assert check_target(loose, [-150.0, None, -210.0, -170.0, -180.0], None)["status"] == "missed"
    assert check_target(loose, [-200.0] * 5, None)["status"] == "met"
    strict = Target(metric="eval_mean", threshold=100, strict=True, at_least=2, of=2, text="t")
    assert check_target(strict, [100.0, 100.5], None)["status"] == "missed"
    assert check_target(strict, scores, "reduced budget")["status"] == "not applicable"
    assert check_target(None, scores, None)["status"] == "report only"


def test_target_on_the_iqm_and_on_keeping_half_of_the_best():
    # Per seed >= 1000 in 4 of 5, IQM >= 3000 (of 5 scores, the mean of the middle three), each
    # seed's last evaluation >= half its best.
    target = Target(
        metric="eval_mean",
        threshold=1000,
        strict=False,
        at_least=4,
        of=5,
        text="t",
        iqm_min=3000,
        hold=0.5,
    )
    scores = [
        500.0,
        2800.0,
        3000.0,
        3200.0,
        9000.0,
    ]  # IQM 3000 (a mean of 3700 would hide the weak seed)
    assert iqm(scores) == pytest.approx(3000.0)
    result = check_target(target, scores, None, [True] * 5)
    assert (result["status"], result["passed_seeds"], result["iqm"]) == (
        "met",
        4,
        pytest.approx(3000.0),
    )
    assert (
        check_target(target, [500.0, 2700.0, 3000.0, 3200.0, 9000.0], None, [True] * 5)["status"]
        == "missed"
    )
    # a seed that fell below half its best is a miss even with a high final score; None (no curve) too
    assert check_target(target, scores, None, [True, True, False, True, True])["passed_seeds"] == 3
    assert check_target(target, scores, None, [True, True, None, True, True])["status"] == "missed"
    # a failed seed leaves the IQM incomplete: missed whatever the others score
    assert (
        check_target(target, [None, 5000.0, 5000.0, 5000.0, 5000.0], None, [None] + [True] * 4)[
            "status"
        ]
        == "missed"
    )
    with pytest.raises(ValueError, match="one `held` entry per seed"):
        check_target(target, scores, None)


def test_holds_compares_the_last_evaluation_with_the_best():
    record = {"curves": {"eval": [[1, 100.0], [2, 3000.0], [3, 1400.0]]}}
    assert holds(record, 0.5) is False  # 1400 < 1500
    assert holds({"curves": {"eval": [[1, 100.0], [2, 3000.0], [3, 1500.0]]}}, 0.5) is True
    assert (
        holds({"curves": {"eval": [[1, -300.0], [2, -100.0]]}}, 0.5) is False
    )  # nothing positive was learned
    assert holds({"curves": {"eval": []}}, 0.5) is None


def test_run_metrics_final_and_lowest_of_the_last_three():
    record = {
        "summary": {"eval_mean": 900.0},
        "curves": {"eval": [[1, 10.0], [2, 1000.0], [3, 120.0], [4, 1000.0], [5, 900.0]]},
    }
    assert run_metric(record, "eval_mean") == 900.0
    assert run_metric(record, "eval_min_last3") == 120.0  # forgot at step 3, recovered by the end
    assert (
        run_metric({**record, "curves": {"eval": [[1, 10.0], [2, 1000.0]]}}, "eval_min_last3")
        is None
    )
    with pytest.raises(ValueError, match="unknown metric"):
        run_metric(record, "eval_max")


def test_human_normalised_breakout():
    assert normalise(20.8, 1.7, 30.5) == pytest.approx(19.1 / 28.8)
    assert normalise(1.7, 1.7, 30.5) == 0.0 and normalise(30.5, 1.7, 30.5) == 1.0
