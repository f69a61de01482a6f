"""A sweep's results: `results.json`, `report.md`, learning-curve plots, and the README block."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from . import aggregate
from .manifest import Preset, ZooError
from .runner import load_records, write_atomic, write_json

README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"
PLOT_POINTS = 200


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).parent)
    except OSError:
        return None
    return out.stdout.strip() or None


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version()}


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r["summary"][key] for r in records if isinstance(r["summary"].get(key), (int, float))]
    return float(np.mean(values)) if values else None


def summarize_preset(preset: Preset, records: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """Per-preset numbers from its run records (one per seed)."""
    ok = [r for r in records if r["status"] == "ok"]
    scores = [r["summary"]["eval_mean"] for r in ok]
    steps = sorted({r["total_steps"] for r in records})
    reduced = mode == "smoke" or steps != [preset.full.total_steps]
    why = None
    if reduced:
        why = f"reduced budget ({', '.join(map(str, steps))} of {preset.full.total_steps:,} steps)"
    elif preset.target is not None and len(records) != preset.target.of:
        why = f"{len(records)} seeds run, the target is over {preset.target.of}"
    by_seed = [r["summary"]["eval_mean"] if r["status"] == "ok" else None for r in records]
    crossings = [r["crossing_step"] for r in records]
    return {
        "algo": preset.algo, "env_id": preset.env_id, "total_steps": steps, "full_total_steps": preset.full.total_steps,
        "reduced_budget": reduced, "seeds": [r["seed"] for r in records], "failed_seeds": [r["seed"] for r in records
                                                                                            if r["status"] != "ok"],
        "eval_mean": aggregate.score_stats(scores),
        "target": aggregate.check_target(preset.target, by_seed, why) | {"provisional": preset.provisional},
        "references": [ref.__dict__ for ref in preset.references],
        "crossing": {"threshold": preset.curve_threshold, "window": preset.curve_window, "steps": crossings,
                     "crossed": sum(c is not None for c in crossings)},
        "sps_mean": _mean(ok, "sps"), "wall_time_s_mean": _mean(ok, "wall_time_s"),
        "peak_rss_mb_max": max((r["summary"]["peak_rss_mb"] for r in ok), default=None),
        "dataset": preset.dataset,
    }


def build_results(sweep: str, meta: dict[str, Any], presets: dict[str, Preset],
                  records: list[dict[str, Any]]) -> dict[str, Any]:
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["preset"] in presets:
            by_preset.setdefault(record["preset"], []).append(record)
    return {
        "sweep": sweep, "mode": meta["mode"], "budget": meta["budget"], "commands": meta["commands"],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "git_commit": _git_commit(),
        "machine": machine(), "statistics": aggregate.__doc__.split("Definitions (stated in every report):")[1].strip(),
        "presets": {name: summarize_preset(presets[name], by_preset[name], meta["mode"])
                    for name in presets if name in by_preset},
        "runs": [{k: v for k, v in r.items() if k != "curves"} for r in records if r["preset"] in presets],
    }


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _score(stats: dict[str, Any]) -> str:
    if not stats["n"]:
        return "—"
    return f"{_num(stats['mean'])} ± {_num(stats['std'])}"


def _iqm(stats: dict[str, Any]) -> str:
    if not stats["n"]:
        return "—"
    low, high = stats["iqm_ci95"]
    return f"{_num(stats['iqm'])} [{_num(low)}, {_num(high)}]"


def _target(target: dict[str, Any]) -> str:
    status = target["status"]
    if status in ("met", "missed"):
        status = f"**{status}** ({target['passed_seeds']}/{target['of']} seeds)"
    elif status == "not applicable":
        status = f"not applicable: {target['why']}"
    return status + (" (provisional)" if target.get("provisional") and target["text"] else "")


def _crossing(crossing: dict[str, Any]) -> str:
    if crossing["threshold"] is None:
        return "—"
    steps = [f"{s:,}" if s is not None else "never" for s in crossing["steps"]]
    return f"≥ {crossing['threshold']:g}: {', '.join(steps)}"


def preset_table(results: dict[str, Any], plot_prefix: str | None) -> list[str]:
    """The per-preset Markdown table shared by the report and the README block."""
    lines = ["| preset | env | steps | seeds | eval mean ± std | IQM [95% CI] | target | crossing step "
             "(10-ep avg) | SPS | wall time |" + (" plot |" if plot_prefix is not None else ""),
             "|---" * (10 + (plot_prefix is not None)) + "|"]
    for name, p in results["presets"].items():
        row = [name, p["env_id"], "/".join(f"{s:,}" for s in p["total_steps"]), str(len(p["seeds"])),
               _score(p["eval_mean"]), _iqm(p["eval_mean"]), _target(p["target"]), _crossing(p["crossing"]),
               _num(p["sps_mean"], 0), _num(p["wall_time_s_mean"] and p["wall_time_s_mean"] / 60) + " min"]
        if plot_prefix is not None:
            row.append(f"[plot]({plot_prefix}plots/{name}.png)")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def render_report(results: dict[str, Any], with_plots: bool) -> str:
    m = results["machine"]
    lines = [f"# Benchmark sweep `{results['sweep']}` ({results['mode']})", "",
             f"- date: {results['date']}, commit `{results['git_commit']}`",
             f"- machine: {m['platform']}, {m['processor']}, {m['cpu_count']} CPUs, Python {m['python']}",
             "- command(s):", *[f"  - `{c}`" for c in results["commands"]], "",
             "## Results", "", *preset_table(results, "" if with_plots else None), ""]
    for name, p in results["presets"].items():
        seeds = [f"seed {r['seed']}: {_num(r['summary']['eval_mean']) if r['status'] == 'ok' else 'failed'}"
                 + (" (resumed)" if r.get("resumed") else "") for r in results["runs"] if r["preset"] == name]
        lines += [f"### {name}", "", f"- target: {p['target']['text'] or 'none (report only)'} — {_target(p['target'])}",
                  f"- ours: {_score(p['eval_mean'])} (IQM {_iqm(p['eval_mean'])}); {', '.join(seeds)}",
                  f"- peak memory: {_num(p['peak_rss_mb_max'], 0)} MB"]
        if p["dataset"]:
            lines.append(f"- dataset: {p['dataset']}")
        for ref in p["references"]:
            note = f" ({ref['note']})" if ref["note"] else ""
            lines.append(f"- reference: {ref['name']}: {ref['score']}{note}; source: {ref['source']}")
        lines.append("")
    failed = [r for r in results["runs"] if r["status"] != "ok"]
    if failed:
        lines += ["## Failed runs", ""]
        for r in failed:
            resumed = " (resumed)" if r.get("resumed") else ""
            lines += [f"### {r['preset']} seed{r['seed']}{resumed}: {r['reason']}", "", "```", r["log_tail"], "```", ""]
    lines += ["## Statistics", "", results["statistics"], "",
              "Mean ± std: over seeds, population std (ddof=0). Scores are each run's final "
              "`eval_mean` from summary.json.", ""]
    return "\n".join(lines)


def plot_preset(name: str, records: list[dict[str, Any]], target: float | None, window: int, path: Path) -> None:
    """Return vs env steps: the mean over seeds of each seed's moving-average training curve,
    min-max shaded, and every evaluation point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    curves = [np.asarray(r["curves"]["train"], dtype=float) for r in records if r["curves"]["train"]]
    if curves:
        end = max(c[-1, 0] for c in curves)
        grid = np.linspace(0, end, PLOT_POINTS)
        rows = []
        for c in curves:
            smooth = np.convolve(c[:, 1], np.ones(window), "valid") / window if len(c) >= window else c[:, 1]
            x = c[len(c) - len(smooth):, 0]
            rows.append(np.where((grid >= x[0]) & (grid <= x[-1]), np.interp(grid, x, smooth), np.nan))
        stack = np.array(rows)
        seen = ~np.all(np.isnan(stack), axis=0)
        ax.plot(grid[seen], np.nanmean(stack[:, seen], axis=0), label=f"training ({window}-episode average)")
        ax.fill_between(grid[seen], np.nanmin(stack[:, seen], axis=0), np.nanmax(stack[:, seen], axis=0), alpha=0.25,
                        label="min-max over seeds")
    for i, r in enumerate(records):
        if r["curves"]["eval"]:
            steps, values = zip(*r["curves"]["eval"])
            ax.scatter(steps, values, s=12, color="black", label="evaluation" if i == 0 else None, zorder=3)
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", label="target")
    ax.set(title=f"{name} ({len(records)} seeds)", xlabel="environment steps", ylabel="episodic return")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report_sweep(sweep_dir: Path, presets: dict[str, Preset], out_dir: Path, with_plots: bool) -> dict[str, Any]:
    """Aggregate a sweep's run records into `out_dir` (results.json, report.md, plots/)."""
    records = load_records(sweep_dir)
    results = build_results(sweep_dir.name, json.loads((sweep_dir / "sweep.json").read_text()), presets, records)
    if with_plots:
        for name in results["presets"]:
            preset = presets[name]
            plot_preset(name, [r for r in records if r["preset"] == name],
                        preset.target.threshold if preset.target else None, preset.curve_window,
                        out_dir / "plots" / f"{name}.png")
    write_json(out_dir / "results.json", results)
    write_atomic(out_dir / "report.md", render_report(results, with_plots))
    return results


