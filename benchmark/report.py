"""A sweep's results: `results.json`, `curves.json`, `manifest.json`, `report.md`, plots, the README block.

Everything is computed from the run records and the sweep's own copy of its manifest, so a
committed results folder can be reported again (`python -m benchmark report`) on any clone,
after targets were edited or algorithm files renamed: `results.json` holds the records without
their curves, `curves.json` the curves, `manifest.json` the presets' tables as the sweep ran them.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from . import aggregate
from .equivalence import equivalence_line
from .manifest import Preset, ZooError, is_number, presets_from_tables
from .provenance import git
from .runner import MANIFEST_NAME, load_records, write_atomic, write_json

README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"
PLOT_POINTS = 200
CURVES_NAME = "curves.json"


def collect(sweep_dir: Path) -> dict[str, Any]:
    """A sweep as its raw run folders hold it."""
    manifest = sweep_dir / MANIFEST_NAME
    if not (sweep_dir / "sweep.json").exists() or not manifest.exists():
        raise ZooError(f"{sweep_dir} holds no sweep (sweep.json and {MANIFEST_NAME})")
    return {
        "meta": {"sweep": sweep_dir.name, **json.loads((sweep_dir / "sweep.json").read_text())},
        "manifest": json.loads(manifest.read_text()),
        "records": load_records(sweep_dir),
    }


def load_committed(out_dir: Path) -> dict[str, Any]:
    """A sweep as its results folder holds it (results.json, curves.json, manifest.json)."""
    try:
        results = json.loads((out_dir / "results.json").read_text())
        curves = json.loads((out_dir / CURVES_NAME).read_text())
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
    except FileNotFoundError as e:
        raise ZooError(f"{out_dir} is not a results folder: no {Path(e.filename).name}") from None
    empty = {"train": [], "eval": []}
    records = [
        r | {"curves": curves.get(f"{r['preset']}/seed{r['seed']}", empty)} for r in results["runs"]
    ]
    meta = {k: results[k] for k in ("sweep", "mode", "budget", "commands")}
    return {"meta": meta, "manifest": manifest, "records": records}


def with_committed(sweep: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """`sweep` (its raw runs, from `collect`) joined with what its results folder `out_dir`
    already holds, so that reporting never shrinks a committed sweep (a clone without the raw
    runs, a sweep filtered to some presets): a run of the raw sweep replaces the committed run of
    the same preset and seed; the committed runs of a preset the raw sweep ran with another
    definition are dropped; every other committed run stays, with its own provenance."""
    if not (out_dir / "results.json").exists():
        return sweep
    committed = load_committed(out_dir)
    old, new = committed["meta"], sweep["meta"]
    if (old["mode"], old["budget"]) != (new["mode"], new["budget"]):
        raise ZooError(
            f"sweep '{out_dir.name}' was run as {old['mode']} with budget {old['budget']} (its "
            f"committed results: {out_dir}), not {new['mode']} with {new['budget']}; choose "
            "another --name"
        )
    ran = {(r["preset"], r["seed"]) for r in sweep["records"]}
    redefined = {
        name
        for name, table in sweep["manifest"].items()
        if name in committed["manifest"]
        and any(r["preset"] == name for r in sweep["records"])
        and definition(committed["manifest"][name]) != definition(table)
    }
    kept = [
        r
        for r in committed["records"]
        if (r["preset"], r["seed"]) not in ran and r["preset"] not in redefined
    ]
    names = {r["preset"] for r in kept}
    manifest = {
        name: table
        for name, table in {**committed["manifest"], **sweep["manifest"]}.items()
        if name in names or name in sweep["manifest"]
    }
    for name in names - redefined:  # a kept run is judged by the table it ran under
        if not any(r["preset"] == name for r in sweep["records"]):
            manifest[name] = committed["manifest"][name]
    records = sorted(kept + sweep["records"], key=lambda r: (r["preset"], r["seed"]))
    commands = list(dict.fromkeys([*old["commands"], *new["commands"]]))
    return {"meta": {**new, "commands": commands}, "manifest": manifest, "records": records}


def _measured(records: list[dict[str, Any]], key: str) -> list[float]:
    """Each run's `key`: the runner's measurement (wall time, peak memory), else the run's own
    summary.json's (sps; records written before the runner measured memory kept it there)."""
    values = [r[key] if r.get(key) is not None else r["summary"].get(key) for r in records]
    return [v for v in values if isinstance(v, (int, float))]


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = _measured(records, key)
    return float(np.mean(values)) if values else None


