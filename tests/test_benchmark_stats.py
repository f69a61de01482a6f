"""The benchmark's statistics against rliable's definitions (Agarwal et al., 2021) and SciPy on
fixed inputs: hand-computed interquartile means, the trimmed-mean t-interval (and its coverage by
simulation), the pooled bootstrap against the exact bootstrap distribution, stratification, the
probability of improvement against the Mann-Whitney U statistic, the rank test and Holm's
correction (and `compare`'s false-alarm rate and power by simulation), sample efficiency from
evaluation curves, targets, normalisation."""

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
    exact_p_value,
    holds,
    holm,
    iqm,
    iqm_ci,
    iqm_interval,
    normalise,
    probability_of_improvement,
    rank_test,
    run_metric,
    score_stats,
    smallest_p_value,
    stays_above_step,
    trimmed_t_interval,
    u_statistic,
    verdicts,
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


def test_no_interval_under_three_seeds_and_no_std_for_one():
    assert iqm_ci([5.0]) is None and iqm_ci([1.0, 2.0]) is None
    assert iqm_interval([5.0]) is None and iqm_interval([1.0, 2.0]) is None
    one = score_stats([2336.6])
    assert one["iqm_ci95"] is None  # not "2,336.6 [2,336.6, 2,336.6]"
    assert one["std"] is None  # not 0.0, which reads as no variance
    assert iqm_ci([1.0, 2.0, 3.0]) is not None and iqm_interval([1.0, 2.0, 3.0]) is not None
    assert iqm_ci([1.0, 2.0, 3.0], [4.0, 5.0]) is None  # any preset under three seeds
    assert score_stats([]) == {"n": 0, "mean": None, "std": None, "iqm": None, "iqm_ci95": None}


def test_std_is_the_sample_std():
    summary = score_stats(NAF)
    assert summary["std"] == pytest.approx(np.std(NAF, ddof=1)) and summary["n"] == 5
    assert score_stats([101.0, 102.0])["std"] == pytest.approx(np.sqrt(0.5))


# --- a preset's interval: the Tukey-McLaughlin t-interval of the IQM ------------------------


def test_trimmed_t_interval_hand_computed():
    # naf-pendulum, n = 5: g = 1 trimmed each side, h = 3 kept.
    low, high = iqm_interval(NAF)
    kept = [-144.7, -140.5, -129.5]
    winsorised = np.array([-144.7, -144.7, -140.5, -129.5, -129.5])  # -147.3 up, -123.3 down
    ssw = ((winsorised - winsorised.mean()) ** 2).sum()
    half = stats.t.ppf(0.975, 2) * np.sqrt(ssw / (3 * 2))
    assert (low, high) == pytest.approx((np.mean(kept) - half, np.mean(kept) + half))
    assert score_stats(NAF)["iqm_ci95"] == pytest.approx([low, high])
    # n < 4 trims nothing: Student's t-interval of the mean.
    three = [1.0, 2.0, 4.0]
    expected = stats.t.interval(0.95, 2, loc=np.mean(three), scale=stats.sem(three))
    assert iqm_interval(three) == pytest.approx(expected)
    # n = 8: two trimmed each side, 3 degrees of freedom; vectorised rows give the same.
    x = np.array(
        [[3.0, 9.0, 1.0, 4.0, 7.0, 2.0, 8.0, 30.0], [5.0, 1.0, 2.0, 2.0, 9.0, 6.0, 4.0, 3.0]]
    )
    lows, highs = trimmed_t_interval(x)
    for row, lo, hi in zip(x, lows, highs):
        s = np.sort(row)
        w = np.concatenate([[s[2]] * 2, s[2:6], [s[5]] * 2])
        half = stats.t.ppf(0.975, 3) * np.sqrt(((w - w.mean()) ** 2).sum() / (4 * 3))
        assert (lo, hi) == pytest.approx((s[2:6].mean() - half, s[2:6].mean() + half))
    assert score_stats([500.0] * 5)["iqm_ci95"] == [500.0, 500.0]  # no spread, no width


def population_trimmed_mean(dist) -> float:
    """The mean of the middle half of a distribution (its 25% trimmed mean)."""
    return float(dist.ppf(np.linspace(0.25, 0.75, 200_001)).mean())


COVERAGE_TRIALS = 20_000


