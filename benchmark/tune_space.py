"""The search space of `python -m benchmark tune`, as the zoo declares it, checked before any trial.

A preset's `[<preset>.tune]` table says how a trial runs it (seeds, budget, the scores that
normalise it beside other presets) and which flags to search (`params`); an algorithm's space,
`<zoo>/spaces/<algo>.toml`, holds the flags searched for every preset of that file (adapted from
RL Zoo's samplers, rl_zoo3/hyperparams_opt.py), under which a preset's own `params` are merged (a
flag given in both takes the preset's). A parameter is a range (`{ low, high }`: integers when
both bounds are, `log = true` for a log scale, `step` for a grid), a list of choices
(`{ choices = [...] }`), or a fixed value (a number, string, boolean or list), passed as the
runner passes a preset's `args`. Each flag must be one the algorithm file takes: its `Args`
dataclass, read with `ast` (the file is not imported), or, for a file without one, the flags its
`--help` prints. See zoo/README.md ("Tuning").

A study (StudyDef) searches one set of flags for all its presets: a trial runs each preset with
them on seeds 1..S at the trial budget (default: the full one) and scores the IQM of its runs'
final evaluations; with several presets, each score is first normalised, (score - random) /
(reference - random), and the IQM is over all of them, so that the search aims at flags that do
well on every task (CleanRL's tuner normalises between random and reference scores likewise).
Validation runs start at seed VALIDATION_SEED0, which no trial uses.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .aggregate import eval_iqm_curve, iqm, normalise
from .manifest import RESERVED_FLAGS, ArgValue, Preset, ZooError, is_number, tomllib
from .runner import Job, plan_jobs

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial  # only `tune` needs optuna; sweeps read this module

SPACES_DIR = "spaces"  # beside the zoo's files: <zoo>/spaces/<algo>.toml
TUNE_KEYS = {"seeds", "total_steps", "random", "reference", "algo_space", "params"}
SPACE_KEYS = {"source", "params"}
RANGE_KEYS = {"low", "high", "log", "step"}
DEFAULT_TRIAL_SEEDS = 3
# Trials use seeds 1..S; validation seeds start above them (VALIDATION_SEED0).
MAX_TRIAL_SEEDS = 1000
FLAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Param:
    """One searched (or fixed) flag: a float or int range, a choice among values, or a value."""

    flag: str
    kind: Literal["float", "int", "choice", "fixed"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    value: ArgValue | None = None

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed at {json.dumps(self.value)}"
        if self.kind == "choice":
            return "one of " + ", ".join(json.dumps(c) for c in self.choices)
        scale = ", log scale" if self.log else f", step {self.step:g}" if self.step else ""
        return f"{self.kind} in [{self.low:g}, {self.high:g}]{scale}"

    def as_dict(self) -> dict[str, Any]:
        """The parameter as the study records it (a resumed study must have the same)."""
        return {**self.__dict__, "choices": list(self.choices)}


@dataclass(frozen=True)
class TuneTable:
    """A preset's `[<preset>.tune]` table."""

    seeds: int = DEFAULT_TRIAL_SEEDS
    total_steps: int | None = None  # a trial run's budget (None: the preset's full budget)
    random: float | None = None  # a random policy's score (normalisation across presets)
    reference: float | None = None  # the score that normalises to 1 (default: the target's)
    algo_space: bool = True  # merge the preset's params over <zoo>/spaces/<algo>.toml
    params: dict[str, Param] = field(default_factory=dict)