def _sample_efficiency(preset: Preset, ok: list[dict[str, Any]]) -> dict[str, Any]:
    curves = [r["curves"]["eval"] for r in ok]
    stored = bool(curves) and all(curves)
    curve = aggregate.eval_iqm_curve(curves) if stored else []
    threshold = preset.curve_threshold
    return {
        "threshold": threshold,
        "curves_stored": stored,
        "eval_iqm_curve": curve,
        "eval_from_step": aggregate.stays_above_step(curve, threshold)
        if threshold is not None
        else None,
    }


def _normalised(preset: Preset, scores: list[float]) -> dict[str, Any] | None:
    norm = preset.normalise
    if norm is None:
        return None
    values = [aggregate.normalise(s, norm.random, norm.reference) for s in scores]
    return {
        **norm.__dict__,
        "scores": values,
        **{k: v for k, v in aggregate.score_stats(values).items() if k in ("iqm", "iqm_ci95")},
    }


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
    metric = preset.target.metric if preset.target else "eval_mean"
    by_seed = [aggregate.run_metric(r, metric) if r["status"] == "ok" else None for r in records]
    hold = preset.target.hold if preset.target else None
    held = (
        [aggregate.holds(r, hold) if r["status"] == "ok" else None for r in records]
        if hold
        else None
    )
    crossings = [r["crossing_step"] for r in records]
    return {
        "algo": preset.algo,
        "env_id": preset.env_id,
        "group": preset.group,
        "total_steps": steps,
        "full_total_steps": preset.full.total_steps,
        "reduced_budget": reduced,
        "seeds": [r["seed"] for r in records],
        "failed_seeds": [
            {"seed": r["seed"], "reason": r["reason"]} for r in records if r["status"] != "ok"
        ],
        "eval_mean": aggregate.score_stats(scores),
        "target": aggregate.check_target(preset.target, by_seed, why, held)
        | {"provisional": preset.provisional},
        "references": [ref.__dict__ for ref in preset.references],
        "sample_efficiency": _sample_efficiency(preset, ok),
        "train_crossing": {
            "threshold": preset.curve_threshold,
            "window": preset.curve_window,
            "steps": crossings,
        },
        "normalised": _normalised(preset, scores),
        "sps_mean": _mean(ok, "sps"),
        "wall_time_s_mean": _mean(ok, "wall_time_s"),
        "peak_rss_mb_max": max(_measured(ok, "peak_rss_mb"), default=None),
        # How many finished runs the two above are over: a run resumed from an attempt that could
        # not note its wall time or memory has none.
        "measured_runs": {key: len(_measured(ok, key)) for key in ("wall_time_s", "peak_rss_mb")},
        "finished_runs": len(ok),
        "dataset": preset.dataset.command(preset.env_id) if preset.dataset else None,
    }


