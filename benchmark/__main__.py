"""`python -m benchmark <subcommand>`: the benchmark zoo's runner.

- smoke: every preset at its tiny smoke budget, one seed (checks that each file runs).
- full: the full budgets and seeds (results/<sweep>/; `--dry-run` lists what it would run and its
  estimated CPU time).
- datasets: only build the Minari datasets the selected presets read.
- report: rebuild a sweep's report, results and plots.
- readme: rewrite README.md's results table from results/latest and the zoo.
- compare: two sweeps per preset, with a rank test corrected for the presets compared.
- sizes: each algorithm file's size beside its CleanRL counterpart (informational).
- harness: write the run harness from benchmark/run_harness.py into every algorithm file.
- speed: each algorithm file's steady-state steps/s, eager and compiled, optionally against a commit.
- equivalence: every preset's smoke run with the algorithm files at a commit and in the working tree,
  compared exactly (checkpoints, scalars, summaries): proof that a refactor changed no behaviour.
- tune: a hyperparameter search on Optuna over presets' search spaces, the best re-run on fresh seeds
  beside the defaults (results/tune-<name>/).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import shlex
import signal
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

import tyro

from .backends import (
    Callbacks,
    Machine,
    fail_before_running,
    local_gpus,
    physical_memory_gb,
    run_local,
    run_ray,
)
from .compare import compare, load_sweep
from .harness import write as write_harness
from .manifest import Mode, Preset, ZooError, load_zoo
from .progress import Progress
from .report import (
    collect,
    definition_changes,
    load_committed,
    report_sweep,
    update_readme,
    with_committed,
)
from .runner import (
    Job,
    build_datasets,
    finished_ok,
    open_sweep,
    plan_jobs,
    relative,
    write_atomic,
    write_json,
)
from .sizes import report as report_sizes


@dataclass
class Common:
    zoo: Path = Path("zoo")
    """The manifest: a .toml file or a folder of them."""
    algos_dir: Path = Path("algos")
    """Where the algorithm files named by the presets live."""
    runs_dir: Path = Path("runs/benchmark")
    """Raw run folders go to <runs-dir>/<sweep>/<preset>/seed<k>/."""


@dataclass
class Sizes:
    """Each algorithm file's size beside its CleanRL counterpart (informational)."""

    algos_dir: Path = Path("algos")
    """The algorithm files to measure."""


@dataclass
class Harness:
    """Write the run harness from its one source, benchmark/run_harness.py, into every algorithm
    file (the block from `# ===== run harness` to the main guard)."""

    algos_dir: Path = Path("algos")
    """The algorithm files to write."""
    check: bool = False
    """Write nothing; exit 1 when a file's harness differs from the source."""


@dataclass
class Selection(Common):
    preset: tuple[str, ...] = ()
    """Only these presets (names or shell patterns such as 'naf-*')."""
    algo: tuple[str, ...] = ()
    """Only these algorithm files (stems or patterns)."""
    env: tuple[str, ...] = ()
    """Only these environment ids (or patterns)."""


