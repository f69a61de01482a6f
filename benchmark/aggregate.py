"""Statistics across seeds and presets, as rliable (Agarwal et al., 2021) defines them.

Definitions (stated in every report):

- **IQM** (interquartile mean): `scipy.stats.trim_mean(scores, 0.25)`, rliable's definition:
  sort the n scores, drop the lowest and the highest `floor(n / 4)` whole scores, average the
  rest (n = 5: the middle three; n < 4: the plain mean).
- **95 % confidence interval**: `scipy.stats.bootstrap`, percentile method (rliable's default),
  50,000 resamples, `numpy.random.default_rng(0)` so the report is reproducible. Where several
  presets are pooled (an aggregate, a comparison) the bootstrap is stratified: each preset's seeds
  are resampled with replacement on their own, as rliable's `StratifiedBootstrap` does. With fewer
  than 3 seeds in a preset there is no interval ("n/a"), not a zero-width one.
- **Failed seeds**: a run that crashed or timed out has no score; it is listed, counts as a seed
  that missed the target, and the seeds column says how many of the seeds finished.
- **Sample efficiency**: the IQM across seeds of the evaluation return at each evaluation step
  (the steps every finished seed evaluated at), and the first step from which it stays at or
  above the preset's `curve_threshold` until the end. The training average (of exploration
  episodes) is reported beside it as the first step where the moving average of the last
  `window` training episodes reaches the threshold.
- **Normalised score**: (score - random) / (reference - random) with the published random and
  reference (for Atari: human) scores of the task; the aggregate is the IQM of the normalised
  scores of one algorithm's presets, pooled across its tasks.
- **Probability of improvement** of B over A (rliable's): per preset, the probability that a
  seed of B scores higher than a seed of A (ties count one half; the Mann-Whitney U statistic
  divided by the number of pairs), averaged over presets; its interval from the stratified
  bootstrap of both sweeps' seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from .manifest import Target

BOOTSTRAP_REPS = 50_000  # rliable's default
BOOTSTRAP_SEED = 0
MIN_SEEDS_FOR_CI = 3


def iqm(scores: Sequence[float]) -> float:
    return float(stats.trim_mean(np.asarray(scores, dtype=float), 0.25))


def _pooled_iqm(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    return stats.trim_mean(np.concatenate(samples, axis=axis), 0.25, axis=axis)


def _bootstrap(samples: Sequence[Sequence[float]], statistic: Any) -> tuple[float, float] | None:
    """Percentile interval of `statistic` over a bootstrap stratified by sample; None when a
    sample has fewer than MIN_SEEDS_FOR_CI values."""
    arrays = tuple(np.asarray(s, dtype=float) for s in samples)
    if not arrays or min(len(a) for a in arrays) < MIN_SEEDS_FOR_CI:
        return None
    result = stats.bootstrap(
        arrays,
        statistic,
        n_resamples=BOOTSTRAP_REPS,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
        vectorized=True,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def iqm_ci(*tasks: Sequence[float]) -> tuple[float, float] | None:
    """95 % interval of the IQM of the pooled scores, each task's seeds resampled on their own."""
    return _bootstrap(tasks, _pooled_iqm)