def normalised_aggregates(presets: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per algorithm and normaliser: the IQM of the normalised scores pooled over its presets
    (tasks), with the interval of a bootstrap stratified by preset. Only presets with a target
    are pooled: a report-only preset is an ablation or a baseline, not the algorithm as
    benchmarked, and its own section still gives its normalised score."""
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for name, p in presets.items():
        if p["normalised"] and p["normalised"]["scores"] and p["target"]["status"] != "report only":
            groups.setdefault((p["algo"], p["normalised"]["name"]), {})[name] = p["normalised"][
                "scores"
            ]
    out = []
    for (algo, norm), tasks in sorted(groups.items()):
        ci = aggregate.iqm_ci(*tasks.values())
        out.append(
            {
                "algo": algo,
                "normaliser": norm,
                "presets": list(tasks),
                "iqm": aggregate.iqm([s for scores in tasks.values() for s in scores]),
                "iqm_ci95": list(ci) if ci else None,
            }
        )
    return out


def _shown(value: Any) -> str:
    return "unknown" if value is None else str(value)


def provenance_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The distinct values of each provenance field over a sweep's runs ("unknown" where a run
    did not record one; the code and host of a resumed run's earlier attempts included), and the
    distinct notes."""
    fields: dict[str, set[str]] = {}
    for r in records:
        prov = r["provenance"]
        flat = {
            "commit": prov.get("commit"),
            "dirty": prov.get("dirty"),
            "host": prov.get("host"),
            "device": prov.get("device"),
            **(prov.get("versions") or {}),
        }
        for key, value in flat.items():
            fields.setdefault(key, set()).add(_shown(value))
        if "earlier_attempts" in prov:
            for attempt in prov["earlier_attempts"] or [{}]:  # None: not known
                for key in ("commit", "dirty", "host"):
                    fields[key].add(_shown(attempt.get(key)))
        if prov.get("note"):
            fields.setdefault("notes", set()).add(prov["note"])
    return {key: sorted(values) for key, values in fields.items()}


def build_results(sweep: dict[str, Any], presets: dict[str, Preset]) -> dict[str, Any]:
    meta, records = sweep["meta"], [r for r in sweep["records"] if r["preset"] in presets]
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_preset.setdefault(record["preset"], []).append(record)
    summaries = {
        name: summarize_preset(presets[name], by_preset[name], meta["mode"])
        for name in presets
        if name in by_preset
    }
    groups: dict[str, list[str]] = {}
    for name, p in summaries.items():
        if p["group"]:
            groups.setdefault(p["group"], []).append(name)
    return {
        "sweep": meta["sweep"],
        "mode": meta["mode"],
        "budget": meta["budget"],
        "commands": list(dict.fromkeys(meta["commands"])),  # each resumption appends its own
        "reported": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "provenance": provenance_summary(records),
        "statistics": aggregate.__doc__.split("Definitions (stated in every report):")[1].strip(),
        "presets": summaries,
        "groups": {g: names for g, names in groups.items() if len(names) > 1},
        "normalised": normalised_aggregates(summaries),
        "runs": [{k: v for k, v in r.items() if k != "curves"} for r in records],
    }


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "—"
    text = f"{value:,.{digits}f}"
    # A value that rounds to zero reads "0.0", not "-0.0".
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text


def _of_runs(p: dict[str, Any], key: str) -> str:
    """' (k of n runs)' where only k of a preset's n finished runs have the measurement `key`."""
    measured, finished = p["measured_runs"][key], p["finished_runs"]
    return "" if measured in (0, finished) else f" ({measured} of {finished} runs)"


def _wall_time(p: dict[str, Any]) -> str:
    mean = p["wall_time_s_mean"]
    if mean is None:
        return "unknown" if p["finished_runs"] else "—"
    return f"{mean / 60:,.1f} min" + _of_runs(p, "wall_time_s")


def _score(stats: dict[str, Any]) -> str:
    if not stats["n"]:
        return "—"
    std = "n/a" if stats["std"] is None else _num(stats["std"])  # one seed: no spread to show
    return f"{_num(stats['mean'])} ± {std}"


def _interval(value: float | None, ci: list[float] | None, digits: int = 1) -> str:
    if value is None:
        return "—"
    return (
        f"{_num(value, digits)} [{_num(ci[0], digits)}, {_num(ci[1], digits)}]"
        if ci
        else f"{_num(value, digits)} [n/a]"
    )


def _seeds(p: dict[str, Any]) -> str:
    n, failed = len(p["seeds"]), len(p["failed_seeds"])
    return f"{n - failed} of {n} ({failed} failed)" if failed else str(n)


def _target(target: dict[str, Any]) -> str:
    status = target["status"]
    if status in ("met", "missed"):
        seeds = f"{target['passed_seeds']}/{target['of']} seeds"
        # A floor on the mean or the IQM can fail whatever the seeds did: name it first, so that
        # such a miss does not read as "missed (5/5 seeds)".
        failed = [
            f"{label} {_num(target[key], 1)} < {_num(target[floor], 1)}"
            for label, key, floor in (("mean", "mean", "mean_min"), ("IQM", "iqm", "iqm_min"))
            if target.get(floor) is not None
            and (target[key] is None or target[key] < target[floor])
        ]
        status = (
            f"**{status}**: {', '.join(failed)}; {seeds} pass"
            if failed
            else f"**{status}** ({seeds})"
        )
    elif status == "not applicable":
        status = f"not applicable: {target['why']}"
    return status + (" (provisional)" if target.get("provisional") and target["text"] else "")


def _efficiency(eff: dict[str, Any]) -> str:
    if eff["threshold"] is None:
        return "—"
    if not eff["curves_stored"]:
        return "n/a (no curves stored)"
    step = eff["eval_from_step"]
    return (
        f"≥ {eff['threshold']:g} from {step:,}"
        if step is not None
        else f"≥ {eff['threshold']:g}: never"
    )


def _plot_link(out_dir: Path | None, name: str, prefix: str) -> str:
    return (
        f"[plot]({prefix}plots/{name}.png)"
        if out_dir and (out_dir / "plots" / f"{name}.png").exists()
        else "—"
    )


def preset_table(results: dict[str, Any], plots: Path | None, prefix: str = "") -> list[str]:
    """The per-preset Markdown table shared by the report and the README block; `plots`: the
    results folder whose plots/ to link (with `prefix` before the link), or None for no column."""
    lines = [
        f"| preset | env | steps | seeds | eval mean ± std | IQM [95% CI, {aggregate.PRESET_CI_METHOD}] "
        "| target | eval IQM (sample efficiency) | SPS | wall time |"
        + (" plot |" if plots is not None else ""),
        "|---" * (10 + (plots is not None)) + "|",
    ]
    for name, p in results["presets"].items():
        stats = p["eval_mean"]
        row = [
            name,
            p["env_id"],
            "/".join(f"{s:,}" for s in p["total_steps"]),
            _seeds(p),
            _score(stats),
            _interval(stats["iqm"], stats["iqm_ci95"]),
            _target(p["target"]),
            _efficiency(p["sample_efficiency"]),
            _num(p["sps_mean"], 0),
            _wall_time(p),
        ]
        if plots is not None:
            row.append(_plot_link(plots, name, prefix))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def provenance_line(prov: dict[str, list[str]]) -> str:
    def one(key: str) -> str:
        values = prov.get(key, ["unknown"])
        return ", ".join(f"`{v[:10]}`" if key == "commit" and v != "unknown" else v for v in values)

    versions = "; ".join(f"{lib} {one(lib)}" for lib in ("torch", "gymnasium", "ale-py"))
    notes = "".join(f" ({note})" for note in prov.get("notes", []))
    return (
        f"runs at commit(s) {one('commit')} (dirty: {one('dirty')}), on {one('host')}, device(s) {one('device')}; "
        f"{versions}{notes}"
    )


def _seed_text(r: dict[str, Any]) -> str:
    score = (
        _num(r["summary"]["eval_mean"]) if r["status"] == "ok" else f"**failed** ({r['reason']})"
    )
    return f"seed {r['seed']}: {score}" + (" (resumed)" if r.get("resumed") else "")


def _preset_section(
    name: str, p: dict[str, Any], runs: list[dict[str, Any]], plots: Path | None
) -> list[str]:
    cross = p["train_crossing"]
    lines = [
        f"### {name}",
        "",
        f"- target: {p['target']['text'] or 'none (report only)'} — {_target(p['target'])}",
        f"- ours: {_score(p['eval_mean'])} (IQM [95% CI, {aggregate.PRESET_CI_METHOD}] "
        f"{_interval(p['eval_mean']['iqm'], p['eval_mean']['iqm_ci95'])}); "
        + ", ".join(_seed_text(r) for r in runs),
        f"- sample efficiency: evaluation IQM across seeds {_efficiency(p['sample_efficiency'])}",
    ]
    if cross["threshold"] is not None:
        steps = ", ".join(f"{s:,}" if s is not None else "never" for s in cross["steps"])
        lines.append(
            f"- training {cross['window']}-episode average (exploration included) first ≥ "
            f"{cross['threshold']:g} at: {steps}"
        )
    if p["normalised"]:
        n = p["normalised"]
        lines.append(
            f"- {n['name']}-normalised: IQM [95% CI, {aggregate.PRESET_CI_METHOD}] "
            f"{_interval(n['iqm'], n['iqm_ci95'], 3)} "
            f"(random {n['random']:g}, {n['name']} {n['reference']:g}; {n['source']})"
        )
    memory = p["peak_rss_mb_max"]
    lines.append(
        "- peak memory: "
        + ("unknown" if memory is None else f"{_num(memory, 0)} MB")
        + _of_runs(p, "peak_rss_mb")
    )
    if p["dataset"]:
        lines.append(f"- dataset: {p['dataset']}")
    for ref in p["references"]:
        note = f" ({ref['note']})" if ref["note"] else ""
        lines.append(f"- reference: {ref['name']}: {ref['score']}{note}; source: {ref['source']}")
    return lines + [""]


def render_report(results: dict[str, Any], plots: Path | None) -> str:
    lines = [
        f"# Benchmark sweep `{results['sweep']}` ({results['mode']})",
        "",
        f"- {provenance_line(results['provenance'])}",
        f"- reported {results['reported']}; per-run provenance in the table at the end",
        "- command(s):",
        *[f"  - `{c}`" for c in results["commands"]],
        "",
        "## Results",
        "",
        *preset_table(results, plots),
        "",
    ]
    if results["groups"]:
        lines += ["## Comparison groups", ""]
        for group, names in results["groups"].items():
            lines.append(
                f"- {group}: {', '.join(names)} — {_plot_link(plots, f'group-{group}', '')}"
            )
        lines.append("")
    if results["normalised"]:
        lines += [
            "## Normalised scores",
            "",
            f"| algorithm | normalised by | presets | IQM [95% CI, {aggregate.POOLED_CI_METHOD}] |",
            "|---|---|---|---|",
        ]
        for agg in results["normalised"]:
            lines.append(
                f"| {agg['algo']} | {agg['normaliser']} | {', '.join(agg['presets'])} | "
                f"{_interval(agg['iqm'], agg['iqm_ci95'], 3)} |"
            )
        lines.append("")
    for name, p in results["presets"].items():
        lines += _preset_section(
            name, p, [r for r in results["runs"] if r["preset"] == name], plots
        )
    failed = [r for r in results["runs"] if r["status"] != "ok"]
    if failed:
        lines += ["## Failed runs", ""]
        for r in failed:
            resumed = " (resumed)" if r.get("resumed") else ""
            lines += [
                f"### {r['preset']} seed{r['seed']}{resumed}: {r['reason']}",
                "",
                "```",
                r["log_tail"],
                "```",
                "",
            ]
    lines += [
        "## Provenance",
        "",
        "| run | status | commit | dirty | host | device | torch | gymnasium | ale-py |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        prov = r["provenance"]
        versions = prov.get("versions") or {}
        commit = _shown(prov.get("commit"))[:10]
        if "earlier_attempts" in prov:
            earlier = [_shown(a.get("commit"))[:10] for a in prov["earlier_attempts"] or [{}]]
            commit += f" (resumed from {', '.join(dict.fromkeys(earlier))})"
        cells = [
            f"{r['preset']}/seed{r['seed']}",
            r["status"],
            commit,
            _shown(prov.get("dirty")),
            _shown(prov.get("host")),
            _shown(prov.get("device")),
            *(_shown(versions.get(lib)) for lib in ("torch", "gymnasium", "ale-py")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Statistics",
        "",
        results["statistics"],
        "",
        "Mean ± std: over the finished seeds, sample std (ddof=1; n/a for one seed). Scores are "
        "each run's final `eval_mean` from summary.json.",
        "",
    ]
    return "\n".join(lines)


def _figure(ncols: int = 1) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(1, ncols, figsize=(6 * ncols, 4), squeeze=False)


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _reference_lines(ax: Any, references: list[dict[str, Any]]) -> None:
    for i, ref in enumerate(references):
        if is_number(ref["score"]):
            ax.axhline(
                ref["score"],
                color=f"C{7 + i % 3}",
                linestyle=":",
                label=f"{ref['name']} ({ref['score']:g})",
            )


def plot_preset(
    name: str,
    records: list[dict[str, Any]],
    target: float | None,
    window: int,
    eval_iqm: list[tuple[int, float]],
    path: Path,
) -> None:
    """Return vs env steps: the mean over seeds of each seed's moving-average training curve,
    min-max shaded, every evaluation point, and the evaluation IQM across seeds."""
    plt, fig, axes = _figure()
    ax = axes[0, 0]
    curves = [
        np.asarray(r["curves"]["train"], dtype=float) for r in records if r["curves"]["train"]
    ]
    if curves:
        end = max(c[-1, 0] for c in curves)
        grid = np.linspace(0, end, PLOT_POINTS)
        rows = []
        for c in curves:
            smooth = (
                np.convolve(c[:, 1], np.ones(window), "valid") / window
                if len(c) >= window
                else c[:, 1]
            )
            x = c[len(c) - len(smooth) :, 0]
            rows.append(
                np.where((grid >= x[0]) & (grid <= x[-1]), np.interp(grid, x, smooth), np.nan)
            )
        stack = np.array(rows)
        seen = ~np.all(np.isnan(stack), axis=0)
        ax.plot(
            grid[seen],
            np.nanmean(stack[:, seen], axis=0),
            label=f"training ({window}-episode average)",
        )
        ax.fill_between(
            grid[seen],
            np.nanmin(stack[:, seen], axis=0),
            np.nanmax(stack[:, seen], axis=0),
            alpha=0.25,
            label="min-max over seeds",
        )
    for i, r in enumerate(records):
        if r["curves"]["eval"]:
            steps, values = zip(*r["curves"]["eval"])
            ax.scatter(
                steps, values, s=12, color="black", label="evaluation" if i == 0 else None, zorder=3
            )
    if eval_iqm:
        steps, values = zip(*eval_iqm)
        ax.plot(steps, values, color="black", label="evaluation IQM across seeds", zorder=3)
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", label="target")
    ax.set(
        title=f"{name} ({len(records)} seeds)", xlabel="environment steps", ylabel="episodic return"
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    _save(plt, fig, path)


def plot_group(
    group: str, results: dict[str, Any], records: list[dict[str, Any]], path: Path
) -> None:
    """The presets of one comparison group on one chart: each seed's final evaluation with the
    IQM and its interval and, where curves were stored, the evaluation IQM across seeds against
    env steps; the numeric peer references as dotted lines."""
    names = results["groups"][group]
    curves = {
        name: results["presets"][name]["sample_efficiency"]["eval_iqm_curve"] for name in names
    }
    plt, fig, axes = _figure(2 if any(curves.values()) else 1)
    final_ax = axes[0, 0]
    references: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        p, color = results["presets"][name], f"C{i}"
        if curves[name]:
            steps, values = zip(*curves[name])
            axes[0, 1].plot(steps, values, color=color, marker="o", markersize=3, label=name)
        scores = [
            r["summary"]["eval_mean"]
            for r in records
            if r["preset"] == name and r["status"] == "ok"
        ]
        final_ax.scatter([i] * len(scores), scores, color=color, alpha=0.6, s=18)
        stats = p["eval_mean"]
        if stats["iqm"] is not None:
            low, high = stats["iqm_ci95"] or (stats["iqm"], stats["iqm"])
            final_ax.errorbar(
                [i + 0.15],
                [stats["iqm"]],
                yerr=[[stats["iqm"] - low], [high - stats["iqm"]]],
                fmt="D",
                color=color,
                capsize=4,
                label=f"{name}: IQM"
                + (f" [95% CI, {aggregate.PRESET_CI_METHOD}]" if stats["iqm_ci95"] else ""),
            )
        references.update({ref["name"]: ref for ref in p["references"]})
    final_ax.set(
        title=f"{group}: final evaluation per seed",
        xticks=range(len(names)),
        xticklabels=names,
        ylabel="episodic return",
    )
    if axes.shape[1] == 2:
        axes[0, 1].set(
            title="evaluation IQM across seeds",
            xlabel="environment steps",
            ylabel="episodic return",
        )
    for ax in axes[0]:
        _reference_lines(ax, list(references.values()))
        ax.legend(loc="best", fontsize="small")
    _save(plt, fig, path)


def report_sweep(sweep: dict[str, Any], out_dir: Path, with_plots: bool) -> dict[str, Any]:
    """Aggregate a sweep (from `collect` or `load_committed`) into `out_dir`: results.json,
    curves.json, manifest.json, report.md and, `with_plots`, plots/ (a preset without stored
    curves keeps the plot it has)."""
    presets = presets_from_tables(sweep["manifest"], Path("algos"), check_scripts=False)
    results = build_results(sweep, presets)
    records = [r for r in sweep["records"] if r["preset"] in results["presets"]]
    if with_plots:
        for name in results["presets"]:
            runs = [r for r in records if r["preset"] == name]
            if any(r["curves"]["train"] or r["curves"]["eval"] for r in runs):
                preset = presets[name]
                plot_preset(
                    name,
                    runs,
                    preset.target.threshold if preset.target else None,
                    preset.curve_window,
                    results["presets"][name]["sample_efficiency"]["eval_iqm_curve"],
                    out_dir / "plots" / f"{name}.png",
                )
        for group in results["groups"]:
            plot_group(group, results, records, out_dir / "plots" / f"group-{group}.png")
    write_json(out_dir / "results.json", results)
    write_json(
        out_dir / CURVES_NAME,
        {f"{r['preset']}/seed{r['seed']}": r["curves"] for r in records},
        indent=None,
    )
    write_json(out_dir / MANIFEST_NAME, sweep["manifest"])
    write_atomic(out_dir / "report.md", render_report(results, out_dir if with_plots else None))
    return results


# What makes a preset's numbers what they are: a sweep holds a result "at the preset's current
# definition" when these parts of its copy of the preset equal the zoo's (time limits, memory
# requests, references and notes may change without invalidating a result).
DEFINITION = {
    "algo": None,
    "env_id": None,
    "args": None,
    "full": ("total_steps", "seeds", "args"),
    "target": None,
    "dataset": None,
}


def definition(table: dict[str, Any]) -> dict[str, Any]:
    """The parts of a preset's table that define its result (see DEFINITION), flattened to
    dotted keys."""
    out: dict[str, Any] = {}
    for key, parts in DEFINITION.items():
        value = table.get(key)
        if parts is None:
            out[key] = value
        else:
            for part in parts:
                out[f"{key}.{part}"] = (value or {}).get(part)
    return out


def definition_changes(ran: dict[str, Any] | None, preset: Preset) -> list[str]:
    """The parts of `preset`'s definition that differ from the table a sweep ran it with
    (`ran`, None where the sweep did not run it): [] when the sweep ran this definition."""
    if ran is None:
        return ["not run"]
    old, new = definition(ran), definition(preset.table)
    return [key for key in new if old.get(key) != new[key]]


def current_result(results: dict[str, Any], manifest: dict[str, Any], preset: Preset) -> str | None:
    """Why a sweep holds no result for `preset` at its current definition (None when it does:
    the same definition, the full budget, every seed run)."""
    summary = results["presets"].get(preset.name)
    if summary is None or preset.name not in manifest:
        return f"not in sweep {results['sweep']}"
    changed = definition_changes(manifest[preset.name], preset)
    if changed:
        return f"{results['sweep']} ran another definition ({', '.join(changed)} changed since)"
    if summary["reduced_budget"] or len(summary["seeds"]) < preset.full.seeds:
        return f"{results['sweep']} ran {len(summary['seeds'])} of {preset.full.seeds} seeds"
    return None


def _algos_folder(repo: Path, algos_dir: Path) -> str | None:
    """The algorithm folder relative to the top of `repo`'s git checkout (None outside one)."""
    top = git(repo, "rev-parse", "--show-toplevel")
    return None if top is None else os.path.relpath(algos_dir.resolve(), Path(top).resolve())


def _changed_files(
    repo: Path, commit: str, folder: str | None, algos_dir: Path
) -> tuple[str, list[str]]:
    """Which algorithm files (in `folder`, as `_algos_folder` gives it) differ between `commit`
    and the commit checked out at `repo`: the README's words, and their names."""
    if folder is None:
        return "unknown (not a git checkout)", []
    if git(repo, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        shallow = git(repo, "rev-parse", "--is-shallow-repository") == "true"
        return "unknown (the commit is not in this clone's history" + (
            ": a shallow clone; `git fetch --unshallow` fetches it)" if shallow else ")"
        ), []
    names = git(repo, "diff", "--name-only", commit, "HEAD", "--", folder)
    if names is None:
        return "unknown (git diff failed)", []
    changed = sorted(Path(n).name for n in names.splitlines() if n.endswith(".py"))
    total = len(list(algos_dir.glob("*.py")))
    if not changed:
        return "none", []
    return f"{len(changed)} of {total}: " + ", ".join(f"`{n}`" for n in changed), changed


def _changed_since(repo: Path, commits: list[str], algos_dir: Path, results_dir: Path) -> list[str]:
    """The README header's lines on the algorithm files: per version of them that the sweep ran,
    its commits and the files changed since, and which of those the equivalence reports committed
    in `results_dir` prove to behave as they did. A sweep resumed across commits that changed only
    the tooling ran one version, said in one line."""
    if not commits:
        return ["- algorithm files changed since: unknown (the sweep recorded no commit)"]
    folder = _algos_folder(repo, algos_dir)
    # The git tree id of the algorithm folder at each commit: None where git cannot say.
    trees = {
        c: folder and git(repo, "rev-parse", "--verify", "-q", f"{c}:{folder}") for c in commits
    }
    versions: dict[str, list[str]] = {}
    for c in commits:  # a commit whose tree is unknown stays apart
        versions.setdefault(trees[c] or c, []).append(c)
    lines = []
    if len(versions) > 1 and None not in trees.values():
        lines.append(f"- the runs ran {len(versions)} different versions of the algorithm files")
    for group in versions.values():
        changed, names = _changed_files(repo, group[0], folder, algos_dir)
        if len(group) == 1:
            lines.append(f"- algorithm files changed since commit `{group[0][:10]}`: {changed}")
        elif len(versions) == 1:  # the commits are listed in the line above
            lines.append(
                f"- the runs' {len(group)} commits hold the same algorithm files; changed since: "
                f"{changed}"
            )
        else:
            named = ", ".join(f"`{c[:10]}`" for c in group)
            lines.append(
                f"- commits {named} hold the same algorithm files; changed since: {changed}"
            )
        if names and folder is not None:
            lines.append(equivalence_line(repo, group[0], folder, names, results_dir))
    return lines


def readme_block(
    readme: Path, results_dir: Path, presets: dict[str, Preset], algos_dir: Path
) -> str:
    """The README's results block: every preset of the zoo (`presets`), with the result
    results/latest's sweep holds at the preset's current definition, or "not run at this
    definition"; the sweep's commit, the algorithm files changed since, and which of them the
    equivalence reports committed in `results_dir` prove to behave as the sweep's versions."""
    latest = results_dir / "latest"
    if not latest.exists():
        raise ZooError(f"no {latest}: run a full sweep first (python -m benchmark full)")
    sweep_dir = results_dir / json.loads(latest.read_text())["sweep"]
    sweep = load_committed(sweep_dir)
    ran = presets_from_tables(sweep["manifest"], algos_dir, check_scripts=False)
    results = build_results(sweep, ran)
    why_not = {name: current_result(results, sweep["manifest"], p) for name, p in presets.items()}
    shown = {name: results["presets"][name] for name, why in why_not.items() if why is None}
    prefix = os.path.relpath(sweep_dir, readme.parent).replace(os.sep, "/") + "/"
    table = preset_table({**results, "presets": shown}, sweep_dir, prefix)
    rows = {line.split(" | ", 1)[0][2:]: line for line in table[2:]}
    missing = 0
    for name, preset in presets.items():
        if why_not[name] is not None:
            missing += 1
            cells = [
                name,
                preset.env_id,
                f"{preset.full.total_steps:,}",
                str(preset.full.seeds),
                "**not run at this definition**",
                "—",
                why_not[name],
                "—",
                "—",
                "—",
                "—",
            ]
            rows[name] = "| " + " | ".join(cells) + " |"
    commits = sorted({c for c in results["provenance"].get("commit", []) if c != "unknown"})
    changed = _changed_since(readme.parent, commits, algos_dir, results_dir)
    block = [
        README_START,
        "<!-- generated by `python -m benchmark readme` from results/latest and the zoo; do not edit -->",
        "",
        f"Sweep `{results['sweep']}`: {provenance_line(results['provenance'])}. Command(s):",
        "",
        *[f"    {c}" for c in results["commands"]],
        "",
        *changed,
        f"- {len(presets) - missing} of the zoo's {len(presets)} presets have a result at their "
        "current definition (budget, seeds, arguments, target); "
        + (
            f'the other {missing} read "not run at this definition", with the reason in the '
            "target column."
            if missing
            else "every preset does."
        ),
        "",
        *table[:2],
        *(rows[name] for name in presets),
        "",
        f"Full report: [{prefix}report.md]({prefix}report.md).",
        README_END,
    ]
    return "\n".join(block)


def readme_text(readme: Path, block: str) -> str:
    """README.md's text with its results block replaced by `block`."""
    text = readme.read_text() if readme.exists() else ""
    if (
        text.count(README_START) != 1
        or text.count(README_END) != 1
        or text.index(README_START) > text.index(README_END)
    ):
        raise ZooError(
            f"{readme} needs one '{README_START}' line followed by one '{README_END}' line"
        )
    head, rest = text.split(README_START)
    tail = rest.split(README_END, 1)[1]
    return head + block + tail


def update_readme(
    readme: Path, results_dir: Path, presets: dict[str, Preset], algos_dir: Path
) -> None:
    """Rewrite the block between the results markers (see `readme_block`)."""
    write_atomic(readme, readme_text(readme, readme_block(readme, results_dir, presets, algos_dir)))
