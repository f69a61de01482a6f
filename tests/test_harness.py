"""The run harness: the block from `# ===== run harness` to the line before
`if __name__ == "__main__":` of every file of algos/ is benchmark/run_harness.py's block, byte for
byte (`python -m benchmark harness` writes it), and `Run` checks, seeds, logs, evaluates and saves
as CONTRIBUTING.md says. These tests drive the source module; the copies are its text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import ALGOS, scalars

from benchmark import harness, run_harness, sizes
from benchmark.__main__ import main
from benchmark.run_harness import Run

MAIN = harness.MAIN
FILES = sorted(p.name for p in ALGOS.glob("*.py"))


@pytest.mark.parametrize("name", FILES)
def test_every_algorithm_file_has_the_source_harness(name):
    assert harness.file_block(ALGOS / name) == harness.source_block(), (
        f"the run harness of {name} differs from benchmark/run_harness.py's; edit the source, "
        "then run `python -m benchmark harness`"
    )


def test_the_comparison_detects_a_one_character_change(tmp_path):
    changed = tmp_path / "changed.py"
    changed.write_text((ALGOS / FILES[0]).read_text().replace("def every(", "def every_(", 1))
    assert harness.file_block(changed) != harness.source_block()


def fake_algorithm(harness_text: str) -> str:
    """An algorithm file whose harness block is `harness_text`."""
    return f'"""Doc."""\n\n\ndef train(args):\n    return 1\n\n\n{harness_text}{MAIN}\n    train(None)\n'


def test_the_harness_command_writes_the_source_into_every_file(tmp_path, capsys):
    """--check names each stale copy and exits 1; the command rewrites only the harness block;
    afterwards --check passes."""
    stale = "# ===== run harness: an older text\ndef every():\n    return 0\n\n\n"
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(fake_algorithm(stale))
    (tmp_path / "c.py").write_text(fake_algorithm(harness.source_block()))
    assert main(["harness", "--algos-dir", str(tmp_path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "a.py: harness differs" in out and "b.py: harness differs" in out and "c.py" not in out
    assert (tmp_path / "a.py").read_text() == fake_algorithm(stale)  # --check writes nothing
    assert main(["harness", "--algos-dir", str(tmp_path)]) == 0
    for name in ("a.py", "b.py", "c.py"):
        assert (tmp_path / name).read_text() == fake_algorithm(harness.source_block())
    assert main(["harness", "--algos-dir", str(tmp_path), "--check"]) == 0


def test_a_file_without_its_markers_is_refused(tmp_path):
    (tmp_path / "a.py").write_text('"""Doc."""\n\nx = 1\n')
    with pytest.raises(ValueError, match="expected one"):
        main(["harness", "--algos-dir", str(tmp_path)])


# A file whose sizes are counted by hand: docstring lines 1-3; outside it and the harness, code
# lines are 5 (import), 9 ("def f():"), 10 (its docstring), 11, 14, 15 and 22-23 (the main guard);
# comments, blank lines and the harness (lines 18-21) do not count.
SAMPLE = textwrap.dedent('''\
    """Doc.

    More."""

    import os
    # a comment line


    def f():
        """f."""
        return os.sep  # a trailing comment counts with its line


    def train(args):
        return f()


    # ===== run harness
    def harness_only():
        return 1

    if __name__ == "__main__":
        train(None)
    ''')


def test_sizes_counts_code_as_its_table_says(tmp_path):
    path = tmp_path / "ppg.py"
    path.write_text(SAMPLE)
    lines = SAMPLE.splitlines()
    code = [lines[i - 1] for i in (5, 9, 10, 11, 14, 15, 22, 23)]
    size = sizes.measure(path)
    assert (size.docstring_lines, size.code_lines, size.code_chars) == (3, 8, sum(map(len, code)))
    assert size.algorithm_chars == sum(map(len, code[:6]))  # up to the end of train()
    assert (size.train_lines, size.first_def_line, size.harness_lines) == (2, 9, 4)
    assert size.widest_line == len("    return os.sep  # a trailing comment counts with its line")
    assert size.counterpart == "ppg_procgen.py"


def test_main_guard_is_the_last_statement():
    for name in FILES:
        tail = (ALGOS / name).read_text().rstrip().splitlines()[-2:]
        assert tail == [MAIN, "    train(tyro.cli(Args))"], name


# Runs a file's module code up to the import of torch, prints OMP_WAIT_POLICY at that moment and
# leaves (torch itself is never loaded, so this is quick).
SPY = """
import importlib.abc, importlib.util, os, sys
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torch":
            print(os.environ.get("OMP_WAIT_POLICY"), flush=True)
            os._exit(0)
