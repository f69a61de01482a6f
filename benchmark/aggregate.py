"""Statistics across seeds: interquartile mean, its bootstrap interval, targets, curve crossings.

Definitions (stated in every report):

- **IQM** (interquartile mean) of n scores: sort them; score i (0-based) covers the
  quantile interval [i/n, (i+1)/n]; its weight is the length of that interval's overlap
  with [0.25, 0.75], divided by 0.5. This is the mean of the middle 50 % with fractional
  trimming, so it is defined for any n (n = 1: the score; n = 4: the mean of the middle
  two; n = 5: (0.15 x2 + 0.2 x3 + 0.15 x4) / 0.5). For n divisible by 4 it equals
  rliable's `scipy.stats.trim_mean(x, 0.25)`.
- **95 % confidence interval**: percentile bootstrap as in rliable, stratified by preset
  (one task per preset, so: resample the n seeds with replacement), 2,000 resamples,
  IQM of each, the 2.5th and 97.5th percentiles; `numpy.random.default_rng(0)`, so the
  report is reproducible.
- **Crossing step**: the first env step at which the moving average of the last `window`
  values of `charts/episodic_return` reaches the threshold (from the `window`-th episode on).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .manifest import Target

BOOTSTRAP_REPS = 2000
BOOTSTRAP_SEED = 0


def iqm_weights(n: int) -> np.ndarray:
    """Weight of each sorted score in the interquartile mean (see the module docstring)."""
    edges = np.arange(n + 1) / n
    overlap = np.clip(np.minimum(edges[1:], 0.75) - np.maximum(edges[:-1], 0.25), 0.0, None)
    return overlap / 0.5


def iqm(scores: Sequence[float]) -> float:
    values = np.sort(np.asarray(scores, dtype=float))
    return float(values @ iqm_weights(len(values)))


def bootstrap_ci(scores: Sequence[float], level: float = 0.95, reps: int = BOOTSTRAP_REPS,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile-bootstrap interval of the IQM, resampling seeds with replacement."""
    values = np.asarray(scores, dtype=float)
    rng = np.random.default_rng(seed)
    samples = np.sort(values[rng.integers(0, len(values), size=(reps, len(values)))], axis=1)
    stats = samples @ iqm_weights(len(values))
    alpha = (1 - level) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return float(low), float(high)


def crossing_step(curve: Sequence[tuple[int, float]], threshold: float, window: int) -> int | None:
    """First step where the `window`-episode moving average reaches `threshold`, else None."""
    if len(curve) < window:
        return None
    steps = np.array([s for s, _ in curve])
    values = np.array([v for _, v in curve], dtype=float)
    sums = np.convolve(values, np.ones(window), mode="valid")
    hits = np.nonzero(sums / window >= threshold)[0]
    return int(steps[hits[0] + window - 1]) if len(hits) else None


def check_target(target: Target | None, scores: Sequence[float | None], not_applicable: str | None) -> dict[str, Any]:
    """Whether a preset met its target. `scores` has one entry per seed, None for a failed run
    (which counts as a miss); `not_applicable` says why the check does not apply, if so."""
    if target is None:
        return {"status": "report only", "text": ""}
    if not_applicable:
        return {"status": "not applicable", "text": target.text, "why": not_applicable}
    passed = sum(s is not None and target.passes(s) for s in scores)
    done = [s for s in scores if s is not None]
    mean = float(np.mean(done)) if done else None
    met = passed >= target.at_least and (
        target.mean_min is None or (len(done) == len(scores) and mean is not None and mean >= target.mean_min))
    return {"status": "met" if met else "missed", "text": target.text, "passed_seeds": passed,
            "needed_seeds": target.at_least, "of": target.of, "mean": mean}


def score_stats(scores: Sequence[float]) -> dict[str, Any]:
    """Mean, std (population, ddof=0), IQM and its interval; None values when there are no scores."""
    if not scores:
        return {"n": 0, "mean": None, "std": None, "iqm": None, "iqm_ci95": None}
    values = np.asarray(scores, dtype=float)
    return {"n": len(values), "mean": float(values.mean()), "std": float(values.std()),
            "iqm": iqm(values), "iqm_ci95": list(bootstrap_ci(values))}