@pytest.mark.parametrize(
    "name, dist", [("normal", stats.norm(10, 3)), ("lognormal", stats.lognorm(1.0))]
)
def test_trimmed_t_interval_covers_the_population_trimmed_mean(name, dist):
    """Coverage of the 95% interval at the benchmark's seed counts, by simulation: within 3.5
    points of nominal for normal scores and strongly skewed ones (lognormal, sigma 1, skewness
    6.2). The percentile bootstrap of the same IQM, which reports used before, is shown beside it
    for 3 and 5 seeds (computed exactly: every equally likely resample)."""
    rng = np.random.default_rng(2024)
    target = population_trimmed_mean(dist)
    for n in (3, 5, 10):
        x = dist.rvs(size=(COVERAGE_TRIALS, n), random_state=rng)
        low, high = trimmed_t_interval(x)
        coverage = float(np.mean((low <= target) & (target <= high)))
        line = f"{name}, {n} seeds: trimmed t covers {coverage:.3f}"
        if n <= 5:
            resamples = np.array(list(itertools.product(range(n), repeat=n)))
            hits = []
            for chunk in np.split(x[:1000], 5):  # [200, n^n resamples, n] at a time
                boot = stats.trim_mean(chunk[:, resamples], 0.25, axis=-1)
                lo, hi = np.quantile(boot, [0.025, 0.975], axis=1)
                hits.append((lo <= target) & (target <= hi))
            line += f"; percentile bootstrap {np.mean(hits):.3f}"
        print(line)
        assert abs(coverage - 0.95) <= 0.035, line


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
    assert poi == pytest.approx(np.mean([rliable_poi(b, a) for b, a in tasks]))
    assert probability_of_improvement([([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])]) == 0.5
    # A description only: complete separation at 3 seeds is P = 1, with no interval that would
    # read as certainty ([1.00, 1.00]); whether it is a difference is the rank test's question.
    assert probability_of_improvement([([3.0, 4.0, 5.0], [0.0, 1.0, 2.0])]) == 1.0
    assert rank_test([3.0, 4.0, 5.0], [0.0, 1.0, 2.0])["p"] == pytest.approx(0.1)


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


# --- compare: the rank test, Holm's correction, and their behaviour by simulation ----------


def test_rank_test_is_scipys_exact_mann_whitney_without_ties():
    rng = np.random.default_rng(3)
    for n, m in ((3, 3), (5, 5), (10, 10), (4, 7), (6, 2)):
        for _ in range(10):
            b, a = rng.normal(size=n), rng.normal(size=m)
            test = rank_test(b, a)
            expected = stats.mannwhitneyu(b, a, alternative="two-sided", method="exact")
            assert test["method"] == "exact" and test["p"] == pytest.approx(expected.pvalue)
            assert test["poi"] == pytest.approx(expected.statistic / (n * m))
            # the vectorised lookup the simulations use gives the same p-value
            assert exact_p_value(u_statistic(b, a), n, m) == pytest.approx(expected.pvalue)
    assert smallest_p_value(3, 3) == pytest.approx(0.1)  # 2 / C(6, 3)
    assert smallest_p_value(5, 5) == pytest.approx(2 / 252)
    assert smallest_p_value(10, 10) == pytest.approx(2 / 184_756)
    assert exact_p_value(0, 3, 3) == pytest.approx(0.1) and exact_p_value(4.5, 3, 3) == 1.0


@pytest.mark.parametrize(
    ("b", "a"),
    [
        ([3.0, 4.0, 5.0, 5.0], [0.0, 1.0, 5.0, 5.0]),
        # One seed on a side (a preset run once in an older sweep): scipy's permutation test
        # refuses such a sample, so the enumeration must not depend on it.
        ([1000.0, 1000.0, 1000.0, 990.0, 1000.0], [1000.0]),
        ([2.0], [1.0, 2.0, 2.0, 3.0]),
    ],
)
def test_rank_test_with_ties_is_the_exact_permutation_distribution(b, a):
    n, m = len(b), len(a)
    pooled = np.array(b + a)
    u_seen = float(u_statistic(np.array(b), np.array(a)))
    splits = [
        (pooled[list(i)], np.delete(pooled, list(i)))
        for i in itertools.combinations(range(n + m), n)
    ]  # every equally likely split
    us = np.array([float(u_statistic(x, y)) for x, y in splits])
    # two-sided: twice the smaller tail, at most 1
    expected = min(1.0, 2 * min(np.mean(us >= u_seen), np.mean(us <= u_seen)))
    test = rank_test(b, a)
    assert test["method"] == "exact permutation (ties)"
    assert test["p"] == pytest.approx(expected) and test["poi"] == pytest.approx(u_seen / (n * m))


def test_rank_test_with_ties_beyond_enumeration_draws_splits():
    # C(21, 10) = 352,716 splits, more than are enumerated: 200,000 are drawn. The reference
    # enumerates them all here, from the rank sums of the pooled mid-ranks.
    b = [5.0, 5.0, 6.0, 7.0, 7.0, 8.0, 9.0, 9.0, 10.0, 11.0]
    a = [1.0, 2.0, 3.0, 5.0, 5.0, 6.0, 7.0, 8.0, 8.0, 9.0, 4.0]
    ranks = stats.rankdata(b + a)
    sums = np.array([ranks[list(i)].sum() for i in itertools.combinations(range(21), 10)])
    seen = ranks[:10].sum()
    expected = min(1.0, 2 * min(np.mean(sums >= seen), np.mean(sums <= seen)))
    test = rank_test(b, a)
    assert test["method"] == "Monte Carlo permutation (ties)"
    assert test["p"] == pytest.approx(expected, abs=0.002)  # p about 0.046; its sd about 0.0005