@dataclass
class Sweep(Selection):
    name: str | None = None
    """The sweep's name (default: <subcommand>-<date>-<time>); the same name resumes a sweep,
    skipping the runs that finished and continuing each unfinished run from its
    checkpoints/latest.pt with --resume (with Ray: from its copy in --storage; without one it starts
    afresh)."""
    workers: Annotated[int, tyro.conf.arg(metavar="CPUS")] = 2
    """How many CPUs to use (not how many runs): each run holds its preset's num_cpus of them while
    it runs (local backend), or the CPUs of the local Ray instance (ray backend). The progress ETA
    assumes this many runs at once."""
    memory_gb: float | None = None
    """Memory the local backend may fill with the presets' memory_gb requests (default: all of it)."""
    gpus: int | None = None
    """GPUs the local backend may hand out (default: those `nvidia-smi -L` lists)."""
    backend: Literal["local", "ray"] = "local"
    """Local processes, or one Ray task per run."""
    ray_address: str | None = None
    """Ray cluster to join (e.g. 'auto' or 'ray://host:10001'); default: start a local one."""
    storage: str | None = None
    """Ray: a folder every node mounts, or an fsspec URI, that outlives the nodes; each run's
    folder and checkpoint are copied there while it runs, so a run retried after its node died,
    or re-run under the same --name, resumes. Without it a Ray run that did not finish starts afresh."""
    sync_interval_s: float = 60.0
    """Ray: seconds between copies of a running run's folder to --storage."""
    ray_requirements: str = "auto"
    """Ray: a pip requirements file every node installs (in a virtualenv of Ray's) before running;
    'auto': requirements.lock when joining a cluster with --ray-address, nothing for a local
    instance; 'none': nothing (the nodes have the packages)."""
    timeout_scale: float = 1.0
    """Multiply every preset's time limit (a slow or busy machine)."""
    progress_interval_s: float = 30.0
    """Seconds between progress lines when the output is not a terminal."""
    dry_run: bool = False
    """Run nothing: list the runs the sweep would start (those of this --name that finished are
    skipped), each preset's CPUs and time limit, and the estimated CPU time."""


@dataclass
class Smoke(Sweep):
    """Every preset at its smoke budget, one seed; checks each run's exit status and outputs.
    The report goes to <runs-dir>/<sweep>/."""


@dataclass
class Full(Sweep):
    """The full budgets and seeds; writes results/<sweep>/ and, once the sweep holds every
    preset's full seeds at the full budget, results/latest. Exits non-zero when a run fails
    or a preset misses its target."""

    seeds: int | None = None
    """Seeds 1..N instead of each preset's number (the target then does not apply)."""
    steps_scale: float = 1.0
    """Multiply each preset's total steps (a shorter sweep; targets do not apply)."""
    total_steps: int | None = None
    """Use this many total steps for every preset (targets do not apply)."""
    results_dir: Path = Path("results")
    """Committed results go to <results-dir>/<sweep>/."""


@dataclass
class Tune(Sweep):
    """A hyperparameter search over the selected presets' search spaces (zoo/README.md, "Tuning"):
    each trial runs every preset on its trial seeds with the sampled flags, as a sweep runs it, and
    scores the IQM of the final evaluations; weak trials are pruned on their evaluation curves. The
    best trial (and the next --top-k - 1) is then re-run at the full budget on fresh seeds beside
    the defaults and compared as `compare` does. Writes results/tune-<name>/ (trials.csv,
    best.toml, report.md, plots); the same --name resumes the study."""

    trials: int = 20
    """Trials the study holds at the end (those of earlier invocations count; an interrupted one
    does not)."""
    processes: int = 1
    """Worker processes running trials side by side on this machine, sharing the study's storage;
    each one's trial runs its runs on --workers / --processes CPUs."""
    study_storage: str | None = None
    """Optuna storage: a journal file (default: <runs-dir>/tune-<name>/study.journal) or an RDB
    URL (sqlite:///tune.db, postgresql://...) that processes on several machines share."""
    sampler: Literal["tpe", "random"] = "tpe"
    """TPE (multivariate, as RL Zoo) after --startup-trials random ones, or random search."""
    pruner: Literal["median", "halving", "none"] = "median"
    """Stop a trial whose intermediate IQM falls below the median of the earlier trials' at the
    same step (after --startup-trials, not in the first third of the budget), or successive halving."""
    startup_trials: int = 5
    """Trials sampled at random before TPE models the others, and trials completed before the
    median pruner prunes any."""
    seed: int = 0
    """The sampler's seed (each worker process adds its index and the trials before it)."""
    top_k: int = 1
    """Validate the best K trials against the defaults (0: no validation)."""
    validation_seeds: int | None = None
    """Validation seeds per set (default: each preset's full seeds), from 1001 on."""
    level: float = 0.05
    """Family-wise level of the validation's rank tests (divided by --top-k across the sets)."""
    results_dir: Path = Path("results")
    """The study's outputs go to <results-dir>/tune-<name>/."""


