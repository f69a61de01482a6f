"""Runs: what to launch (jobs), how one run is executed and checked, and the sweep's records.

A sweep lives in `<runs_dir>/<sweep>/`: `sweep.json` (mode, budget scale, the commands
that ran it), `manifest.json` (the tables of the presets it ran, as they were: the report reads
targets and references from this copy, not from today's zoo) and one folder per run,
`<preset>/seed<k>/`, which is the algorithm's run directory plus the runner's `benchmark.log`
(the run's stdout and stderr), `attempts.json` (the code, host, wall time and peak memory of
each attempt that trained it) and `run.json` (the record, with its curves and provenance; a
resumed run's wall time is the sum of its attempts' and its peak memory their largest). A run
whose `run.json` says "ok" is skipped when the sweep runs again. A run that did not finish but
left `checkpoints/latest.pt` (saved on SIGTERM at the time limit or on Ctrl-C, or at a
checkpoint interval) continues from it with `--resume`, appending to its log; one without a
checkpoint starts again from scratch. Each sweep invocation makes one attempt per run, so a run
that fails again after resuming is recorded, not retried in a loop. Paths in commands and logs
are relative to the working directory (the repository), so records read the same on every clone.

Before its runs, a sweep builds the datasets its presets read (their `dataset` tables), each
distinct one once, in the driver process, with `benchmark.datasets` (which leaves a dataset made by
the same recipe as it is); its output goes to the sweep's `datasets.log`. A dataset that cannot be
built fails the runs of the presets that read it, with the maker's one-line message as the reason;
the other presets run.
"""

from __future__ import annotations

import io
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .aggregate import crossing_step
from .events import read_scalars
from .manifest import ArgValue, Dataset, Mode, Preset, ZooError, is_number

# What a run reports about itself; its wall time and peak memory the runner measures (execute).
SUMMARY_KEYS = (
    "script",
    "env_id",
    "seed",
    "global_step",
    "eval_mean",
    "eval_std",
    "eval_episodes",
    "sps",
)
LOG_NAME, RECORD_NAME, MANIFEST_NAME = "benchmark.log", "run.json", "manifest.json"
# In a run dir: the code and host of each attempt that trained it (a resumed run spans several).
ATTEMPTS_NAME = "attempts.json"
LOG_TAIL_LINES = 40
CHECKPOINT = Path("checkpoints") / "latest.pt"  # in the run dir, the one a re-run resumes from
# At the time limit a run gets SIGTERM, then this long to save its checkpoint and exit before
# SIGKILL; a re-run of the sweep resumes from that checkpoint. A save slower than this
# (dqn_atari's replay buffer of several GB) is cut off; the write is atomic, so the run then
# resumes from its previous checkpoint, or starts afresh when it had none.
KILL_GRACE_S = 30.0
POLL_S = 2.0  # how often a running run's log is read for its progress line
# The algorithms' progress line: "step 1,200/20,000 | ...".
PROGRESS_LINE = re.compile(rb"step ([\d,]+)/([\d,]+) \|")
# Started between the runner and the algorithm (Linux): the run gets SIGTERM (checkpoint and exit)
# when the thread that started it dies, so a killed runner or Ray worker leaves no training process
# behind (runs have their own session for the time limit's group kill, which takes them out of
# reach of the clean-up of Ray and of the terminal). The launcher forks the run from itself, a
# small process, and reaps it with os.wait4: the run's peak memory is then its own, not the
# runner's that a fork from the runner would count, and goes to the file named by argv[2]. The
# group's signals reach the run directly, so the launcher ignores them; its own parent's death
# reaches it as SIGUSR1, which it passes on as SIGTERM.
LAUNCHER = """
import ctypes, os, signal, sys
prctl = ctypes.CDLL(None).prctl
prctl(1, signal.SIGUSR1)
if os.getppid() != int(sys.argv[1]):
    sys.exit("benchmark: the runner exited before the run started")
pid = os.fork()
if pid == 0:
    prctl(1, signal.SIGTERM)
    os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
signal.signal(signal.SIGUSR1, lambda *_: os.kill(pid, signal.SIGTERM))
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[2], "w") as out:
    out.write(str(usage.ru_maxrss / 1024))
code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _finite(data: Any) -> Any:
    """NaN and infinities as null, so that the files stay strict JSON."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    write_atomic(path, json.dumps(_finite(data), indent=indent, allow_nan=False) + "\n")


