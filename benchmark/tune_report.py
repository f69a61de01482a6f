"""The validation of a study's best trials, and what `python -m benchmark tune` leaves in
results/tune-<name>/.

Validation: the best trial's flags (and the next best, with `--top-k`) run at each preset's full
budget on seeds from VALIDATION_SEED0, which no trial uses, beside the presets' defaults on the
same seeds, one set after another (each a sweep folder of its own under
<runs-dir>/tune-<name>/validation/), and each tuned set is compared with the defaults as
`compare` compares two sweeps: the rank test per preset with Holm's correction; with k tuned
sets, each comparison at level / k (Bonferroni across the sets). The verdict says whether the
set beats the defaults, ties or loses.

Outputs: `trials.csv` (every trial, its
flags, value, state and why it was pruned or failed), `best.toml` (the best trial's arguments as
preset tables to paste into the zoo), `report.md` (the study, the best trials, and the validation
against the defaults with its verdict and intervals) and `plots/` (the optimisation history, the
parameter importances and the validation scores per seed), drawn with optuna's matplotlib
visualisation."""

from __future__ import annotations

import csv
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .aggregate import FAMILY_LEVEL, iqm_ci, score_stats, smallest_p_value
from .backends import Callbacks
from .compare import Comparison, compare
from .progress import Progress
from .report import _figure, _interval, _save, collect
from .runner import finished_ok, open_sweep, write_atomic
from .tune_search import Backend
from .tune_space import VALIDATION_SEED0, StudyDef, params_of, tuned

TOP_TRIALS = 10  # trials listed in report.md (all of them are in trials.csv)


def state(trial: FrozenTrial) -> str:
    return "interrupted" if "interrupted" in trial.user_attrs else trial.state.name.lower()


def trials_csv(study: StudyDef, trials: list[FrozenTrial]) -> str:
    flags = list(study.searched)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        ["trial", "state", "value", *flags, "reason", "last_step", "started", "duration_s"]
        + ["worker", "runs", "scores"]
    )
    for t in trials:
        took = t.duration.total_seconds() if t.duration else None
        writer.writerow(
            [
                t.number,
                state(t),
                "" if t.value is None else f"{t.value:.6g}",
                *(t.params.get(flag, "") for flag in flags),
                t.user_attrs.get("reason", ""),
                "" if t.last_step is None else t.last_step,
                t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else "",
                "" if took is None else f"{took:.1f}",
                t.user_attrs.get("worker", ""),
                t.user_attrs.get("runs", ""),
                json.dumps(t.user_attrs["scores"]) if "scores" in t.user_attrs else "",
            ]
        )
    return out.getvalue()


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return json.dumps(str(value))  # a TOML basic string


def toml_table(args: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{flag} = {toml_value(v)}" for flag, v in args.items()) + " }"


def objective_text(study: StudyDef) -> str:
    steps = ", ".join(
        f"{study.steps[p.name]:,}" + (f" ({p.name})" if study.anchors else "")
        for p in study.presets
    )
    text = (
        f"the IQM of the final evaluation (summary.json's eval_mean) over a trial's seeds "
        f"1-{study.seeds} at {steps} steps"
    )
    if study.anchors:
        anchors = "; ".join(
            f"{n}: random {r:g}, reference {f:g}" for n, (r, f) in study.anchors.items()
        )
        text += f", each score normalised as (score - random) / (reference - random) ({anchors})"
    return text


def best_toml(study: StudyDef, trial: FrozenTrial, said: str, command: str) -> str:
    """Preset tables with the best trial's arguments over each preset's own."""
    lines = [
        f"# Tuning study '{study.name}', trial {trial.number}: objective {trial.value:.6g} "
        f"({objective_text(study)}).",
        f"# Validation: {said}.",
        f"# Made by: {command}",
        "# Each args line holds the preset's own arguments with the tuned ones: paste it over the",
        "# preset's args in zoo/ (a [<preset>.full] line lists the budget's without the tuned flags).",
    ]
    for preset in study.presets:
        new = tuned(preset, params_of(study, trial))
        lines += ["", f"[{preset.name}]", f"args = {toml_table(new.args)}"]
        if new.full.args != preset.full.args:
            lines += ["", f"[{preset.name}.full]", f"args = {toml_table(new.full.args)}"]
    return "\n".join(lines) + "\n"


def _scores(sweep: dict[str, Any]) -> dict[str, list[float]]:
    scores: dict[str, list[float]] = {}
    for r in sweep["records"]:
        if r["status"] == "ok":
            scores.setdefault(r["preset"], []).append(r["summary"]["eval_mean"])
    return scores


def _iqm_text(scores: list[float]) -> str:
    stats = score_stats(scores)
    return _interval(stats["iqm"], stats["iqm_ci95"])