def _poi(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    """Mean over tasks of P(b > a) + P(b == a) / 2; samples alternate b1, a1, b2, a2, ..."""
    per_task = []
    for b, a in zip(samples[0::2], samples[1::2]):
        b, a = np.moveaxis(b, axis, -1)[..., :, None], np.moveaxis(a, axis, -1)[..., None, :]
        per_task.append(((b > a) + 0.5 * (b == a)).mean(axis=(-2, -1)))
    return np.mean(per_task, axis=0)


def probability_of_improvement(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
) -> dict[str, Any]:
    """P(B > A) over tasks given (scores_b, scores_a) per task, and its 95 % interval (None
    when a task has fewer than MIN_SEEDS_FOR_CI seeds on either side)."""
    samples = [np.asarray(s, dtype=float) for pair in pairs for s in pair]
    return {"p": float(_poi(*samples)), "ci95": _bootstrap(samples, _poi)}


def crossing_step(curve: Sequence[tuple[int, float]], threshold: float, window: int) -> int | None:
    """First step where the `window`-episode moving average reaches `threshold`, else None."""
    if len(curve) < window:
        return None
    steps = np.array([s for s, _ in curve])
    values = np.array([v for _, v in curve], dtype=float)
    sums = np.convolve(values, np.ones(window), mode="valid")
    hits = np.nonzero(sums / window >= threshold)[0]
    return int(steps[hits[0] + window - 1]) if len(hits) else None


def eval_iqm_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """(step, IQM across seeds) at the evaluation steps that every seed's curve has (the last
    value where a step was logged twice)."""
    by_seed = [dict((int(s), float(v)) for s, v in curve) for curve in curves]
    if not by_seed:
        return []
    steps = sorted(set.intersection(*(set(d) for d in by_seed)))
    return [(step, iqm([d[step] for d in by_seed])) for step in steps]


def stays_above_step(curve: Sequence[tuple[int, float]], threshold: float) -> int | None:
    """The first step from which every later value of `curve` is >= threshold, else None."""
    first = None
    for step, value in curve:
        if value < threshold:
            first = None
        elif first is None:
            first = step
    return first


def run_metric(record: dict[str, Any], metric: str) -> float | None:
    """A finished run's value of a target metric (manifest.METRICS); None where the run has too
    few evaluations for it."""
    if metric == "eval_mean":
        return record["summary"]["eval_mean"]
    if metric == "eval_min_last3":
        evals = [value for _, value in record["curves"]["eval"]]
        return min(evals[-3:]) if len(evals) >= 3 else None
    raise ValueError(f"unknown metric {metric!r}")


def holds(record: dict[str, Any], fraction: float) -> bool | None:
    """Whether a finished run's last evaluation is at least `fraction` of its best one (a target's
    `hold`: it learned and kept it); None without an evaluation curve. Meant for tasks whose
    returns are positive once learned: a best at or below 0 does not hold."""
    evals = [value for _, value in record["curves"]["eval"]]
    if not evals:
        return None
    best = max(evals)
    return best > 0 and evals[-1] >= fraction * best


def check_target(
    target: Target | None,
    scores: Sequence[float | None],
    not_applicable: str | None,
    held: Sequence[bool | None] | None = None,
) -> dict[str, Any]:
    """Whether a preset met its target. `scores` has one entry per seed, None for a failed run
    (which counts as a miss); `held` (for a target with `hold`) says per seed whether its last
    evaluation kept `hold` of its best, None or False being a miss; `not_applicable` says why the
    check does not apply, if so."""
    if target is None:
        return {"status": "report only", "text": ""}
    if not_applicable:
        return {"status": "not applicable", "text": target.text, "why": not_applicable}
    if target.hold is not None and (held is None or len(held) != len(scores)):
        raise ValueError("a target with `hold` needs one `held` entry per seed")
    kept = held if target.hold is not None else [True] * len(scores)
    passed = sum(s is not None and target.passes(s) and bool(k) for s, k in zip(scores, kept))
    done = [s for s in scores if s is not None]
    complete = bool(done) and len(done) == len(scores)
    mean = float(np.mean(done)) if done else None
    centre = iqm(done) if done else None
    met = (
        passed >= target.at_least
        and (target.mean_min is None or (complete and mean >= target.mean_min))
        and (target.iqm_min is None or (complete and centre >= target.iqm_min))
    )
    return {
        "status": "met" if met else "missed",
        "text": target.text,
        "passed_seeds": passed,
        "needed_seeds": target.at_least,
        "of": target.of,
        "mean": mean,
        "iqm": centre,
        "iqm_min": target.iqm_min,
    }


def score_stats(scores: Sequence[float]) -> dict[str, Any]:
    """Over the finished seeds: mean, std (population, ddof=0), IQM and its interval (None with
    fewer than MIN_SEEDS_FOR_CI seeds); None values when there are no scores."""
    if not scores:
        return {"n": 0, "mean": None, "std": None, "iqm": None, "iqm_ci95": None}
    values = np.asarray(scores, dtype=float)
    ci = iqm_ci(values)
    return {
        "n": len(values),
        "mean": float(values.mean()),
        "std": float(values.std()),
        "iqm": iqm(values),
        "iqm_ci95": list(ci) if ci else None,
    }


def normalise(score: float, random: float, reference: float) -> float:
    return (score - random) / (reference - random)
