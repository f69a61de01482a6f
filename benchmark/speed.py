"""`python -m benchmark speed`: steady-state environment steps per second of each algorithm file
(or the ones named), eager and compiled (`--compile`), optionally beside the same files at another
commit, on one device.

Each file runs one fixed short command (SPECS: its usual environment at the file's defaults, one
seed, one final evaluation episode, no periodic evaluation or checkpoint, a run folder in a temporary
directory) for `warmup` + `steps` environment steps. The rate is taken from the run's own TensorBoard
events: every scalar event carries the wall time at which it was logged, so the events give a
timeline of (step, time) points, and the steady rate is the steps between the first point at or past
`warmup` and the last point, over the time between them:

    rate = (step_last - step_first) / (time_last - time_first)

`warmup` lies past the file's `--learning-starts` and its first updates, so start-up (imports,
environments), the random-action phase and torch.compile's compilation (tens of seconds, on the first
calls) fall before the first point and are left out, whatever they cost; the final evaluation and
checkpoint come after the last point. summary.json's `sps`, which counts from the loop's start and so
includes compilation, is not used. Reading the events needs no change to the files and no parsing of
their progress lines, and the points come every 100-1,000 steps (losses, episodes, charts/SPS).

With `--against COMMIT` the same runs use the files as they were at COMMIT, from a git worktree in a
temporary folder (removed afterwards). A is the working tree (uncommitted changes included), B the
commit; per round, per file and per mode, A runs and then B (A B A B over `--repeats` rounds), and
the table gives each configuration's median. A file whose source declares no `compile` option (a
tyro field `compile: bool` or an argparse "--compile") has no compiled run on that side: "n/a".

Rounds are the outer loop, so a call cut short by `--budget-s` (no run starts, and a running one is
stopped, once it is spent) still holds a first round of every file. At the default step counts one
round of the eight files, eager and compiled, is meant to fit about ten minutes on one GPU (figures on
an H100: ppo_atari ~2,400 steps/s, dqn_atari ~500, rlpd ~10 at UTD 20 before its speed-up).
"""

from __future__ import annotations

import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from .events import timeline
from .manifest import ZooError
from .runner import write_json

Compile = Literal["off", "on", "both"]
MIN_START_S = 15.0  # with less of the budget left, a run is not started


@dataclass(frozen=True)
class Spec:
    """One file's fixed speed run."""

    flags: tuple[str, ...]
    """Environment and any flag the short run needs (a small --learning-starts)."""
    warmup: int
    """Env steps left out: past --learning-starts and the first updates (and compilation)."""
    steps: int
    """Env steps measured after the warm-up, at --steps 1."""
    unit: int = 1
    """Env steps per iteration (num_envs * num_steps): the budgets are whole iterations."""


ATARI = ("--env-id", "BreakoutNoFrameskip-v4")
SPECS: dict[str, Spec] = {
    "ppo_atari": Spec(ATARI, warmup=3 * 1024, steps=10 * 1024, unit=1024),
    "recurrent_ppo_atari": Spec(ATARI, warmup=3 * 1024, steps=6 * 1024, unit=1024),
    "dqn_atari": Spec((*ATARI, "--learning-starts", "1000"), warmup=1_500, steps=2_500),
    "appo": Spec(("--env-id", "CartPole-v1"), warmup=2 * 2048, steps=8 * 2048, unit=2048),
    # PPG: 8 policy iterations of 256 steps, then an auxiliary phase; warm-up: two phases.
    "ppg": Spec(("--env-id", "CartPole-v1"), warmup=2 * 2048, steps=4 * 2048, unit=256),
    "d4pg": Spec(("--env-id", "Pendulum-v1"), warmup=1_500, steps=2_000),
    "naf": Spec(("--env-id", "Pendulum-v1"), warmup=1_500, steps=2_000),
    "rlpd": Spec(
        ("--env-id", "Pendulum-v1", "--offline-ratio", "0", "--learning-starts", "300"),
        warmup=400,
        steps=200,
    ),
}
COMMON = (
    "--seed",
    "1",
    "--eval-episodes",
    "1",
    "--eval-interval",
    "0",
    "--checkpoint-interval",
    "0",
)