def relative(path: str | Path) -> str:
    """`path` relative to the working directory (the repository), as records keep it."""
    return os.path.relpath(Path(path).resolve(), Path.cwd().resolve())


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Job:
    preset: Preset
    seed: int
    total_steps: int
    timeout_s: float
    args: dict[str, ArgValue]
    required_tags: tuple[str, ...]
    run_dir: Path
    memory_gb: float = 0

    @property
    def key(self) -> str:
        return f"{self.preset.name}/seed{self.seed}"

    def argv(self, script: str | Path, run_dir: str | Path) -> list[str]:
        """The algorithm's command line, without the interpreter."""
        argv = [
            str(script),
            "--env-id",
            self.preset.env_id,
            "--seed",
            str(self.seed),
            "--total-steps",
            str(self.total_steps),
            "--run-dir",
            str(run_dir),
        ]
        for flag, value in self.args.items():
            if isinstance(value, bool):
                argv.append(f"--{flag}" if value else f"--no-{flag}")
            elif isinstance(value, list):
                argv += [f"--{flag}", *map(str, value)]
            else:
                argv += [f"--{flag}", str(value)]
        return argv

    def command(self, resume: str | None = None) -> list[str]:
        """The command as records keep it: paths relative to the repository."""
        return self.argv(relative(self.preset.script), relative(self.run_dir)) + (
            ["--resume", resume] if resume else []
        )


def plan_jobs(
    presets: list[Preset],
    mode: Mode,
    sweep_dir: Path,
    *,
    seeds: int | None = None,
    steps_scale: float = 1.0,
    total_steps: int | None = None,
    timeout_scale: float = 1.0,
) -> list[Job]:
    """One job per preset and seed; smoke runs use one seed."""
    jobs = []
    for preset in presets:
        budget = preset.budget(mode)
        steps = total_steps or max(1, round(budget.total_steps * steps_scale))
        n_seeds = 1 if mode == "smoke" else seeds or budget.seeds
        for seed in range(1, n_seeds + 1):
            jobs.append(
                Job(
                    preset=preset,
                    seed=seed,
                    total_steps=steps,
                    timeout_s=budget.timeout_s * timeout_scale,
                    args={**preset.args, **budget.args},
                    required_tags=budget.required_tags,
                    run_dir=sweep_dir / preset.name / f"seed{seed}",
                    memory_gb=budget.memory_gb,
                )
            )
    return jobs


def _without_time_limits(table: dict[str, Any]) -> dict[str, Any]:
    return {
        k: {kk: vv for kk, vv in v.items() if kk != "timeout_s"} if k in ("smoke", "full") else v
        for k, v in table.items()
    }


def open_sweep(
    sweep_dir: Path, mode: Mode, budget: dict[str, Any], command: str, presets: list[Preset]
) -> None:
    """Create or reopen a sweep; refuse to mix budgets or preset definitions under one name.
    Keeps a copy of each preset's table (time limits may change between invocations)."""
    path, manifest_path = sweep_dir / "sweep.json", sweep_dir / MANIFEST_NAME
    meta = {"mode": mode, "budget": budget, "commands": []}
    manifest: dict[str, Any] = {}
    if path.exists():
        old = json.loads(path.read_text())
        if (old["mode"], old["budget"]) != (mode, budget):
            raise ZooError(
                f"sweep '{sweep_dir.name}' was run as {old['mode']} with budget {old['budget']}, "
                f"not {mode} with {budget}; choose another --name"
            )
        meta = old
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for preset in presets:
        if preset.name in manifest and _without_time_limits(
            manifest[preset.name]
        ) != _without_time_limits(preset.table):
            raise ZooError(
                f"zoo preset '{preset.name}' changed since sweep '{sweep_dir.name}' ran it; "
                "choose another --name (or restore the preset)"
            )
        manifest[preset.name] = preset.table
    meta["commands"].append(command)
    write_json(path, meta)
    write_json(manifest_path, manifest)


