"""`python -m benchmark tune`: a hyperparameter search on Optuna whose winners are re-run on fresh
seeds beside the defaults.

A study tunes one preset, or several at once with one set of flags: their search spaces, and how a
trial runs and scores them, are benchmark/tune_space.py's; running the trials (worker processes
sharing an Optuna storage, the runner's backends, pruning on the runs' evaluation curves) is
benchmark/tune_search.py's; the validation and the outputs in results/tune-<name>/ are
benchmark/tune_report.py's. This module is the subcommand: its options, its dry run (the CPU time
a study would take), and the order of things: open the study (the same `--name` resumes it, and
cannot change what it searches), run trials until it holds `--trials`, re-run the best
`--top-k` and the defaults on fresh seeds, write the outputs. Ctrl-C or SIGTERM stops it as it
stops a sweep: the runs get SIGTERM, the study keeps every trial that ended, and the same command
resumes it.
"""

from __future__ import annotations

import math
import signal
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from .backends import physical_memory_gb
from .manifest import Preset, ZooError
from .progress import duration
from .report import collect
from .runner import relative
from .tune_report import validate, write_outputs
from .tune_search import (
    Backend,
    Monitor,
    Search,
    counted,
    fail_lost_trials,
    open_storage,
    open_study,
    run_processes,
    run_trials,
    shown,
)
from .tune_space import VALIDATION_SEED0, StudyDef, build_study


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _check(args: Any) -> None:
    if not (args.preset or args.algo or args.env):
        raise ZooError("name the presets to tune: --preset NAME (or --algo / --env patterns)")
    if min(args.trials, args.processes, args.workers) < 1 or args.timeout_scale <= 0:
        raise ZooError("--trials, --processes, --workers and --timeout-scale must be positive")
    if args.processes > args.workers:
        raise ZooError(
            f"--processes {args.processes} > --workers {args.workers}: a trial needs a CPU"
        )
    if args.top_k < 0 or args.startup_trials < 0 or (args.validation_seeds or 2) < 2:
        raise ZooError("--top-k and --startup-trials must be at least 0, --validation-seeds 2")
    if not 0 < args.level < 1:
        raise ZooError(f"--level {args.level}: must be between 0 and 1")
    if (args.memory_gb is not None and args.memory_gb <= 0) or args.sync_interval_s <= 0:
        raise ZooError("--memory-gb and --sync-interval-s must be positive")
    if args.backend == "ray" and args.processes > 1 and not args.ray_address:
        raise ZooError("--backend ray with several --processes needs --ray-address (one cluster)")


def _backend(args: Any, name: str, requirements: Path | None, gpus: int) -> Backend:
    return Backend(
        kind=args.backend,
        algos_dir=args.algos_dir,
        cpus=args.workers,
        memory_gb=args.memory_gb or physical_memory_gb(),
        gpus=(1.0,) * gpus,
        ray_address=args.ray_address,
        storage=f"{args.storage.rstrip('/')}/tune-{name}" if args.storage else None,
        requirements=requirements,
        sync_s=args.sync_interval_s,
    )


def _per_run(preset: Preset, steps: int, rates: dict[str, float], timeout_scale: float) -> float:
    """A run's estimated CPU seconds: the preset's measured time per step, else its time limit."""
    cpus = max(1, math.ceil(preset.num_cpus))
    return cpus * (
        rates[preset.name] * steps
        if preset.name in rates
        else preset.full.timeout_s * timeout_scale
    )


def dry_run(study: StudyDef, args: Any, rates: dict[str, float]) -> int:
    names = [p.name for p in study.presets]
    print(
        f"study {study.name} (dry run: nothing is started): {', '.join(names)}; a trial runs "
        f"seeds 1-{study.seeds} at "
        + ", ".join(f"{study.steps[n]:,}" for n in names)
        + f" steps; {args.trials} trials on {args.processes} process(es), then the best "
        f"{args.top_k} and the defaults on validation seeds from {VALIDATION_SEED0}"
    )
    for flag, p in study.space.items():
        print(f"  --{flag}: {p.describe()}")
    trial = sum(
        study.seeds * _per_run(p, study.steps[p.name], rates, args.timeout_scale)
        for p in study.presets
    )
    validation = (args.top_k + 1) * sum(
        (args.validation_seeds or p.full.seeds)
        * _per_run(p, p.full.total_steps, rates, args.timeout_scale)
        for p in study.presets
    )
    total = args.trials * trial + validation
    measured = sum(p.name in rates for p in study.presets)
    print(
        f"estimated CPU time: {total / 3600:,.1f} CPU-hours: {args.trials} trials of "
        f"{trial / 60:,.1f} CPU-min (none pruned, each at the defaults' speed, which sampled "
        "flags can change) and a validation of "
        f"{validation / 60:,.1f} CPU-min; about {duration(total / args.workers)} on --workers "
        f"{args.workers} (per run: the median time per step of committed sweeps for {measured} of "
        f"the {len(names)} presets, the time limit for the others)"
    )
    return 0