def update_readme(readme: Path, results_dir: Path) -> None:
    """Rewrite the block between the results markers from the sweep `results/latest` names."""
    latest = results_dir / "latest"
    if not latest.exists():
        raise ZooError(f"no {latest}: run a full sweep first (python -m benchmark full)")
    sweep_dir = results_dir / json.loads(latest.read_text())["sweep"]
    results = json.loads((sweep_dir / "results.json").read_text())
    text = readme.read_text() if readme.exists() else ""
    if text.count(README_START) != 1 or text.count(README_END) != 1 or text.index(README_START) > text.index(README_END):
        raise ZooError(f"{readme} needs one '{README_START}' line followed by one '{README_END}' line")
    m = results["machine"]
    prefix = os.path.relpath(sweep_dir, readme.parent).replace(os.sep, "/") + "/"
    block = [README_START, "<!-- generated by `python -m benchmark readme` from results/latest; do not edit -->", "",
             f"Sweep `{results['sweep']}`, {results['date'][:10]}, commit `{(results['git_commit'] or '?')[:10]}`, "
             f"on {m['platform']} ({m['cpu_count']} CPUs). Command:", "",
             *[f"    {c}" for c in results["commands"]], "",
             *preset_table(results, prefix), "",
             f"Full report: [{prefix}report.md]({prefix}report.md).", README_END]
    head, rest = text.split(README_START)
    tail = rest.split(README_END, 1)[1]
    write_atomic(readme, head + "\n".join(block) + tail)
