"""The benchmark runner: manifest validation, sweeps of fake algorithm scripts (ok, crash,
timeout), resume, resource requests, per-run provenance, the sweep's manifest copy, reports,
plots, comparison groups, `compare`, progress and ETA, the README block, and the
datasets a sweep builds before its runs (and `datasets`, which only builds them).
The statistics are in test_benchmark_stats.py, the Ray cluster in test_benchmark_ray.py."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from importlib import metadata
from pathlib import Path

import pytest
from conftest import ROOT, check_error

sys.path.insert(0, str(ROOT))  # the package, when the project is not pip-installed
from benchmark import progress as progress_module
from benchmark import provenance
from benchmark.__main__ import main
from benchmark.backends import Machine, Storage
from benchmark.manifest import ZooError, load_zoo, tomllib
from benchmark.progress import Progress, describe
from benchmark.runner import build_datasets, execute, plan_jobs

ALGOS = ("ppo_atari", "dqn_atari", "naf", "d4pg", "ppg")

# A fake algorithm file honouring the CLI/outputs contract in a few lines. The training
# curve rises linearly over 20 episodes to `--score`, with a progress line per episode; the
# evaluation at episodes 5, 10, 15 and 20 is that value + seed (so the final one is score + seed).
# It writes events with tensorboard's own writer (the format torch's SummaryWriter writes)
# because importing torch would cost seconds per run. Its checkpoint is {"step": N}; `--resume`
# continues the curve after that step. "stall-once" logs half the curve, saves its checkpoint,
# then waits (unless resumed) for SIGTERM, on which it saves again and exits. "stall-unsaved" logs
# half the curve and waits without any checkpoint, unless the file `--marker` exists (it creates it
# first): a run whose first attempt is lost before its first save. `--device` and the
# GPUs it was given (CUDA_VISIBLE_DEVICES) and OpenMP's wait policy go to config.json, its start and end times to summary.json,
# and whether the Minari dataset of `--dataset-path` was there when it started. `--delay S` waits S
# seconds after each point, its events written (a run whose curve can be watched while it runs).
FAKE = textwrap.dedent("""
    import argparse, json, os, signal, sys, time
    from pathlib import Path
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    began = time.time()
    p = argparse.ArgumentParser()
    p.add_argument("--env-id", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--total-steps", type=int, required=True)
    p.add_argument("--behaviour", default="ok", choices=["ok", "crash", "sleep", "no-eval", "nan-eval", "stall-once", "stall-unsaved", "peak"])
    p.add_argument("--resume", default=None)
    p.add_argument("--score", type=float, default=100.0)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--layers", type=int, nargs="+", default=[64])
    p.add_argument("--fast", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--device", default="auto")
    p.add_argument("--dataset-path", default=None)
    p.add_argument("--marker", default=None)
    p.add_argument("--delay", type=float, default=0.0)
    args = p.parse_args()
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    print("fake run", args.env_id, args.seed, "from", Path(__file__).parent, flush=True)
    ready = args.dataset_path is not None and (Path(args.dataset_path) / "data" / "metadata.json").is_file()
    (run / "config.json").write_text(json.dumps({**vars(args), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "omp": os.environ.get("OMP_WAIT_POLICY"),
                                                 "dataset_ready": ready}))
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
    unsaved = args.behaviour == "stall-unsaved" and not Path(args.marker).exists()
    if unsaved:
        Path(args.marker).write_text("first attempt")
        stall = True
    final = float("nan") if args.behaviour == "nan-eval" else args.score + args.seed
    for i in range(1, 11 if stall else 21):
        step = i * args.total_steps // 20
        if step > start:
            log("charts/episodic_return", args.score * i / 20, step)
            if i % 5 == 0 and args.behaviour != "no-eval":
                peak = args.behaviour == "peak" and i == 15  # a best at 4x the final score, then lost
                log("eval/episodic_return", final if i == 20 else 4 * args.score if peak else args.score * i / 20 + args.seed, step)
            print(f"step {step:,}/{args.total_steps:,} | fake", flush=True)
            if args.delay:
                writer.flush()
                time.sleep(args.delay)
    if unsaved:
        writer.flush()
        print("stalling unsaved", flush=True)
        time.sleep(600)
    if stall:
        writer.flush()
        save(args.total_steps // 2)
        def stop(signum, frame):
            writer.close()
            save(args.total_steps // 2)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("stalling", flush=True)
        time.sleep(600)
    log("charts/SPS", 1000.0, args.total_steps)
    writer.close()
    save(args.total_steps)
    (run / "summary.json").write_text(json.dumps({
        "script": "fake.py", "algo": "fake", "env_id": args.env_id, "seed": args.seed, "start_step": start,
        "global_step": args.total_steps, "eval_mean": final, "eval_std": 0.0,
        "eval_episodes": args.eval_episodes, "eval_returns": [final],
        "sps": 1000.0 + args.seed, "began": began, "ended": time.time()}))
""")


def preset_toml(
    name: str,
    *,
    args: str = "",
    seeds: int = 1,
    target: str = "",
    timeout: float = 60,
    extra: str = "",
    full_extra: str = "",
    env: str = "Fake-v0",
    algo: str = "fake",
) -> str:
    """A manifest entry for the fake script (or another algorithm file in the fake's folder)."""
    return textwrap.dedent(f'''
        [{name}]
        algo = "{algo}"
        env_id = "{env}"
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
        {full_extra}
    ''') + (f"[{name}.target]\n{target}\n" if target else "")


@pytest.fixture
def zoo(tmp_path: Path, monkeypatch):
    """Write the fake script and a manifest; return a function building the CLI arguments.
    Runs from tmp_path, so that no default output path can land in the repository."""
    monkeypatch.chdir(tmp_path)
    algos = tmp_path / "algos"
    algos.mkdir(exist_ok=True)
    (algos / "fake.py").write_text(FAKE)

    def make(*entries: str) -> list[str]:
        manifest = tmp_path / "zoo.toml"
        manifest.write_text("\n".join(entries))
        return [
            "--zoo",
            str(manifest),
            "--algos-dir",
            str(algos),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--progress-interval-s",
            "600",
        ]

    return make


def record(tmp_path: Path, sweep: str, preset: str, seed: int = 1) -> dict:
    return json.loads((tmp_path / "runs" / sweep / preset / f"seed{seed}" / "run.json").read_text())


# --- the manifest -------------------------------------------------------------------------


def test_real_zoo_is_valid_and_covers_every_algorithm(tmp_path: Path):
    for manifest in (ROOT / "zoo").glob(
        "*.toml"
    ):  # stand-ins, so this test does not depend on the algorithm files
        for entry in tomllib.loads(manifest.read_text()).values():
            (tmp_path / f"{entry['algo']}.py").touch()
    presets = {n: p for n, p in load_zoo(ROOT / "zoo", tmp_path).items() if p.algo in ALGOS}
    assert {p.algo for p in presets.values()} == set(ALGOS)
    assert {
        "ppo_atari-breakout",
        "dqn_atari-breakout",
        "naf-pendulum",
        "d4pg-pendulum",
        "naf-invertedpendulum",
        "d4pg-halfcheetah",
        "naf-halfcheetah",
        "ppg-cartpole",
        "ppg-lunarlander",
        "ppg-lunarlander-noaux",
    } <= set(presets)
    pendulum = presets["naf-pendulum"]
    assert (pendulum.full.total_steps, pendulum.full.seeds, pendulum.curve_threshold) == (
        20_000,
        5,
        -200,
    )
    assert (pendulum.target.threshold, pendulum.target.at_least, pendulum.target.mean_min) == (
        -200,
        4,
        -160,
    )
    assert presets["ppg-lunarlander"].target.strict
    assert presets["ppg-lunarlander-noaux"].target is None
    # The ablation differs from the tuned preset in the auxiliary phase only, and shares its chart.
    assert presets["ppg-lunarlander-noaux"].args == {**presets["ppg-lunarlander"].args, "e-aux": 0}
    assert (
        presets["ppg-lunarlander"].group
        == presets["ppg-lunarlander-noaux"].group
        == "ppg-lunarlander"
    )
    for name in (
        "naf-halfcheetah",
        "d4pg-halfcheetah",
    ):  # issue 13: RL Zoo TD3's IQM at 100k, and no seed below half its best
        hc = presets[name]
        assert not hc.provisional and (hc.full.total_steps, hc.full.seeds) == (100_000, 5)
        assert (hc.target.iqm_min, hc.target.hold, hc.target.at_least, hc.target.of) == (
            5476,
            0.5,
            5,
            5,
        )
    hopper = presets[
        "naf-hopper"
    ]  # issue 13: naf's second locomotion task, against RL Zoo TD3's IQM there
    assert not hopper.provisional and (hopper.full.total_steps, hopper.full.seeds) == (100_000, 5)
    assert (hopper.target.iqm_min, hopper.target.hold, hopper.target.threshold) == (875, 0.5, 438)
    # Twins, LayerNorm and noise 0.05 were measured to help HalfCheetah, not Hopper.
    assert {
        **hopper.args,
        "twin-q": True,
        "batch-size": 256,
        "layer-norm": True,
        "noise-scale": 0.05,
        "final-noise-scale": 0.05,
    } == presets["naf-halfcheetah"].args
    assert hopper.args["noise-scale"] == hopper.args["final-noise-scale"] == 0.1
    for name in (
        "naf-invertedpendulum",
        "d4pg-invertedpendulum",
    ):  # issue 13: held over the last third of the run
        ip = presets[name]
        assert not ip.provisional and (ip.full.total_steps, ip.full.seeds) == (30_000, 5)
        assert (ip.target.metric, ip.target.threshold, ip.target.at_least, ip.target.of) == (
            "eval_min_last3",
            950,
            4,
            5,
        )
    assert presets["d4pg-pendulum"].smoke.args["batch-size"] == 32
    assert all(
        p.references
        for n, p in presets.items()
        if n.endswith(("breakout", "-pendulum", "cartpole"))
    )
    # Atari is human-normalised with the published Breakout scores; the 1M buffer asks for its memory.
    for name in ("dqn_atari-breakout", "ppo_atari-breakout"):
        norm = presets[name].normalise
        assert (norm.name, norm.random, norm.reference) == ("human", 1.7, 30.5)
    assert (
        presets["dqn_atari-breakout"].full.memory_gb == 7
        and presets["dqn_atari-breakout"].smoke.memory_gb == 0
    )


GOOD = 'metric = "eval_mean"\nmin = 1\nat_least = 1\nof = 1\ntext = "t"'
NORM = '[x.normalise]\nname = "human"\nrandom = 1\nsource = "s"\n'
BAD_MANIFESTS = {
    "unknown algorithm": (
        preset_toml("x").replace('algo = "fake"', 'algo = "nope"'),
        "unknown algorithm file",
    ),
    "missing budget": (preset_toml("x").split("[x.full]")[0], "missing budget [x.full]"),
    "missing total steps": (
        preset_toml("x").replace("total_steps = 200", ""),
        "full: missing 'total_steps'",
    ),
    "malformed target": (
        preset_toml("x", target=GOOD.replace("of = 1", "of = 0")),
        "'of' must be a positive int",
    ),
    "target over other seeds": (
        preset_toml("x", target=GOOD.replace("of = 1", "of = 3")),
        "must equal full.seeds",
    ),
    "min and above": (preset_toml("x", target=GOOD + "\nabove = 2"), "exactly one of 'min'"),
    "unknown key": (preset_toml("x", extra="seed = 3"), "unknown key(s) seed"),
    "unknown target key": (
        preset_toml("x", target=GOOD + "\nmax = 3"),
        "target: unknown key(s) max",
    ),
    "unknown metric": (
        preset_toml("x", target=GOOD.replace("eval_mean", "eval_max")),
        "metric 'eval_max' is not one of eval_mean, eval_min_last3",
    ),
    "hold above one": (
        preset_toml("x", target=GOOD + "\nhold = 1.5"),
        "hold (1.5) must be in (0, 1]",
    ),
    "hold of zero": (preset_toml("x", target=GOOD + "\nhold = 0"), "hold (0) must be in (0, 1]"),
    "reserved flag": (
        preset_toml("x", args="total-steps = 5"),
        "'total-steps' is set by the runner",
    ),
    "bad reference": (
        preset_toml("x", extra='references = [{name = "a", score = 1}]'),
        "missing 'source'",
    ),
    "wrong type": (
        preset_toml("x").replace("timeout_s = 60", 'timeout_s = "1h"', 1),
        "'timeout_s' must be a",
    ),
    "fractional gpus above one": (
        preset_toml("x", extra="num_gpus = 1.5"),
        "num_gpus must be a fraction up to 1",
    ),
    "negative gpus": (
        preset_toml("x", extra="num_gpus = -1"),
        "num_gpus must be a fraction up to 1",
    ),
    "zero memory": (
        preset_toml("x", full_extra="memory_gb = 0"),
        "full: 'memory_gb' must be a positive number",
    ),
    "group not a string": (preset_toml("x", extra="group = 3"), "'group' must be a str"),
    "normaliser without reference": (preset_toml("x") + NORM, "normalise: missing 'reference'"),
    "normaliser of zero width": (
        preset_toml("x") + NORM + "reference = 1\n",
        "'reference' must differ from 'random'",
    ),
    "dataset as a command": (
        preset_toml("x", extra='dataset = "python -m benchmark.datasets --env-id X"'),
        "dataset: a command line is not run; write a [<preset>.dataset] table of benchmark.datasets "
        "arguments (checkpoint, dataset_id, episodes, noise, root, seed)",
    ),
    "dataset without id": (
        preset_toml("x", extra="dataset = { episodes = 2 }"),
        "dataset: missing 'dataset_id'",
    ),
    "dataset id": (
        preset_toml("x", extra='dataset = { dataset_id = "../up-v0" }'),
        "dataset: 'dataset_id' '../up-v0' is not a Minari id (namespace/)name-v<version>",
    ),
    "dataset env": (
        preset_toml("x", extra='dataset = { dataset_id = "mc/x-v0", env_id = "Pendulum-v1" }'),
        "dataset: unknown key(s) env_id; allowed: checkpoint, dataset_id",
    ),
    "dataset episodes": (
        preset_toml("x", extra='dataset = { dataset_id = "mc/x-v0", episodes = 0 }'),
        "dataset: 'episodes' must be a positive int, got 0",
    ),
    "dataset noise": (
        preset_toml("x", extra='dataset = { dataset_id = "mc/x-v0", noise = -0.5 }'),
        "dataset: 'noise' and 'seed' must be at least 0",
    ),
    "dataset nan noise": (
        preset_toml("x", extra='dataset = { dataset_id = "mc/x-v0", noise = nan }'),
        "dataset: 'noise' must be a number, got nan",
    ),
    "dataset root": (
        preset_toml("x", extra='dataset = { dataset_id = "mc/x-v0", root = 3 }'),
        "dataset: 'root' must be a str, got 3",
    ),
    "dataset elsewhere": (
        preset_toml(
            "x",
            full_extra='args = { dataset-path = "data/mc/y-v0" }',
            extra='dataset = { dataset_id = "mc/x-v0", root = "data" }',
        ),
        "dataset: the preset reads --dataset-path data/mc/y-v0, but the dataset lands in data/mc/x-v0",
    ),
    "one folder, two recipes": (
        preset_toml("w", extra='dataset = { dataset_id = "mc/x-v0", root = "data" }')
        + preset_toml("x", extra='dataset = { dataset_id = "mc/x-v0", root = "data", noise = 1 }'),
        "its dataset lands in data/mc/x-v0 as that of zoo preset 'w', but with another recipe",
    ),
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


BAD_OPTIONS = {
    "--workers": (
        ["--workers", "0"],
        "--workers, --seeds, --steps-scale and --timeout-scale must be positive",
    ),
    "--memory-gb": (["--memory-gb", "0"], "--memory-gb and --sync-interval-s must be positive"),
    "--gpus": (["--gpus", "-1"], "--gpus at least 0"),
    "--sync-interval-s": (
        ["--sync-interval-s", "0"],
        "--memory-gb and --sync-interval-s must be positive",
    ),
    "--ray-requirements": (
        ["--ray-requirements", "missing.txt"],
        "--ray-requirements missing.txt: no such file",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_bad_sweep_option_is_refused(case: str, zoo, capsys):
    args = zoo(preset_toml("x"))
    assert main(["full", *args, *BAD_OPTIONS[case][0]]) == 2
    assert BAD_OPTIONS[case][1] in capsys.readouterr().err


def test_cli_error_has_no_traceback(tmp_path: Path, zoo):
    args = zoo(preset_toml("x").replace('algo = "fake"', 'algo = "nope"'))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmark", "full", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    check_error(proc, "benchmark: error: zoo preset 'x'", "unknown algorithm file")


# --- sweeps -------------------------------------------------------------------------------


def test_smoke_records_crash_and_timeout_and_goes_on(tmp_path: Path, zoo, capsys):
    args = zoo(
        preset_toml("good", args="fast = true, layers = [3, 4]"),
        preset_toml("crash", args='behaviour = "crash"'),
        preset_toml("slow", args='behaviour = "sleep"', timeout=3),
        preset_toml("no-eval", args='behaviour = "no-eval"'),
        preset_toml("nan", args='behaviour = "nan-eval"'),
    )
    assert main(["smoke", *args, "--name", "s", "--workers", "2"]) == 1
    good = record(tmp_path, "s", "good")
    assert good["status"] == "ok", good
    # Paths relative to the working directory (the repository), as they will be committed.
    assert good["command"][:1] == ["algos/fake.py"] and good["command"][-4:] == [
        "--fast",
        "--layers",
        "3",
        "4",
    ]
    assert good["command"][good["command"].index("--run-dir") + 1] == "runs/s/good/seed1"
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
    assert (
        a2_record["status"] == "ok" and not a2_record["resumed"] and not (a2 / "stale.txt").exists()
    )
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
    assert stall["command"][-2:] == ["--resume", "runs/u/stall/seed1/checkpoints/latest.pt"]
    assert (
        json.loads((stall_dir / "config.json").read_text())["resume"]
        == "runs/u/stall/seed1/checkpoints/latest.pt"
    )
    assert (stall["summary"]["start_step"], stall["summary"]["global_step"]) == (100, 200)
    # The curve continues where the checkpoint left it: both attempts' points, none twice.
    assert [step for step, _ in stall["curves"]["train"]] == list(range(10, 201, 10))
    log = (stall_dir / "benchmark.log").read_text()
    marker = "resumed from runs/u/stall/seed1/checkpoints/latest.pt at "
    assert log.index("stalling") < log.index(marker) < log.index("resumed at step 100"), log
    again = record(tmp_path, "u", "crash")
    assert again["status"] == "failed" and again["resumed"] and again["command"][-2] == "--resume"
    assert (crash_dir / "benchmark.log").read_text().count(
        "deliberate crash"
    ) == 2  # appended, not replaced
    report = (tmp_path / "results/u/report.md").read_text()
    assert (
        "seed 1: 101.0 (resumed)" in report and "### crash seed1 (resumed): exit status 1" in report
    )
    # The failed seed is shown and counted: "0 of 1 (1 failed)", never a silent mean over fewer seeds.
    assert "| crash | Fake-v0 | 200 | 0 of 1 (1 failed) | — | — |" in report


def _wait_for(condition, proc: subprocess.Popen | None = None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline and (proc is None or proc.poll() is None), (
            proc.communicate() if proc else "timed out"
        )
        time.sleep(0.2)


def test_sigterm_stops_the_sweep_and_its_runs(tmp_path: Path, zoo):
    args = zoo(
        preset_toml("a", seeds=2), preset_toml("slow", args='behaviour = "sleep"', timeout=300)
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmark",
            "full",
            *args,
            "--name",
            "k",
            "--results-dir",
            str(tmp_path / "results"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = tmp_path / "runs/k"
    _wait_for(
        lambda: (
            (runs / "slow/seed1/benchmark.log").exists()
            and len(list(runs.glob("a/seed*/run.json"))) == 2
        ),
        proc,
    )
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted; re-run with --name k to resume" in err, (
        out,
        err,
    )
    slow = json.loads((runs / "slow/seed1/run.json").read_text())
    assert (
        slow["status"] == "failed" and slow["returncode"] == -15
    )  # the run was stopped, not left behind
    assert main(["full", *args, "--name", "k", "--preset", "a"]) == 0


def _processes_with(marker: str) -> list[int]:
    """Ids of the live processes whose command line holds `marker` (Linux /proc)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (cmdline.parent / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if marker in text and state != "Z" and int(cmdline.parent.name) != os.getpid():
            pids.append(int(cmdline.parent.name))
    return pids


@pytest.mark.skipif(
    sys.platform != "linux", reason="the runs' parent-death signal is Linux's prctl"
)
def test_a_killed_driver_leaves_no_training_process(tmp_path: Path, zoo):
    """The runs have their own session (for the time limit's group kill); when the runner dies
    without a chance to stop them (SIGKILL), they still get SIGTERM and exit."""
    args = zoo(preset_toml("slow", args='behaviour = "sleep"', timeout=300, env="Lost-v0"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmark", "smoke", *args, "--name", "lost"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = tmp_path / "runs/lost/slow/seed1/benchmark.log"
    _wait_for(lambda: log.exists() and "fake run" in log.read_text(errors="replace"), proc)
    assert _processes_with("Lost-v0")
    proc.kill()
    proc.wait()
    _wait_for(lambda: not _processes_with("Lost-v0"), timeout=30)


# --- resource requests (local backend) ----------------------------------------------------


def test_machine_hands_out_cpus_memory_and_gpus():
    machine = Machine(cpus=4, memory_gb=10, gpus=[1.0, 1.0])
    assert machine.take(1, 7, 0.5) == [0]
    assert machine.take(1, 4, 0) is None  # 7 + 4 GB > 10 GB
    assert machine.take(1, 3, 0.5) == [0]  # two halves share GPU 0
    assert machine.take(1, 0, 2) is None  # GPU 0 is busy: no two whole GPUs
    assert machine.take(1, 0, 1) == [1]
    assert machine.take(1, 0, 0) == []
    assert machine.take(1, 0, 0) is None  # all 4 CPUs held
    machine.give(1, 7, 0.5, [0])
    machine.give(1, 3, 0.5, [0])
    machine.give(1, 0, 1, [1])
    assert (machine.cpus, machine.memory_gb, machine.gpus) == (3, 10, [1.0, 1.0])
    assert machine.take(1, 0, 2) == [0, 1]


def _overlap(a: dict, b: dict) -> bool:
    return (
        a["summary"]["began"] < b["summary"]["ended"]
        and b["summary"]["began"] < a["summary"]["ended"]
    )


def test_a_job_waiting_for_two_cpus_is_not_overtaken_by_later_one_cpu_jobs(tmp_path: Path, zoo):
    """Two workers, a 2-CPU job queued between 1-CPU ones: it runs as soon as both CPUs are
    free, before the 1-CPU jobs queued after it (a worker that gives back one CPU must not take
    it again for its next job while the 2-CPU job waits)."""
    args = zoo(
        preset_toml("before", seeds=2),
        preset_toml("pair", extra="num_cpus = 2"),
        preset_toml("after", seeds=4),
    )
    flags = ["--name", "fifo", "--workers", "2", "--results-dir", str(tmp_path / "results")]
    assert main(["full", *args, *flags]) == 0
    pair = record(tmp_path, "fifo", "pair")
    began, ended = pair["summary"]["began"], pair["summary"]["ended"]
    for seed in (1, 2):
        assert record(tmp_path, "fifo", "before", seed)["summary"]["ended"] <= began
    for seed in range(1, 5):  # the old scheduler let these overtake the pair
        assert ended <= record(tmp_path, "fifo", "after", seed)["summary"]["began"]


def test_local_backend_honours_memory_and_gpu_requests(tmp_path: Path, zoo, capsys):
    big = "memory_gb = 0.6"
    args = zoo(
        preset_toml("m1", full_extra=big),
        preset_toml("m2", full_extra=big),
        preset_toml("g1", extra="num_gpus = 1"),
        preset_toml("g2", extra="num_gpus = 1"),
        preset_toml("huge", full_extra="memory_gb = 5"),
        preset_toml("cpu"),
    )
    results = ["--results-dir", str(tmp_path / "results")]
    assert (
        main(
            [
                "full",
                *args,
                "--name",
                "res",
                "--workers",
                "2",
                "--memory-gb",
                "1",
                "--gpus",
                "1",
                *results,
            ]
        )
        == 1
    )
    runs = {name: record(tmp_path, "res", name) for name in ("m1", "m2", "g1", "g2", "cpu")}
    assert all(r["status"] == "ok" for r in runs.values()), runs
    assert not _overlap(runs["m1"], runs["m2"])  # 0.6 + 0.6 GB > 1 GB: one after the other
    assert not _overlap(runs["g1"], runs["g2"])  # one GPU between them
    gpus = {
        name: json.loads((tmp_path / f"runs/res/{name}/seed1/config.json").read_text())["gpus"]
        for name in runs
    }
    assert gpus == {
        "m1": "",
        "m2": "",
        "g1": "0",
        "g2": "0",
        "cpu": "",
    }  # no GPU to runs that asked for none
    huge = record(tmp_path, "res", "huge")
    assert huge["status"] == "failed" and "asks for 5 GB of memory; this machine" in huge["reason"]
    # Without GPUs, the request is dropped with a note and CUDA_VISIBLE_DEVICES is left alone.
    capsys.readouterr()
    assert main(["full", *args, "--name", "nogpu", "--preset", "g1", "--gpus", "0", *results]) == 0
    assert "no GPU here: presets that ask for one run on CPU" in capsys.readouterr().out
    assert json.loads((tmp_path / "runs/nogpu/g1/seed1/config.json").read_text())["gpus"] is None


def test_runs_side_by_side_sleep_while_waiting_and_a_lone_run_spins(
    tmp_path: Path, zoo, monkeypatch
):
    """OpenMP's spinning threads are fastest alone and take the cores of runs beside them: the
    runner sets OMP_WAIT_POLICY=PASSIVE only where runs share the machine, and never over the
    user's own setting."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    args = zoo(preset_toml("a"), preset_toml("b"))

    def policies(name: str) -> dict:
        runs = tmp_path / "runs" / name
        return {p: json.loads((runs / p / "seed1/config.json").read_text())["omp"] for p in "ab"}

    assert main(["smoke", *args, "--name", "two", "--workers", "2"]) == 0
    assert policies("two") == {"a": "PASSIVE", "b": "PASSIVE"}
    assert main(["smoke", *args, "--name", "one", "--workers", "1"]) == 0
    assert policies("one") == {"a": None, "b": None}  # one at a time: OpenMP's default
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert main(["smoke", *args, "--name", "own", "--workers", "2"]) == 0
    assert policies("own") == {"a": "ACTIVE", "b": "ACTIVE"}


# --- provenance ---------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _repository(tmp_path: Path) -> tuple[list[str], str]:
    """A git repository of the fake zoo (its algorithm files and manifest): git's arguments to
    commit, and its first commit."""
    _git(tmp_path, "init", "-q")
    commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q"]
    _git(tmp_path, "add", "algos", "zoo.toml")
    _git(tmp_path, *commit, "-m", "first")
    return commit, _git(tmp_path, "rev-parse", "HEAD")


def test_each_run_records_its_provenance(tmp_path: Path, zoo):
    args = zoo(preset_toml("a"))
    commit = _repository(tmp_path)[1]
    results = ["--results-dir", str(tmp_path / "results")]
    assert main(["full", *args, "--name", "clean", *results]) == 0
    prov = record(tmp_path, "clean", "a")["provenance"]
    assert (prov["commit"], prov["dirty"], prov["device"]) == (commit, False, "cpu")
    assert prov["host"] == os.uname().nodename and prov["versions"] == {
        lib: metadata.version(lib) for lib in ("torch", "gymnasium", "ale-py")
    }
    with open(tmp_path / "algos/fake.py", "a") as f:
        f.write("# an uncommitted change\n")
    assert main(["full", *args, "--name", "dirty", *results]) == 0
    assert record(tmp_path, "dirty", "a")["provenance"]["dirty"] is True
    report = (tmp_path / "results/dirty/report.md").read_text()
    assert f"runs at commit(s) `{commit[:10]}` (dirty: True)" in report
    assert f"| a/seed1 | ok | {commit[:10]} | True | {os.uname().nodename} | cpu |" in report


def test_a_run_resumed_across_commits_keeps_each_attempts_commit(tmp_path: Path, zoo):
    """A sweep resumed after a commit continues its unfinished runs: such a run trained under both
    commits, and its record says so (not only the commit that finished it)."""
    args = zoo(preset_toml("stall", args='behaviour = "stall-once"', timeout=10))
    commit, first = _repository(tmp_path)
    results = ["--results-dir", str(tmp_path / "results")]
    assert main(["full", *args, "--name", "x", *results]) == 1  # timed out halfway, checkpoint kept
    assert record(tmp_path, "x", "stall")["provenance"]["commit"] == first
    args = zoo(
        preset_toml("stall", args='behaviour = "stall-once"')
    )  # a change lands (here: the time limit)
    _git(tmp_path, *commit, "-am", "second")
    second = _git(tmp_path, "rev-parse", "HEAD")
    assert main(["full", *args, "--name", "x", *results]) == 0
    rec = record(tmp_path, "x", "stall")
    assert rec["resumed"] and rec["provenance"]["commit"] == second
    (earlier,) = rec["provenance"]["earlier_attempts"]
    assert (earlier["commit"], earlier["dirty"], earlier["host"]) == (
        first,
        False,
        os.uname().nodename,
    )
    # its wall time is both attempts' (the first ran to its 10 s limit), its peak memory the larger
    assert earlier["wall_time_s"] >= 10 and 0 < rec["attempt_wall_time_s"] < 10
    assert rec["wall_time_s"] == round(earlier["wall_time_s"] + rec["attempt_wall_time_s"], 2)
    assert rec["peak_rss_mb"] >= earlier["peak_rss_mb"] > 0
    report = (tmp_path / "results/x/report.md").read_text()
    assert (
        f"runs at commit(s) {', '.join(f'`{c[:10]}`' for c in sorted([first, second]))} (dirty: False)"
        in report
    )
    assert f"| stall/seed1 | ok | {second[:10]} (resumed from {first[:10]}) | False |" in report


def test_run_device_follows_the_runs_device_flag(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(provenance, "cuda_device", lambda env: "Fake GPU")
    for asked, device in (("cpu", "cpu"), ("auto", "cuda (Fake GPU)"), ("cuda", "cuda (Fake GPU)")):
        (tmp_path / "config.json").write_text(json.dumps({"device": asked}))
        assert provenance.run_host(tmp_path, {})["device"] == device


def test_cuda_probe_is_skipped_without_a_driver_and_cached(monkeypatch):
    monkeypatch.setattr(provenance, "_cuda_names", {})
    monkeypatch.setattr(provenance.shutil, "which", lambda name: None)
    assert provenance.cuda_device({"CUDA_VISIBLE_DEVICES": "0"}) is None
    monkeypatch.setattr(provenance.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert (
        provenance.cuda_device({"CUDA_VISIBLE_DEVICES": "0"}) is None
    )  # cached for that device list
    assert provenance.cuda_device({"CUDA_VISIBLE_DEVICES": ""}) is None  # no GPU given: no probe


# --- the manifest copy, reports from stored curves -----------------------------------------


def test_report_uses_the_sweeps_manifest_copy_and_committed_curves(tmp_path: Path, zoo, capsys):
    target = 'metric = "eval_mean"\nmin = 102\nat_least = 1\nof = 2\ntext = "final eval >= 102"'
    args = zoo(preset_toml("a", seeds=2, target=target))
    results_dir = tmp_path / "results"
    assert main(["full", *args, "--name", "m", "--results-dir", str(results_dir)]) == 0
    before = json.loads((results_dir / "m/results.json").read_text())["presets"]["a"]
    assert (
        before["target"]["status"] == "met" and before["sample_efficiency"]["eval_from_step"] == 100
    )
    # Later the target is raised and the algorithm file renamed: an old sweep reports as it ran.
    (tmp_path / "algos/fake.py").rename(tmp_path / "algos/renamed.py")
    zoo(
        preset_toml("a", seeds=2, target=target.replace("min = 102", "min = 500")).replace(
            '"fake"', '"renamed"'
        )
    )
    assert (
        main(
            [
                "report",
                "--name",
                "m",
                "--runs-dir",
                str(tmp_path / "runs"),
                "--results-dir",
                str(results_dir),
            ]
        )
        == 0
    )
    again = json.loads((results_dir / "m/results.json").read_text())
    assert again["presets"]["a"]["target"] == before["target"]
    # Without the raw runs, the committed folder alone (records, curves, manifest) gives the same numbers.
    shutil.rmtree(tmp_path / "runs")
    (results_dir / "m/plots/a.png").unlink()
    assert (
        main(
            [
                "report",
                "--name",
                "m",
                "--runs-dir",
                str(tmp_path / "runs"),
                "--results-dir",
                str(results_dir),
            ]
        )
        == 0
    )
    committed = json.loads((results_dir / "m/results.json").read_text())
    for key in ("presets", "runs", "provenance", "groups", "normalised"):
        assert committed[key] == again[key], key
    assert (results_dir / "m/plots/a.png").exists()  # redrawn from curves.json
    assert main(["report", "--name", "nope", "--results-dir", str(results_dir)]) == 2
    assert "no sweep named 'nope'" in capsys.readouterr().err


def test_target_on_the_lowest_of_the_last_three_evaluations(tmp_path: Path, zoo):
    # The fake run of seed k evaluates 25 + k, 50 + k, 75 + k, 100 + k: its last three are at least 50 + k.
    target = (
        'metric = "eval_min_last3"\nmin = 52\nat_least = 2\nof = 2\ntext = "last three evals >= 52"'
    )
    args = zoo(
        preset_toml("a", seeds=2, target=target),
        preset_toml("b", seeds=2, target=target.replace("52", "51")),
    )
    results_dir = tmp_path / "results"
    assert (
        main(["full", *args, "--name", "l", "--results-dir", str(results_dir)]) == 1
    )  # 'a' misses
    presets = json.loads((results_dir / "l/results.json").read_text())["presets"]
    assert (presets["a"]["target"]["status"], presets["a"]["target"]["passed_seeds"]) == (
        "missed",
        1,
    )
    assert (presets["b"]["target"]["status"], presets["b"]["target"]["passed_seeds"]) == ("met", 2)
    assert presets["a"]["eval_mean"]["mean"] == pytest.approx(
        101.5
    )  # the final evaluations alone would pass


def test_target_on_the_iqm_and_on_keeping_half_of_the_best_evaluation(tmp_path: Path, zoo):
    # Both presets end at 100 + k; 'peak' evaluated 400 before that, so its seeds keep only a quarter.
    target = 'metric = "eval_mean"\nmin = 100\nat_least = 2\nof = 2\niqm_min = 101.5\nhold = 0.5\ntext = "t"'
    args = zoo(
        preset_toml("kept", seeds=2, target=target),
        preset_toml("peak", seeds=2, args='behaviour = "peak"', target=target),
        preset_toml("low", seeds=2, target=target.replace("101.5", "101.6")),
        preset_toml("mean", seeds=2, target=target.replace("iqm_min = 101.5", "mean_min = 102")),
    )
    results_dir = tmp_path / "results"
    assert main(["full", *args, "--name", "h", "--results-dir", str(results_dir)]) == 1
    presets = json.loads((results_dir / "h/results.json").read_text())["presets"]
    assert (presets["kept"]["target"]["status"], presets["kept"]["target"]["iqm"]) == (
        "met",
        pytest.approx(101.5),
    )
    assert (presets["peak"]["target"]["status"], presets["peak"]["target"]["passed_seeds"]) == (
        "missed",
        0,
    )
    assert (presets["low"]["target"]["status"], presets["low"]["target"]["passed_seeds"]) == (
        "missed",
        2,
    )  # IQM 101.5
    report = (results_dir / "h/report.md").read_text()
    # A failed floor comes first, so that these misses do not read "missed (2/2 seeds)".
    assert "| **missed**: IQM 101.5 < 101.6; 2/2 seeds pass |" in report
    assert "| **missed**: mean 101.5 < 102.0; 2/2 seeds pass |" in report
    assert "| **met** (2/2 seeds) |" in report and "| **missed** (0/2 seeds) |" in report


def test_a_changed_preset_cannot_join_its_old_sweep(tmp_path: Path, zoo, capsys):
    args = zoo(preset_toml("a", args="score = 5"))
    assert main(["smoke", *args, "--name", "c"]) == 0
    manifest = json.loads((tmp_path / "runs/c/manifest.json").read_text())
    assert manifest["a"]["args"] == {"score": 5}
    args = zoo(preset_toml("a", args="score = 6"))
    assert main(["smoke", *args, "--name", "c"]) == 2
    assert "zoo preset 'a' changed since sweep 'c' ran it" in capsys.readouterr().err


def test_full_sweep_report_plot_and_readme(tmp_path: Path, zoo, capsys):
    met = 'metric = "eval_mean"\nmin = 102\nat_least = 1\nof = 2\nmean_min = 102\ntext = "final eval >= 102"'
    reference = (
        'references = [{name = "peer", score = "414.7 +- 28.1", source = "https://example.org"}]'
    )
    args = zoo(
        preset_toml(
            "hit",
            seeds=2,
            target=met.replace("mean_min = 102", "mean_min = 101.5"),
            extra=reference,
        ),
        preset_toml("miss", seeds=2, target=met),
    )
    results_dir = tmp_path / "results"
    assert (
        main(["full", *args, "--name", "f", "--results-dir", str(results_dir)]) == 1
    )  # 'miss' misses
    assert "target missed: miss: final eval >= 102" in capsys.readouterr().out
    results = json.loads((results_dir / "f/results.json").read_text())
    hit = results["presets"]["hit"]
    assert hit["eval_mean"]["mean"] == pytest.approx(101.5) and hit["eval_mean"][
        "std"
    ] == pytest.approx(0.5**0.5)  # the sample std of 101 and 102
    assert (
        hit["eval_mean"]["iqm"] == pytest.approx(101.5) and hit["eval_mean"]["iqm_ci95"] is None
    )  # 2 seeds
    assert hit["target"]["status"] == "met" and hit["target"]["passed_seeds"] == 1
    assert (
        results["presets"]["miss"]["target"]["status"] == "missed"
    )  # 1 of 2 >= 102 but mean 101.5
    # Returns 5, 10, ..., 100 at steps 10, 20, ...: the 10-episode average reaches 40 at episode 12.5 -> 13.
    assert hit["train_crossing"]["steps"] == [130, 130]
    # Evaluations 25 + seed, 50 + seed, 75 + seed, 100 + seed at steps 50..200: IQM >= 40 from step 100 on.
    assert hit["sample_efficiency"]["eval_iqm_curve"] == [
        [50, 26.5],
        [100, 51.5],
        [150, 76.5],
        [200, 101.5],
    ]
    assert hit["sample_efficiency"]["eval_from_step"] == 100
    assert hit["sps_mean"] == 1001.5  # from the runs' summary.json
    peaks = [r["peak_rss_mb"] for r in results["runs"] if r["preset"] == "hit"]
    assert hit["peak_rss_mb_max"] == max(peaks) > 0  # measured by the runner
    assert hit["references"][0]["score"] == "414.7 +- 28.1"
    assert "python -m benchmark full" in results["commands"][0]
    assert json.loads((results_dir / "latest").read_text()) == {"sweep": "f"}
    report = (results_dir / "f/report.md").read_text()
    assert (
        "| hit | Fake-v0 | 200 | 2 | 101.5 ± 0.7 | 101.5 [n/a] | **met** (1/2 seeds) | ≥ 40 from 100 |"
        in report
    )
    assert "peer: 414.7 +- 28.1" in report and "[plot](plots/hit.png)" in report
    assert "training 10-episode average (exploration included) first ≥ 40 at: 130, 130" in report
    png = (results_dir / "f/plots/hit.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    # The runs' checkpoints stay in runs/, not in the committed results, and no absolute path goes there.
    assert not list(results_dir.rglob("*.pt"))
    for path in (results_dir / "f").glob("*.*"):
        if path.suffix in (".json", ".md"):
            assert str(tmp_path) not in path.read_text(), path
    assert json.loads((results_dir / "f/curves.json").read_text())["hit/seed1"]["eval"][-1] == [
        200,
        101.0,
    ]

    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nno markers\n")
    flags = ["--readme", str(readme), "--results-dir", str(results_dir), *args[:4]]
    assert main(["readme", *flags]) == 2
    assert "needs one '<!-- results:start -->' line" in capsys.readouterr().err
    readme.write_text("# Title\n<!-- results:start -->\nold\n<!-- results:end -->\ntail\n")
    assert main(["readme", *flags]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n<!-- results:start -->") and text.endswith(
        "<!-- results:end -->\ntail\n"
    )
    assert (
        "old" not in text
        and "| hit | Fake-v0 |" in text
        and "[plot](results/f/plots/hit.png)" in text
    )


def test_comparison_group_and_normalised_scores(tmp_path: Path, zoo):
    group = 'group = "g"\nreferences = [{name = "peer", score = 60, source = "s"}]'
    norm = '[{p}.normalise]\nname = "human"\nrandom = 1\nreference = 201\nsource = "paper"\n'
    target = 'metric = "eval_mean"\nmin = 0\nat_least = 3\nof = 3\ntext = "t"'
    args = zoo(
        preset_toml("base", seeds=3, extra=group, target=target) + norm.format(p="base"),
        preset_toml("harder", seeds=3, args="score = 50", extra=group, target=target)
        + norm.format(p="harder"),
        # Report-only: an ablation has its own normalised score but is not pooled as the algorithm.
        preset_toml("ablation", args="score = -1.01", extra=group) + norm.format(p="ablation"),
        preset_toml("alone"),
    )
    results_dir = tmp_path / "results"
    assert (
        main(["full", *args, "--name", "g", "--results-dir", str(results_dir), "--workers", "2"])
        == 0
    )
    results = json.loads((results_dir / "g/results.json").read_text())
    assert results["groups"] == {"g": ["base", "harder", "ablation"]}
    png = (results_dir / "g/plots/group-g.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000
    # Scores 101, 102, 103: normalised (s - 1) / 200 = 0.5, 0.505, 0.51.
    base = results["presets"]["base"]["normalised"]
    assert base["scores"] == pytest.approx([0.5, 0.505, 0.51]) and base["iqm"] == pytest.approx(
        0.505
    )
    assert results["presets"]["ablation"]["normalised"]["scores"] == pytest.approx(
        [(-0.01 - 1) / 200]
    )
    (agg,) = results["normalised"]
    assert (agg["algo"], agg["normaliser"], agg["presets"]) == (
        "fake",
        "human",
        ["base", "harder"],
    )
    # Pooled: 0.25, 0.255, 0.26, 0.5, 0.505, 0.51 -> trim one each side -> mean of the middle four.
    assert agg["iqm"] == pytest.approx((0.255 + 0.26 + 0.5 + 0.505) / 4)
    low, high = agg["iqm_ci95"]
    assert low < agg["iqm"] < high
    report = (results_dir / "g/report.md").read_text()
    assert "- g: base, harder, ablation — [plot](plots/group-g.png)" in report
    assert "| fake | human | base, harder | 0.380 [" in report
    # The ablation's final evaluation, -0.01, reads 0.0 rather than -0.0.
    assert "| ablation | Fake-v0 | 200 | 1 | 0.0 ± n/a | 0.0 [n/a] |" in report


# --- a sweep's name never loses committed results ----------------------------------------


def test_a_filtered_sweep_under_a_committed_name_keeps_its_other_presets(
    tmp_path: Path, zoo, capsys
):
    """On a clone without runs/ (git-ignored), a sweep filtered to one preset under the name of
    a committed sweep adds to it or replaces that preset's runs; the other presets stay, with
    their own commits, and results/latest keeps its whole table."""
    args = zoo(preset_toml("a", seeds=2), preset_toml("b", args="score = 50"))
    results_dir = tmp_path / "results"
    flags = [*args, "--name", "x", "--results-dir", str(results_dir)]
    assert main(["full", *flags]) == 0
    assert json.loads((results_dir / "latest").read_text()) == {"sweep": "x"}
    committed = json.loads((results_dir / "x/results.json").read_text())
    shutil.rmtree(tmp_path / "runs")  # a fresh clone: the committed results, no raw runs

    # A shorter sweep cannot join (nor replace) the full one: refused before anything runs.
    shorter = ["--steps-scale", "0.5", "--preset", "a"]
    assert main(["full", *flags, *shorter]) == 2
    assert "sweep 'x' was run as full with budget" in capsys.readouterr().err
    assert not (tmp_path / "runs/x").exists()

    assert main(["full", *flags, "--preset", "a"]) == 0
    again = json.loads((results_dir / "x/results.json").read_text())
    assert list(again["presets"]) == ["a", "b"]
    assert [r for r in again["runs"] if r["preset"] == "b"] == [
        r for r in committed["runs"] if r["preset"] == "b"
    ]  # untouched, provenance and all
    assert {r["seed"] for r in again["runs"] if r["preset"] == "a"} == {1, 2}
    assert len(again["commands"]) == 2 and again["commands"][1].endswith("--preset a")
    assert json.loads((results_dir / "latest").read_text()) == {"sweep": "x"}
    assert "| b | Fake-v0 | 200 | 1 | 51.0 ± n/a |" in (results_dir / "x/report.md").read_text()

    # A preset new to the zoo joins the sweep; `report` from partial raw runs keeps the rest.
    args = zoo(preset_toml("a", seeds=2), preset_toml("b", args="score = 50"), preset_toml("c"))
    assert (
        main(["full", *args, "--name", "x", "--results-dir", str(results_dir), "--preset", "c"])
        == 0
    )
    report = ["report", "--name", "x", "--runs-dir", str(tmp_path / "runs")]
    assert main([*report, "--results-dir", str(results_dir)]) == 0
    presets = json.loads((results_dir / "x/results.json").read_text())["presets"]
    assert list(presets) == ["a", "b", "c"] and presets["b"]["eval_mean"]["mean"] == 51.0


# --- compare ------------------------------------------------------------------------------


def committed_sweep(results_dir: Path, name: str, scores: dict[str, list[float | None]]) -> None:
    """A committed results folder, as `full` leaves one, holding these final evaluations per
    preset (seeds 1, 2, ...; None: a failed seed)."""
    manifest, runs = {}, []
    for preset, values in scores.items():
        manifest[preset] = {
            "algo": "fake",
            "env_id": "Fake-v0",
            "args": {},
            "smoke": {"total_steps": 100, "timeout_s": 60},
            "full": {"total_steps": 200, "seeds": len(values), "timeout_s": 60},
        }
        for seed, value in enumerate(values, start=1):
            runs.append(
                {
                    "preset": preset,
                    "algo": "fake",
                    "env_id": "Fake-v0",
                    "seed": seed,
                    "total_steps": 200,
                    "status": "failed" if value is None else "ok",
                    "reason": "exit status 1" if value is None else "",
                    "summary": {} if value is None else {"eval_mean": value},
                    "crossing_step": None,
                    "wall_time_s": 60.0,
                    "provenance": {"commit": "0123456789abcdef", "dirty": False},
                }
            )
    folder = results_dir / name
    folder.mkdir(parents=True)
    meta = {"sweep": name, "mode": "full", "budget": {"steps_scale": 1.0, "total_steps": None}}
    command = f"python -m benchmark full --name {name}"
    (folder / "results.json").write_text(json.dumps({**meta, "commands": [command], "runs": runs}))
    (folder / "curves.json").write_text("{}")
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_the_report_says_how_many_runs_its_wall_time_and_memory_are_over(tmp_path: Path, zoo):
    """A run resumed from an attempt that could not note its wall time or memory has neither:
    the preset's mean wall time and peak memory then cover only some of its runs, and say so."""
    args = ["--results-dir", str(tmp_path / "results"), "--runs-dir", str(tmp_path / "runs")]
    committed_sweep(tmp_path / "results", "s", {"part": [1.0, 2.0, 3.0], "none": [1.0, 2.0]})
    path = tmp_path / "results/s/results.json"
    results = json.loads(path.read_text())
    for run, wall, peak in zip(
        results["runs"], [None, 60.0, 120.0, None, None], [None, 500.0, 700.0, None, None]
    ):
        run["wall_time_s"], run["peak_rss_mb"] = wall, peak
    path.write_text(json.dumps(results))
    assert main(["report", "--name", "s", *args]) == 0
    text = (tmp_path / "results/s/report.md").read_text()
    assert "| 1.5 min (2 of 3 runs) |" in text and "- peak memory: 700 MB (2 of 3 runs)" in text
    none = next(line for line in text.splitlines() if line.startswith("| none |"))
    # SPS, wall time, plot: the fake records have no SPS and no curves to plot.
    assert none.endswith("| — | unknown | — |") and "- peak memory: unknown" in text


def test_compare_gives_a_verdict_only_where_the_seeds_support_one(tmp_path: Path, capsys):
    results = ["--results-dir", str(tmp_path / "results"), "--runs-dir", str(tmp_path / "runs")]
    committed_sweep(
        tmp_path / "results",
        "before",
        {
            "sep": [101.0, 102.0, 103.0, 104.0, 105.0, 106.0],
            "few": [11.0, 12.0, 13.0],
            "same": [1.0, 3.0, 5.0, 7.0, 9.0, 11.0],
            "capped": [500.0] * 5,
            "gone": [1.0, 2.0, 3.0],
        },
    )
    committed_sweep(
        tmp_path / "results",
        "after",
        {
            "sep": [51.0, 52.0, 53.0, 54.0, 55.0, 56.0],
            "few": [1.0, 2.0, 3.0],
            "same": [2.0, 4.0, 6.0, 8.0, 10.0, 12.0],
            "capped": [500.0] * 5,
            "gone": [None, None, None],
        },
    )
    out = tmp_path / "cmp.md"
    assert main(["compare", "before", "after", *results, "--out", str(out)]) == 1  # 'sep' got worse
    text = capsys.readouterr()
    assert "B is worse than A on: sep (family-wise level 0.05 over the 3 presets compared)" in (
        text.err
    )
    assert "- 3 of the 5 presets both sweeps ran were compared, at a family-wise level of 0.05" in (
        text.out
    )
    # Every seed of B below every seed of A at 6 seeds a side: p = 2 / C(12, 6) = 0.0022, times 3
    # for the three presets compared.
    assert "| 0.00 | 0.002 | 0.006 | **B worse** |" in text.out
    # Complete separation at 3 seeds a side (p = 0.1) cannot be a verdict.
    assert (
        "| 0.00 | 0.100 | — | no verdict: too few seeds: at 3 against 3 the smallest possible p "
        "is 0.100 > 0.05 |" in text.out
    )
    assert "no verdict: adjusted p 1.000 > 0.05 (exact permutation (ties)) |" in text.out
    assert "| gone | 3 / 0 of 3 (3 failed) |" in text.out and "no finished seed in B" in text.out
    assert "IQM A [95% CI, trimmed t]" in text.out
    assert out.read_text() == text.out
    assert main(["compare", "after", "before", *results]) == 0
    assert "| 1.00 | 0.002 | 0.006 | **B better** |" in capsys.readouterr().out
    # Fewer presets compared: a smaller correction.
    assert main(["compare", "before", "after", *results, "--preset", "sep"]) == 1
    assert "| 0.00 | 0.002 | 0.002 | **B worse** |" in capsys.readouterr().out
    assert main(["compare", "before", "nope", *results]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err


def test_compare_says_when_no_verdict_is_attainable(tmp_path: Path, capsys):
    """20 presets at 5 seeds a side: the smallest possible p, 2 / 252, is above Holm's first
    threshold, 0.05 / 20, so even complete separation everywhere is no verdict; it says so."""
    results = ["--results-dir", str(tmp_path / "results")]
    names = [f"p{i:02d}" for i in range(20)]
    committed_sweep(tmp_path / "results", "a", {n: [10.0, 11.0, 12.0, 13.0, 14.0] for n in names})
    committed_sweep(tmp_path / "results", "b", {n: [1.0, 2.0, 3.0, 4.0, 5.0] for n in names})
    assert main(["compare", "a", "b", *results]) == 0
    out = capsys.readouterr().out
    assert "No verdict is attainable in this comparison: with 20 presets" in out
    assert out.count("no verdict: adjusted p 0.159 > 0.05") == 20  # 20 x 2/252, made monotone


# --- the README's table -------------------------------------------------------------------


def test_readme_lists_every_preset_and_what_was_not_run_at_this_definition(
    tmp_path: Path, zoo, capsys
):
    args = zoo(preset_toml("a", seeds=2), preset_toml("b"))
    commit, first = _repository(tmp_path)
    results_dir = tmp_path / "results"
    assert main(["full", *args, "--name", "s", "--results-dir", str(results_dir)]) == 0
    readme = tmp_path / "README.md"
    readme.write_text("# T\n<!-- results:start -->\n<!-- results:end -->\n")
    flags = ["readme", "--readme", str(readme), "--results-dir", str(results_dir), *args[:4]]
    assert main(flags) == 0
    text = readme.read_text()
    assert f"- algorithm files changed since commit `{first[:10]}`: none" in text
    assert "- 2 of the zoo's 2 presets have a result at their current definition" in text
    assert "not run at this definition" not in text

    # The zoo moves on: b's budget changes, c is added, and the algorithm file changes.
    zoo(
        preset_toml("a", seeds=2),
        preset_toml("b").replace("total_steps = 200", "total_steps = 400"),
        preset_toml("c"),
    )
    with open(tmp_path / "algos/fake.py", "a") as f:
        f.write("# a change\n")
    _git(tmp_path, *commit, "-am", "second")
    assert main(flags) == 0
    text = readme.read_text()
    assert f"- algorithm files changed since commit `{first[:10]}`: 1 of 1: `fake.py`" in text
    assert "- 1 of the zoo's 3 presets have a result at their current definition" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0] for row in rows] == ["| a", "| b", "| c"]  # the zoo's presets
    assert rows[0].startswith("| a | Fake-v0 | 200 | 2 | 101.5 ± 0.7 |")
    assert rows[1] == (
        "| b | Fake-v0 | 400 | 1 | **not run at this definition** | — | s ran another definition "
        "(full.total_steps changed since) | — | — | — | — |"
    )
    assert (
        "| c | Fake-v0 | 200 | 1 | **not run at this definition** | — | not in sweep s |" in rows[2]
    )
    assert "101.0" not in rows[1]  # no old number under a new definition

    # A clone without the sweep's commit (shallow, or rewritten history) says so.
    results = json.loads((results_dir / "s/results.json").read_text())
    for run in results["runs"]:
        run["provenance"]["commit"] = "f" * 40
    (results_dir / "s/results.json").write_text(json.dumps(results))
    assert main(flags) == 0
    assert (
        f"- algorithm files changed since commit `{'f' * 10}`: unknown (the commit is not in this "
        "clone's history)" in readme.read_text()
    )


def test_readme_says_when_a_resumed_sweep_ran_one_version_of_the_algorithm_files(
    tmp_path: Path, zoo
):
    """A sweep resumed across commits: commits that changed only the tooling hold the same
    algorithm files, said in one line; a commit that changed an algorithm file is another
    version. A command run several times (each resumption) is listed once."""
    args = zoo(preset_toml("a", seeds=2), preset_toml("b"))
    commit, first = _repository(tmp_path)
    results_dir = tmp_path / "results"
    sweep = ["full", *args, "--name", "s", "--results-dir", str(results_dir)]
    assert main(sweep) == 0
    assert main(sweep) == 0  # resumed: every run already finished
    readme = tmp_path / "README.md"
    readme.write_text("# T\n<!-- results:start -->\n<!-- results:end -->\n")
    flags = ["readme", "--readme", str(readme), "--results-dir", str(results_dir), *args[:4]]

    def stamp(*commits: str) -> str:
        """The committed runs, stamped with these commits in turn; the README generated."""
        path = results_dir / "s/results.json"
        results = json.loads(path.read_text())
        for run, c in zip(results["runs"], commits):
            run["provenance"]["commit"] = c
        path.write_text(json.dumps(results))
        assert main(flags) == 0
        return readme.read_text()

    (tmp_path / "tool.txt").write_text("the runner changed\n")
    _git(tmp_path, "add", "tool.txt")
    _git(tmp_path, *commit, "-m", "tooling")
    tooling = _git(tmp_path, "rev-parse", "HEAD")
    text = stamp(first, tooling, first)
    assert "- the runs' 2 commits hold the same algorithm files; changed since: none" in text
    assert "algorithm files changed since commit" not in text and "versions" not in text
    assert text.count("    python -m benchmark full") == 1
    shutil.rmtree(results_dir / "s")  # the report from the raw sweep alone, both invocations
    report = ["report", "--name", "s", "--results-dir", str(results_dir)]
    report += ["--runs-dir", str(tmp_path / "runs")]
    assert main(report) == 0
    assert (results_dir / "s/report.md").read_text().count("  - `python -m benchmark full") == 1

    with open(tmp_path / "algos/fake.py", "a") as f:
        f.write("# a change\n")
    _git(tmp_path, *commit, "-am", "algorithm")
    algorithm = _git(tmp_path, "rev-parse", "HEAD")
    text = stamp(first, tooling, algorithm)
    pair = ", ".join(f"`{c[:10]}`" for c in sorted([first, tooling]))
    assert "- the runs ran 2 different versions of the algorithm files" in text
    assert f"- commits {pair} hold the same algorithm files; changed since: 1 of 1: `fake.py`" in (
        text
    )
    assert f"- algorithm files changed since commit `{algorithm[:10]}`: none" in text

    # A commit this clone lacks is not called another version: git cannot say what it holds.
    text = stamp(first, "f" * 40, first)
    assert "versions" not in text
    assert f"- algorithm files changed since commit `{first[:10]}`: 1 of 1: `fake.py`" in text
    assert f"- algorithm files changed since commit `{'f' * 10}`: unknown" in text


def test_the_committed_readme_block_is_what_readme_generates():
    """README.md's results table is generated, never typed: it must equal `python -m benchmark
    readme`'s output for the committed results and today's zoo (run that command after a sweep,
    a change to a preset, or a commit that changes which algorithm files differ from the sweep's)."""
    from benchmark.report import README_END, README_START, readme_block

    shallow = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
    )
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        pytest.skip("needs the repository's git history (the block names files changed since)")
    readme = ROOT / "README.md"
    text = readme.read_text()
    committed = text[text.index(README_START) : text.index(README_END) + len(README_END)]
    generated = readme_block(
        readme, ROOT / "results", load_zoo(ROOT / "zoo", ROOT / "algos"), ROOT / "algos"
    )
    assert committed == generated, (
        "README.md's results block is stale: run python -m benchmark readme"
    )


# --- the command line ---------------------------------------------------------------------


def test_help_names_every_subcommand_and_workers_counts_cpus(capsys):
    from benchmark import __main__ as cli

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    names = re.findall(r"^- ([a-z-]+):", cli.__doc__, flags=re.M)
    assert names == [
        "smoke",
        "full",
        "datasets",
        "report",
        "readme",
        "compare",
        "sizes",
        "harness",
        "speed",
        "equivalence",
        "tune",
    ]
    for name in names:
        assert f"- {name}:" in text, name
    with pytest.raises(SystemExit):
        main(["full", "--help"])
    text = capsys.readouterr().out
    assert "--workers CPUS" in text and "How many CPUs to use (not how many runs)" in text


def test_report_of_a_smoke_sweep_stays_with_its_runs(tmp_path: Path, zoo):
    args = zoo(preset_toml("a"))
    assert main(["smoke", *args, "--name", "s"]) == 0
    (tmp_path / "runs/s/report.md").unlink()
    results_dir = tmp_path / "results"
    report = ["report", "--name", "s", "--runs-dir", str(tmp_path / "runs")]
    assert main([*report, "--results-dir", str(results_dir)]) == 0
    assert (tmp_path / "runs/s/report.md").exists() and not results_dir.exists()


def test_dry_run_lists_the_runs_and_their_estimated_cpu_time(tmp_path: Path, zoo, capsys):
    args = zoo(
        preset_toml("a", seeds=3, timeout=600), preset_toml("b", timeout=900, extra="num_cpus = 2")
    )
    results_dir = tmp_path / "results"
    committed_sweep(results_dir, "old", {"a": [1.0, 2.0]})  # measured: 60 s per run of 200 steps
    capsys.readouterr()
    assert main(["full", *args, "--name", "n", "--results-dir", str(results_dir), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sweep n (dry run: nothing is started): 4 runs to start, 0 already finished" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:4]}
    assert lines["a"][:4] == ["a", "3", "200", "1"] and "1.0 min" in " ".join(lines["a"])
    assert "15.0 min (time limit)" in " ".join(lines["b"])  # no measurement: the limit
    # 3 runs x 1 min x 1 CPU + 1 run x 15 min x 2 CPUs = 33 CPU-minutes
    assert "estimated CPU time: 0.6 CPU-hours (0.5 of them time limits), about 16.5 min on " in out
    assert "for 1 of the 2 presets" in out
    assert not (tmp_path / "runs/n").exists()  # nothing started, nothing written


# --- progress -----------------------------------------------------------------------------


def test_progress_shows_running_runs_and_eta(tmp_path: Path, zoo):
    zoo(preset_toml("a", seeds=3), preset_toml("b"))
    presets = load_zoo(tmp_path / "zoo.toml", tmp_path / "algos")
    jobs = {j.key: j for j in plan_jobs(list(presets.values()), "full", tmp_path / "runs")}
    clock = [0.0]
    progress = Progress(
        list(jobs.values()),
        skipped=1,
        slots=2,
        stream=open(os.devnull, "w"),
        clock=lambda: clock[0],
    )
    assert progress.eta() is None and "1/5 done" in progress.line() and "eta ?" in progress.line()
    progress.started(jobs["a/seed1"], "local")
    progress.started(jobs["b/seed1"], "host:n1")
    clock[0] = 40.0
    progress.progressed(jobs["a/seed1"], (30, 200))
    assert "a/seed1 15% [local]" in progress.line()  # one progress line: its speed is not known yet
    clock[0] = 60.0
    progress.progressed(jobs["a/seed1"], (50, 200))  # 1 s per step: 150 s left, 200 s for a run
    line = progress.line()
    assert "2 running, 2 queued" in line and "a/seed1 25%, 2m30s left [local]" in line
    assert "b/seed1 starting [host:n1]" in line and "eta ?" in line  # nothing known about b yet
    progress.finished(
        {
            "preset": "b",
            "seed": 1,
            "status": "ok",
            "wall_time_s": 100.0,
            "summary": {"eval_mean": 1.0},
        }
    )
    # Slots free at 150 s (a/seed1) and now; a/seed2 and a/seed3 take 200 s each (a/seed1's
    # speed): one starts now and ends at 200 s, the other at 150 + 200 = 350 s.
    assert progress.eta() == pytest.approx(350.0)
    assert "2/5 done (0 failed, 1 from before) | 1 running, 2 queued" in progress.line()
    progress.finished(
        {"preset": "a", "seed": 1, "status": "failed", "wall_time_s": 200.0, "reason": "x"}
    )
    assert progress.eta() == pytest.approx(200.0)  # 2 runs of a's measured 200 s, on 2 slots
    assert "3/5 done (1 failed" in progress.line()


def test_progress_projects_a_run_from_its_recent_speed(tmp_path: Path, zoo):
    """A run that slows down (DQN once it starts learning) or resumed from a checkpoint is
    projected at the speed of its last RATE_WINDOW_S, not from its start."""
    zoo(preset_toml("a", seeds=2))
    presets = load_zoo(tmp_path / "zoo.toml", tmp_path / "algos")
    jobs = {j.key: j for j in plan_jobs(list(presets.values()), "full", tmp_path / "runs")}
    clock = [0.0]
    progress = Progress(
        list(jobs.values()), 0, 2, stream=open(os.devnull, "w"), clock=lambda: clock[0]
    )
    progress.started(jobs["a/seed1"], "local")
    progress.started(jobs["a/seed2"], "local")
    progress.progressed(jobs["a/seed2"], (400_000, 500_000))  # resumed from its checkpoint
    for t, step in ((10, 10_000), (20, 20_000), (30, 30_000), (40, 30_000)):
        clock[0] = t
        progress.progressed(jobs["a/seed1"], (step, 500_000))  # 1,000 steps/s before learning
    for t in range(100, 1400, 100):
        clock[0] = t
        progress.progressed(jobs["a/seed1"], (30_000 + 10 * (t - 40), 500_000))  # then 10 steps/s
        progress.progressed(jobs["a/seed2"], (400_000 + 10 * t, 500_000))
    # 1,300 s in: seed1 at 42,600 steps, 10 steps/s over the last ten minutes -> 45,740 s left
    # (from its start: 28,153 s); seed2 at 413,000 -> 8,700 s (from its start: 274 s).
    line = progress.line()
    assert "a/seed1 9%, 12h42m left" in line and "a/seed2 83%, 2h25m left" in line
    assert progress.eta() == pytest.approx(45_740.0)


def test_a_finished_run_whose_wall_time_is_unknown_says_so():
    killed_once = {"preset": "a", "seed": 2, "status": "ok", "wall_time_s": None}
    assert describe({**killed_once, "summary": {"eval_mean": 1.0}}) == (
        "ok     a seed2: eval 1.0, wall time unknown"
    )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_redraws_its_block_in_place(tmp_path: Path, zoo, monkeypatch):
    zoo(preset_toml("a", seeds=2))
    jobs = plan_jobs(
        list(load_zoo(tmp_path / "zoo.toml", tmp_path / "algos").values()),
        "full",
        tmp_path / "runs",
    )
    monkeypatch.setattr(progress_module, "TTY_REFRESH_S", 0.05)
    terminal = Terminal()
    with Progress(jobs, skipped=0, slots=1, stream=terminal) as progress:
        progress.started(jobs[0], "local")
        time.sleep(0.3)
        progress.finished(
            {
                "preset": "a",
                "seed": 1,
                "status": "ok",
                "wall_time_s": 3.0,
                "summary": {"eval_mean": 1.0},
            }
        )
        time.sleep(0.2)
    text = terminal.getvalue()
    # Each redraw moves up over the two-line block (head and running runs) and clears it.
    assert "\x1b[2F\x1b[J" in text and "a/seed1 starting [local]" in text
    # The finished run's line stays; the block ends as one final plain line.
    assert text.count("ok     a seed1: eval 1.0, 3 s\n") == 1
    assert text.endswith(
        "\x1b[J1/2 done (0 failed, 0 from before) | 0 running, 1 queued | elapsed 0m00s | eta 0m03s\n"
    )


@pytest.mark.parametrize("url", ["folder", "memory://bench/store"])
def test_storage_keeps_a_run_folder_and_gives_it_back(tmp_path: Path, url: str):
    url = str(tmp_path / "store") if url == "folder" else url
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints/latest.pt").write_text("step 100")
    (run / "benchmark.log").write_text("first attempt\n")
    (run / "checkpoints/latest.pt.tmp").write_text(
        "half-written"
    )  # a save in progress is not copied
    stored = Storage(url)
    assert not stored.restore(tmp_path / "nothing")
    stored.upload(run)
    sent = dict(stored.sent)
    stored.upload(run)  # unchanged files are not sent again
    assert stored.sent == sent and len(sent) == 2
    (run / "benchmark.log").write_text("first attempt\nmore\n")
    stored.upload(run)
    back = tmp_path / "back"
    assert Storage(url).restore(back)
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()) == [
        "benchmark.log",
        "checkpoints/latest.pt",
    ]  # no .part or .tmp files
    assert (back / "benchmark.log").read_text() == "first attempt\nmore\n"


# --- what a Ray job carries (the cluster itself: test_benchmark_ray.py) -------------------


@pytest.mark.parametrize(
    "flags, pip",
    [
        ([], None),
        (["--ray-address", "auto"], ["numpy==2.4.6"]),
        (["--ray-address", "auto", "--ray-requirements", "none"], None),
        (["--ray-requirements", "req.txt"], ["tomli>=1"]),
    ],
)
def test_the_ray_job_carries_code_and_requirements(
    tmp_path: Path, zoo, monkeypatch, flags: list[str], pip
):
    ray = pytest.importorskip("ray")
    args = zoo(preset_toml("a"))
    (tmp_path / "requirements.lock").write_text("# pinned\nnumpy==2.4.6\n")
    (tmp_path / "req.txt").write_text("tomli>=1\n\n")
    seen = {}

    def init(**kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt  # stop there, as Ctrl-C would

    monkeypatch.setattr(ray, "init", init)
    assert main(["smoke", *args, "--backend", "ray", "--name", "r", *flags]) == 130
    env = seen["runtime_env"]
    assert env["working_dir"] == str(tmp_path / "algos") and env["py_modules"] == [
        str(ROOT / "benchmark")
    ]
    assert env.get("pip") == pip
    assert seen["address"] == ("auto" if "--ray-address" in flags else None)


# --- datasets -----------------------------------------------------------------------------

MC_DATA = 'dataset = { dataset_id = "mc/expert-v0", episodes = 1, root = "data" }'
MC_ARGS = 'dataset-path = "data/mc/expert-v0"'


def test_sweep_builds_a_shared_dataset_once_before_its_runs(tmp_path: Path, zoo, capsys):
    mc = "MountainCarContinuous-v0"  # the fake script takes any id; the maker has a controller for this one
    args = zoo(
        preset_toml("a", env=mc, args=MC_ARGS, extra=MC_DATA),
        preset_toml("b", env=mc, args=MC_ARGS, extra=MC_DATA),
        preset_toml("plain", env=mc),
    )
    assert main(["smoke", *args, "--name", "d", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    # One build for both presets, before either ran: each found the dataset there when it started.
    assert out.count("dataset mc/expert-v0 for a, b: wrote ") == 1 and out.index(
        "dataset mc/expert-v0"
    ) < out.index("ok ")
    for name in ("a", "b"):
        assert json.loads((tmp_path / f"runs/d/{name}/seed1/config.json").read_text())[
            "dataset_ready"
        ]
    assert not json.loads((tmp_path / "runs/d/plain/seed1/config.json").read_text())[
        "dataset_ready"
    ]
    log = (tmp_path / "runs/d/datasets.log").read_text()
    assert (
        log.count(
            "--- python -m benchmark.datasets --env-id MountainCarContinuous-v0 --dataset-id mc/expert-v0 "
            "--episodes 1 --noise 0.0 --seed 0 --root data (for a, b) at "
        )
        == 1
    )
    assert log.count("wrote ") == 1
    data = tmp_path / "data/mc/expert-v0/data/main_data.hdf5"
    made = data.stat().st_mtime_ns
    report = (tmp_path / "runs/d/report.md").read_text()
    assert (
        "- dataset: python -m benchmark.datasets --env-id MountainCarContinuous-v0 --dataset-id mc/expert-v0"
        in report
    )
    # Another sweep finds it made by the same recipe and leaves it alone; so does a resumed sweep
    # that has nothing left to run for the presets (no dataset step at all).
    assert main(["smoke", *args, "--name", "d2", "--preset", "a"]) == 0
    assert (
        "dataset mc/expert-v0 for a: up to date: " in capsys.readouterr().out
        and data.stat().st_mtime_ns == made
    )
    assert main(["smoke", *args, "--name", "d"]) == 0
    assert "dataset mc/expert-v0" not in capsys.readouterr().out


def test_a_dataset_that_cannot_be_built_fails_only_its_presets(tmp_path: Path, zoo, capsys):
    (tmp_path / "afile").write_text("a file where a folder should be")
    args = zoo(
        preset_toml(
            "bad",
            args='dataset-path = "data/fake/x-v0"',
            extra='dataset = { dataset_id = "fake/x-v0", root = "data" }',
        ),  # no controller for Fake-v0
        preset_toml(
            "broken",
            env="Pendulum-v1",
            extra='dataset = { dataset_id = "pend/x-v0", root = "afile" }',
        ),
        preset_toml("good"),
    )
    assert main(["smoke", *args, "--name", "f"]) == 1
    out, err = capsys.readouterr()
    refusal = (
        "benchmark.datasets: error: no scripted controller for 'Fake-v0'; choose one of "
        "MountainCarContinuous-v0, Pendulum-v1, or pass --checkpoint"
    )
    assert f"dataset fake/x-v0 for bad FAILED: {refusal} (output in runs/f/datasets.log)" in out
    assert "Traceback" not in out + err
    bad, broken = record(tmp_path, "f", "bad"), record(tmp_path, "f", "broken")
    assert bad["status"] == "failed" and bad["reason"] == f"dataset fake/x-v0 not built: {refusal}"
    # An exception from deeper down (a file where the root should be): one line in the record, the
    # traceback in the sweep's datasets.log.
    assert broken["status"] == "failed" and broken["reason"].startswith(
        "dataset pend/x-v0 not built: "
    )
    assert "\n" not in broken["reason"] and "Error" in broken["reason"], broken["reason"]
    assert "Traceback" in (tmp_path / "runs/f/datasets.log").read_text()
    assert record(tmp_path, "f", "good")["status"] == "ok"
    assert not (tmp_path / "runs/f/bad/seed1/config.json").exists()  # never started
    # A checkpoint of an earlier attempt survives a dataset failure, for the next invocation.
    ckpt = tmp_path / "runs/f/bad/seed1/checkpoints/latest.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_text(json.dumps({"step": 50}))
    assert main(["smoke", *args, "--name", "f"]) == 1
    assert record(tmp_path, "f", "bad")["status"] == "failed" and json.loads(ckpt.read_text()) == {
        "step": 50
    }


def test_datasets_subcommand_builds_only_the_selected_presets_datasets(tmp_path: Path, zoo, capsys):
    mc = "MountainCarContinuous-v0"
    zoo(
        preset_toml("a", env=mc, args=MC_ARGS, extra=MC_DATA),
        preset_toml(
            "p",
            env="Pendulum-v1",
            extra='dataset = { dataset_id = "pend/x-v0", episodes = 1, root = "data" }',
        ),
        preset_toml("bad", extra='dataset = { dataset_id = "fake/x-v0", root = "data" }'),
        preset_toml("plain"),
    )
    common = ["--zoo", "zoo.toml", "--algos-dir", "algos", "--runs-dir", "runs"]
    assert main(["datasets", *common, "--preset", "a", "plain"]) == 0
    assert "dataset mc/expert-v0 for a: wrote " in capsys.readouterr().out
    assert (tmp_path / "data/mc/expert-v0/data/metadata.json").is_file() and not (
        tmp_path / "data/pend"
    ).exists()
    assert "wrote " in (tmp_path / "runs/datasets.log").read_text()
    assert not list((tmp_path / "runs").glob("*/"))  # no sweep, no run
    assert main(["datasets", *common, "--preset", "plain"]) == 0
    assert "no selected preset reads a dataset" in capsys.readouterr().out
    assert main(["datasets", *common, "--env", "Fake-v0"]) == 1
    assert (
        "dataset fake/x-v0 for bad FAILED: benchmark.datasets: error: no scripted "
        "controller for 'Fake-v0'" in capsys.readouterr().out
    )
    assert main(["datasets", *common, "--preset", "nope"]) == 2
    assert "no preset matches" in capsys.readouterr().err


def test_a_dataset_from_a_checkpoint_uses_the_sweeps_algorithm_files(tmp_path: Path, zoo, capsys):
    from test_datasets import load_algo, save_with_harness

    naf = load_algo("naf")
    save_with_harness(
        naf,
        tmp_path / "naf.pt",
        naf.Args(env_id="Pendulum-v1", hidden_dim=8),
        9,
        {"net": naf.NAFNetwork(3, 1, 8).state_dict()},
    )
    zoo(
        preset_toml(
            "ckpt",
            env="Pendulum-v1",
            args='dataset-path = "data/pend/naf-v0"',
            extra='dataset = { dataset_id = "pend/naf-v0", episodes = 1, root = "data", checkpoint = "naf.pt" }',
        )
    )
    presets = list(load_zoo(tmp_path / "zoo.toml", tmp_path / "algos").values())
    assert build_datasets(presets, tmp_path / "algos", tmp_path / "datasets.log") == {
        "ckpt": f"dataset pend/naf-v0 not built: benchmark.datasets: error: checkpoint naf.pt was written by naf.py, "
        f"which is not in {tmp_path / 'algos'}; pass --algos-dir"
    }  # the sweep's --algos-dir, not the repository's
    assert build_datasets(presets, ROOT / "algos", tmp_path / "datasets.log") == {}
    assert "dataset pend/naf-v0 for ckpt: wrote " in capsys.readouterr().out
    metadata = json.loads((tmp_path / "data/pend/naf-v0/data/metadata.json").read_text())
    assert (
        metadata["algorithm_name"]
        == "benchmark.datasets checkpoint naf.py naf.pt step=9 episodes=1 noise=0.0 seed=0"
    )


def test_ray_refuses_a_relative_dataset_root_without_building(tmp_path: Path, zoo, capsys):
    zoo(
        preset_toml(
            "rel",
            env="Pendulum-v1",
            extra='dataset = { dataset_id = "pend/x-v0", episodes = 1, root = "data" }',
        )
    )
    presets = list(load_zoo(tmp_path / "zoo.toml", tmp_path / "algos").values())
    failed = build_datasets(presets, tmp_path / "algos", tmp_path / "datasets.log", ray=True)
    assert failed == {
        "rel": "dataset pend/x-v0 not built: its root data is relative, and Ray runs execute in folders "
        "of their own; give the dataset an absolute root on a folder every node mounts, or use "
        "--backend local"
    }
    assert not (tmp_path / "data").exists() and not (tmp_path / "datasets.log").exists()


def test_real_rlpd_presets_build_what_they_read(tmp_path: Path):
    """Every real preset with a dataset reads it, at both budgets, from where the runner builds it."""
    for manifest in (ROOT / "zoo").glob("*.toml"):
        for entry in tomllib.loads(manifest.read_text()).values():
            (tmp_path / f"{entry['algo']}.py").touch()
    presets = [p for p in load_zoo(ROOT / "zoo", tmp_path).values() if p.dataset]
    assert {p.name for p in presets} >= {"rlpd-mountaincar-expert", "rlpd-pendulum-noisy-expert"}
    for preset in presets:
        for budget in (preset.smoke, preset.full):
            args = {**preset.args, **budget.args}
            assert (
                Path(args["dataset-path"]) == preset.dataset.folder
                and args.get("offline-ratio", 0.5) > 0
            )


# --- the real zoo -------------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_over_the_real_zoo(tmp_path: Path):
    """Every real preset at its smoke budget (needs the algorithm files)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmark",
            "smoke",
            "--runs-dir",
            str(tmp_path),
            "--name",
            "smoke",
            "--workers",
            "2",
            "--timeout-scale",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_execute_measures_wall_time_and_peak_memory(tmp_path):
    """A run reports neither its wall time nor its peak memory: the runner measures both from
    outside, the memory from the reaped process's resource usage (os.wait4)."""
    script = tmp_path / "hold.py"
    script.write_text("import time\nblock = b'x' * (300 << 20)\ntime.sleep(0.5)\n")
    result = execute([str(script)], tmp_path, tmp_path / "hold.log", 120, 1)
    assert result["returncode"] == 0 and not result["timed_out"]
    assert 300 <= result["peak_rss_mb"] < 450, result
    assert 0.5 <= result["wall_time_s"] < 60
    small = execute(["-c", "pass"], tmp_path, tmp_path / "small.log", 120, 1)
    assert small["peak_rss_mb"] < 100, small


def test_execute_measures_a_run_stopped_at_its_time_limit(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\nblock = b'x' * (200 << 20)\ntime.sleep(600)\n")
    result = execute([str(script)], tmp_path, tmp_path / "hang.log", 3, 1)
    assert result["timed_out"] and result["returncode"] == -15  # SIGTERM ended it
    assert 200 <= result["peak_rss_mb"] < 350 and result["wall_time_s"] < 30
