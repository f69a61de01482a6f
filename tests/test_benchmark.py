"""The benchmark runner: manifest validation, sweeps of fake algorithm scripts (ok, crash,
timeout), resume, aggregation against hand-computed numbers, report, plots, README block."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, check_error

sys.path.insert(0, str(ROOT))  # the package, when the project is not pip-installed
from benchmark.__main__ import main
from benchmark.aggregate import bootstrap_ci, check_target, crossing_step, iqm
from benchmark.manifest import Target, ZooError, load_zoo

ALGOS = ("ppo_atari", "dqn_atari", "naf", "d4pg", "ppg")

# A fake algorithm file honouring the CLI/outputs contract in a few lines. The training
# curve rises linearly over 20 episodes to `--score`; the final evaluation is score + seed.
# It writes events with tensorboard's own writer (the format torch's SummaryWriter writes)
# because importing torch would cost seconds per run. Its checkpoint is {"step": N};
# `--resume` continues the curve after that step. "stall-once" logs half the curve, then
# waits (unless resumed) for SIGTERM, on which it saves its checkpoint and exits.
FAKE = textwrap.dedent('''
    import argparse, json, signal, sys, time
    from pathlib import Path
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    p = argparse.ArgumentParser()
    p.add_argument("--env-id", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--total-steps", type=int, required=True)
    p.add_argument("--behaviour", default="ok", choices=["ok", "crash", "sleep", "no-eval", "nan-eval", "stall-once"])
    p.add_argument("--resume", default=None)
    p.add_argument("--score", type=float, default=100.0)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--layers", type=int, nargs="+", default=[64])
    p.add_argument("--fast", action=argparse.BooleanOptionalAction, default=False)
    args = p.parse_args()
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    print("fake run", args.env_id, args.seed, flush=True)
    if args.behaviour == "crash":
        sys.exit("fake.py: error: deliberate crash")
    if args.behaviour == "sleep":
        time.sleep(600)
    start = json.loads(Path(args.resume).read_text())["step"] if args.resume else 0
    if args.resume:
        print("resumed at step", start, flush=True)
    writer = EventFileWriter(str(run))
    def log(tag, value, step):
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(Event(step=step, wall_time=time.time(), summary=summary))
    def save(step):
        (run / "checkpoints").mkdir(exist_ok=True)
        (run / "checkpoints" / "latest.pt").write_text(json.dumps({"step": step}))
    stall = args.behaviour == "stall-once" and not args.resume
    for i in range(1, 11 if stall else 21):
        if i * args.total_steps // 20 > start:
            log("charts/episodic_return", args.score * i / 20, i * args.total_steps // 20)
    if stall:
        writer.flush()
        def stop(signum, frame):
            writer.close()
            save(args.total_steps // 2)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("stalling", flush=True)
        time.sleep(600)
    log("charts/SPS", 1000.0, args.total_steps)
    final = float("nan") if args.behaviour == "nan-eval" else args.score + args.seed
    if args.behaviour != "no-eval":
        log("eval/episodic_return", final, args.total_steps)
    writer.close()
    save(args.total_steps)
    (run / "config.json").write_text(json.dumps(vars(args)))
    (run / "summary.json").write_text(json.dumps({
        "script": "fake.py", "algo": "fake", "env_id": args.env_id, "seed": args.seed, "start_step": start,
        "global_step": args.total_steps, "eval_mean": final, "eval_std": 0.0,
        "eval_episodes": args.eval_episodes, "eval_returns": [final], "wall_time_s": 0.5,
        "sps": 1000.0 + args.seed, "peak_rss_mb": 50.0 + args.seed}))
''')


def preset_toml(name: str, *, args: str = "", seeds: int = 1, target: str = "", timeout: float = 60,
                extra: str = "") -> str:
    """A manifest entry for the fake script."""
    return textwrap.dedent(f'''
        [{name}]
        algo = "fake"
        env_id = "Fake-v0"
        args = {{ {args} }}
        curve_threshold = 40
        {extra}
        [{name}.smoke]
        total_steps = 100
        timeout_s = {timeout}
        [{name}.full]
        total_steps = 200
        seeds = {seeds}
        timeout_s = {timeout}
    ''') + (f"[{name}.target]\n{target}\n" if target else "")


@pytest.fixture
def zoo(tmp_path: Path, monkeypatch):
    """Write the fake script and a manifest; return a function building the CLI arguments.
    Runs from tmp_path, so that no default output path can land in the repository."""
    monkeypatch.chdir(tmp_path)
    algos = tmp_path / "algos"
    algos.mkdir()
    (algos / "fake.py").write_text(FAKE)

    def make(*entries: str) -> list[str]:
        manifest = tmp_path / "zoo.toml"
        manifest.write_text("\n".join(entries))
        return ["--zoo", str(manifest), "--algos-dir", str(algos), "--runs-dir", str(tmp_path / "runs"),
                "--progress-interval-s", "600"]

    return make


def record(tmp_path: Path, sweep: str, preset: str, seed: int = 1) -> dict:
    return json.loads((tmp_path / "runs" / sweep / preset / f"seed{seed}" / "run.json").read_text())


# --- the manifest -------------------------------------------------------------------------

def test_real_zoo_is_valid_and_covers_every_algorithm(tmp_path: Path):
    for algo in ALGOS:  # stand-ins, so this test does not depend on the algorithm files
        (tmp_path / f"{algo}.py").touch()
    presets = load_zoo(ROOT / "zoo", tmp_path)
    assert {p.algo for p in presets.values()} == set(ALGOS)
    assert {"ppo_atari-breakout", "dqn_atari-breakout", "naf-pendulum", "d4pg-pendulum", "naf-invertedpendulum",
            "d4pg-halfcheetah", "ppg-cartpole", "ppg-lunarlander", "ppg-lunarlander-noaux"} <= set(presets)
    pendulum = presets["naf-pendulum"]
    assert (pendulum.full.total_steps, pendulum.full.seeds, pendulum.curve_threshold) == (20_000, 5, -200)
    assert (pendulum.target.threshold, pendulum.target.at_least, pendulum.target.mean_min) == (-200, 4, -160)
    assert presets["ppg-lunarlander"].target.strict
    assert presets["ppg-lunarlander-noaux"].target is None
    # The ablation differs from the tuned preset in the auxiliary phase only.
    assert presets["ppg-lunarlander-noaux"].args == {**presets["ppg-lunarlander"].args, "e-aux": 0}
    assert presets["naf-invertedpendulum"].provisional and presets["d4pg-halfcheetah"].provisional
    assert presets["d4pg-pendulum"].smoke.args["batch-size"] == 32
    assert all(p.references for n, p in presets.items() if n.endswith(("breakout", "-pendulum", "cartpole")))


GOOD = 'metric = "eval_mean"\nmin = 1\nat_least = 1\nof = 1\ntext = "t"'
BAD_MANIFESTS = {
    "unknown algorithm": (preset_toml("x").replace('algo = "fake"', 'algo = "nope"'), "unknown algorithm file"),
    "missing budget": (preset_toml("x").split("[x.full]")[0], "missing budget [x.full]"),
    "missing total steps": (preset_toml("x").replace("total_steps = 200", ""), "full: missing 'total_steps'"),
    "malformed target": (preset_toml("x", target=GOOD.replace("of = 1", "of = 0")), "'of' must be a positive int"),
    "target over other seeds": (preset_toml("x", target=GOOD.replace("of = 1", "of = 3")), "must equal full.seeds"),
    "min and above": (preset_toml("x", target=GOOD + "\nabove = 2"), "exactly one of 'min'"),
    "unknown key": (preset_toml("x", extra="seed = 3"), "unknown key(s) seed"),
    "unknown target key": (preset_toml("x", target=GOOD + "\nmax = 3"), "target: unknown key(s) max"),
    "reserved flag": (preset_toml("x", args="total-steps = 5"), "'total-steps' is set by the runner"),
    "bad reference": (preset_toml("x", extra='references = [{name = "a", score = 1}]'), "missing 'source'"),
    "wrong type": (preset_toml("x").replace("timeout_s = 60", 'timeout_s = "1h"', 1), "'timeout_s' must be a"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bad_manifest_is_one_line_naming_the_preset(case: str, zoo, capsys):
    text, fragment = BAD_MANIFESTS[case]
    assert main(["smoke", *zoo(text)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("benchmark: error: zoo preset 'x': ") and fragment in err, err


def test_duplicate_preset_across_files(tmp_path: Path, zoo):
    zoo(preset_toml("x"))
    (tmp_path / "zoo").mkdir()
    for file in ("a.toml", "b.toml"):
        (tmp_path / "zoo" / file).write_text(preset_toml("x"))
    with pytest.raises(ZooError, match="zoo preset 'x': duplicate preset name"):
        load_zoo(tmp_path / "zoo", tmp_path / "algos")


def test_cli_error_has_no_traceback(tmp_path: Path, zoo):
    args = zoo(preset_toml("x").replace('algo = "fake"', 'algo = "nope"'))
    proc = subprocess.run([sys.executable, "-m", "benchmark", "full", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    check_error(proc, "benchmark: error: zoo preset 'x'", "unknown algorithm file")


# --- sweeps -------------------------------------------------------------------------------

def test_smoke_records_crash_and_timeout_and_goes_on(tmp_path: Path, zoo, capsys):
    args = zoo(preset_toml("good", args='fast = true, layers = [3, 4]'),
               preset_toml("crash", args='behaviour = "crash"'),
               preset_toml("slow", args='behaviour = "sleep"', timeout=3),
               preset_toml("no-eval", args='behaviour = "no-eval"'),
               preset_toml("nan", args='behaviour = "nan-eval"'))
    assert main(["smoke", *args, "--name", "s", "--workers", "2"]) == 1
    good = record(tmp_path, "s", "good")
    assert good["status"] == "ok", good
    assert good["command"][-4:] == ["--fast", "--layers", "3", "4"]
    config = json.loads((tmp_path / "runs/s/good/seed1/config.json").read_text())
    assert (config["total_steps"], config["fast"], config["layers"]) == (100, True, [3, 4])
    crash = record(tmp_path, "s", "crash")
    assert crash["status"] == "failed" and crash["reason"] == "exit status 1"
    assert "deliberate crash" in crash["log_tail"]
    slow = record(tmp_path, "s", "slow")
    assert slow["status"] == "failed" and "timed out after 3 s" in slow["reason"]
    assert "fake run Fake-v0 1" in slow["log_tail"]
    no_eval = record(tmp_path, "s", "no-eval")
    assert no_eval["status"] == "failed" and "eval/episodic_return" in no_eval["reason"]
    assert "eval_mean is nan, not a finite number" in record(tmp_path, "s", "nan")["reason"]
    report = (tmp_path / "runs/s/report.md").read_text()
    assert "deliberate crash" in report and "## Failed runs" in report
    out = capsys.readouterr().out
    assert "FAILED crash seed1: exit status 1" in out and "ok     good seed1: eval 101.0" in out


def test_interrupted_sweep_resumes_skipping_finished_runs(tmp_path: Path, zoo, capsys):
    args = zoo(preset_toml("a", seeds=2), preset_toml("b", seeds=2))
    assert main(["full", *args, "--name", "r", "--results-dir", str(tmp_path / "results")]) == 0
    # Simulate a kill halfway through a-seed2, before its first checkpoint: its folder holds
    # partial output and no record, so it starts afresh.
    a2 = tmp_path / "runs/r/a/seed2"
    (a2 / "run.json").unlink()
    shutil.rmtree(a2 / "checkpoints")
    (a2 / "stale.txt").write_text("left by the killed run")
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs/r").glob("*/seed*/run.json")}
    capsys.readouterr()
    assert main(["full", *args, "--name", "r", "--results-dir", str(tmp_path / "results")]) == 0
    assert "4 runs, 3 already finished" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in before} == before
    a2_record = record(tmp_path, "r", "a", 2)
    assert a2_record["status"] == "ok" and not a2_record["resumed"] and not (a2 / "stale.txt").exists()
    assert "--resume" not in a2_record["command"]
    sweep = json.loads((tmp_path / "runs/r/sweep.json").read_text())
    assert len(sweep["commands"]) == 2
    # The same name with another budget is refused rather than mixed.
    assert main(["full", *args, "--name", "r", "--steps-scale", "0.5"]) == 2
    assert "was run as full" in capsys.readouterr().err


def test_unfinished_run_resumes_from_its_checkpoint(tmp_path: Path, zoo, capsys):
    results = ["--results-dir", str(tmp_path / "results")]
    crash = preset_toml("crash", args='behaviour = "crash"')
    # The first attempt stalls halfway; at the time limit SIGTERM makes it save step 100 of 200.
    args = zoo(preset_toml("stall", args='behaviour = "stall-once"', timeout=10), crash)
    assert main(["full", *args, "--name", "u", *results]) == 1
    stall_dir, crash_dir = tmp_path / "runs/u/stall/seed1", tmp_path / "runs/u/crash/seed1"
    first = record(tmp_path, "u", "stall")
    assert first["status"] == "failed" and "timed out" in first["reason"] and not first["resumed"]
    ckpt = stall_dir / "checkpoints/latest.pt"
    assert json.loads(ckpt.read_text()) == {"step": 100}
    assert not (crash_dir / "checkpoints").exists()
    (crash_dir / "checkpoints").mkdir()  # as if it had saved one before crashing
    (crash_dir / "checkpoints/latest.pt").write_text(json.dumps({"step": 50}))
    capsys.readouterr()

    # Re-run (the time limit is not part of the sweep's budget, so it may change).
    args = zoo(preset_toml("stall", args='behaviour = "stall-once"'), crash)
    assert main(["full", *args, "--name", "u", *results]) == 1  # 'crash' fails again, once
    stall = record(tmp_path, "u", "stall")
    assert stall["status"] == "ok" and stall["resumed"], stall
    assert stall["command"][-2:] == ["--resume", str(ckpt.resolve())]
    assert stall["command"][stall["command"].index("--run-dir") + 1] == str(stall_dir.resolve())
    assert json.loads((stall_dir / "config.json").read_text())["resume"] == str(ckpt.resolve())
    assert (stall["summary"]["start_step"], stall["summary"]["global_step"]) == (100, 200)
    # The curve continues where the checkpoint left it: both attempts' points, none twice.
    assert [step for step, _ in stall["curves"]["train"]] == list(range(10, 201, 10))
    log = (stall_dir / "benchmark.log").read_text()
    marker = f"resumed from {ckpt.resolve()} at "
    assert log.index("stalling") < log.index(marker) < log.index("resumed at step 100"), log
    again = record(tmp_path, "u", "crash")
    assert again["status"] == "failed" and again["resumed"] and again["command"][-2] == "--resume"
    assert (crash_dir / "benchmark.log").read_text().count("deliberate crash") == 2  # appended, not replaced
    report = (tmp_path / "results/u/report.md").read_text()
    assert "seed 1: 101.0 (resumed)" in report and "### crash seed1 (resumed): exit status 1" in report


def test_sigterm_stops_the_sweep_and_its_runs(tmp_path: Path, zoo):
    args = zoo(preset_toml("a", seeds=2), preset_toml("slow", args='behaviour = "sleep"', timeout=300))
    proc = subprocess.Popen([sys.executable, "-m", "benchmark", "full", *args, "--name", "k",
                             "--results-dir", str(tmp_path / "results")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "runs/k"
    deadline = time.monotonic() + 120
    while not ((runs / "slow/seed1/benchmark.log").exists() and len(list(runs.glob("a/seed*/run.json"))) == 2):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted; re-run with --name k to resume" in err, (out, err)
    slow = json.loads((runs / "slow/seed1/run.json").read_text())
    assert slow["status"] == "failed" and slow["returncode"] == -15  # the run was stopped, not left behind
    assert main(["full", *args, "--name", "k", "--preset", "a"]) == 0


# --- aggregation --------------------------------------------------------------------------

def brute_iqm(scores) -> float:
    """Fractional trimming by repetition: 4 copies of each score, drop the lowest and highest
    quarter of the 4n values, average the rest."""
    values = np.repeat(np.sort(scores), 4)
    n = len(scores)
    return float(values[n:3 * n].mean())


def test_iqm_hand_computed():
    assert iqm([7.0]) == 7.0
    assert iqm([4, 1, 3, 2]) == pytest.approx(2.5)
    assert iqm([1, 2, 3, 4, 100]) == pytest.approx(0.3 * 2 + 0.4 * 3 + 0.3 * 4)
    assert iqm([1, 2, 3, 4, 5, 6]) == pytest.approx(3.5)
    assert iqm(range(1, 9)) == pytest.approx(4.5)
    rng = np.random.default_rng(3)
    for n in range(1, 12):
        scores = rng.normal(size=n)
        assert iqm(scores) == pytest.approx(brute_iqm(scores))


def test_bootstrap_ci_matches_a_per_resample_loop():
    scores = np.array([-150.0, -190.0, -210.0, -170.0, -400.0])
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 5, size=(2000, 5))
    stats = [brute_iqm(scores[row]) for row in idx]
    low, high = bootstrap_ci(scores)
    assert (low, high) == pytest.approx(tuple(np.quantile(stats, [0.025, 0.975])))
    assert low < iqm(scores) < high
    assert bootstrap_ci(scores) == (low, high)  # fixed seed: reproducible
    assert bootstrap_ci([5.0]) == (5.0, 5.0)


def test_target_check_hand_cases():
    target = Target(metric="eval_mean", threshold=-200, strict=False, at_least=4, of=5, text="t", mean_min=-160)
    scores = [-150.0, -190.0, -210.0, -170.0, -180.0]  # 4 pass, mean -180
    assert check_target(target, scores, None)["status"] == "missed"
    assert check_target(target, [-150.0, -150.0, -210.0, -150.0, -140.0], None)["status"] == "met"
    loose = Target(metric="eval_mean", threshold=-200, strict=False, at_least=4, of=5, text="t")
    result = check_target(loose, scores, None)
    assert (result["status"], result["passed_seeds"], result["mean"]) == ("met", 4, -180.0)
    assert check_target(loose, [-150.0, None, -210.0, -170.0, -180.0], None)["status"] == "missed"
    assert check_target(loose, [-200.0] * 5, None)["status"] == "met"
    strict = Target(metric="eval_mean", threshold=100, strict=True, at_least=2, of=2, text="t")
    assert check_target(strict, [100.0, 100.5], None)["status"] == "missed"
    assert check_target(strict, scores, "reduced budget")["status"] == "not applicable"
    assert check_target(None, scores, None)["status"] == "report only"


def test_crossing_step_hand_computed():
    curve = [(10 * i, float(v)) for i, v in enumerate([0, 0, 10, 10, 10, 10, 0, 20], start=1)]
    # 3-episode averages from episode 3 on: 3.3, 6.7, 10, 10, 6.7, 10 (at steps 30..80)
    assert crossing_step(curve, 10, 3) == 50
    assert crossing_step(curve, 6, 3) == 40
    assert crossing_step(curve, 11, 3) is None
    assert crossing_step(curve[:2], -1e9, 3) is None  # fewer episodes than the window


# --- report, plots, README ----------------------------------------------------------------

def test_full_sweep_report_plot_and_readme(tmp_path: Path, zoo, capsys):
    met = 'metric = "eval_mean"\nmin = 102\nat_least = 1\nof = 2\nmean_min = 102\ntext = "final eval >= 102"'
    reference = 'references = [{name = "peer", score = "414.7 +- 28.1", source = "https://example.org"}]'
    args = zoo(preset_toml("hit", seeds=2, target=met.replace("mean_min = 102", "mean_min = 101.5"), extra=reference),
               preset_toml("miss", seeds=2, target=met))
    results_dir = tmp_path / "results"
    assert main(["full", *args, "--name", "f", "--results-dir", str(results_dir)]) == 1  # 'miss' misses
    assert "target missed: miss: final eval >= 102" in capsys.readouterr().out
    results = json.loads((results_dir / "f/results.json").read_text())
    hit = results["presets"]["hit"]
    assert hit["eval_mean"]["mean"] == pytest.approx(101.5) and hit["eval_mean"]["std"] == pytest.approx(0.5)
    assert hit["eval_mean"]["iqm"] == pytest.approx(101.5)
    assert hit["target"]["status"] == "met" and hit["target"]["passed_seeds"] == 1
    assert results["presets"]["miss"]["target"]["status"] == "missed"  # 1 of 2 >= 102 but mean 101.5
    # Returns 5, 10, ..., 100 at steps 10, 20, ...: the 10-episode average reaches 40 at episode 12.5 -> 13.
    assert hit["crossing"]["steps"] == [130, 130]
    assert (hit["sps_mean"], hit["peak_rss_mb_max"]) == (1001.5, 52.0)
    assert hit["references"][0]["score"] == "414.7 +- 28.1"
    assert results["machine"]["cpu_count"] >= 1 and "python -m benchmark full" in results["commands"][0]
    assert json.loads((results_dir / "latest").read_text()) == {"sweep": "f"}
    report = (results_dir / "f/report.md").read_text()
    assert "| hit | Fake-v0 | 200 | 2 | 101.5 ± 0.5 | 101.5 [" in report and "**met** (1/2 seeds)" in report
    assert "peer: 414.7 +- 28.1" in report and "[plot](plots/hit.png)" in report
    png = (results_dir / "f/plots/hit.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    # The runs' checkpoints stay in runs/, not in the committed results.
    assert not list(results_dir.rglob("*.pt"))

    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nno markers\n")
    assert main(["readme", "--readme", str(readme), "--results-dir", str(results_dir)]) == 2
    assert "needs one '<!-- results:start -->' line" in capsys.readouterr().err
    readme.write_text("# Title\n<!-- results:start -->\nold\n<!-- results:end -->\ntail\n")
    assert main(["readme", "--readme", str(readme), "--results-dir", str(results_dir)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n<!-- results:start -->") and text.endswith("<!-- results:end -->\ntail\n")
    assert "old" not in text and "| hit | Fake-v0 |" in text and "[plot](results/f/plots/hit.png)" in text


def test_reduced_budget_marks_targets_not_applicable(tmp_path: Path, zoo):
    target = 'metric = "eval_mean"\nmin = 1000\nat_least = 1\nof = 1\ntext = "unreachable"'
    args = zoo(preset_toml("x", target=target))
    results_dir = tmp_path / "results"
    assert main(["full", *args, "--name", "short", "--steps-scale", "0.5", "--results-dir", str(results_dir)]) == 0
    preset = json.loads((results_dir / "short/results.json").read_text())["presets"]["x"]
    assert preset["total_steps"] == [100] and preset["reduced_budget"]
    assert preset["target"]["status"] == "not applicable" and "reduced budget" in preset["target"]["why"]
    assert not (results_dir / "latest").exists()  # only a full-budget sweep becomes the README's


def test_only_a_sweep_holding_every_preset_becomes_latest(tmp_path: Path, zoo, capsys):
    args = zoo(preset_toml("a", seeds=2), preset_toml("b"))
    results_dir = tmp_path / "results"
    assert main(["full", *args, "--name", "part", "--preset", "a", "--results-dir", str(results_dir)]) == 0
    assert not (results_dir / "latest").exists()  # a filtered sweep must not replace the README's table
    assert "results/latest unchanged" in capsys.readouterr().out
    assert main(["full", *args, "--name", "part", "--preset", "b", "--results-dir", str(results_dir)]) == 0
    assert json.loads((results_dir / "latest").read_text()) == {"sweep": "part"}  # completed under one name
    assert main(["full", *args, "--name", "other", "--preset", "a", "--seeds", "1",
                 "--results-dir", str(results_dir)]) == 0
    assert json.loads((results_dir / "latest").read_text()) == {"sweep": "part"}  # fewer seeds: not complete


# --- the Ray backend (a real local instance) ----------------------------------------------

@pytest.mark.slow
def test_ray_backend_brings_outputs_back(tmp_path: Path, zoo):
    args = zoo(preset_toml("a"), preset_toml("b", args="score = 7"))
    results_dir = tmp_path / "results"
    assert main(["full", *args, "--name", "ray", "--backend", "ray", "--workers", "2",
                 "--results-dir", str(results_dir)]) == 0
    for preset, score in (("a", 101.0), ("b", 8.0)):
        run_dir = tmp_path / "runs/ray" / preset / "seed1"
        assert record(tmp_path, "ray", preset)["summary"]["eval_mean"] == score
        assert (run_dir / "config.json").exists() and "fake run" in (run_dir / "benchmark.log").read_text()
        assert list(run_dir.glob("events.out.tfevents.*"))
        assert not (run_dir / "checkpoints").exists()  # big files stay on the worker
    assert (results_dir / "ray/plots/b.png").exists()


# --- the real zoo -------------------------------------------------------------------------

@pytest.mark.slow
def test_smoke_over_the_real_zoo(tmp_path: Path):
    """Every real preset at its smoke budget (needs the algorithm files)."""
    proc = subprocess.run([sys.executable, "-m", "benchmark", "smoke", "--runs-dir", str(tmp_path), "--name", "smoke",
                           "--workers", "2", "--timeout-scale", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_dqn_memory_tool_fills_the_buffer_and_reports_peak_memory():
    proc = subprocess.run([sys.executable, "-m", "benchmark.dqn_memory", "--capacity", "6000"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    filled = re.search(r"filled 6,000 transitions in \d+ s: peak RSS ([\d,]+) MB", proc.stdout)
    # 6,000 frames of 84x84 bytes are ~42 MB on top of the interpreter and torch
    assert filled and int(filled.group(1).replace(",", "")) > 100, proc.stdout
    assert "1000 batches of 32 sampled" in proc.stdout