def parse_param(flag: str, spec: Any, where: str) -> Param:
    """One entry of a `params` table; every problem is one line naming the flag."""
    where = f"{where}: parameter '{flag}'"
    if not FLAG.fullmatch(flag):
        raise ZooError(f"{where}: must be a flag name without leading dashes")
    if flag in RESERVED_FLAGS:
        raise ZooError(
            f"{where}: is set by the runner (each trial's seeds and budget), not searched"
        )
    if not isinstance(spec, dict):
        return Param(flag, "fixed", value=spec)
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise ZooError(f"{where}: a choice takes only 'choices', not {sorted(set(spec))}")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ZooError(f"{where}: 'choices' must be a non-empty list")
        if not all(isinstance(c, (bool, str)) or is_number(c) for c in choices):
            raise ZooError(
                f"{where}: choices must be numbers, strings or booleans, got {choices!r}"
            )
        if len({json.dumps(c) for c in choices}) != len(choices):
            raise ZooError(f"{where}: a choice is listed twice in {choices!r}")
        return Param(flag, "choice", choices=tuple(choices))
    unknown = sorted(set(spec) - RANGE_KEYS)
    if unknown or not {"low", "high"} <= set(spec):
        raise ZooError(
            f"{where}: unknown key(s) {', '.join(unknown) or 'none'} or missing low/high; a "
            "parameter is { low, high (, log, step) }, { choices = [...] } or a fixed value"
        )
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    if not (is_number(low) and is_number(high)) or not isinstance(log, bool):
        raise ZooError(f"{where}: low and high must be numbers and log a boolean")
    if step is not None and not (is_number(step) and step > 0):
        raise ZooError(f"{where}: step must be a positive number, got {step!r}")
    if low > high:
        raise ZooError(f"{where}: inverted range: low {low:g} > high {high:g}")
    if low == high:
        raise ZooError(f"{where}: empty range [{low:g}, {high:g}]: give a fixed value instead")
    if log and (low <= 0 or step is not None):
        raise ZooError(f"{where}: a log scale needs low > 0 and no step")
    integer = all(isinstance(v, int) for v in (low, high)) and isinstance(step, (int, type(None)))
    return Param(flag, "int" if integer else "float", low, high, log, step)


def parse_params(data: Any, where: str) -> dict[str, Param]:
    if not isinstance(data, dict):
        raise ZooError(f"{where}: 'params' must be a table of flag = parameter")
    return {flag: parse_param(flag, spec, where) for flag, spec in data.items()}


def _get(data: dict[str, Any], key: str, ok: bool, kind: str, where: str) -> Any:
    if key in data and not ok:
        raise ZooError(f"{where}: '{key}' must be {kind}, got {data[key]!r}")
    return data.get(key)


def parse_tune(data: Any, where: str) -> TuneTable:
    """A preset's `[<preset>.tune]` table (`where` names it)."""
    if not isinstance(data, dict):
        raise ZooError(f"{where}: expected a table, got {type(data).__name__}")
    unknown = sorted(set(data) - TUNE_KEYS)
    if unknown:
        raise ZooError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TUNE_KEYS))}"
        )
    seeds = data.get("seeds", DEFAULT_TRIAL_SEEDS)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 2 <= seeds <= MAX_TRIAL_SEEDS:
        raise ZooError(
            f"{where}: 'seeds' must be a whole number from 2 to {MAX_TRIAL_SEEDS} (a trial's "
            f"IQM is over its seeds), got {seeds!r}"
        )
    steps = data.get("total_steps")
    _get(data, "total_steps", isinstance(steps, int) and steps > 0, "a positive integer", where)
    for key in ("random", "reference"):
        _get(data, key, is_number(data.get(key)), "a number", where)
    _get(data, "algo_space", isinstance(data.get("algo_space"), bool), "a boolean", where)
    table = TuneTable(
        seeds=seeds,
        total_steps=steps,
        random=data.get("random"),
        reference=data.get("reference"),
        algo_space=data.get("algo_space", True),
        params=parse_params(data.get("params", {}), where),
    )
    if None not in (table.random, table.reference) and not table.random < table.reference:
        raise ZooError(f"{where}: 'reference' must be above 'random' (higher scores are better)")
    return table


def load_algo_spaces(zoo: Path) -> dict[str, dict[str, Param]]:
    """Each algorithm's space, from `<zoo>/spaces/<algo>.toml` (the zoo folder, or the folder of
    a zoo file)."""
    folder = (zoo if zoo.is_dir() else zoo.parent) / SPACES_DIR
    spaces = {}
    for path in sorted(folder.glob("*.toml")):
        where = f"search space {path}"
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ZooError(f"{where}: not valid TOML: {e}") from None
        unknown = sorted(set(data) - SPACE_KEYS)
        if unknown:
            raise ZooError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: source, params")
        spaces[path.stem] = parse_params(data.get("params", {}), where)
    return spaces


