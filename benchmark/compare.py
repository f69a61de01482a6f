"""Two sweeps side by side per preset (say, before and after a change), so a change that makes
learning worse shows before it lands, and a difference the seeds cannot support is not called one.

Per preset: the two-sided Mann-Whitney rank test of B's final evaluations against A's (exact),
with Holm's correction across the presets compared, at a family-wise level of 5 %: the chance
that any of the verdicts is a false "better" or "worse" is at most that. A preset whose seed
counts cannot reach the level even when every seed of B beats every seed of A gets "too few
seeds" and stays out of the correction. rliable's probability of improvement, P(B > A), is shown
as a description beside the test."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import aggregate
from .manifest import ZooError, presets_from_tables
from .report import (
    _efficiency,
    _interval,
    _seeds,
    build_results,
    collect,
    load_committed,
    provenance_line,
)


def load_sweep(name: str, results_dir: Path, runs_dir: Path) -> dict[str, Any]:
    """A sweep by path (a results folder or a raw sweep folder) or by name: results/<name>/
    (committed), else <runs-dir>/<name>/ (raw runs, where smoke sweeps keep their report)."""
    for folder in (Path(name), results_dir / name, runs_dir / name):
        if (folder / "results.json").exists() and not (folder / "sweep.json").exists():
            return load_committed(folder)
        if (folder / "sweep.json").exists():
            return collect(folder)
    raise ZooError(f"no sweep {name!r}: not a folder, nor in {results_dir} or {runs_dir}")


@dataclass
class Comparison:
    """`compare`'s result: the Markdown lines, the presets where B is worse after the
    correction, and those where it is better."""

    lines: list[str]
    worse: list[str]
    better: list[str]
    compared: int
    level: float


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def compare(
    a: dict[str, Any],
    b: dict[str, Any],
    level: float = aggregate.FAMILY_LEVEL,
    patterns: tuple[str, ...] = (),
) -> Comparison:
    """Compare sweep B with sweep A (as `load_sweep` gives them) at family-wise level `level`,
    over the presets both ran (those matching `patterns`, shell patterns, where given)."""
    if not 0 < level < 1:
        raise ZooError(f"--level {level}: must be between 0 and 1")
    results = [
        build_results(s, presets_from_tables(s["manifest"], Path("algos"), check_scripts=False))
        for s in (a, b)
    ]
    common = [
        name
        for name in results[0]["presets"]
        if name in results[1]["presets"]
        and (not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns))
    ]
    if not common:
        raise ZooError(
            f"sweeps {a['meta']['sweep']!r} and {b['meta']['sweep']!r} share no preset"
            + (" matching --preset" if patterns else "")
        )

    def scores(i: int, name: str) -> list[float]:
        return [
            r["summary"]["eval_mean"]
            for r in results[i]["runs"]
            if r["preset"] == name and r["status"] == "ok"
        ]

    rows: list[dict[str, Any]] = []
    for name in common:
        sa, sb = scores(0, name), scores(1, name)
        row: dict[str, Any] = {"name": name, "a": sa, "b": sb, "test": None, "why": None}
        if not sa or not sb:
            row["why"] = f"no finished seed in {'A' if not sa else 'B'}"
        else:
            smallest = aggregate.smallest_p_value(len(sb), len(sa))
            if smallest > level:
                row["why"] = (
                    f"too few seeds: at {len(sa)} against {len(sb)} the smallest possible p is "
                    f"{_p(smallest)} > {level:g}"
                )
            row["test"] = aggregate.rank_test(sb, sa)
        rows.append(row)
    tested = np.array([r["test"] is not None and r["why"] is None for r in rows])
    p_values = np.array([r["test"]["p"] if r["test"] else np.nan for r in rows])
    poi = np.array([r["test"]["poi"] if r["test"] else 0.5 for r in rows])
    adjusted = aggregate.holm(p_values, tested, level)
    verdict = aggregate.verdicts(poi, p_values, tested, level)
    compared = int(tested.sum())
    smallest = min(
        (aggregate.smallest_p_value(len(r["b"]), len(r["a"])) for r, t in zip(rows, tested) if t),
        default=1.0,
    )

    lines = [
        f"# `{a['meta']['sweep']}` (A) vs `{b['meta']['sweep']}` (B)",
        "",
        f"- A: {provenance_line(results[0]['provenance'])}",
        f"- B: {provenance_line(results[1]['provenance'])}",
        f"- {compared} of the {len(common)} presets both sweeps ran were compared, at a family-wise "
        f"level of {level:g} (two-sided Mann-Whitney rank test per preset, Holm's correction "
        f"across the {compared}): the chance that any verdict below is a false one is at most "
        f"{level:.0%}. A preset without a verdict says why.",
        *(
            [
                f"- No verdict is attainable in this comparison: with {compared} presets, Holm's "
                f"correction needs a p of at most {level / compared:.2g} for a first verdict, and "
                f"the smallest p these seed counts allow is {smallest:.2g}; compare fewer presets "
                "(--preset) or run more seeds."
            ]
            if compared and smallest > level / compared
            else []
        ),
        "",
        f"| preset | seeds A / B | IQM A [95% CI, {aggregate.PRESET_CI_METHOD}] | IQM B [95% CI, "
        f"{aggregate.PRESET_CI_METHOD}] | P(B > A) | p | Holm-adjusted p | verdict "
        "| sample efficiency A / B |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    worse, better = [], []
    for row, adj, v in zip(rows, adjusted, verdict):
        name = row["name"]
        pa, pb = results[0]["presets"][name], results[1]["presets"][name]
        name_cell = name
        if pa["total_steps"] != pb["total_steps"]:
            name_cell = f"{name} (budgets differ: {pa['total_steps']} / {pb['total_steps']} steps)"
        test = row["test"]
        if row["why"] is None:
            if v:
                (better if v > 0 else worse).append(name)
                text = "**B better**" if v > 0 else "**B worse**"
            else:
                text = f"no verdict: adjusted p {_p(adj)} > {level:g}"
        else:
            text = f"no verdict: {row['why']}"
        if test and test["method"] != "exact":
            text += f" ({test['method']})"
        cells = [
            name_cell,
            f"{_seeds(pa)} / {_seeds(pb)}",
            _interval(pa["eval_mean"]["iqm"], pa["eval_mean"]["iqm_ci95"]),
            _interval(pb["eval_mean"]["iqm"], pb["eval_mean"]["iqm_ci95"]),
            f"{test['poi']:.2f}" if test else "—",
            _p(test["p"]) if test else "—",
            _p(adj) if row["why"] is None else "—",
            text,
            f"{_efficiency(pa['sample_efficiency'])} / {_efficiency(pb['sample_efficiency'])}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    pairs = [(r["b"], r["a"]) for r in rows if r["a"] and r["b"]]
    if len(pairs) > 1:
        lines += [
            "",
            f"Over the {len(pairs)} presets with finished seeds on both sides, P(B > A) averages "
            f"{aggregate.probability_of_improvement(pairs):.2f} (a description; the verdicts are "
            "the per-preset tests').",
        ]
    lines += [
        "",
        "P(B > A): the share of (seed of B, seed of A) pairs where B's final evaluation is higher "
        "(ties count one half), rliable's probability of improvement. p: the two-sided "
        "Mann-Whitney test of the final evaluations (exact; with ties, the exact permutation "
        "distribution of the same statistic). Holm-adjusted p: p corrected for the number of "
        f"presets compared; a verdict where it is at most {level:g}. The statistics in full are "
        "in any report.",
    ]
    return Comparison(lines, worse, better, compared, level)
