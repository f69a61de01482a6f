"""Runs: what to launch (jobs), how one run is executed and checked, and the sweep's records.

A sweep lives in `<runs_dir>/<sweep>/`: `sweep.json` (mode, budget scale, the commands
that ran it) and one folder per run, `<preset>/seed<k>/`, which is the algorithm's run
directory plus the runner's `benchmark.log` (the run's stdout and stderr) and `run.json`
(the record). A run whose `run.json` says "ok" is skipped when the sweep runs again. A run
that did not finish but left `checkpoints/latest.pt` (saved on SIGTERM at the time limit or
on Ctrl-C, or at a checkpoint interval) continues from it with `--resume`, appending to its
log; one without a checkpoint starts again from scratch. Each sweep invocation makes one
attempt per run, so a run that fails again after resuming is recorded, not retried in a loop.
Only the local backend resumes: the Ray backend leaves checkpoints on the worker.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .aggregate import crossing_step
from .manifest import ArgValue, Mode, Preset, ZooError, is_number

SUMMARY_KEYS = ("script", "env_id", "seed", "global_step", "eval_mean", "eval_std", "eval_episodes",
                "wall_time_s", "sps", "peak_rss_mb")
LOG_NAME, RECORD_NAME = "benchmark.log", "run.json"
LOG_TAIL_LINES = 40
CHECKPOINT = Path("checkpoints") / "latest.pt"  # in the run dir, the one a re-run resumes from
# At the time limit a run gets SIGTERM, then this long to save its checkpoint and exit before
# SIGKILL; a re-run of the sweep resumes from that checkpoint (local backend only). A save
# slower than this (dqn_atari's replay buffer of several GB) is cut off; the write is atomic,
# so the run then resumes from its previous checkpoint, or starts afresh when it had none.
KILL_GRACE_S = 30.0


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


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(_finite(data), indent=2, allow_nan=False) + "\n")


@dataclass(frozen=True)
class Job:
    preset: Preset
    seed: int
    total_steps: int
    timeout_s: float
    args: dict[str, ArgValue]
    required_tags: tuple[str, ...]
    run_dir: Path

    @property
    def key(self) -> str:
        return f"{self.preset.name}/seed{self.seed}"

    def argv(self, script: str | Path, run_dir: str | Path) -> list[str]:
        """The algorithm's command line, without the interpreter."""
        argv = [str(script), "--env-id", self.preset.env_id, "--seed", str(self.seed),
                "--total-steps", str(self.total_steps), "--run-dir", str(run_dir)]
        for flag, value in self.args.items():
            if isinstance(value, bool):
                argv.append(f"--{flag}" if value else f"--no-{flag}")
            elif isinstance(value, list):
                argv += [f"--{flag}", *map(str, value)]
            else:
                argv += [f"--{flag}", str(value)]
        return argv


def plan_jobs(presets: list[Preset], mode: Mode, sweep_dir: Path, *, seeds: int | None = None,
              steps_scale: float = 1.0, total_steps: int | None = None, timeout_scale: float = 1.0) -> list[Job]:
    """One job per preset and seed; smoke runs use one seed."""
    jobs = []
    for preset in presets:
        budget = preset.budget(mode)
        steps = total_steps or max(1, round(budget.total_steps * steps_scale))
        n_seeds = 1 if mode == "smoke" else seeds or budget.seeds
        for seed in range(1, n_seeds + 1):
            jobs.append(Job(
                preset=preset, seed=seed, total_steps=steps, timeout_s=budget.timeout_s * timeout_scale,
                args={**preset.args, **budget.args}, required_tags=budget.required_tags,
                run_dir=sweep_dir / preset.name / f"seed{seed}",
            ))
    return jobs


def open_sweep(sweep_dir: Path, mode: Mode, budget: dict[str, Any], command: str) -> None:
    """Create or reopen a sweep; refuse to mix budgets under one name."""
    path = sweep_dir / "sweep.json"
    meta = {"mode": mode, "budget": budget, "commands": []}
    if path.exists():
        old = json.loads(path.read_text())
        if (old["mode"], old["budget"]) != (mode, budget):
            raise ZooError(f"sweep '{sweep_dir.name}' was run as {old['mode']} with budget {old['budget']}, "
                           f"not {mode} with {budget}; choose another --name")
        meta = old
    meta["commands"].append(command)
    write_json(path, meta)


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