@dataclass(frozen=True)
class Side:
    """The files one column measures: A, the working tree, or B, a commit's worktree."""

    name: str
    label: str
    algos_dir: Path


@dataclass
class Run:
    file: str
    mode: str
    side: str
    round: int
    status: str
    """ok, failed, n/a (no compile option), missing (no such file), skipped or cut (budget)."""
    steps_per_s: float | None = None
    measured_steps: int | None = None
    measured_s: float | None = None
    total_steps: int | None = None
    wall_s: float | None = None
    error: str | None = None


# --- the measurement ------------------------------------------------------------------------


def steady_rate(points: list[tuple[int, float]], warmup: int) -> tuple[float, int, float]:
    """Steps per second between the first (step, time) point at or past `warmup` and the last one;
    also the steps and seconds that rate spans."""
    after = sorted(p for p in points if p[0] >= warmup)
    if len(after) < 2 or after[-1][0] == after[0][0] or after[-1][1] <= after[0][1]:
        raise ZooError(
            f"fewer than two logged points after the warm-up of {warmup:,} steps "
            f"({len(after)} of {len(points)}); raise --steps"
        )
    (step0, time0), (step1, time1) = after[0], after[-1]
    return (step1 - step0) / (time1 - time0), step1 - step0, time1 - time0


def budget(spec: Spec, scale: float) -> tuple[int, int]:
    """(warm-up, total steps) of a run at --steps `scale`, in whole iterations."""
    warmup = math.ceil(spec.warmup / spec.unit) * spec.unit
    measured = max(1, math.ceil(spec.steps * scale / spec.unit)) * spec.unit
    return warmup, warmup + measured


def has_compile_flag(script: Path) -> bool:
    """Whether the file declares --compile (a tyro field `compile: bool` or an argparse flag)."""
    text = script.read_text()
    return bool(re.search(r"^\s+compile: bool\b|[\"']--compile[\"']", text, flags=re.M))


def command(
    script: Path, spec: Spec, total: int, device: str, compiled: bool, run_dir: Path
) -> list[str]:
    flags = [*spec.flags, "--total-steps", str(total), *COMMON, "--device", device]
    return [sys.executable, str(script), *flags, "--run-dir", str(run_dir)] + (
        ["--compile"] if compiled else []
    )


def run_process(argv: list[str], cwd: Path, env: dict, log: Path, timeout_s: float) -> int | None:
    """The exit status, or None when it ran past `timeout_s` (its process group is then ended)."""
    with log.open("w") as out:
        # Its own process group (to end it whole), not its own session: on Linux a new session is
        # a new scheduler autogroup, which takes an equal share of the CPU beside every other
        # group, so niced background jobs would slow the timed run several-fold.
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=os.setpgrp
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        except BaseException:  # Ctrl-C, or SIGTERM (made SystemExit below): no run left behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


def tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(text[-lines:]) or "no output"


def run_one(
    name: str, spec: Spec, side: Side, mode: str, round_: int, options: Options, timeout_s: float
) -> Run:
    """One timed run of `name` on `side` in `mode` ('eager' or 'compiled')."""
    run = Run(name, mode, side.name, round_, "ok")
    script = side.algos_dir / f"{name}.py"
    if not script.is_file():
        run.status, run.error = "missing", f"no {script.name} on side {side.name}"
        return run
    if mode == "compiled" and not has_compile_flag(script):
        run.status, run.error = "n/a", f"{script.name} has no --compile on side {side.name}"
        return run
    warmup, run.total_steps = budget(spec, options.steps)
    with tempfile.TemporaryDirectory(prefix=f"speed-{name}-") as tmp:
        run_dir, log = Path(tmp) / "run", Path(tmp) / "log.txt"
        argv = command(script, spec, run.total_steps, options.device, mode == "compiled", run_dir)
        start = time.monotonic()
        code = run_process(argv, side.algos_dir.parent, options.env(), log, timeout_s)
        run.wall_s = round(time.monotonic() - start, 2)
        if code is None:
            run.status, run.error = "cut", f"stopped at the budget after {run.wall_s:.0f} s"
        elif code != 0 or not (run_dir / "summary.json").exists():
            run.status, run.error = "failed", f"exit {code}: {tail(log)}"
        else:
            try:
                rate, steps, seconds = steady_rate(timeline(run_dir), warmup)
            except ZooError as e:
                run.status, run.error = "failed", str(e)
            else:
                run.steps_per_s, run.measured_steps = rate, steps
                run.measured_s = round(seconds, 3)
    return run