def _build_dataset(
    env_id: str, dataset: Dataset, algos_dir: Path, log: io.TextIOBase
) -> tuple[bool, str]:
    """(whether it is there, the maker's last line or its one-line failure), with its output in `log`."""
    from . import datasets  # Minari and Gymnasium only for sweeps that need a dataset

    args = datasets.Args(
        env_id=env_id,
        dataset_id=dataset.dataset_id,
        episodes=dataset.episodes,
        noise=dataset.noise,
        seed=dataset.seed,
        root=None if dataset.root is None else Path(dataset.root),
        checkpoint=None if dataset.checkpoint is None else Path(dataset.checkpoint),
        algos_dir=algos_dir,
    )
    out = io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(out):
            datasets.make_dataset(args)
        ok, line = True, (out.getvalue().strip().splitlines() or ["done"])[-1]
    except SystemExit as e:  # the maker's refusals: one line
        ok, line = False, str(e.code)
    except Exception as e:  # anything else: the traceback to the log, one line to the records
        out.write(traceback.format_exc())
        ok, line = False, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    log.write(out.getvalue() + ("" if ok else line + "\n"))
    return ok, line


def build_datasets(
    presets: list[Preset], algos_dir: Path, log_path: Path, *, ray: bool = False
) -> dict[str, str]:
    """Build each distinct dataset the presets read, once, in this process, appending the output to
    `log_path` and printing one line per dataset. Returns, per preset whose dataset is missing, the
    one-line reason its runs fail with. `ray`: the runs read the dataset on Ray workers, in folders
    of their own, where a relative root does not exist: refused without building."""
    needs: dict[tuple[str, Dataset], list[str]] = {}
    for preset in presets:
        if preset.dataset is not None:
            needs.setdefault((preset.env_id, preset.dataset), []).append(preset.name)
    failed: dict[str, str] = {}
    for (env_id, dataset), names in needs.items():
        where = ""
        if ray and dataset.root is not None and not Path(dataset.root).is_absolute():
            ok, line = (
                False,
                (
                    f"its root {dataset.root} is relative, and Ray runs execute in folders of their own; "
                    "give the dataset an absolute root on a folder every node mounts, or use --backend local"
                ),
            )
        else:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a") as log:
                log.write(
                    f"--- {dataset.command(env_id)} (for {', '.join(names)}) at {now()} ---\n"
                )
                ok, line = _build_dataset(env_id, dataset, algos_dir, log)
            where = f" (output in {relative(log_path)})"
        if ok:
            print(f"dataset {dataset.dataset_id} for {', '.join(names)}: {line}", flush=True)
        else:
            print(
                f"dataset {dataset.dataset_id} for {', '.join(names)} FAILED: {line}{where}",
                flush=True,
            )
            failed.update(
                (name, f"dataset {dataset.dataset_id} not built: {line}") for name in names
            )
    return failed


def finished_ok(job: Job) -> bool:
    path = job.run_dir / RECORD_NAME
    return path.exists() and json.loads(path.read_text()).get("status") == "ok"


_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


def stop_all() -> None:
    """SIGTERM every run this process started and that is still going (on Ctrl-C)."""
    with _running_lock:
        for proc in _running:
            _signal_group(proc, signal.SIGTERM)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's process group (checkpoint and exit), SIGKILL after the grace period."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def _peak_memory(path: Path) -> float | None:
    """The launcher's measurement of the run's peak resident memory in MB, if it made one."""
    try:
        return round(float(path.read_text()), 1)
    except (OSError, ValueError):
        return None
    finally:
        path.unlink(missing_ok=True)