@functools.cache
def file_flags(script: Path) -> dict[str, str | None]:
    """The flags `script` takes, each with its type annotation where known: the fields of its
    `Args` dataclass (tyro's `--field-name`), read without importing the file, or else the
    `--flag` names its `--help` prints."""
    try:
        tree = ast.parse(script.read_text())
    except (OSError, SyntaxError) as e:
        raise ZooError(f"cannot read the flags of {script}: {e}") from None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            return {
                item.target.id.replace("_", "-"): ast.unparse(item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    try:
        out = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ZooError(f"cannot read the flags of {script}: --help: {e}") from None
    flags = re.findall(r"--(?:\[no-\])?([A-Za-z0-9][A-Za-z0-9_-]*)", out.stdout)
    if out.returncode != 0 or not flags:
        raise ZooError(f"cannot read the flags of {script}: neither an Args class nor --help flags")
    return dict.fromkeys(flags)


def check_flags(params: dict[str, Param], script: Path, where: str) -> None:
    """Refuse a flag the algorithm file does not take, or a float range for an integer flag."""
    flags = file_flags(script)
    for flag, param in params.items():
        if flag not in flags:
            raise ZooError(
                f"{where}: parameter '{flag}': {script.name} takes no --{flag} (see "
                f"python {script} --help)"
            )
        annotation = flags[flag] or ""
        if param.kind == "float" and re.fullmatch(r"int( \| None)?", annotation):
            raise ZooError(
                f"{where}: parameter '{flag}': --{flag} is an integer; give integer low and high"
            )


# Trials run seeds 1..S (S <= MAX_TRIAL_SEEDS); validation seeds start here.
VALIDATION_SEED0 = 1001


def tuned(preset: Preset, params: dict[str, Any]) -> Preset:
    """`preset` with `params` over its arguments: in its args, and out of its budgets' args,
    so that every run of it gets them (and its table, the sweep's copy, says so)."""
    if not params:
        return preset

    def without(args: dict[str, Any]) -> dict[str, Any]:
        return {flag: value for flag, value in args.items() if flag not in params}

    table = {**preset.table, "args": {**preset.args, **params}}
    for mode in ("smoke", "full"):
        table[mode] = {**table[mode], "args": without(table[mode].get("args", {}))}
    return replace(
        preset,
        args={**preset.args, **params},
        smoke=replace(preset.smoke, args=without(preset.smoke.args)),
        full=replace(preset.full, args=without(preset.full.args)),
        table=table,
    )


@dataclass(frozen=True)
class StudyDef:
    """What a study searches and how a trial is run and scored."""

    name: str
    presets: tuple[Preset, ...]
    space: dict[str, Param]
    seeds: int  # a trial's seeds: 1..seeds
    steps: dict[str, int]  # a trial run's budget, per preset
    anchors: dict[str, tuple[float, float]] | None  # (random, reference), with several presets
    folder: Path  # <runs-dir>/tune-<name>

    @property
    def searched(self) -> dict[str, Param]:
        return {flag: p for flag, p in self.space.items() if p.kind != "fixed"}

    @property
    def fixed(self) -> dict[str, Any]:
        return {flag: p.value for flag, p in self.space.items() if p.kind == "fixed"}

    def definition(self) -> dict[str, Any]:
        """What a resumed study must share with the one it resumes."""
        return {
            "presets": {
                p.name: {
                    "algo": p.algo,
                    "env_id": p.env_id,
                    "args": {**p.args, **p.full.args},
                    "total_steps": self.steps[p.name],
                    "anchors": self.anchors and list(self.anchors[p.name]),
                }
                for p in self.presets
            },
            "seeds": self.seeds,
            "space": {flag: p.as_dict() for flag, p in self.space.items()},
        }

    def score(self, preset: str, value: float) -> float:
        return normalise(value, *self.anchors[preset]) if self.anchors else value

    def objective(self, records: list[dict[str, Any]]) -> float:
        return iqm([self.score(r["preset"], r["summary"]["eval_mean"]) for r in records])

    def intermediate(self, jobs: list[Job], curves: dict[str, list]) -> list[tuple[int, float]]:
        """(step, IQM of the runs' scores) at the steps every run of the trial has evaluated."""
        return eval_iqm_curve(
            [[(s, self.score(j.preset.name, v)) for s, v in curves.get(j.key, [])] for j in jobs]
        )

    def trial_jobs(self, params: dict[str, Any], folder: Path, scale: float) -> list[Job]:
        """A trial's runs of its flags in `folder`: seeds 1..S at the trial budget."""
        return [
            job
            for p in self.presets
            for job in plan_jobs(
                [tuned(p, params)],
                "full",
                folder,
                seeds=self.seeds,
                total_steps=self.steps[p.name],
                timeout_scale=scale,
            )
        ]

    def validation_jobs(
        self, params: dict[str, Any], folder: Path, scale: float, seeds: int | None
    ) -> list[Job]:
        """The validation runs of a set of flags in `folder`: the full budget on `seeds` seeds
        (None: each preset's own number) from VALIDATION_SEED0."""
        presets = [tuned(p, params) for p in self.presets]
        return [
            replace(job, seed=seed, run_dir=job.run_dir.with_name(f"seed{seed}"))
            for job in plan_jobs(presets, "full", folder, seeds=seeds, timeout_scale=scale)
            for seed in [VALIDATION_SEED0 - 1 + job.seed]
        ]


def _anchors(preset: Preset, table: TuneTable) -> tuple[float, float]:
    norm, target = preset.normalise, preset.target
    random = table.random if table.random is not None else norm and norm.random
    reference = next(
        (
            v
            for v in (table.reference, norm and norm.reference, target and target.threshold)
            if v is not None
        ),
        None,
    )
    if random is None or reference is None or not random < reference:
        raise ZooError(
            f"zoo preset '{preset.name}': tune: beside other presets its score is normalised: give "
            "[<preset>.tune] random (a random policy's score) and, without a target, reference "
            "(above random)"
        )
    return float(random), float(reference)


def build_study(presets: list[Preset], zoo: Path, name: str, runs_dir: Path) -> StudyDef:
    """The study of `presets` from their tune tables and their algorithms' spaces, each flag
    checked against the algorithm file."""
    algo_spaces = load_algo_spaces(zoo)
    spaces, tables = {}, {}
    for preset in presets:
        where = f"zoo preset '{preset.name}': tune"
        table = preset.tune or (TuneTable() if preset.algo in algo_spaces else None)
        if table is None:
            raise ZooError(
                f"zoo preset '{preset.name}': no search space: give it a [{preset.name}.tune] "
                f"table with params, or write {SPACES_DIR}/{preset.algo}.toml beside the zoo"
            )
        space = {**(algo_spaces.get(preset.algo, {}) if table.algo_space else {}), **table.params}
        if not any(p.kind != "fixed" for p in space.values()):
            raise ZooError(f"{where}: nothing to search (no range or choice among its params)")
        check_flags(space, preset.script, where)
        spaces[preset.name], tables[preset.name] = space, table
    first = presets[0].name
    for preset in presets[1:]:
        if spaces[preset.name] != spaces[first] or tables[preset.name].seeds != tables[first].seeds:
            raise ZooError(
                f"zoo presets '{first}' and '{preset.name}': one study searches one set of flags "
                "on one number of seeds; their spaces or seeds differ"
            )
    return StudyDef(
        name=name,
        presets=tuple(presets),
        space=spaces[first],
        seeds=tables[first].seeds,
        steps={p.name: tables[p.name].total_steps or p.full.total_steps for p in presets},
        anchors={p.name: _anchors(p, tables[p.name]) for p in presets}
        if len(presets) > 1
        else None,
        folder=runs_dir / f"tune-{name}",
    )


def params_of(study: StudyDef, trial: FrozenTrial) -> dict[str, Any]:
    """A trial's flags: the fixed ones and those it sampled."""
    return {**study.fixed, **trial.params}
