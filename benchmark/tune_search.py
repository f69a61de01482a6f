"""Running a study's trials (`python -m benchmark tune`, benchmark/tune.py): its Optuna storage,
the worker processes that share it, each trial's runs through the runner's backends, the
intermediate values read from the runs' event files for the pruner, and the driver's progress lines.

A trial samples the searched flags and runs every preset of the study with them on seeds 1..S at
the trial budget, exactly as a sweep runs a preset (the same command, backends and run records),
and scores the IQM of its runs' final evaluations (benchmark/tune_space.py, StudyDef). While the
runs go, each run's `eval/episodic_return` points are read from its event files (again each time
it has gone READ_EVERY of its budget further) and the trial reports the IQM at every step all its
runs have evaluated; when the pruner stops the trial, its runs get SIGTERM. A finished trial
reports the rest of its curve, so that later trials are judged at every step. A run that fails
fails its trial. Both are recorded with why (the trial's `reason`).

Trials run in worker processes that share the storage (a journal file; an RDB URL shares it
between machines, with heartbeats that fail the trials of a process that died). Ctrl-C or SIGTERM
stops a worker's runs and records its trial as `interrupted`, which does not count towards the
study's trials; a trial whose process was killed outright is recorded so by the next invocation
on the same host.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import multiprocessing
import os
import platform
import shutil
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from .backends import Callbacks, Machine, run_local, run_ray
from .events import read_scalars
from .manifest import ZooError
from .progress import duration
from .runner import KILL_GRACE_S, Job, relative
from .tune_space import Param, StudyDef

EVAL_TAG = "eval/episodic_return"
HEARTBEAT_S, GRACE_S = 60, 300  # RDB storage: a trial silent for GRACE_S is failed as stale
MONITOR_POLL_S = 2.0
READ_EVERY = 0.05  # a running run's events are read again after this share of its budget


class TrialFailed(Exception):
    """A run of the trial failed (its reason is the trial's `reason`)."""


class Pruned(optuna.TrialPruned):
    """The pruner stopped the trial (its reason is the trial's `reason`)."""


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An RDB URL (with heartbeats, so a trial whose process died is failed), or a journal file."""
    try:
        if "://" in url:
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
            )
        Path(url).parent.mkdir(parents=True, exist_ok=True)
        backend = optuna.storages.journal.JournalFileBackend(url)
        return optuna.storages.JournalStorage(backend)
    except Exception as e:  # noqa: BLE001  # sqlalchemy's and the file system's errors alike
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ZooError(f"--study-storage {shown(url)}: cannot be opened: {first}") from None


def shown(url: str) -> str:
    """A storage URL as printed and recorded: an RDB URL without its password."""
    if "://" not in url:
        return url
    from sqlalchemy.engine import make_url  # optuna's RDB storage is SQLAlchemy's

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001  # not a URL SQLAlchemy reads: say only its scheme
        return url.split("://", 1)[0] + "://..."


def open_study(study: StudyDef, storage: optuna.storages.BaseStorage, url: str) -> optuna.Study:
    """Create the study, or load it and refuse another definition under its name."""
    opened = optuna.create_study(
        study_name=study.name, storage=storage, direction="maximize", load_if_exists=True
    )
    mine = json_copy(study.definition())
    stored = opened.user_attrs.get("definition")
    if stored is None:
        opened.set_user_attr("definition", mine)
    elif stored != mine:
        changed = [key for key in mine if stored.get(key) != mine[key]]
        if "space" in changed:
            flags = {*stored["space"], *mine["space"]}
            changed += [f for f in sorted(flags) if stored["space"].get(f) != mine["space"].get(f)]
        raise ZooError(
            f"study '{study.name}' in {shown(url)} was run with another definition ({', '.join(changed)} "
            "differ); choose another --name, or restore the presets and space it ran"
        )
    return opened


def json_copy(data: Any) -> Any:
    """`data` as a storage gives it back (tuples as lists)."""
    return json.loads(json.dumps(data))


def counted(trials: list[FrozenTrial]) -> int:
    """Trials that count towards --trials: ended (an interrupted one does not), or running."""
    return sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        or (
            t.state == TrialState.FAIL
            and "reason" in t.user_attrs
            and "interrupted" not in t.user_attrs
        )
        for t in trials
    )


def fail_lost_trials(study: optuna.Study) -> None:
    """Record as interrupted the running trials of this host whose process is gone (killed
    before it could record the interruption)."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        host, _, pid = trial.user_attrs.get("worker", "").rpartition(":")
        if host == platform.node() and pid.isdigit() and not _alive(int(pid)):
            for key, value in (("reason", "interrupted: its process is gone"), ("interrupted", 1)):
                study._storage.set_trial_user_attr(trial._trial_id, key, value)
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@dataclass(frozen=True)
class Backend:
    """Where a study's runs execute (the runner's backends) and this process's share of it."""

    kind: str
    algos_dir: Path
    cpus: int
    memory_gb: float
    gpus: tuple[float, ...] = ()
    ray_address: str | None = None
    storage: str | None = None  # Ray: the runs' storage for this study
    requirements: Path | None = None
    sync_s: float = 60.0

    def run(self, jobs: list[Job], calls: Callbacks) -> None:
        if self.kind == "ray":
            run_ray(
                jobs,
                address=self.ray_address,
                local_cpus=self.cpus,
                algos_dir=self.algos_dir,
                repo=self.algos_dir,
                storage=self.storage,
                requirements=self.requirements,
                sync_s=self.sync_s,
                calls=calls,
            )
        else:
            run_local(
                jobs, Machine(self.cpus, self.memory_gb, list(self.gpus)), self.algos_dir, calls
            )

    def events_folder(self, job: Job) -> Path | None:
        """Where a running run's event files can be read: its folder; with Ray, its copy in a
        storage folder (as run_ray names it), and nowhere without one or for a URI."""
        if self.kind != "ray":
            return job.run_dir
        root = self.events_folder_root()
        return root and root / job.run_dir.parent.parent.name / job.preset.name / f"seed{job.seed}"

    def events_folder_root(self) -> Path | None:
        """Ray: the storage folder the runs are copied to while they run (None for a URI)."""
        if self.storage is None or "://" in self.storage:
            return None
        return Path(self.storage).resolve()


def share(backend: Backend, index: int, processes: int) -> Backend:
    """Worker process `index`'s part of the machine: its CPUs and memory, and every
    `processes`-th GPU (a Ray cluster is shared by its own scheduler)."""
    if processes == 1 or backend.kind == "ray":
        return backend
    return replace(
        backend,
        cpus=backend.cpus // processes,
        memory_gb=backend.memory_gb / processes,
        gpus=tuple(g if i % processes == index else 0.0 for i, g in enumerate(backend.gpus)),
    )


@dataclass(frozen=True)
class Search:
    """What each worker process needs to run trials."""

    study: StudyDef
    storage: str
    trials: int
    sampler: str
    seed: int
    pruner: str
    startup_trials: int
    backend: Backend
    timeout_scale: float
    processes: int = 1


class Watcher:
    """A trial's intermediate values, from its runs' event files as they are written (read
    again when a run has gone READ_EVERY of its budget further), and the pruner's decision."""

    def __init__(self, search: Search, trial: optuna.Trial, jobs: list[Job]):
        self.search, self.trial, self.jobs = search, trial, jobs
        self.curves: dict[str, list] = {}
        self.read_at: dict[str, float] = {}
        self.last_step = -1
        self.reason: str | None = None
        self.lock = threading.Lock()

    def progressed(self, job: Job, progress: tuple[int, int] | None) -> None:
        with self.lock:
            if self.reason is not None:
                raise Pruned(self.reason)
            folder = self.search.backend.events_folder(job)
            if progress is None or folder is None:
                return
            if progress[0] - self.read_at.get(job.key, -math.inf) < READ_EVERY * progress[1]:
                return
            self.read_at[job.key] = progress[0]
            self.curves[job.key] = read_scalars(folder, [EVAL_TAG])[EVAL_TAG]
            new = self._report()
            if new and self.trial.should_prune():
                step, value = new[-1]
                pruner = {"halving": "successive halving"}.get(self.search.pruner, "median")
                self.reason = (
                    f"pruned at step {step:,}: IQM {value:.4g}, below the {pruner} pruner's cut"
                )
                self.trial.set_user_attr("reason", self.reason)
                raise Pruned(self.reason)

    def _report(self) -> list[tuple[int, float]]:
        """Report the intermediate values at the steps not reported yet; return them."""
        new = [
            (step, value)
            for step, value in self.search.study.intermediate(self.jobs, self.curves)
            if step > self.last_step
        ]
        for step, value in new:
            self.trial.report(value, step)
            self.last_step = step
        return new

    def finish(self, records: list[dict[str, Any]]) -> None:
        """Report the rest of the finished runs' curves: later trials are judged at every step."""
        self.curves = {f"{r['preset']}/seed{r['seed']}": r["curves"]["eval"] for r in records}
        self._report()


def _suggest(trial: optuna.Trial, flag: str, p: Param) -> Any:
    if p.kind == "choice":
        return trial.suggest_categorical(flag, list(p.choices))
    if p.kind == "int":
        return trial.suggest_int(flag, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(flag, p.low, p.high, step=p.step, log=p.log)


def _objective(search: Search, trial: optuna.Trial) -> float:
    study = search.study
    params = {flag: _suggest(trial, flag, p) for flag, p in study.searched.items()}
    folder = study.folder / f"trial{trial.number:04d}"
    trial.set_user_attr("worker", f"{platform.node()}:{os.getpid()}")
    trial.set_user_attr("runs", relative(folder))
    if folder.exists():  # left by an earlier study of this name whose storage is gone
        shutil.rmtree(folder)
    jobs = study.trial_jobs({**study.fixed, **params}, folder, search.timeout_scale)
    watcher, records = Watcher(search, trial, jobs), []
    try:
        search.backend.run(
            jobs, Callbacks(lambda job, where: None, watcher.progressed, records.append)
        )
    except KeyboardInterrupt:
        trial.set_user_attr("reason", "interrupted")
        trial.set_user_attr("interrupted", 1)
        raise
    # in the runs' order (preset, then seed), not the order they happened to end in
    failed = sorted(
        (r for r in records if r["status"] != "ok"), key=lambda r: (r["preset"], r["seed"])
    )
    if failed:
        reason = "; ".join(f"{r['preset']} seed{r['seed']}: {r['reason']}" for r in failed)
        trial.set_user_attr("reason", reason)
        raise TrialFailed(reason)
    watcher.finish(records)
    scores: dict[str, list[float]] = {}
    for r in sorted(records, key=lambda r: (r["preset"], r["seed"])):
        scores.setdefault(r["preset"], []).append(r["summary"]["eval_mean"])
    trial.set_user_attr("scores", scores)
    trial.set_user_attr("reason", "")
    return study.objective(records)


def _sampler(search: Search, seed: int) -> optuna.samplers.BaseSampler:
    if search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # RL Zoo's choice (multivariate TPE); the constant liar keeps parallel workers apart.
    return optuna.samplers.TPESampler(
        n_startup_trials=search.startup_trials, multivariate=True, constant_liar=True, seed=seed
    )


def _pruner(search: Search) -> optuna.pruners.BasePruner:
    if search.pruner == "none":
        return optuna.pruners.NopPruner()
    if search.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    # RL Zoo's: no pruning in the first third of a run (its n_evaluations // 3).
    warmup = min(search.study.steps.values()) // 3
    return optuna.pruners.MedianPruner(
        n_startup_trials=search.startup_trials, n_warmup_steps=warmup
    )


def run_trials(search: Search, index: int = 0) -> None:
    """Run trials in this process until the study holds `search.trials` that count (with
    several processes it may hold up to one more per process, started at the same moment)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the driver prints each trial's end
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    search = replace(search, backend=share(search.backend, index, search.processes))
    study = optuna.load_study(study_name=search.study.name, storage=open_storage(search.storage))
    study.sampler = _sampler(search, search.seed + 1000 * index + len(study.trials))
    study.pruner = _pruner(search)
    objective = functools.partial(_objective, search)
    while counted(study.get_trials(deepcopy=False)) < search.trials:
        study.optimize(objective, n_trials=1, catch=(TrialFailed,))


def _interrupt_once(signum: int, frame: object) -> None:
    """Stop the worker once: a second signal must not cut short the recording of the first."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _worker(search: Search, index: int) -> None:
    if sys.platform == "linux":  # the driver's death reaches this process as SIGTERM
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    signal.signal(signal.SIGINT, _interrupt_once)
    signal.signal(signal.SIGTERM, _interrupt_once)
    try:
        run_trials(search, index)
    except KeyboardInterrupt:
        sys.exit(130)


def run_processes(search: Search, processes: int) -> None:
    """Run trials in `processes` worker processes; on Ctrl-C or SIGTERM, stop them with SIGTERM
    (each stops its trial's runs and records the trial as interrupted)."""
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_worker, args=(search, i), name=f"tune-worker-{i}")
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join()
    except BaseException:
        for worker in workers:
            if worker.is_alive():
                os.kill(worker.pid, signal.SIGTERM)
        for worker in workers:
            worker.join(KILL_GRACE_S + 15)
            if worker.is_alive():
                worker.kill()
                worker.join()
        raise
    failed = [f"{w.name} (status {w.exitcode})" for w in workers if w.exitcode != 0]
    if failed:
        raise ZooError(f"worker process(es) {', '.join(failed)} stopped; see their output above")


class Monitor:
    """The driver's progress lines: one per trial as it ends, and every `interval_s` the trials
    done, pruned and failed, the best so far and an ETA (the mean duration of the trials ended in
    this invocation, over the processes)."""

    def __init__(
        self,
        study: optuna.Study,
        trials: int,
        processes: int,
        interval_s: float,
        stream: TextIO | None = None,
    ):
        self.study, self.trials, self.processes = study, trials, processes
        self.interval_s = interval_s
        self.stream = stream or sys.stdout
        ended = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        self.seen = {t.number for t in ended}
        self.before = counted(ended)
        self.durations: list[float] = []
        self.start = time.monotonic()
        self.stopped = threading.Event()

    def trial_line(self, t: FrozenTrial) -> str:
        flags = ", ".join(f"{k}={_short(v)}" for k, v in t.params.items())
        if t.state == TrialState.COMPLETE:
            return f"trial {t.number} complete: {t.value:.4g} | {flags}"
        if t.state == TrialState.PRUNED:
            return f"trial {t.number} {t.user_attrs.get('reason', 'pruned')} | {flags}"
        return f"trial {t.number} FAILED: {t.user_attrs.get('reason') or 'no reason recorded'}"

    def line(self) -> str:
        trials = self.study.get_trials(deepcopy=False)
        states = [t.state for t in trials if "interrupted" not in t.user_attrs]
        done = counted(trials) - states.count(TrialState.RUNNING)
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        best = max(complete, key=lambda t: t.value, default=None)
        left = max(0, self.trials - done)
        eta = (
            duration(left * sum(self.durations) / len(self.durations) / self.processes)
            if self.durations
            else "?"
            if left
            else duration(0)
        )
        return (
            f"{done}/{self.trials} trials done ({states.count(TrialState.PRUNED)} pruned, "
            f"{states.count(TrialState.FAIL)} failed, {self.before} from before) | "
            f"{states.count(TrialState.RUNNING)} running | best "
            + (f"{best.value:.4g} (trial {best.number})" if best else "none yet")
            + f" | elapsed {duration(time.monotonic() - self.start)} | eta {eta}"
        )

    def poll(self) -> None:
        for t in self.study.get_trials(deepcopy=False):
            if t.state.is_finished() and t.number not in self.seen:
                self.seen.add(t.number)
                if t.datetime_start and t.datetime_complete and "interrupted" not in t.user_attrs:
                    self.durations.append((t.datetime_complete - t.datetime_start).total_seconds())
                self._print(self.trial_line(t))

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _tick(self) -> None:
        last = time.monotonic()
        while not self.stopped.wait(MONITOR_POLL_S):
            self.poll()
            if time.monotonic() - last >= self.interval_s:
                self._print(self.line())
                last = time.monotonic()

    def __enter__(self) -> Monitor:
        self.thread = threading.Thread(target=self._tick, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()
        self.poll()
        self._print(self.line())


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
