"""`python -m benchmark speed`: the steady-state rate, the A B A B order, the ratios' direction,
'n/a' for a side without --compile, the budget, and one-line errors (benchmark/speed.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmark import speed
from benchmark.__main__ import main
from benchmark.manifest import ZooError

ROOT = Path(__file__).resolve().parents[1]

# A stand-in algorithm file: a fixed sleep per step, TensorBoard events every 10 steps, a stall
# before the warm-up ends under --compile (its "compilation"), and a line per run in $FAKE_LOG.
# Its events carry the time it meant to take (start + stall + sleeps), not the clock's: a loaded
# machine (CI beside other jobs) oversleeps, and the measured ratios would drift with the load.
FAKE = """
import argparse, os, time
from pathlib import Path
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

SIDE, SLEEP = "{side}", {sleep}
parser = argparse.ArgumentParser()
for name in ("env-id", "total-steps", "seed", "eval-episodes", "eval-interval",
             "checkpoint-interval", "device", "run-dir"):
    parser.add_argument("--" + name)
{compile_flag}
args = parser.parse_args()
compiled = getattr(args, "compile", False)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(f"{{SIDE}} {{'compiled' if compiled else 'eager'}} {{os.environ.get('OMP_NUM_THREADS')}}\\n")
if "FAKE_IDS" in os.environ:  # (session, process group, pid) of the run
    Path(os.environ["FAKE_IDS"]).write_text(f"{{os.getsid(0)}} {{os.getpgid(0)}} {{os.getpid()}}")
time.sleep(0.3)  # start-up
run_dir = Path(args.run_dir)
run_dir.mkdir(parents=True)
writer = EventFileWriter(str(run_dir))
start, per_step = time.time(), SLEEP / 2 if compiled else SLEEP
for step in range(1, int(args.total_steps) + 1):
    if compiled and step == 15:
        time.sleep(1.0)  # compilation: after the first logged point, before the warm-up ends
    time.sleep(per_step)
    clock = start + (1.0 if compiled and step >= 15 else 0.0) + step * per_step
    if step % 10 == 0:
        value = Summary.Value(tag="charts/SPS", simple_value=0.0)
        writer.add_event(Event(wall_time=clock, step=step, summary=Summary(value=[value])))
writer.close()
(run_dir / "summary.json").write_text("{{}}")
"""
WITH_COMPILE = 'parser.add_argument("--compile", action="store_true")'
SPECS = {"fake": speed.Spec(("--env-id", "Fake-v0"), warmup=20, steps=50)}


def fake(side: str, sleep: float, with_compile: bool) -> str:
    return FAKE.format(side=side, sleep=sleep, compile_flag=WITH_COMPILE if with_compile else "")


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose commit holds a slow fake without --compile (B) and whose working
    tree holds a fast one with it (A)."""
    root = tmp_path / "repo"
    (root / "algos").mkdir(parents=True)
    (root / "algos/fake.py").write_text(fake("B", 0.010, with_compile=False))
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "slow")
    (root / "algos/fake.py").write_text(fake("A", 0.005, with_compile=True))
    return root


def test_steady_rate_leaves_out_what_comes_before_the_warm_up():
    # start-up and a 30 s compilation up to step 10, then 10 steps per second
    points = [(40, 33.0), (0, 0.0), (10, 30.0), (20, 31.0), (30, 32.0)]
    assert speed.steady_rate(points, warmup=20) == (10.0, 20, 2.0)
    assert speed.steady_rate(points, warmup=11) == (10.0, 20, 2.0)  # first point at or past it
    with pytest.raises(ZooError, match="fewer than two logged points after the warm-up"):
        speed.steady_rate(points, warmup=35)


def test_budget_rounds_to_whole_iterations_and_scales_only_the_measured_steps():
    spec = speed.Spec((), warmup=3000, steps=10_000, unit=1024)
    assert speed.budget(spec, 1.0) == (3072, 3072 + 10 * 1024)
    assert speed.budget(spec, 0.5) == (3072, 3072 + 5 * 1024)
    assert speed.budget(spec, 1e-6) == (3072, 3072 + 1024)


def test_compile_flag_is_read_from_the_source(tmp_path: Path):
    cases = {
        "class Args:\n    compile: bool = False\n": True,
        fake("A", 0.0, with_compile=True): True,
        fake("B", 0.0, with_compile=False): False,
        "def compiled(fn, args):\n    if not args.compile:\n": False,
    }
    for i, (text, expected) in enumerate(cases.items()):
        (tmp_path / f"{i}.py").write_text(text)
        assert speed.has_compile_flag(tmp_path / f"{i}.py") is expected, text


def test_every_algorithm_file_has_a_speed_run_whose_flags_it_declares():
    assert sorted(speed.SPECS) == sorted(p.stem for p in Path("algos").glob("*.py"))
    for name, spec in speed.SPECS.items():
        source = Path(f"algos/{name}.py").read_text()
        flags = [
            a for a in (*spec.flags, *speed.COMMON, "--total-steps", "--device") if a[:2] == "--"
        ]
        for flag in flags:  # tyro turns the field learning_starts into --learning-starts
            field = flag[2:].replace("-", "_")
            assert re.search(rf"^    {field}: ", source, flags=re.M), (name, flag)