def test_rank_test_of_identical_scores_finds_no_difference():
    assert rank_test([500.0] * 5, [500.0] * 5)["p"] == 1.0  # a capped return
    assert rank_test([1000.0] * 5, [1000.0])["p"] == 1.0


def test_holm_hand_computed():
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.5])
    tested = np.array([True, True, True, True, False])
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> made
    # non-decreasing: 0.02, 0.03, 0.06, 0.06; the untested one has none.
    adjusted = holm(p, tested)
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and np.isnan(adjusted[4])
    poi = np.array([0.9, 0.1, 0.2, 0.0, 1.0])
    assert verdicts(poi, p, tested).tolist() == [1, 0, 0, -1, 0]
    assert verdicts(poi, p, tested, level=0.1).tolist() == [1, -1, -1, -1, 0]
    # vectorised over trials: each row on its own
    rows = np.stack([p, p[::-1]])
    assert holm(rows, np.ones(5, bool))[1] == pytest.approx(holm(p[::-1], np.ones(5, bool)))


PRESETS, TRIALS = 20, 10_000


def simulate(n: int, shift: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`compare`'s verdicts over TRIALS pairs of simulated sweeps: PRESETS presets, n seeds a
    side, standard normal final evaluations, B's shifted by `shift` (per preset) standard
    deviations. The same decisions as compare's: presets whose smallest possible p exceeds the
    level get no verdict and stay out of Holm's correction; the exact p-value of each U."""
    a = rng.normal(size=(TRIALS, PRESETS, n))
    b = rng.normal(size=(TRIALS, PRESETS, n)) + shift[:, None]
    u = u_statistic(b, a)
    p = exact_p_value(u, n, n)
    tested = np.full(PRESETS, smallest_p_value(n, n) <= 0.05)
    return verdicts(u / (n * n), p, tested)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_compare_rarely_raises_a_false_alarm_between_two_sweeps_of_one_distribution(n):
    """Two sweeps of 20 presets from one distribution: the share of simulated comparisons with
    any verdict (any preset called better or worse) is at most 5%, at 3, 5 and 10 seeds a side.
    At 3 seeds no verdict is possible (p >= 0.1); at 5, none with 20 presets (Holm's first
    threshold, 0.05 / 20, is below the smallest possible p, 2 / 252); at 10 the exact rate under
    Holm is 1 - (1 - P(p <= 0.0025))^20, which the simulation must match."""
    verdict = simulate(n, np.zeros(PRESETS), np.random.default_rng(n))
    any_verdict = float(np.mean((verdict != 0).any(axis=1)))
    any_worse = float(np.mean((verdict < 0).any(axis=1)))
    exact = 0.0
    if n == 10:
        null = exact_p_value(np.arange(101), 10, 10)
        reachable = np.unique(null[null <= 0.05 / PRESETS]).max()  # P(p <= 0.0025) exactly
        exact = 1 - (1 - reachable) ** PRESETS
        sd = np.sqrt(exact * (1 - exact) / TRIALS)
        assert abs(any_verdict - exact) <= 4 * sd
    print(
        f"{n} seeds: some verdict in {any_verdict:.4f} of {TRIALS} comparisons, some 'B worse' "
        f"in {any_worse:.4f} (exact family-wise rate {exact:.4f})"
    )
    assert any_verdict <= 0.05 and exact <= 0.05
    if n < 10:
        assert any_verdict == 0.0


def test_compare_detects_a_shift_of_one_standard_deviation_at_10_seeds():
    """Power at 10 seeds a side, B worse by one standard deviation: (1) on all 20 presets, the
    share of comparisons that flag at least one preset "B worse" (the exit status) must be most;
    the share of presets flagged is reported; (2) on one preset of 20, the share of comparisons
    that flag it."""
    rng = np.random.default_rng(7)
    every = simulate(10, np.full(PRESETS, -1.0), rng)
    at_least_one = float(np.mean((every < 0).any(axis=1)))
    per_preset = float(np.mean(every < 0))
    shift = np.zeros(PRESETS)
    shift[0] = -1.0
    one = simulate(10, shift, rng)
    print(
        f"every preset 1 sd worse: at least one flagged in {at_least_one:.3f} of comparisons, "
        f"{per_preset:.3f} of presets flagged; one preset of 20 worse: flagged in "
        f"{np.mean(one[:, 0] < 0):.3f}, a false verdict elsewhere in "
        f"{np.mean((one[:, 1:] != 0).any(axis=1)):.3f}; 'B better' on all 20 in "
        f"{np.mean((every > 0).any(axis=1)):.4f}"
    )
    assert at_least_one > 0.5
    # The opposite verdict (Holm's later, looser thresholds can take a preset whose seeds happen
    # to favour B) stays rare.
    assert np.mean((every > 0).any(axis=1)) < 0.01