# --- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    device: str = "cpu"
    steps: float = 1.0
    threads: int | None = None
    budget_s: float = 570.0

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.threads)
        return env


def choose(files: tuple[str, ...], specs: dict[str, Spec]) -> list[str]:
    unknown = [f for f in files if f.removesuffix(".py") not in specs]
    if unknown:
        raise ZooError(
            f"--files: no speed run for {', '.join(unknown)}; choose from {', '.join(specs)}"
        )
    return [f.removesuffix(".py") for f in files] if files else list(specs)


def modes_for(compile_: Compile) -> list[str]:
    return {"off": ["eager"], "on": ["compiled"], "both": ["eager", "compiled"]}[compile_]


def plan(
    files: list[str], modes: list[str], sides: list[Side], repeats: int
) -> list[tuple[int, str, str, Side]]:
    """(round, file, mode, side): rounds outermost, then files, modes, and A then B."""
    return [
        (r, f, m, s) for r in range(1, repeats + 1) for f in files for m in modes for s in sides
    ]


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ZooError(f"git {' '.join(args)}: {proc.stderr.strip() or 'failed'}")
    return proc.stdout.strip()


def resolve(repo: Path, commit: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ZooError(f"--against {commit}: not a commit of the repository at {repo}")
    return proc.stdout.strip()


def working_tree_label(algos_dir: Path) -> str:
    head = git(algos_dir, "rev-parse", "--short", "HEAD")
    changed = git(algos_dir, "status", "--porcelain", "--", ".")
    return f"working tree at {head}" + (
        ", with uncommitted changes to the files" if changed else ""
    )


@contextmanager
def worktree(repo: Path, sha: str) -> Iterator[Path]:
    """A detached worktree of `sha` in a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="speed-against-") as tmp:
        path = Path(tmp) / "tree"
        git(repo, "worktree", "add", "--detach", "--quiet", str(path), sha)
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(path)],
                capture_output=True,
            )
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


# --- the report -------------------------------------------------------------------------------


def median_rate(runs: list[Run], file: str, mode: str, side: str) -> float | str | None:
    """The median of the ok runs; 'n/a' where the side has no such run; None where none is ok."""
    mine = [r for r in runs if (r.file, r.mode, r.side) == (file, mode, side)]
    rates = [r.steps_per_s for r in mine if r.status == "ok" and r.steps_per_s is not None]
    if rates:
        return statistics.median(rates)
    if mine and all(r.status in ("n/a", "missing") for r in mine):
        return "n/a"
    return None


def ratio(a: float | str | None, b: float | str | None) -> float | str | None:
    if isinstance(a, float | int) and isinstance(b, float | int) and b > 0:
        return a / b
    return "n/a" if "n/a" in (a, b) else None


def rows(runs: list[Run], files: list[str], modes: list[str], sides: list[Side]) -> list[dict]:
    """Per file and mode: each side's median, A/B, and compiled/eager per side."""
    out = []
    for file in files:
        for mode in modes:
            row: dict = {"file": file, "mode": mode}
            for side in sides:
                row[side.name] = median_rate(runs, file, mode, side.name)
                if mode == "compiled" and "eager" in modes:
                    eager = median_rate(runs, file, "eager", side.name)
                    row[f"{side.name} compiled/eager"] = ratio(row[side.name], eager)
            if len(sides) == 2:
                row["A/B"] = ratio(row["A"], row["B"])
            out.append(row)
    return out


def cell(value: float | str | None, ratio_: bool) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.2f}x" if ratio_ else f"{value:,.1f}"