@dataclass
class Datasets(Selection):
    """Only build the datasets the selected presets read (their `dataset` tables), as a sweep does
    before its runs: each distinct one once, left as it is when made by the same recipe. Useful
    before a Ray sweep, whose runs read them on the workers (an absolute root on a folder every node
    mounts). Output appended to <runs-dir>/datasets.log; exits 1 when one could not be built."""


@dataclass(kw_only=True)
class Report:
    """Rebuild results/<sweep>/ (report, results.json, curves.json, plots) from the sweep's run
    records in <runs-dir>/<sweep>/ joined with what results/<sweep>/ already holds of other presets
    and seeds, or, where the runs are gone, from results/<sweep>/ itself; targets and references
    come from the sweep's copy of its manifest, not from today's zoo. A smoke sweep's report is
    rebuilt where it lives, in <runs-dir>/<sweep>/."""

    name: str
    """The sweep."""
    runs_dir: Path = Path("runs/benchmark")
    results_dir: Path = Path("results")


@dataclass
class Readme:
    """Rewrite the block between the results markers in README.md: every preset of the zoo, with
    its result in results/latest's sweep where that sweep ran the preset's current definition,
    else "not run at this definition"; the sweep's commit, the algorithm files changed since, and
    which of them committed `equivalence` reports (results/equivalence-*.json) proved equivalent."""

    readme: Path = Path("README.md")
    results_dir: Path = Path("results")
    zoo: Path = Path("zoo")
    """The manifest whose presets the table lists."""
    algos_dir: Path = Path("algos")


@dataclass
class Compare:
    """Two sweeps side by side per preset: a two-sided Mann-Whitney rank test of the final
    evaluations (exact), Holm's correction across the presets compared, and rliable's probability
    of improvement P(B > A) as a description. Exits 1 when B is worse than A on some preset after
    the correction."""

    a: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="SWEEP_A")]
    """The baseline: a sweep's name in --results-dir or --runs-dir, or its folder."""
    b: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="SWEEP_B")]
    """The change, likewise."""
    results_dir: Path = Path("results")
    runs_dir: Path = Path("runs/benchmark")
    out: Path | None = None
    """Also write the comparison to this Markdown file."""
    level: float = 0.05
    """Family-wise level: the chance of any false verdict among the presets compared."""
    preset: tuple[str, ...] = ()
    """Only these presets (names or shell patterns): fewer presets compared, a smaller correction."""


@dataclass
class Speed:
    """Steady-state env steps/s of each algorithm file (or those named) at a fixed short run on one
    device, eager and compiled, optionally beside the files at another commit (a temporary
    worktree), alternating A B A B; prints each run, then per file and mode the median steps/s,
    A/B and compiled/eager. How the rate leaves out start-up and compilation:
    benchmark/speed.py."""

    files: tuple[str, ...] = ()
    """Only these files (stems such as ppo_atari; default: all eight)."""
    device: str = "cpu"
    """cpu, cuda or cuda:N, passed to each file's --device."""
    steps: float = 1.0
    """Multiply each file's measured steps (the warm-up before them stays)."""
    compile: Literal["off", "on", "both"] = "both"
    """Eager runs, --compile runs, or both."""
    against: str | None = None
    """B: the same runs with the files as they were at this commit (A: the working tree)."""
    repeats: int = 2
    """Rounds; in each, per file and mode, A then B. The table gives the medians."""
    threads: int | None = None
    """Set OMP_NUM_THREADS for the runs (default: the environment's, passed through)."""
    budget_s: float = 570.0
    """Start no run, and stop a running one, once this many seconds have passed (one call fits a
    10-minute window); rounds are the outer loop, so the first round of every file comes first."""
    out: Path | None = None
    """Also write every run's numbers and the table to this JSON file."""
    algos_dir: Path = Path("algos")