def validation_lines(
    study: StudyDef, defaults: dict[str, Any], validations: list[Validation]
) -> list[str]:
    base = _scores(defaults)
    seeds = sorted({r["seed"] for r in defaults["records"]})
    lines = [
        "## Validation",
        "",
        f"The defaults and the best {len(validations)} tuned set(s), each at the presets' full "
        f"budget on seeds {seeds[0]}-{seeds[-1]} (validation seeds start at {VALIDATION_SEED0}; "
        f"no trial used them: trials ran seeds 1-{study.seeds}). Each tuned set is compared with "
        "the defaults as `python -m benchmark compare` compares two sweeps: the rank test per "
        "preset with Holm's correction across the presets"
        + (
            f", each of the {len(validations)} comparisons at level "
            f"{FAMILY_LEVEL:g} / {len(validations)} (Bonferroni across the tuned sets)."
            if len(validations) > 1
            else "."
        ),
        "",
    ]
    for v in validations:
        mine = _scores(collect(v.folder))
        parts = [
            f"{name}: IQM {_iqm_text(mine.get(name, []))} against {_iqm_text(base.get(name, []))} "
            "for the defaults"
            for name in (p.name for p in study.presets)
        ]
        lines += [
            f"**Trial {v.trial.number}: {v.verdict}.** " + "; ".join(parts) + " (95% CI).",
            "",
        ]
        if study.anchors:
            pooled = []
            for scores in (mine, base):
                tasks = [[study.score(n, s) for s in scores.get(n, [])] for n in study.anchors]
                flat = [s for task in tasks for s in task]
                ci = iqm_ci(*tasks) if all(tasks) else None
                pooled.append(_interval(score_stats(flat)["iqm"], list(ci) if ci else None, 3))
            lines += [
                f"Normalised IQM over the presets: {pooled[0]} against {pooled[1]} for the defaults "
                "(95% stratified bootstrap interval).",
                "",
            ]
        lines += [
            ("###" + line[1:]) if line.startswith("# ") else line for line in v.comparison.lines
        ]
        lines.append("")
    return lines


def report_md(
    study: StudyDef,
    trials: list[FrozenTrial],
    options: dict[str, Any],
    defaults: dict[str, Any] | None,
    validations: list[Validation],
    plots: list[str],
) -> str:
    states = [state(t) for t in trials]
    complete = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: -t.value)
    flags = list(study.searched)
    lines = [
        f"# Tuning study `{study.name}`",
        "",
        *(f"- Command: `{c}`" for c in options["commands"]),
        "- Presets: " + ", ".join(f"`{p.name}` ({p.algo} on {p.env_id})" for p in study.presets),
        f"- Objective: {objective_text(study)}.",
        f"- Trials: {len(trials)}: {states.count('complete')} complete, "
        f"{states.count('pruned')} pruned, {states.count('fail')} failed, "
        f"{states.count('interrupted')} interrupted (not counted). Sampler: {options['sampler']}; "
        f"pruner: {options['pruner']}.",
        f"- Storage: `{options['storage']}`; runs in `{options['runs']}`.",
        "",
        "## Search space",
        "",
        "| flag | searched as |",
        "|---|---|",
        *(f"| `--{flag}` | {p.describe()} |" for flag, p in study.space.items()),
        "",
        f"## Best trials (of {len(complete)} complete; every trial: trials.csv)",
        "",
        "| trial | value | " + " | ".join(f"`{f}`" for f in flags) + " |",
        "|---|---|" + "---|" * len(flags),
        *(
            f"| {t.number} | {t.value:.4g} | "
            + " | ".join(_cell(t.params.get(f)) for f in flags)
            + " |"
            for t in complete[:TOP_TRIALS]
        ),
        "",
        "A trial's value is measured on the seeds every trial shares, so the best of many is an "
        "optimistic pick; the validation below, on fresh seeds, is the evidence.",
        "",
    ]
    if defaults is not None and validations:
        lines += validation_lines(study, defaults, validations)
    else:
        lines += ["## Validation", "", options["unvalidated"], ""]
    lines += ["## Plots", "", *(f"![{name}](plots/{name}.png)" for name in plots), ""]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def plot_study(
    optuna_study: optuna.Study,
    study: StudyDef,
    defaults: dict[str, Any] | None,
    validations: list[Validation],
    folder: Path,
) -> list[str]:
    """The plots that can be drawn (importances need two complete trials); their names."""
    plt, fig, _ = _figure()  # selects the Agg backend before optuna imports pyplot
    plt.close(fig)
    from optuna.visualization import matplotlib as vis

    made = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks its matplotlib plots experimental
        for name, draw in (
            ("history", vis.plot_optimization_history),
            ("importances", vis.plot_param_importances),
        ):
            try:
                ax = draw(optuna_study)
            except (ValueError, RuntimeError):  # too few complete trials
                continue
            _save(plt, ax.figure, folder / f"{name}.png")
            made.append(name)
    if defaults is not None and validations:
        sets = [("defaults", _scores(defaults))] + [
            (f"trial {v.trial.number}", _scores(collect(v.folder))) for v in validations
        ]
        plt, fig, axes = _figure(len(study.presets))
        for ax, preset in zip(axes[0], study.presets):
            for x, (label, scores) in enumerate(sets):
                values = scores.get(preset.name, [])
                ax.scatter([x] * len(values), values, color=f"C{x}", alpha=0.7)
                if values:
                    centre = score_stats(values)["iqm"]
                    ax.plot([x - 0.25, x + 0.25], [centre, centre], color=f"C{x}")
            ax.set_xticks(range(len(sets)), [label for label, _ in sets])
            ax.set_title(f"{preset.name}: final eval per validation seed (line: IQM)")
        _save(plt, fig, folder / "validation.png")
        made.append("validation")
    return made