def table(table_rows: list[dict], sides: list[Side]) -> str:
    names = [s.name for s in sides]
    columns = ["file", "mode", *[f"{n} steps/s" for n in names]]
    keys = ["file", "mode", *names]
    if len(sides) == 2:
        columns.append("A/B")
        keys.append("A/B")
    for n in names:
        if any(f"{n} compiled/eager" in row for row in table_rows):  # with --compile both
            columns.append(f"{n} compiled/eager")
            keys.append(f"{n} compiled/eager")
    lines = [columns]
    for row in table_rows:
        lines.append(
            [
                cell(row.get(k), ratio_="/" in k) if k not in ("file", "mode") else row[k]
                for k in keys
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


# --- the command ------------------------------------------------------------------------------


def measure(
    files: tuple[str, ...],
    compile_: Compile,
    against: str | None,
    repeats: int,
    options: Options,
    algos_dir: Path = Path("algos"),
    out: Path | None = None,
    specs: dict[str, Spec] | None = None,
) -> int:
    """Run the plan, print each run as it ends and then the table; 1 when a run failed."""
    specs = SPECS if specs is None else specs
    chosen = choose(files, specs)
    if repeats < 1 or options.steps <= 0 or options.budget_s <= 0 or (options.threads or 1) < 1:
        raise ZooError("--repeats, --steps, --budget-s and --threads must be positive")
    missing = [f for f in chosen if not (algos_dir / f"{f}.py").is_file()]
    if missing:
        raise ZooError(f"no {', '.join(f + '.py' for f in missing)} in {algos_dir}")
    repo = Path(git(algos_dir, "rev-parse", "--show-toplevel")) if against else algos_dir
    sha = resolve(repo, against) if against else None
    a = Side("A", working_tree_label(algos_dir) if against else "working tree", algos_dir.resolve())
    with terminate_unwinds():
        if sha is None:
            return _measure([a], chosen, compile_, repeats, options, out, specs)
        inside = algos_dir.resolve().relative_to(repo.resolve())
        with worktree(repo, sha) as tree:
            b = Side("B", f"commit {sha[:10]}", tree / inside)
            return _measure([a, b], chosen, compile_, repeats, options, out, specs)


@contextmanager
def terminate_unwinds() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C: the running file's process group is killed and the worktree
    removed, instead of leaving a run behind that would disturb the next measurement."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure(
    sides: list[Side],
    files: list[str],
    compile_: Compile,
    repeats: int,
    options: Options,
    out: Path | None,
    specs: dict[str, Spec],
) -> int:
    modes, start = modes_for(compile_), time.monotonic()
    todo, runs = plan(files, modes, sides, repeats), []
    for side in sides:
        print(f"{side.name}: {side.label}", flush=True)
    print(
        f"device {options.device}, OMP_NUM_THREADS "
        f"{options.threads if options.threads is not None else os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"--steps {options.steps:g}, {len(todo)} runs, budget {options.budget_s:.0f} s",
        flush=True,
    )
    for i, (round_, file, mode, side) in enumerate(todo, 1):
        left = options.budget_s - (time.monotonic() - start)
        if left < MIN_START_S:
            run = Run(file, mode, side.name, round_, "skipped", error="budget spent")
        else:
            run = run_one(file, specs[file], side, mode, round_, options, left)
        runs.append(run)
        print(f"[{i}/{len(todo)} {time.monotonic() - start:.0f}s] {describe(run)}", flush=True)
    table_rows = rows(runs, files, modes, sides)
    print(table(table_rows, sides))
    if out is not None:
        record = {
            "sides": [{"name": s.name, "label": s.label} for s in sides],
            "options": asdict(options),
            "runs": [asdict(r) for r in runs],
            "table": table_rows,
        }
        write_json(out, record)
        print(f"wrote {out}")
    return 1 if any(r.status in ("failed", "cut") for r in runs) else 0


def describe(run: Run) -> str:
    what = f"{run.file} {run.mode} {run.side} round {run.round}"
    if run.status != "ok":
        return f"{what}: {run.status} ({run.error})"
    return (
        f"{what}: {run.steps_per_s:,.1f} steps/s ({run.measured_steps:,} steps in "
        f"{run.measured_s:.1f} s; run {run.wall_s:.0f} s for {run.total_steps:,} steps)"
    )