sys.meta_path.insert(0, Spy())
spec = importlib.util.spec_from_file_location("algo", sys.argv[1])
sys.modules["algo"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print("torch never imported")
"""


def omp_wait_policy_when_torch_loads(path: Path, policy: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env |= {"OMP_WAIT_POLICY": policy} if policy else {}
    proc = subprocess.run(
        [sys.executable, "-c", SPY, str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("name", FILES)
def test_files_leave_openmp_wait_policy_to_the_user_and_the_runner(name):
    """OpenMP reads OMP_WAIT_POLICY when torch loads it. Its default (idle threads spin a while) is
    fastest alone; the benchmark runner sets PASSIVE for runs side by side (tests/test_benchmark.py),
    and a user's own setting reaches torch unchanged."""
    assert omp_wait_policy_when_torch_loads(ALGOS / name) == "None"
    assert omp_wait_policy_when_torch_loads(ALGOS / name, "ACTIVE") == "ACTIVE"


@dataclass
class FakeArgs:
    """The common flags every algorithm file's Args has."""

    run_dir: str | None = None
    env_id: str = "Fake-v0"
    exp_name: str = "test"
    seed: int = 1
    total_steps: int = 100
    torch_deterministic: bool = True
    device: str = "cpu"
    compile: bool = False
    checkpoint_interval: int = 0
    eval_interval: int = 0
    eval_episodes: int = 1
    eval_only: bool = False
    checkpoint: str | None = None
    resume: str | None = None
    capture_video: bool = False
    track: bool = False
    wandb_project_name: str = "test"


@pytest.fixture
def restore_signals():
    """Run() catches SIGINT and SIGTERM; give pytest its handlers back."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in handlers.items():
        signal.signal(s, handler)


def test_end_iteration_evaluates_and_saves_as_their_intervals_pass(tmp_path, restore_signals):
    """Evaluations at each multiple of --eval-interval, checkpoints at each multiple of
    --checkpoint-interval, neither at the last step (finish() does both there) nor after a signal."""
    args = FakeArgs(run_dir=str(tmp_path), total_steps=100, eval_interval=30)
    args.checkpoint_interval = 50
    now, evaluated, saved = [0], [], []

    def evaluate(_video_dir):
        evaluated.append(now[0])
        return [1.0]

    run = Run(args)
    with run.start(0, 100, state=lambda: {"s": 1}, evaluate=evaluate):
        run.save = saved.append
        for step in range(10, 101, 10):
            now[0] = step
            run.end_iteration(step)
        assert (evaluated, saved) == ([30, 60, 90], [50])
        run.stop.append(signal.SIGTERM)
        now[0] = 120
        run.end_iteration(120)
    assert (evaluated, saved) == ([30, 60, 90], [50])
    assert [step for step, _ in scalars(tmp_path, "eval/episodic_return")] == [30, 60, 90]


def test_finish_saves_evaluates_and_counts_sps_over_the_loop_only(tmp_path, restore_signals):
    """summary.json's sps divides the loop's steps by the loop's time, without the final
    evaluation (0.6 s here, after a 0.3 s loop); its extras keep their eval_ names and go to
    TensorBoard as eval/<name>; after a signal there is no evaluation and no summary.json."""
    args = FakeArgs(run_dir=str(tmp_path), total_steps=300)
    state = {"weights": torch.arange(3.0)}
    result = ([1.0, 3.0], {"eval_capped_games": 1})

    def slow_evaluate(_video_dir):
        time.sleep(0.6)
        return result

    run = Run(args)
    with run.start(0, 300, state=lambda: state, evaluate=slow_evaluate):
        time.sleep(0.3)
        run.finish(300, extra=7)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert 0.3 <= 300 / summary["sps"] < 0.6
    assert summary["eval_mean"] == 2.0
    assert summary["eval_std"] == 1.0
    assert summary["eval_returns"] == [1, 3]
    assert (summary["eval_capped_games"], summary["extra"], summary["global_step"]) == (1, 7, 300)
    assert scalars(tmp_path, "eval/capped_games") == [(300, 1.0)]
    ckpt = torch.load(tmp_path / "checkpoints" / "latest.pt", weights_only=True)
    assert ckpt["global_step"] == 300 and torch.equal(ckpt["weights"], state["weights"])

    stopped = tmp_path / "stopped"
    run = Run(FakeArgs(run_dir=str(stopped), total_steps=300))
    never = lambda _: pytest.fail("evaluated after a signal")  # noqa: E731
    with run.start(0, 300, state=lambda: state, evaluate=never):
        os.kill(os.getpid(), signal.SIGTERM)  # caught: the run stops at its next check
        assert run.stop == [signal.SIGTERM]
        run.finish(150)
    assert not (stopped / "summary.json").exists()
    ckpt = torch.load(stopped / "checkpoints" / "latest.pt", weights_only=True)
    assert ckpt["global_step"] == 150


def test_a_non_finite_loss_stops_the_run_and_is_never_saved(tmp_path, restore_signals):
    run = Run(FakeArgs(run_dir=str(tmp_path)))
    with run.start(0, 100, state=lambda: {}, evaluate=lambda _: [0.0]):
        run.check_finite(torch.tensor([1.0, 2.0]), 10)
        with pytest.raises(SystemExit, match="non-finite loss at step 20"):
            run.check_finite(torch.tensor([1.0, float("nan")]), 20)
        with pytest.raises(SystemExit, match="non-finite loss at step 20"):
            run.save(30)
    assert not (tmp_path / "checkpoints" / "latest.pt").exists()


def test_polyak_averages_modules_and_tensor_lists():
    torch.manual_seed(0)
    target = torch.nn.Linear(3, 2)
    source = torch.nn.Linear(3, 2)
    expected = [0.9 * t + 0.1 * s for t, s in zip(target.parameters(), source.parameters())]
    Run.polyak(target, source, 0.1)
    for got, want in zip(target.parameters(), expected):
        torch.testing.assert_close(got, want)
    a, b = [torch.zeros(2)], [torch.ones(2)]
    Run.polyak(a, b, 0.25)
    assert a[0].tolist() == [0.25, 0.25]


def test_every_and_bad_flags(restore_signals, tmp_path):
    assert [s for s in range(10, 60, 10) if Run.every(s, s - 10, 25)] == [30, 50]
    assert not Run.every(100, 0, 0)  # an interval of 0 never passes
    with pytest.raises(SystemExit, match="--total-steps must be positive, got 0"):
        Run(FakeArgs(total_steps=0))
    with pytest.raises(SystemExit, match="--batch must divide"):
        Run(FakeArgs(), checks=[(True, "fine"), (False, "--batch must divide")])


def test_a_run_dir_that_is_a_file_is_refused_in_one_line(tmp_path, restore_signals):
    (tmp_path / "taken").write_text("")
    with pytest.raises(SystemExit) as stopped:
        Run(FakeArgs(run_dir=str(tmp_path / "taken")))
    assert str(stopped.value) == (
        f"{run_harness.SCRIPT}: error: --run-dir {tmp_path / 'taken'} is a file; "
        "pass a folder's path"
    )


@pytest.mark.parametrize("name", FILES)
def test_every_file_refuses_a_run_dir_that_is_a_file(name, tmp_path):
    (tmp_path / "taken").write_text("")
    proc = subprocess.run(
        [sys.executable, str(ALGOS / name), "--run-dir", str(tmp_path / "taken")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert (
        proc.stderr
        == f"{name}: error: --run-dir {tmp_path / 'taken'} is a file; pass a folder's path\n"
    )