@dataclass
class Equivalence:
    """Each selected preset's smoke run (seed 1, --device cpu, deterministic) twice, with the
    algorithm file as it is at --against and as it is in the working tree, each in its own run
    folder; compares the checkpoints' tensors exactly, every TensorBoard scalar and summary.json,
    leaving out timings and paths (benchmark/equivalence.py). One line per preset: equivalent,
    DIFFERENT (the first difference) or FAILED; writes results/equivalence-<commit>.md (and .json,
    which `readme` reads). Exits 0 only when every preset compared is equivalent."""

    against: str
    """The commit whose algorithm files are the reference (e.g. the commit before a refactor)."""
    preset: tuple[str, ...] = ()
    """Only these presets (names or shell patterns such as 'naf-*'); each must match one."""
    algo: tuple[str, ...] = ()
    """Only these algorithm files (stems or patterns)."""
    env: tuple[str, ...] = ()
    """Only these environment ids (or patterns)."""
    workers: int = 1
    """How many CPUs to use: runs go side by side, each holding its preset's num_cpus of them (at
    most all) with as many threads, as in a sweep."""
    keep: Path | None = None
    """Keep the run folders in this new (or empty) folder instead of a temporary one."""
    out: Path | None = None
    """The report (default: results/equivalence-<7-digit commit>.md; the .json goes beside it)."""
    timeout_scale: float = 1.0
    """Multiply every preset's smoke time limit (a slow or busy machine)."""
    zoo: Path = Path("zoo")
    """The manifest: a .toml file or a folder of them."""
    algos_dir: Path = Path("algos")
    """The working tree's algorithm files (the same folder is read at --against)."""


def _matches(value: str, patterns: tuple[str, ...]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(value, p) for p in patterns)


def select(presets: dict[str, Preset], sweep: Selection | Equivalence) -> list[Preset]:
    chosen = [
        p
        for p in presets.values()
        if _matches(p.name, sweep.preset)
        and _matches(p.algo, sweep.algo)
        and _matches(p.env_id, sweep.env)
    ]
    if not chosen:
        raise ZooError(
            "no preset matches --preset/--algo/--env; the zoo has: " + ", ".join(presets)
        )
    return chosen


def covers_zoo(results: dict, manifest: dict, presets: dict[str, Preset]) -> bool:
    """Whether a sweep holds a run for every seed of every preset's full budget at the preset's
    current definition (`manifest`: the sweep's copy of its presets), the condition for it to
    become results/latest (the README's table), so a filtered sweep cannot replace it."""
    done = {(r["preset"], r["seed"]) for r in results["runs"]}
    return all(
        not definition_changes(manifest.get(p.name), p)
        and all((p.name, seed) in done for seed in range(1, p.budget("full").seeds + 1))
        for p in presets.values()
    )


def _seconds_per_step(results_dir: Path) -> dict[str, float]:
    """Per preset: the median wall time per environment step of the finished runs that committed
    sweeps in `results_dir` hold (a run's own measurement, else its summary.json's)."""
    rates: dict[str, list[float]] = {}
    for path in sorted(results_dir.glob("*/results.json")):
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (OSError, json.JSONDecodeError):
            continue
        for r in runs:
            wall = r.get("wall_time_s") or (r.get("summary") or {}).get("wall_time_s")
            if r.get("status") == "ok" and isinstance(wall, (int, float)) and r.get("total_steps"):
                rates.setdefault(r["preset"], []).append(wall / r["total_steps"])
    return {name: float(statistics.median(values)) for name, values in rates.items()}