def write_outputs(
    out: Path,
    optuna_study: optuna.Study,
    study: StudyDef,
    options: dict[str, Any],
    defaults: dict[str, Any] | None,
    validations: list[Validation],
) -> None:
    trials = optuna_study.get_trials(deepcopy=False)
    write_atomic(out / "trials.csv", trials_csv(study, trials))
    plots = plot_study(optuna_study, study, defaults, validations, out / "plots")
    write_atomic(out / "report.md", report_md(study, trials, options, defaults, validations, plots))
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
        best = max(complete, key=lambda t: t.value)
        said = validations[0].verdict if validations else options["unvalidated"].rstrip(".")
        write_atomic(out / "best.toml", best_toml(study, best, said, options["commands"][-1]))


@dataclass
class Validation:
    """One tuned set beside the defaults on the validation seeds."""

    trial: FrozenTrial
    folder: Path
    comparison: Comparison
    verdict: str


def verdict(result: Comparison, smallest_p: float) -> str:
    """Whether the tuned set (B) beats the defaults (A), ties or loses, in words; `smallest_p`:
    the smallest p-value the seed counts allow, below which no verdict can be reached."""
    level = f"family-wise level {result.level:g}"
    if not result.compared or smallest_p > result.level / result.compared:
        return (
            f"no verdict: at these seeds the rank test cannot reach {level} over "
            f"{max(1, result.compared)} preset(s) (run more --validation-seeds)"
        )
    if result.better and result.worse:
        return (
            f"mixed: beats the defaults on {', '.join(result.better)} and loses on "
            f"{', '.join(result.worse)} ({level})"
        )
    if result.better:
        return f"beats the defaults on {', '.join(result.better)} ({level})"
    if result.worse:
        return f"loses to the defaults on {', '.join(result.worse)} ({level})"
    return (
        f"ties with the defaults: no difference reaches {level} on the {result.compared} compared"
    )


def judge(
    defaults: dict[str, Any], tuned_set: dict[str, Any], level: float
) -> tuple[str, Comparison]:
    """Compare a tuned set's validation sweep with the defaults' (as `collect` or `load_sweep`
    give them), as `compare` does, and say what it found."""
    result = compare(defaults, tuned_set, level)
    a, b = _scores(defaults), _scores(tuned_set)
    smallest = min((smallest_p_value(len(b[n]), len(a[n])) for n in a if n in b), default=1.0)
    return verdict(result, smallest), result


def validate(
    study: StudyDef,
    best: list[FrozenTrial],
    seeds: int | None,
    backend: Backend,
    options: dict[str, Any],
) -> tuple[Path, list[Validation]]:
    """Run the defaults and each of `best` at the full budget on the validation seeds (one set
    after another: a run is named by its preset and seed, as in a sweep), skipping runs that
    finished before, and compare each tuned set with the defaults at level / len(best)."""
    root = study.folder / "validation"
    sets = [(root / "defaults", {})] + [
        (root / f"trial{t.number:04d}", params_of(study, t)) for t in best
    ]
    for folder, params in sets:
        jobs = study.validation_jobs(params, folder, options["timeout_scale"], seeds)
        first, last = min(j.seed for j in jobs), max(j.seed for j in jobs)
        open_sweep(
            folder,
            "full",
            {"validation_seeds": [first, last]},
            options["command"],
            [tuned(p, params) for p in study.presets],
        )
        todo = [job for job in jobs if not finished_ok(job)]
        print(
            f"validation of {folder.name}: {len(jobs)} runs, {len(jobs) - len(todo)} already finished",
            flush=True,
        )
        with Progress(todo, len(jobs) - len(todo), backend.cpus, options["interval_s"]) as progress:
            backend.run(todo, Callbacks(progress.started, progress.progressed, progress.finished))
    defaults = collect(root / "defaults")
    level = options["level"] / max(1, len(best))
    out = []
    for (folder, _), trial in zip(sets[1:], best):
        text, comparison = judge(defaults, collect(folder), level)
        out.append(Validation(trial, folder, comparison, text))
    return root / "defaults", out
