"""Helpers shared by the test modules: run an algorithm file by subprocess and
read what it left behind."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from benchmark.events import read_scalars

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"


def run_script(
    script: str | Path,
    *args: str,
    cwd: str | Path | None = None,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run `python <script> <args>` and return the finished process (text output).

    `script` is a file name in `algos/` or a path. Threads are capped at one
    so that parallel test workers do not fight over the two cores.
    """
    path = Path(script)
    if not path.is_absolute() and not path.exists():
        path = ALGOS / path
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(path), *args],
        cwd=str(cwd) if cwd else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def check_ok(proc: subprocess.CompletedProcess) -> None:
    """Fail with the process's output tail when it did not exit 0."""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-3000:]}"
    )


def check_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """The run stopped with a non-zero status and its last stderr line names every fragment."""
    assert proc.returncode != 0, f"expected failure, got exit 0\n{proc.stdout[-2000:]}"
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert lines, "no message on stderr"
    last = lines[-1]
    for fragment in fragments:
        assert fragment.lower() in last.lower(), f"{fragment!r} not in last stderr line: {last!r}"
    assert "Traceback" not in proc.stderr, (
        f"traceback instead of a one-line message:\n{proc.stderr[-2000:]}"
    )


def scalars(run_dir: str | Path, tag: str) -> list[tuple[int, float]]:
    """All (step, value) pairs logged under `tag` in a run's TensorBoard events, in order."""
    return read_scalars(run_dir, [tag])[tag]


def summary(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def copy_alone(script: str, dest: Path) -> Path:
    """Copy one algorithm file into an empty folder, as a user would."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / script
    shutil.copy(ALGOS / script, target)
    return target


@pytest.fixture
def tmp_run(tmp_path: Path) -> Path:
    return tmp_path / "run"


class FakeWandb(types.ModuleType):
    """Stands in for wandb (not installed here): records init (with the TensorBoard event files
    present at that moment, which must be none: wandb has to patch the writer before it exists)
    and finish with its exit code."""

    def __init__(self):
        super().__init__("wandb")
        self.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
        self.run, self.calls = None, []

    def init(self, **kwargs):
        self.calls.append(
            ("init", sorted(p.name for p in Path(kwargs["dir"]).glob("events.out.tfevents*")))
        )
        self.run = object()
        return self.run

    def finish(self, exit_code=0):
        self.calls.append(("finish", exit_code))
        self.run = None


@pytest.fixture
def fake_wandb(monkeypatch) -> FakeWandb:
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return fake


@pytest.fixture
def restore_signals():
    """In-process runs install SIGINT/SIGTERM handlers; put pytest's back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def check_eval_only_after_move(run: Path, eval_only, seed: int) -> None:
    """Copy a finished run's folder elsewhere, run `eval_only(checkpoint_path)` (the script's
    --eval-only) on the copied checkpoint, and check that eval.json lands beside the copy, not in
    the original folder, with the run's own seed (not --seed's default) and the same returns as
    the run's final evaluation."""
    moved = run.parent / "moved"
    shutil.copytree(run, moved)
    eval_only(str(moved / "checkpoints" / "latest.pt"))
    result = json.loads((moved / "eval.json").read_text())
    assert result["seed"] == seed
    assert result["eval_returns"] == summary(run)["eval_returns"]
    assert not (run / "eval.json").exists()


def sigterm_on_call(n: int, fn):
    """Wrap `fn` so that its n-th call first sends SIGTERM to this process (an in-process run's
    handler then sees it mid-loop). Returns the wrapper and the list that counts its calls."""
    calls: list[int] = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            signal.raise_signal(signal.SIGTERM)
        return fn(*args, **kwargs)

    return wrapper, calls


class ScriptedGames:
    """Fake Atari vector env for evaluation tests: at the steps in events[i], env i loses a life ("life"),
    ends its game ("term") or hits the time limit ("trunc"); 1 point per step; games that ended go on (as
    autoreset does) and may end again. It records the actions it is given; FIRE is action 1."""

    fire = 1

    def __init__(self, events, frame_stack=4):
        self.events, self.steps, self.actions = events, 0, []
        self.obs, self.lives = (
            np.zeros((len(events), frame_stack, 84, 84), np.uint8),
            np.full(len(events), 5),
        )
        self.single_action_space = types.SimpleNamespace(n=4)

    def reset(self, seed=None):
        return self.obs, {"lives": self.lives.copy()}

    def step(self, actions):
        self.steps += 1
        self.actions.append(actions.copy())
        kinds = [events.get(self.steps) for events in self.events]
        self.lives -= np.array([k == "life" for k in kinds])
        term, trunc = (
            np.array([k == "term" for k in kinds]),
            np.array([k == "trunc" for k in kinds]),
        )
        return (
            self.obs,
            np.ones(len(kinds)),
            term,
            trunc,
            {"lives": self.lives.copy(), "final_obs": self.obs},
        )

    def close(self):
        pass