def dry_run(
    name: str, jobs: list[Job], todo: list[Job], workers: int, results_dir: Path | None
) -> int:
    """Print what a sweep would run and its estimated CPU time; run nothing."""
    rates = _seconds_per_step(results_dir) if results_dir is not None else {}
    print(
        f"sweep {name} (dry run: nothing is started): {len(todo)} runs to start, "
        f"{len(jobs) - len(todo)} already finished"
    )
    header = ("preset", "runs", "steps", "CPUs", "time limit", "estimate per run", "CPU time")
    rows, cpu_s, bound_s, measured = [], 0.0, 0.0, 0
    for preset in {job.preset.name: job.preset for job in todo}.values():
        mine = [job for job in todo if job.preset is preset]
        steps, cpus = mine[0].total_steps, max(1, math.ceil(preset.num_cpus))
        if preset.name in rates:
            per_run, basis = rates[preset.name] * steps, ""
            measured += 1
        else:
            per_run, basis = mine[0].timeout_s, " (time limit)"
            bound_s += per_run * cpus * len(mine)
        cpu_s += per_run * cpus * len(mine)
        rows.append(
            (
                preset.name,
                str(len(mine)),
                f"{steps:,}",
                f"{cpus}",
                _duration(mine[0].timeout_s),
                _duration(per_run) + basis,
                _duration(per_run * cpus * len(mine)),
            )
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    presets = len(rows)
    print(
        f"estimated CPU time: {cpu_s / 3600:,.1f} CPU-hours ({bound_s / 3600:,.1f} of them time "
        f"limits), about {_duration(cpu_s / workers)} on --workers {workers} (per run: the median "
        f"time per step of the preset's finished runs in committed sweeps for {measured} of the "
        f"{presets} presets; the time limit, an upper bound, for the other {presets - measured})"
    )
    return 0


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:,.1f} min" if minutes < 90 else f"{minutes / 60:,.1f} h"