def test_against_alternates_a_b_and_says_na_for_a_side_without_compile(
    repo: Path, tmp_path: Path, monkeypatch, capsys
):
    log, out = tmp_path / "order.log", tmp_path / "speed.json"
    monkeypatch.setenv("FAKE_LOG", str(log))
    options = speed.Options(device="cpu", threads=3)
    code = speed.measure(
        ("fake",), "both", "HEAD", 2, options, repo / "algos", out=out, specs=SPECS
    )
    text = capsys.readouterr().out
    assert code == 0, text
    # per round: eager A, eager B, compiled A (B has no --compile, so nothing runs)
    assert log.read_text().split("\n")[:-1] == ["A eager 3", "B eager 3", "A compiled 3"] * 2
    record = json.loads(out.read_text())
    order = [(r["round"], r["mode"], r["side"], r["status"]) for r in record["runs"]]
    assert order == [
        (1, "eager", "A", "ok"),
        (1, "eager", "B", "ok"),
        (1, "compiled", "A", "ok"),
        (1, "compiled", "B", "n/a"),
        (2, "eager", "A", "ok"),
        (2, "eager", "B", "ok"),
        (2, "compiled", "A", "ok"),
        (2, "compiled", "B", "n/a"),
    ]
    eager, compiled = record["table"]
    # A sleeps half as long per step as B, and half again when compiled; the stall is left out
    assert eager["A/B"] == pytest.approx(2.0, rel=1e-4), eager
    assert compiled["A compiled/eager"] == pytest.approx(2.0, rel=1e-4), compiled
    assert compiled["B"] == "n/a" and compiled["A/B"] == "n/a"
    assert compiled["B compiled/eager"] == "n/a"
    ok = [r for r in record["runs"] if r["status"] == "ok"]
    assert all(r["measured_steps"] == 50 for r in ok)  # from step 20 to step 70
    a_eager = [r["steps_per_s"] for r in ok if (r["side"], r["mode"]) == ("A", "eager")]
    assert eager["A"] == pytest.approx(statistics.median(a_eager))
    row = next(line for line in text.splitlines() if line.startswith("fake") and "compiled" in line)
    assert row.split()[3] == "n/a", text  # file, mode, A steps/s, B steps/s
    assert "B: commit" in text and "A: working tree at" in text
    worktrees = git(repo, "worktree", "list", "--porcelain").count("worktree ")
    assert worktrees == 1  # the temporary worktree is gone


def test_sigterm_leaves_no_run_and_no_worktree_behind(repo: Path, tmp_path: Path):
    """A measurement stopped with SIGTERM (a cluster's or a shell's kill) kills the running file's
    process group and removes its worktree: an orphaned run would disturb the next measurement."""
    log = tmp_path / "order.log"
    code = (
        "import sys; from pathlib import Path; from benchmark import speed\n"
        "specs = {'fake': speed.Spec(('--env-id', 'Fake-v0'), warmup=20, steps=100_000)}\n"
        f"speed.measure(('fake',), 'off', 'HEAD', 1, speed.Options(), Path({str(repo / 'algos')!r}),"
        " specs=specs)\n"
    )
    env = {**os.environ, "FAKE_LOG": str(log), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path)
    deadline = time.time() + 60
    while not (log.exists() and log.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    assert log.exists(), "the fake run never started"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    time.sleep(0.5)
    running = subprocess.run(["pgrep", "-f", str(repo)], capture_output=True, text=True).stdout
    assert not running.strip(), running
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_a_run_has_its_own_process_group_in_the_callers_session(
    repo: Path, tmp_path: Path, monkeypatch
):
    """Its own group, so that a cut or a stop ends it whole; the caller's session, because on Linux
    a new session is a new scheduler autogroup, which would share the CPU equally with niced
    background jobs instead of taking precedence over them."""
    ids = tmp_path / "ids"
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "order.log"))
    monkeypatch.setenv("FAKE_IDS", str(ids))
    assert (
        speed.measure(("fake",), "off", None, 1, speed.Options(), repo / "algos", specs=SPECS) == 0
    )
    session, group, pid = map(int, ids.read_text().split())
    assert session == os.getsid(0) and group == pid != os.getpgid(0)


def test_a_spent_budget_starts_nothing(repo: Path, tmp_path: Path, monkeypatch, capsys):
    log = tmp_path / "order.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    options = speed.Options(budget_s=1.0)
    assert speed.measure(("fake",), "off", None, 1, options, repo / "algos", specs=SPECS) == 0
    assert not log.exists()
    assert "fake eager A round 1: skipped (budget spent)" in capsys.readouterr().out


def test_bad_input_is_refused_in_one_line(repo: Path, capsys):
    (repo / "algos/naf.py").write_text("")
    cases = {
        ("--files", "nope"): "--files: no speed run for nope; choose from ppo_atari",
        ("--files", "naf", "--against", "no-such-commit"): "--against no-such-commit: not a commit",
        ("--files", "naf", "--repeats", "0"): "must be positive",
        ("--files", "d4pg"): "no d4pg.py in",
    }
    for args, message in cases.items():
        assert main(["speed", "--algos-dir", str(repo / "algos"), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("benchmark: error: ") and message in err, err
        assert err.count("\n") == 1, err


@pytest.mark.slow
def test_one_real_file_on_the_cpu(tmp_path: Path, capsys):
    """naf.py, eager only (it does not depend on --compile), a short measured stretch."""
    options = speed.Options(device="cpu", steps=0.1, threads=1)
    out = tmp_path / "naf.json"
    assert speed.measure(("naf",), "off", None, 1, options, Path("algos"), out=out) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["status"] == "ok" and run["measured_steps"] >= 100 and run["steps_per_s"] > 0
