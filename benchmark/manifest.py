"""The zoo manifest: presets read from TOML files and checked before anything runs.

See `zoo/README.md` for the format. Every problem is a `ZooError` whose message
names the preset, so the command line can print it as one line.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .tune_space import TuneTable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

Mode = Literal["smoke", "full"]
ArgValue = bool | int | float | str | list
DEFAULT_TAGS: dict[str, tuple[str, ...]] = {
    "smoke": ("charts/SPS", "eval/episodic_return"),
    "full": ("charts/SPS", "eval/episodic_return", "charts/episodic_return"),
}


class ZooError(Exception):
    """A manifest problem, worded as one line."""


@dataclass(frozen=True)
class Budget:
    total_steps: int
    timeout_s: float
    seeds: int = 1
    args: dict[str, ArgValue] = field(default_factory=dict)
    required_tags: tuple[str, ...] = ()
    memory_gb: float = 0


@dataclass(frozen=True)
class Target:
    """Per seed `metric >= min` (or `> above`) in `at_least` of `of` seeds, and optionally the
    mean over seeds `>= mean_min`, their IQM `>= iqm_min`, and (`hold`) a seed counts only if its
    last evaluation is at least `hold` times its best."""

    metric: str
    threshold: float
    strict: bool
    at_least: int
    of: int
    text: str
    mean_min: float | None = None
    iqm_min: float | None = None
    hold: float | None = None

    def passes(self, value: float) -> bool:
        return value > self.threshold if self.strict else value >= self.threshold


@dataclass(frozen=True)
class Reference:
    name: str
    score: float | str
    source: str
    note: str = ""


@dataclass(frozen=True)
class Normaliser:
    """Published scores of the task for (score - random) / (reference - random)."""

    name: str
    random: float
    reference: float
    source: str


@dataclass(frozen=True)
class Dataset:
    """The arguments of `benchmark.datasets` (the environment is the preset's) that make the dataset a
    preset reads; the runner builds it before the preset's runs."""

    dataset_id: str
    episodes: int = 10
    noise: float = 0.0
    seed: int = 0
    root: str | None = None
    checkpoint: str | None = None

    @property
    def folder(self) -> Path | None:
        """Where it lands, when the root is given (else MINARI_DATASETS_PATH or Minari's default decides)."""
        return Path(self.root) / self.dataset_id if self.root is not None else None

    def argv(self, env_id: str) -> list[str]:
        """The command line of `python -m benchmark.datasets` that makes it."""
        argv = [
            "--env-id",
            env_id,
            "--dataset-id",
            self.dataset_id,
            "--episodes",
            str(self.episodes),
            "--noise",
            str(self.noise),
            "--seed",
            str(self.seed),
        ]
        return argv + [
            x
            for flag, value in (("--root", self.root), ("--checkpoint", self.checkpoint))
            if value is not None
            for x in (flag, value)
        ]

    def command(self, env_id: str) -> str:
        return "python -m benchmark.datasets " + shlex.join(self.argv(env_id))


@dataclass(frozen=True)
class Preset:
    name: str
    algo: str
    script: Path
    env_id: str
    args: dict[str, ArgValue]
    smoke: Budget
    full: Budget
    target: Target | None = None
    references: tuple[Reference, ...] = ()
    curve_threshold: float | None = None
    curve_window: int = 10
    num_cpus: float = 1
    num_gpus: float = 0
    provisional: bool = False
    dataset: Dataset | None = None
    group: str | None = None
    normalise: Normaliser | None = None
    table: dict[str, Any] = field(
        default_factory=dict, compare=False
    )  # as written, for the sweep's copy
    # `python -m benchmark tune`'s table (benchmark/tune_space.py); not in `table`, so that a
    # sweep's copy of its presets, and what a result was run at, do not change with it.
    tune: TuneTable | None = field(default=None, compare=False)

    def budget(self, mode: Mode) -> Budget:
        return self.smoke if mode == "smoke" else self.full


PRESET_KEYS = {
    "algo",
    "env_id",
    "args",
    "smoke",
    "full",
    "target",
    "references",
    "curve_threshold",
    "curve_window",
    "num_cpus",
    "num_gpus",
    "provisional",
    "dataset",
    "group",
    "normalise",
    "tune",
}
BUDGET_KEYS = {"total_steps", "timeout_s", "seeds", "args", "required_tags", "memory_gb"}
TARGET_KEYS = {"metric", "min", "above", "at_least", "of", "mean_min", "iqm_min", "hold", "text"}
# What a target's `metric` may name, per seed: the final evaluation's mean return (summary.json), or
# the lowest of the last three evaluations' means (the eval curve), which a run that learns and then
# forgets misses even when its final evaluation recovers.
METRICS = ("eval_mean", "eval_min_last3")
REFERENCE_KEYS = {"name", "score", "source", "note"}
NORMALISE_KEYS = {"name", "random", "reference", "source"}
DATASET_KEYS = {"dataset_id", "episodes", "noise", "seed", "root", "checkpoint"}
# Minari's (namespace/)name(-v<version>) (minari.dataset.minari_dataset.DATASET_ID_RE), so no '..' or leading '/'.
DATASET_ID = re.compile(r"(?:[-_\w][-_\w/]*[-_\w]+/)?[-_\w]+?(?:-v\d+)?")
RESERVED_FLAGS = {"total-steps", "seed", "run-dir", "env-id"}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Table:
    """A TOML table read key by key; every error names where it is."""

    def __init__(self, data: Any, where: str, allowed: set[str]):
        if not isinstance(data, dict):
            raise ZooError(f"{where}: expected a table, got {type(data).__name__}")
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ZooError(
                f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
            )
        self.data, self.where = data, where

    def get(self, key: str, kind: str, default: Any = ..., *, positive: bool = False) -> Any:
        if key not in self.data:
            if default is ...:
                raise ZooError(f"{self.where}: missing '{key}'")
            return default
        value = self.data[key]
        ok = {
            "str": isinstance(value, str) and value != "",
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": is_number(value),
            "bool": isinstance(value, bool),
            "table": isinstance(value, dict),
            "list": isinstance(value, list),
            "score": isinstance(value, str) or is_number(value),
        }[kind]
        if ok and positive and not value > 0:
            ok, kind = False, f"positive {kind}"
        if not ok:
            raise ZooError(f"{self.where}: '{key}' must be a {kind}, got {value!r}")
        return value


def _args(table: _Table) -> dict[str, ArgValue]:
    args = table.get("args", "table", {})
    for flag, value in args.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", flag):
            raise ZooError(
                f"{table.where}: argument '{flag}' must be a flag name without leading dashes"
            )
        if isinstance(value, dict):
            raise ZooError(f"{table.where}: argument '{flag}' cannot be a table")
        if flag in RESERVED_FLAGS:
            raise ZooError(
                f"{table.where}: '{flag}' is set by the runner; use total_steps / seeds instead"
            )
    return dict(args)


def _budget(data: Any, where: str, mode: Mode) -> Budget:
    table = _Table(data, where, BUDGET_KEYS if mode == "full" else BUDGET_KEYS - {"seeds"})
    tags = table.get("required_tags", "list", list(DEFAULT_TAGS[mode]))
    if not all(isinstance(tag, str) for tag in tags):
        raise ZooError(f"{where}: 'required_tags' must be a list of strings")
    args = _args(table)
    return Budget(
        total_steps=table.get("total_steps", "int", positive=True),
        timeout_s=table.get("timeout_s", "number", positive=True),
        seeds=table.get("seeds", "int", 1, positive=True),
        args=args,
        required_tags=tuple(tags),
        memory_gb=table.get("memory_gb", "number", 0, positive=True),
    )


def _target(data: Any, where: str, seeds: int) -> Target:
    table = _Table(data, where, TARGET_KEYS)
    if ("min" in data) == ("above" in data):
        raise ZooError(
            f"{where}: give exactly one of 'min' (metric >= min) or 'above' (metric > above)"
        )
    strict = "above" in data
    metric = table.get("metric", "str")
    if metric not in METRICS:
        raise ZooError(f"{where}: metric {metric!r} is not one of {', '.join(METRICS)}")
    target = Target(
        metric=metric,
        threshold=table.get("above" if strict else "min", "number"),
        strict=strict,
        at_least=table.get("at_least", "int", positive=True),
        of=table.get("of", "int", positive=True),
        mean_min=table.get("mean_min", "number", None),
        iqm_min=table.get("iqm_min", "number", None),
        hold=table.get("hold", "number", None),
        text=table.get("text", "str"),
    )
    if target.hold is not None and not 0 < target.hold <= 1:
        raise ZooError(
            f"{where}: hold ({target.hold}) must be in (0, 1]: the fraction of its best evaluation a seed's last one must keep"
        )
    if target.at_least > target.of:
        raise ZooError(f"{where}: at_least ({target.at_least}) is more than of ({target.of})")
    if target.of != seeds:
        raise ZooError(f"{where}: of ({target.of}) must equal full.seeds ({seeds})")
    return target


def _normaliser(data: Any, where: str) -> Normaliser:
    table = _Table(data, where, NORMALISE_KEYS)
    normaliser = Normaliser(
        name=table.get("name", "str"),
        random=table.get("random", "number"),
        reference=table.get("reference", "number"),
        source=table.get("source", "str"),
    )
    if normaliser.reference == normaliser.random:
        raise ZooError(f"{where}: 'reference' must differ from 'random'")
    return normaliser


def _dataset(data: Any, where: str, budgets: list[dict[str, ArgValue]]) -> Dataset:
    """The dataset table; `budgets`: each budget's arguments, whose --dataset-path must name its folder."""
    if isinstance(data, str):
        raise ZooError(
            f"{where}: a command line is not run; write a [<preset>.dataset] table of benchmark.datasets "
            f"arguments ({', '.join(sorted(DATASET_KEYS))})"
        )
    table = _Table(data, where, DATASET_KEYS)
    dataset = Dataset(
        dataset_id=table.get("dataset_id", "str"),
        episodes=table.get("episodes", "int", 10, positive=True),
        noise=float(table.get("noise", "number", 0.0)),
        seed=table.get("seed", "int", 0),
        root=table.get("root", "str", None),
        checkpoint=table.get("checkpoint", "str", None),
    )
    if not DATASET_ID.fullmatch(dataset.dataset_id):
        raise ZooError(
            f"{where}: 'dataset_id' {dataset.dataset_id!r} is not a Minari id (namespace/)name-v<version>"
        )
    if dataset.noise < 0 or dataset.seed < 0:
        raise ZooError(f"{where}: 'noise' and 'seed' must be at least 0")
    for args in budgets:
        path = args.get("dataset-path")
        if dataset.folder is not None and isinstance(path, str) and Path(path) != dataset.folder:
            raise ZooError(
                f"{where}: the preset reads --dataset-path {path}, "
                f"but the dataset lands in {dataset.folder}"
            )
    return dataset


def _preset(name: str, data: Any, where: str, algos_dir: Path, check_script: bool) -> Preset:
    table = _Table(data, where, PRESET_KEYS)
    algo = table.get("algo", "str")
    script = algos_dir / f"{algo}.py"
    if check_script and not script.is_file():
        raise ZooError(f"{where}: unknown algorithm file {script} (algo = {algo!r})")
    for mode in ("smoke", "full"):
        if mode not in data:
            raise ZooError(f"{where}: missing budget [{name}.{mode}]")
    full = _budget(data["full"], f"{where}: full", "full")
    args = _args(table)
    smoke = _budget(data["smoke"], f"{where}: smoke", "smoke")
    dataset = (
        _dataset(data["dataset"], f"{where}: dataset", [{**args, **b.args} for b in (smoke, full)])
        if "dataset" in data
        else None
    )
    references = table.get("references", "list", [])
    num_gpus = table.get("num_gpus", "number", 0)
    if num_gpus < 0 or (num_gpus > 1 and num_gpus != int(num_gpus)):
        raise ZooError(
            f"{where}: num_gpus must be a fraction up to 1 or a whole number (as Ray asks), got {num_gpus!r}"
        )
    return Preset(
        name=name,
        algo=algo,
        script=script,
        env_id=table.get("env_id", "str"),
        args=args,
        smoke=smoke,
        full=full,
        target=_target(data["target"], f"{where}: target", full.seeds)
        if "target" in data
        else None,
        references=tuple(
            _reference(ref, f"{where}: reference {i + 1}") for i, ref in enumerate(references)
        ),
        curve_threshold=table.get("curve_threshold", "number", None),
        curve_window=table.get("curve_window", "int", 10, positive=True),
        num_cpus=table.get("num_cpus", "number", 1, positive=True),
        num_gpus=num_gpus,
        provisional=table.get("provisional", "bool", False),
        dataset=dataset,
        group=table.get("group", "str", None),
        normalise=_normaliser(data["normalise"], f"{where}: normalise")
        if "normalise" in data
        else None,
        table={key: value for key, value in data.items() if key != "tune"},
        tune=_tune(data["tune"], f"{where}: tune") if "tune" in data else None,
    )


def _tune(data: Any, where: str) -> TuneTable:
    from .tune_space import parse_tune  # which imports this module

    return parse_tune(data, where)


def _reference(data: Any, where: str) -> Reference:
    table = _Table(data, where, REFERENCE_KEYS)
    return Reference(
        name=table.get("name", "str"),
        score=table.get("score", "score"),
        source=table.get("source", "str"),
        note=table.get("note", "str", ""),
    )


def presets_from_tables(
    tables: dict[str, Any], algos_dir: Path, check_scripts: bool = True
) -> dict[str, Preset]:
    """Presets from their tables as written (a sweep's copy of its manifest); without
    `check_scripts` an algorithm file renamed since then does not matter."""
    return {
        name: _preset(name, entry, f"zoo preset '{name}'", algos_dir, check_scripts)
        for name, entry in tables.items()
    }


def load_zoo(path: Path, algos_dir: Path) -> dict[str, Preset]:
    """All presets of a manifest file, or of every `*.toml` file in a folder, by name."""
    if tomllib is None:
        raise ZooError(
            "reading the zoo needs Python >= 3.11 or the 'tomli' package; pip install tomli"
        )
    files = sorted(path.glob("*.toml")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ZooError(f"no manifest at {path} (a .toml file or a folder of them)")
    presets: dict[str, Preset] = {}
    folders: dict[Path, Preset] = {}
    for file in files:
        try:
            data = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ZooError(f"{file}: not valid TOML: {e}") from None
        for name, entry in data.items():
            where = f"zoo preset '{name}'"
            if name in presets:
                raise ZooError(f"{where}: duplicate preset name (in {file} and an earlier file)")
            presets[name] = preset = _preset(name, entry, where, algos_dir, True)
            folder = preset.dataset.folder if preset.dataset else None
            other = folders.setdefault(folder, preset) if folder is not None else preset
            if other is not preset and (other.env_id, other.dataset) != (
                preset.env_id,
                preset.dataset,
            ):
                raise ZooError(
                    f"{where}: its dataset lands in {folder} as that of zoo preset '{other.name}', but "
                    "with another recipe; give it another dataset_id or root"
                )
    if not presets:
        raise ZooError(f"no presets in {path}")
    return presets