def _check_committed(out_dir: Path, mode: Mode, budget: dict) -> None:
    """Refuse, before running anything, a full sweep whose name holds committed results of
    another budget (a shorter sweep must not join, nor replace, a full one)."""
    path = out_dir / "results.json"
    if not path.exists():
        return
    old = json.loads(path.read_text())
    if (old["mode"], old["budget"]) != (mode, budget):
        raise ZooError(
            f"sweep '{out_dir.name}' was run as {old['mode']} with budget {old['budget']} (its "
            f"committed results: {out_dir}), not {mode} with {budget}; choose another --name"
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def command_line(argv: list[str]) -> str:
    """The command as the sweep records it: absolute paths made relative to the repository."""

    def rel(arg: str) -> str:
        flag, eq, value = (
            arg.rpartition("=") if arg.startswith("--") and "=" in arg else ("", "", arg)
        )
        return flag + eq + (relative(value) if os.path.isabs(value) else value)

    return "python -m benchmark " + shlex.join(map(rel, argv))


def _requirements(sweep: Sweep) -> Path | None:
    if sweep.ray_requirements == "none":
        return None
    if sweep.ray_requirements == "auto":
        lock = Path("requirements.lock")
        return lock if sweep.ray_address and lock.is_file() else None
    path = Path(sweep.ray_requirements)
    if not path.is_file():
        raise ZooError(f"--ray-requirements {path}: no such file")
    return path


def run_sweep(sweep: Sweep, mode: Mode, command: str) -> int:
    presets = load_zoo(sweep.zoo, sweep.algos_dir)
    chosen = select(presets, sweep)
    name = sweep.name or f"{mode}-{datetime.now():%Y%m%d-%H%M}"
    sweep_dir = sweep.runs_dir / name
    full = sweep if isinstance(sweep, Full) else None
    budget = {"steps_scale": full.steps_scale, "total_steps": full.total_steps} if full else {}
    if (
        sweep.workers < 1
        or sweep.timeout_scale <= 0
        or (full and (full.steps_scale <= 0 or (full.seeds or 1) < 1))
    ):
        raise ZooError("--workers, --seeds, --steps-scale and --timeout-scale must be positive")
    if (
        (sweep.memory_gb is not None and sweep.memory_gb <= 0)
        or (sweep.gpus or 0) < 0
        or sweep.sync_interval_s <= 0
    ):
        raise ZooError("--memory-gb and --sync-interval-s must be positive, --gpus at least 0")
    requirements = _requirements(sweep)
    if full:
        _check_committed(full.results_dir / name, mode, budget)
    jobs = plan_jobs(
        chosen,
        mode,
        sweep_dir,
        seeds=full.seeds if full else None,
        steps_scale=full.steps_scale if full else 1.0,
        total_steps=full.total_steps if full else None,
        timeout_scale=sweep.timeout_scale,
    )
    todo = [job for job in jobs if not finished_ok(job)]
    if sweep.dry_run:
        return dry_run(name, jobs, todo, sweep.workers, full.results_dir if full else None)
    open_sweep(sweep_dir, mode, budget, command, chosen)
    print(
        f"sweep {name}: {len(jobs)} runs, {len(jobs) - len(todo)} already finished; "
        f"raw outputs in {sweep_dir} (re-run with --name {name} to resume)",
        flush=True,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a preempted driver stops its runs too
    try:
        # Once per distinct dataset, here, before any run: with Ray, before submitting (see build_datasets).
        unbuilt = build_datasets(
            [p for p in chosen if any(job.preset is p for job in todo)],
            sweep.algos_dir,
            sweep_dir / "datasets.log",
            ray=sweep.backend == "ray",
        )
        with Progress(
            todo, len(jobs) - len(todo), sweep.workers, sweep.progress_interval_s
        ) as progress:
            calls = Callbacks(progress.started, progress.progressed, progress.finished)
            todo = fail_before_running(todo, unbuilt, sweep.algos_dir, calls)
            if sweep.backend == "ray":
                run_ray(
                    todo,
                    address=sweep.ray_address,
                    local_cpus=sweep.workers,
                    algos_dir=sweep.algos_dir,
                    repo=sweep.algos_dir,
                    storage=sweep.storage,
                    requirements=requirements,
                    sync_s=sweep.sync_interval_s,
                    calls=calls,
                )
            else:
                gpus = local_gpus() if sweep.gpus is None else sweep.gpus
                machine = Machine(
                    sweep.workers, sweep.memory_gb or physical_memory_gb(), [1.0] * gpus
                )
                run_local(todo, machine, sweep.algos_dir, calls)
    except KeyboardInterrupt:
        print(f"interrupted; re-run with --name {name} to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    names = {p.name for p in chosen}
    out_dir = full.results_dir / name if full else sweep_dir
    # A name that already holds committed results keeps the presets this invocation did not run.
    swept = with_committed(collect(sweep_dir), out_dir) if full else collect(sweep_dir)
    results = report_sweep(swept, out_dir, with_plots=full is not None)
    if full and budget == {"steps_scale": 1.0, "total_steps": None}:
        if covers_zoo(results, swept["manifest"], presets):
            write_json(full.results_dir / "latest", {"sweep": name})
        else:
            print(
                "results/latest unchanged: this sweep does not yet hold every preset's full seeds "
                f"at its current definition (run the rest under --name {name} to complete it)"
            )
    print(f"report: {out_dir / 'report.md'}")
    failed = [r for r in results["runs"] if r["preset"] in names and r["status"] != "ok"]
    missed = [
        n for n, p in results["presets"].items() if n in names and p["target"]["status"] == "missed"
    ]
    for n in missed:
        print(f"target missed: {n}: {results['presets'][n]['target']['text']}")
    return 1 if failed or missed else 0


def run_tune(args: Tune, command: str) -> int:
    try:
        from . import tune  # optuna only for this subcommand
    except ModuleNotFoundError as e:
        raise ZooError(f"tune needs {e.name}: pip install -e '.[tune]'") from None
    presets = select(load_zoo(args.zoo, args.algos_dir), args)
    gpus = local_gpus() if args.gpus is None else args.gpus
    rates = _seconds_per_step(args.results_dir)
    return tune.run_tune(args, presets, command, _requirements(args), rates, gpus)


def run_datasets(args: Datasets) -> int:
    chosen = [p for p in select(load_zoo(args.zoo, args.algos_dir), args) if p.dataset is not None]
    if not chosen:
        print("no selected preset reads a dataset")
        return 0
    return 1 if build_datasets(chosen, args.algos_dir, args.runs_dir / "datasets.log") else 0


def rebuild_report(args: Report) -> int:
    raw, out_dir = args.runs_dir / args.name, args.results_dir / args.name
    if (raw / "sweep.json").exists():
        sweep = collect(raw)
        if sweep["meta"]["mode"] == "smoke":  # a smoke sweep keeps its report with its runs
            out_dir = raw
        else:
            sweep = with_committed(sweep, out_dir)
    elif (out_dir / "results.json").exists():
        sweep = load_committed(out_dir)
    else:
        raise ZooError(f"no sweep named {args.name!r} in {args.runs_dir} or {args.results_dir}")
    report_sweep(sweep, out_dir, with_plots=True)
    print(f"report: {out_dir / 'report.md'}")
    return 0


def run_compare(args: Compare) -> int:
    result = compare(
        load_sweep(args.a, args.results_dir, args.runs_dir),
        load_sweep(args.b, args.results_dir, args.runs_dir),
        args.level,
        args.preset,
    )
    text = "\n".join(result.lines) + "\n"
    print(text, end="")
    if args.out is not None:
        write_atomic(args.out, text)
    if result.worse:
        print(
            f"B is worse than A on: {', '.join(result.worse)} (family-wise level {result.level:g} "
            f"over the {result.compared} presets compared)",
            file=sys.stderr,
        )
    return 1 if result.worse else 0


def main(argv: list[str] | None = None) -> int:
    command = tyro.extras.subcommand_cli_from_dict(
        {
            "smoke": Smoke,
            "full": Full,
            "datasets": Datasets,
            "report": Report,
            "readme": Readme,
            "compare": Compare,
            "sizes": Sizes,
            "harness": Harness,
            "speed": Speed,
            "equivalence": Equivalence,
            "tune": Tune,
        },
        prog="python -m benchmark",
        args=argv,
        description=__doc__,
    )
    line = command_line(sys.argv[1:] if argv is None else argv)
    try:
        if isinstance(command, Full):
            return run_sweep(command, "full", line)
        if isinstance(command, Tune):
            return run_tune(command, line)
        if isinstance(command, Smoke):
            return run_sweep(command, "smoke", line)
        if isinstance(command, Datasets):
            return run_datasets(command)
        if isinstance(command, Report):
            return rebuild_report(command)
        if isinstance(command, Compare):
            return run_compare(command)
        if isinstance(command, Sizes):
            return report_sizes(command.algos_dir)
        if isinstance(command, Harness):
            return write_harness(command.algos_dir, command.check)
        if isinstance(command, Speed):
            from . import speed  # tensorboard only for this subcommand

            options = speed.Options(
                command.device, command.steps, command.threads, command.budget_s
            )
            return speed.measure(
                command.files,
                command.compile,
                command.against,
                command.repeats,
                options,
                command.algos_dir,
                command.out,
            )
        if isinstance(command, Equivalence):
            from . import equivalence

            zoo = load_zoo(command.zoo, command.algos_dir)
            equivalence.check_patterns(command.preset, zoo)
            options = equivalence.Options(
                command.workers, command.keep, command.out, command.timeout_scale, line
            )
            return equivalence.equivalence(
                command.against, select(zoo, command), zoo, command.algos_dir, options
            )
        update_readme(
            command.readme,
            command.results_dir,
            load_zoo(command.zoo, command.algos_dir),
            command.algos_dir,
        )
        print(f"updated {command.readme}")
        return 0
    except ZooError as e:
        print(f"benchmark: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
