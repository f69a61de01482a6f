"""Two sweeps side by side per preset (say, before and after a change), with rliable's probability
of improvement of B over A and its interval, so a change that makes learning worse shows before
it lands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _verdict(ci: tuple[float, float] | None) -> str:
    if ci is None:
        return "n/a (fewer than 3 seeds)"
    if ci[0] > 0.5:
        return "**B better**"
    return "**B worse**" if ci[1] < 0.5 else "no clear difference"


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The comparison as Markdown lines, and the presets where B is worse than A with 95 % confidence."""
    results = [
        build_results(s, presets_from_tables(s["manifest"], Path("algos"), check_scripts=False))
        for s in (a, b)
    ]
    common = [name for name in results[0]["presets"] if name in results[1]["presets"]]
    if not common:
        raise ZooError(f"sweeps {a['meta']['sweep']!r} and {b['meta']['sweep']!r} share no preset")

    def scores(i: int, name: str) -> list[float]:
        return [
            r["summary"]["eval_mean"]
            for r in results[i]["runs"]
            if r["preset"] == name and r["status"] == "ok"
        ]

    lines = [
        f"# `{a['meta']['sweep']}` (A) vs `{b['meta']['sweep']}` (B)",
        "",
        f"- A: {provenance_line(results[0]['provenance'])}",
        f"- B: {provenance_line(results[1]['provenance'])}",
        "",
        "| preset | seeds A / B | IQM A [95% CI] | IQM B [95% CI] | P(B > A) [95% CI] | verdict "
        "| sample efficiency A / B |",
        "|---|---|---|---|---|---|---|",
    ]
    worse, pairs = [], []
    for name in common:
        pa, pb = results[0]["presets"][name], results[1]["presets"][name]
        sa, sb = scores(0, name), scores(1, name)
        if pa["total_steps"] != pb["total_steps"]:
            name_cell = f"{name} (budgets differ: {pa['total_steps']} / {pb['total_steps']} steps)"
        else:
            name_cell = name
        if sa and sb:
            pairs.append((sb, sa))
            poi = aggregate.probability_of_improvement([(sb, sa)])
            cells = [_interval(poi["p"], poi["ci95"], 2), _verdict(poi["ci95"])]
            worse += [name] if cells[1] == "**B worse**" else []
        else:
            cells = ["—", "n/a (no finished seed)"]
        lines.append(
            f"| {name_cell} | {_seeds(pa)} / {_seeds(pb)} | "
            f"{_interval(pa['eval_mean']['iqm'], pa['eval_mean']['iqm_ci95'])} | "
            f"{_interval(pb['eval_mean']['iqm'], pb['eval_mean']['iqm_ci95'])} | {' | '.join(cells)} | "
            f"{_efficiency(pa['sample_efficiency'])} / {_efficiency(pb['sample_efficiency'])} |"
        )
    if len(pairs) > 1:
        poi = aggregate.probability_of_improvement(pairs)
        lines += [
            "",
            f"Over the {len(pairs)} presets (bootstrap stratified by preset): P(B > A) = "
            f"{_interval(poi['p'], poi['ci95'], 2)}, {_verdict(poi['ci95'])}.",
        ]
    lines += [
        "",
        "P(B > A): the probability that a seed of B ends with a higher final evaluation than a seed "
        "of A (ties count one half), rliable's probability of improvement; see the statistics in any report.",
    ]
    return lines, worse