def execute(argv: list[str], cwd: Path, log_path: Path, timeout_s: float, threads: int) -> dict[str, Any]:
    """Run `python <argv>` in its own process group with stdout and stderr into `log_path`.

    At the time limit the group gets SIGTERM (the contract: save a checkpoint and exit),
    then SIGKILL after a grace period. The log is appended to, so that a resumed run keeps
    the output of its earlier attempts.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        with _running_lock:
            _running.add(proc)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        finally:
            with _running_lock:
                _running.discard(proc)
    return {"returncode": proc.returncode, "timed_out": timed_out,
            "wall_time_s": round(time.monotonic() - start, 2), "timeout_s": timeout_s}


def read_scalars(run_dir: Path, tags: list[str]) -> dict[str, list[tuple[int, float]]]:
    """The (step, value) series of every tag logged in a run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    logged = set(acc.Tags().get("scalars", []))
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] if tag in logged else [] for tag in tags}


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def make_record(job: Job, result: dict[str, Any], command: list[str], resumed: bool = False) -> dict[str, Any]:
    """Check what a finished run left behind and write its record (`run.json`); `resumed`:
    this attempt continued from an earlier attempt's checkpoint."""
    problems = [result["error"]] if result.get("error") else []
    if result["timed_out"]:
        problems.append(f"timed out after {result['timeout_s']:.0f} s")
    elif result["returncode"] not in (0, None):
        problems.append(f"exit status {result['returncode']}")
    summary_path = job.run_dir / "summary.json"
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
            problems.append(f"summary.json eval_mean is {summary['eval_mean']!r}, not a finite number")
    elif not problems:
        problems.append("no summary.json")
    curves_tags = sorted({*job.required_tags, "charts/episodic_return", "eval/episodic_return"})
    curves = read_scalars(job.run_dir, curves_tags)
    if not problems:
        absent = [tag for tag in job.required_tags if not curves[tag]]
        if absent:
            problems.append(f"no TensorBoard scalars for {', '.join(absent)}")
    preset = job.preset
    record = {
        "preset": preset.name, "algo": preset.algo, "env_id": preset.env_id, "seed": job.seed,
        "total_steps": job.total_steps, "status": "failed" if problems else "ok", "resumed": resumed,
        "reason": "; ".join(problems), "command": command, **result,
        "summary": {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}
                   | {"eval_returns": summary.get("eval_returns", [])},
        "crossing_step": None if preset.curve_threshold is None else crossing_step(
            curves["charts/episodic_return"], preset.curve_threshold, preset.curve_window),
        "curves": {"train": curves["charts/episodic_return"], "eval": curves["eval/episodic_return"]},
        "log_tail": log_tail(job.run_dir / LOG_NAME) if problems else "",
    }
    write_json(job.run_dir / RECORD_NAME, record)
    return record


def prepare_run_dir(job: Job, resume: bool = True) -> Path | None:
    """Ready the folder of a run that did not finish. With `resume` and a checkpoint there,
    keep the folder, drop the last attempt's summary and record (so the new record judges
    only this attempt), mark the log, and return the checkpoint to pass as `--resume`;
    otherwise empty the folder and return None."""
    ckpt = job.run_dir / CHECKPOINT
    if resume and ckpt.is_file():
        for name in ("summary.json", RECORD_NAME):
            (job.run_dir / name).unlink(missing_ok=True)
        with open(job.run_dir / LOG_NAME, "a") as log:
            log.write(f"\n--- resumed from {ckpt.resolve()} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
        return ckpt.resolve()
    if job.run_dir.exists():
        shutil.rmtree(job.run_dir)
    job.run_dir.mkdir(parents=True)
    return None


def load_records(sweep_dir: Path) -> list[dict[str, Any]]:
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/seed*/{RECORD_NAME}")]
    return sorted(records, key=lambda r: (r["preset"], r["seed"]))