def log_progress(log_path: Path) -> tuple[int, int] | None:
    """(step, total) of the last progress line in the end of a run's log, if any."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 8192))
            matches = PROGRESS_LINE.findall(log.read())
    except OSError:
        return None
    return (
        (int(matches[-1][0].replace(b",", b"")), int(matches[-1][1].replace(b",", b"")))
        if matches
        else None
    )


def execute(
    argv: list[str],
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    threads: int,
    env: dict[str, str] | None = None,
    on_poll: Callable[[tuple[int, int] | None], None] | None = None,
) -> dict[str, Any]:
    """Run `python <argv>` in its own process group with stdout and stderr into `log_path`,
    calling `on_poll` with its progress every POLL_S seconds.

    At the time limit, or when this thread is interrupted (Ctrl-C, a cancelled Ray task), the
    group gets SIGTERM (the contract: save a checkpoint and exit), then SIGKILL after a grace
    period. The log is appended to, so that a resumed run keeps the output of its earlier attempts.
    """
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    peak_file = log_path.with_name(f".{log_path.name}.peak_mb")
    launch = [sys.executable]
    if sys.platform == "linux":
        launch = [sys.executable, "-c", LAUNCHER, str(os.getpid()), str(peak_file)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*launch, *argv],
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        with _running_lock:
            _running.add(proc)
        timed_out = False
        try:
            while proc.poll() is None:
                left = start + timeout_s - time.monotonic()
                if left <= 0:
                    timed_out = True
                    _stop(proc)
                    break
                try:
                    proc.wait(timeout=min(POLL_S, left))
                except subprocess.TimeoutExpired:
                    if on_poll is not None:
                        on_poll(log_progress(log_path))
        except BaseException:
            _stop(proc)
            raise
        finally:
            with _running_lock:
                _running.discard(proc)
    return {
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "wall_time_s": round(time.monotonic() - start, 2),
        "peak_rss_mb": _peak_memory(peak_file),
        "timeout_s": timeout_s,
    }


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def check_run(job: Job, run_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """What a finished run left in `run_dir`: its status, summary and curves (the record
    without the runner's fields; on a Ray worker, `run_dir` is the worker's copy)."""
    problems = [result["error"]] if result.get("error") else []
    if result["timed_out"]:
        problems.append(f"timed out after {result['timeout_s']:.0f} s")
    elif result["returncode"] not in (0, None):
        problems.append(f"exit status {result['returncode']}")
    summary_path = run_dir / "summary.json"
    summary: dict[str, Any] = {}
    if summary_path.exists():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            problems.append("summary.json is not valid JSON")
        missing = [k for k in SUMMARY_KEYS if k not in summary]
        if missing:
            problems.append(f"summary.json lacks {', '.join(missing)}")
        elif not is_number(summary["eval_mean"]):
            problems.append(
                f"summary.json eval_mean is {summary['eval_mean']!r}, not a finite number"
            )
    elif not problems:
        problems.append("no summary.json")
    curves_tags = sorted({*job.required_tags, "charts/episodic_return", "eval/episodic_return"})
    curves = read_scalars(run_dir, curves_tags)
    if not problems:
        absent = [tag for tag in job.required_tags if not curves[tag]]
        if absent:
            problems.append(f"no TensorBoard scalars for {', '.join(absent)}")
    preset = job.preset
    return {
        "status": "failed" if problems else "ok",
        "reason": "; ".join(problems),
        **result,
        "summary": {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}
        | {"eval_returns": summary.get("eval_returns", [])},
        "crossing_step": None
        if preset.curve_threshold is None
        else crossing_step(
            curves["charts/episodic_return"], preset.curve_threshold, preset.curve_window
        ),
        "curves": {
            "train": curves["charts/episodic_return"],
            "eval": curves["eval/episodic_return"],
        },
        "log_tail": log_tail(run_dir / LOG_NAME) if problems else "",
    }


def start_attempt(run_dir: Path, code: dict[str, Any]) -> None:
    """Add this attempt (the code's version, this host, the time) to the run folder's list, which a
    resumed run keeps: a sweep resumed across commits continues runs that trained under both."""
    path = run_dir / ATTEMPTS_NAME
    attempts = json.loads(path.read_text()) if path.exists() else []
    write_json(path, [*attempts, {**code, "host": platform.node(), "started": now()}])


def end_attempt(run_dir: Path, result: dict[str, Any]) -> None:
    """Note in the run folder's list what `execute` measured of this (its last) attempt."""
    path = run_dir / ATTEMPTS_NAME
    attempts = json.loads(path.read_text())
    attempts[-1] |= {key: result.get(key) for key in ("wall_time_s", "peak_rss_mb")}
    write_json(path, attempts)


def _all_attempts(checked: dict[str, Any], earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """A resumed run's wall time over all its attempts (None when one of them did not note its
    own: it was killed, or ran before attempts noted it) and its peak memory over those that did;
    the last attempt's wall time stays as `attempt_wall_time_s`."""
    walls = [a.get("wall_time_s") for a in earlier] + [checked.get("wall_time_s")]
    peaks = [a.get("peak_rss_mb") for a in earlier] + [checked.get("peak_rss_mb")]
    return {
        **checked,
        "wall_time_s": None if None in walls else round(sum(walls), 2),  # type: ignore[arg-type]
        "attempt_wall_time_s": checked.get("wall_time_s"),
        "peak_rss_mb": max((m for m in peaks if m is not None), default=None),
    }


def make_record(
    job: Job,
    checked: dict[str, Any],
    command: list[str],
    provenance: dict[str, Any],
    resumed: bool = False,
) -> dict[str, Any]:
    """Write a run's record (`run.json`) from `check_run`'s result; `resumed`: this attempt
    continued from an earlier attempt's checkpoint; `provenance`: the code's version and the host's.
    A resumed run's provenance adds `earlier_attempts` (see `start_attempt`; None where the folder
    predates that list), and its wall time and peak memory count every attempt."""
    preset = job.preset
    if resumed:
        path = job.run_dir / ATTEMPTS_NAME
        attempts = json.loads(path.read_text()) if path.exists() else []
        provenance = {
            **provenance,
            "earlier_attempts": attempts[:-1] if len(attempts) > 1 else None,
        }
        checked = _all_attempts(checked, attempts[:-1] or [{}])
    record = {
        "preset": preset.name,
        "algo": preset.algo,
        "env_id": preset.env_id,
        "seed": job.seed,
        "total_steps": job.total_steps,
        "resumed": resumed,
        "command": command,
        **checked,
        "provenance": provenance,
    }
    write_json(job.run_dir / RECORD_NAME, record)
    return record


def prepare_run_dir(job: Job, resume: bool = True) -> str | None:
    """Ready the folder of a run that did not finish. With `resume` and a checkpoint there,
    keep the folder, drop the last attempt's summary and record (so the new record judges
    only this attempt), mark the log, and return the checkpoint (relative path) to pass as
    `--resume`; otherwise empty the folder and return None."""
    ckpt = job.run_dir / CHECKPOINT
    if resume and ckpt.is_file():
        for name in ("summary.json", RECORD_NAME):
            (job.run_dir / name).unlink(missing_ok=True)
        with open(job.run_dir / LOG_NAME, "a") as log:
            log.write(f"\n--- resumed from {relative(ckpt)} at {now()} ---\n")
        return relative(ckpt)
    if job.run_dir.exists():
        shutil.rmtree(job.run_dir)
    job.run_dir.mkdir(parents=True)
    return None


def load_records(sweep_dir: Path) -> list[dict[str, Any]]:
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/seed*/{RECORD_NAME}")]
    return sorted(records, key=lambda r: (r["preset"], r["seed"]))