def run_tune(
    args: Any,
    presets: list[Preset],
    command: str,
    requirements: Path | None,
    rates: dict[str, float],
    gpus: int,
) -> int:
    """The `tune` subcommand (`args`: __main__.Tune; `rates`: seconds per step of presets'
    committed runs, for the dry run; `gpus`: this machine's)."""
    _check(args)
    name = args.name or f"{presets[0].name}-{datetime.now():%Y%m%d-%H%M}"
    study = build_study(presets, args.zoo, name, args.runs_dir)
    if gpus and any(p.num_gpus > gpus // args.processes for p in presets):
        raise ZooError(
            f"a preset asks for more GPUs than each of --processes {args.processes} gets"
        )
    backend = _backend(args, name, requirements, gpus)
    if args.dry_run:
        return dry_run(study, args, rates)
    if args.backend == "ray" and args.pruner != "none" and backend.events_folder_root() is None:
        print(
            "note: with Ray, trials are pruned on the runs' copies in --storage, a folder; "
            "without one no trial is pruned",
            flush=True,
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per study opened
    url = args.study_storage or relative(study.folder / "study.journal")
    opened = open_study(study, open_storage(url), url)
    # recorded before any trial runs, so that an invocation stopped midway is reported too
    commands = list(dict.fromkeys(opened.user_attrs.get("commands", []) + [command]))
    opened.set_user_attr("commands", commands)
    fail_lost_trials(opened)
    search = Search(
        study,
        url,
        args.trials,
        args.sampler,
        args.seed,
        args.pruner,
        args.startup_trials,
        backend,
        args.timeout_scale,
        args.processes,
    )
    print(
        f"study {name}: {counted(opened.get_trials(deepcopy=False))} of {args.trials} trials "
        f"done or running; runs in {relative(study.folder)}, storage {shown(url)} (re-run with --name "
        f"{name} to resume)",
        flush=True,
    )
    defaults, validations = None, []
    previous = signal.signal(signal.SIGTERM, _interrupt)  # as a sweep: stop, record, resume later
    try:
        with Monitor(opened, args.trials, args.processes, args.progress_interval_s):
            if args.processes == 1:
                run_trials(search)
            else:
                run_processes(search, args.processes)
        complete = [t for t in opened.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        best = sorted(complete, key=lambda t: -t.value)[: args.top_k]
        if best:
            options = {
                "timeout_scale": args.timeout_scale,
                "command": command,
                "interval_s": args.progress_interval_s,
                "level": args.level,
            }
            defaults_dir, validations = validate(
                study, best, args.validation_seeds, backend, options
            )
            defaults = collect(defaults_dir)
    except KeyboardInterrupt:
        print(f"interrupted; re-run with --name {name} to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = args.results_dir / f"tune-{name}"
    options = {
        "commands": commands,
        "sampler": _sampler_text(args),
        "pruner": _pruner_text(args, study),
        "storage": shown(url),
        "runs": relative(study.folder),
        "unvalidated": "No complete trial to validate."
        if not complete
        else "Not validated (--top-k 0).",
    }
    write_outputs(out, opened, study, options, defaults, validations)
    print(f"report: {out / 'report.md'}")
    for v in validations:
        print(f"trial {v.trial.number}: {v.verdict}")
    return 0 if complete else 1


def _sampler_text(args: Any) -> str:
    if args.sampler == "random":
        return f"random (seed {args.seed})"
    return (
        f"TPE (multivariate, constant liar for parallel trials; the first {args.startup_trials} "
        f"trials random; seed {args.seed} plus the worker's index and the trials before it)"
    )


def _pruner_text(args: Any, study: StudyDef) -> str:
    if args.pruner == "median":
        return (
            f"median (from trial {args.startup_trials}, not before step "
            f"{min(study.steps.values()) // 3:,}: a third of the trial budget)"
        )
    return {"halving": "successive halving (Optuna's defaults)", "none": "none"}[args.pruner]
