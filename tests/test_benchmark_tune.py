"""`python -m benchmark tune` on the fake algorithm file of test_benchmark.py, whose curves are
known: an evaluation at a quarter, half and three quarters of the run of `--score` x that share +
seed, and a final one of `--score` + seed. A tiny study end to end (its outputs and the verdict
of its validation), pruning, two worker processes on one storage, resuming after SIGTERM, the
validation's verdict on known scores, and each one-line error."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import test_benchmark
from conftest import ROOT
from test_benchmark import GOOD, _wait_for, committed_sweep, preset_toml

sys.path.insert(0, str(ROOT))  # the package, when the project is not pip-installed
from benchmark.__main__ import main
from benchmark.aggregate import iqm
from benchmark.compare import load_sweep
from benchmark.manifest import ZooError, load_zoo, tomllib
from benchmark.tune_report import judge
from benchmark.tune_space import build_study, check_flags, load_algo_spaces

zoo = test_benchmark.zoo  # the fixture: the fake file and a manifest in tmp_path


def tune_preset(params: str, *, args: str = "", seeds: int = 4, tune: str = "") -> str:
    """Preset 't' of the fake file (total steps 200, `seeds` full seeds), with a tune table of
    two seeds a trial searching `params`."""
    return (
        preset_toml("t", args=args, seeds=seeds)
        + f"[t.tune]\nseeds = 2\n{tune}params = {{ {params} }}\n"
    )


def tune(args: list[str], name: str, *more: str) -> list[str]:
    results = str(Path("results").resolve())  # the fixture's folder, also for a subprocess
    return ["tune", *args, "--preset", "t", "--name", name, "--results-dir", results, *more]


def trials(tmp_path: Path, name: str) -> list[dict[str, str]]:
    with open(tmp_path / f"results/tune-{name}/trials.csv") as f:
        return list(csv.DictReader(f))


def test_a_tiny_study_end_to_end(tmp_path: Path, zoo, capsys):
    args = zoo(tune_preset("score = { low = 150, high = 200 }, eval-episodes = 5"))
    more = ("--trials", "3", "--sampler", "random", "--pruner", "none", "--validation-seeds", "4")
    assert main(tune(args, "s", *more)) == 0
    out = capsys.readouterr().out
    rows = trials(tmp_path, "s")
    assert [r["state"] for r in rows] == ["complete"] * 3
    for row in rows:  # the IQM of seeds 1 and 2's final evaluations, score + seed
        assert float(row["value"]) == pytest.approx(float(row["score"]) + 1.5, rel=1e-5)
        assert json.loads(row["scores"])["t"] == pytest.approx(
            [float(row["score"]) + 1, float(row["score"]) + 2], rel=1e-5
        )
    best = max(rows, key=lambda r: float(r["value"]))
    # Every run got the trial's flags and the fixed one, as the runner passes a preset's args.
    config = json.loads(
        (tmp_path / f"runs/tune-s/trial{int(best['trial']):04d}/t/seed2/config.json").read_text()
    )
    assert config["score"] == float(best["score"]) and config["eval_episodes"] == 5
    snippet = tomllib.loads((tmp_path / "results/tune-s/best.toml").read_text())
    assert snippet["t"]["args"] == {
        "score": pytest.approx(float(best["score"])),
        "eval-episodes": 5,
    }
    # Validation on seeds 1001-1004, no trial's: the defaults (score 100) end at 1101-1104, every
    # tuned seed above them; complete separation at 4 against 4 gives p = 2 / 70.
    report = (tmp_path / "results/tune-s/report.md").read_text()
    verdict = f"**Trial {best['trial']}: beats the defaults on t (family-wise level 0.05).**"
    assert verdict in report and "on seeds 1001-1004" in report
    assert "against 1,102.5 [1,093.5, 1,111.5] for the defaults (95% CI)" in report
    assert "| 1.00 | 0.029 | 0.029 | **B better** |" in report
    plots = sorted(p.name for p in (tmp_path / "results/tune-s/plots").iterdir())
    assert plots == ["history.png", "importances.png", "validation.png"]
    assert "3/3 trials done (0 pruned, 0 failed, 0 from before)" in out
    assert f"trial {best['trial']}: beats the defaults on t" in out


def test_a_trial_below_the_median_is_pruned_and_its_runs_stopped(tmp_path: Path, zoo, capsys):
    """Trial 0 (score 200) completes; trial 1 (score 10) evaluates 5 + seed at step 100 against
    trial 0's 100 + seed, and is pruned there or at step 150 (the pruner waits out the first
    third of the budget: step 50 cannot prune), its runs stopped before they end."""
    args = zoo(tune_preset("score = { low = 0, high = 200 }, delay = { choices = [0.0, 0.3] }"))
    storage = str(tmp_path / "study.journal")
    study = optuna.create_study(
        study_name="p",
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage)),
        direction="maximize",
    )
    study.enqueue_trial({"score": 200, "delay": 0.0})
    study.enqueue_trial({"score": 10, "delay": 0.3})  # slow enough to be watched
    more = ("--trials", "2", "--startup-trials", "1", "--top-k", "0", "--study-storage", storage)
    assert main(tune(args, "p", *more)) == 0
    rows = trials(tmp_path, "p")
    assert [r["state"] for r in rows] == ["complete", "pruned"]
    # A pruned trial's value is its last intermediate one.
    step, value = {"100": ("100", "6.5"), "150": ("150", "9")}[rows[1]["last_step"]]
    assert rows[1]["reason"] == f"pruned at step {step}: IQM {value}, below the median pruner's cut"
    assert rows[1]["value"] == value
    assert not list((tmp_path / "runs/tune-p/trial0001").glob("t/seed*/summary.json"))
    assert "trial 1 pruned at step 1" in capsys.readouterr().out


def test_a_failed_run_fails_its_trial_with_why(tmp_path: Path, zoo, capsys):
    args = zoo(tune_preset('score = { low = 0, high = 200 }, behaviour = "crash"'))
    assert main(tune(args, "f", "--trials", "1")) == 1  # nothing complete, nothing validated
    (row,) = trials(tmp_path, "f")
    assert (
        row["state"] == "fail" and row["reason"] == "t seed1: exit status 1; t seed2: exit status 1"
    )
    assert "trial 0 FAILED: t seed1: exit status 1" in capsys.readouterr().out
    report = (tmp_path / "results/tune-f/report.md").read_text()
    assert "No complete trial to validate." in report
    assert not (tmp_path / "results/tune-f/best.toml").exists()


def test_two_worker_processes_share_one_study(tmp_path: Path, zoo):
    args = zoo(tune_preset("score = { low = 0, high = 200 }", args="delay = 0.1"))
    more = ("--trials", "2", "--processes", "2", "--workers", "2", "--top-k", "0")
    assert main(tune(args, "w", *more)) == 0
    rows = trials(tmp_path, "w")
    # Two trials side by side, one in each process (one more when both processes asked for
    # the last one at the same moment).
    assert len(rows) in (2, 3) and {r["state"] for r in rows} == {"complete"}
    assert len({r["worker"] for r in rows}) == 2
    (a_start, a_took), (b_start, b_took) = [
        (datetime.fromisoformat(r["started"]), float(r["duration_s"])) for r in rows[:2]
    ]
    assert abs((a_start - b_start).total_seconds()) < min(a_took, b_took)


def test_a_study_stopped_by_sigterm_resumes(tmp_path: Path, zoo):
    args = zoo(tune_preset("score = { low = 0, high = 200 }", args="delay = 0.1"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmark", *tune(args, "r", "--trials", "3", "--top-k", "0")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    second = tmp_path / "runs/tune-r/trial0001/t/seed1/benchmark.log"
    _wait_for(lambda: second.exists() and "step 20/200" in second.read_text(), proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted; re-run with --name r to resume" in err, (
        out,
        err,
    )
    assert "trial 1 FAILED: interrupted" in out
    started = time.monotonic()
    assert main(tune(args, "r", "--trials", "2", "--top-k", "0")) == 0
    rows = trials(tmp_path, "r")
    # The interrupted trial stays on record and does not count: two others make the study.
    assert [r["state"] for r in rows] == ["complete", "interrupted", "complete"]
    assert rows[1]["reason"] == "interrupted" and time.monotonic() - started < 60
    # The report names both invocations, the one SIGTERM stopped included.
    report = (tmp_path / "results/tune-r/report.md").read_text()
    assert "--trials 3 --top-k 0`" in report and "--trials 2 --top-k 0`" in report, report[:800]


def test_presets_tuned_together_are_scored_on_normalised_scores(tmp_path: Path, zoo):
    """Each run's score as (score - random) / (reference - random), the IQM over all of them; a
    preset without the two scores is refused in one line."""
    space = "seeds = 2\nparams = { score = { low = 0, high = 200 } }\n"
    target = GOOD.replace("min = 1", "min = 150")
    zoo(
        preset_toml("a") + f"[a.tune]\nrandom = 0\nreference = 100\n{space}",
        preset_toml("b", target=target) + f"[b.tune]\nrandom = 50\n{space}",
    )
    presets = load_zoo(tmp_path / "zoo.toml", tmp_path / "algos")
    study = build_study(list(presets.values()), tmp_path / "zoo.toml", "x", tmp_path / "runs")
    assert study.anchors == {"a": (0.0, 100.0), "b": (50.0, 150.0)}  # b's reference: its target
    records = [
        {"preset": p, "summary": {"eval_mean": v}} for p, v in [("a", 50), ("a", 100), ("b", 50)]
    ]
    assert study.objective(records) == pytest.approx(iqm([0.5, 1.0, 0.0]))
    jobs = study.trial_jobs({"score": 1}, tmp_path / "runs/trial0000", 1.0)
    assert [j.key for j in jobs] == ["a/seed1", "a/seed2", "b/seed1", "b/seed2"]
    curves = {"a/seed1": [(50, 10.0), (100, 20.0)], "a/seed2": [(50, 30.0)]}
    curves |= {"b/seed1": [(50, 50.0)], "b/seed2": [(50, 150.0), (100, 2.0)]}
    # Only step 50 has every run's evaluation.
    assert study.intermediate(jobs, curves) == [(50, pytest.approx(iqm([0.1, 0.3, 0.0, 1.0])))]
    zoo(preset_toml("a") + f"[a.tune]\n{space}", preset_toml("b") + f"[b.tune]\n{space}")
    presets = load_zoo(tmp_path / "zoo.toml", tmp_path / "algos")
    with pytest.raises(ZooError, match="zoo preset 'a': tune: beside other presets its score"):
        build_study(list(presets.values()), tmp_path / "zoo.toml", "x", tmp_path / "runs")


@pytest.mark.parametrize(
    "a, b, said",
    [
        ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], "beats the defaults on p (family-wise level 0.05)"),
        ([6, 7, 8, 9, 10], [1, 2, 3, 4, 5], "loses to the defaults on p (family-wise level 0.05)"),
        ([1, 3, 5, 7, 9], [2, 4, 6, 8, 10], "ties with the defaults: no difference reaches"),
        ([1, 2, 3], [4, 5, 6], "no verdict: at these seeds the rank test cannot reach"),
        # Two presets at 4 seeds a side: complete separation gives p = 2 / 70 each, above
        # Holm's first threshold, 0.05 / 2: no verdict can be reached, which is not a tie.
        ([1, 2, 3, 4], [5, 6, 7, 8], "no verdict: at these seeds the rank test cannot reach"),
    ],
)
def test_the_validation_verdict_on_known_scores(tmp_path: Path, a, b, said):
    presets = ("p", "q") if len(a) == 4 else ("p",)
    committed_sweep(tmp_path, "defaults", {p: [float(x) for x in a] for p in presets})
    committed_sweep(tmp_path, "tuned", {p: [float(x) for x in b] for p in presets})
    text, _ = judge(
        load_sweep("defaults", tmp_path, tmp_path), load_sweep("tuned", tmp_path, tmp_path), 0.05
    )
    assert text.startswith(said), text


ERRORS = {
    "unknown preset": ("score = { low = 0, high = 1 }", ["--preset", "nope"], "no preset matches"),
    "unknown parameter key": (
        "score = { low = 0, hi = 1 }",
        [],
        "zoo preset 't': tune: parameter 'score': unknown key(s) hi",
    ),
    "flag the file does not take": (
        "nope = { low = 0, high = 1 }",
        [],
        "zoo preset 't': tune: parameter 'nope': fake.py takes no --nope",
    ),
    "empty range": ("score = { low = 1, high = 1 }", [], "parameter 'score': empty range [1, 1]"),
    "inverted range": ("score = { low = 2, high = 1 }", [], "inverted range: low 2 > high 1"),
    "reserved flag": ("seed = { low = 1, high = 9 }", [], "'seed': is set by the runner"),
    "storage": (
        "score = { low = 0, high = 1 }",
        ["--study-storage", "."],
        "--study-storage .: cannot be opened",
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_study_is_one_line(case: str, zoo, capsys):
    params, more, fragment = ERRORS[case]
    args = zoo(tune_preset(params))
    command = tune(args, "e")
    if "--preset" in more:
        command[command.index("--preset") + 1] = more[1]
    else:
        command += more
    assert main(command) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("benchmark: error: "), err
    assert fragment in err, err


def test_a_study_name_cannot_take_another_space(tmp_path: Path, zoo, capsys):
    args = zoo(tune_preset("score = { low = 0, high = 200 }"))
    assert main(tune(args, "n", "--trials", "1", "--top-k", "0")) == 0
    args = zoo(tune_preset("score = { low = 0, high = 100 }"))
    capsys.readouterr()
    assert main(tune(args, "n", "--trials", "2")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("benchmark: error: study 'n' in "), err
    assert "was run with another definition (space, score differ)" in err


def test_the_zoos_search_spaces_name_flags_their_files_take():
    """Read from each file's Args dataclass with ast: no algorithm file is imported or run."""
    spaces = load_algo_spaces(ROOT / "zoo")
    assert {"appo", "naf"} <= set(spaces)
    presets = load_zoo(ROOT / "zoo", ROOT / "algos")
    for algo, space in spaces.items():
        check_flags(space, ROOT / "algos" / f"{algo}.py", f"space {algo}")
    tuned = {n: p for n, p in presets.items() if p.tune is not None}
    assert {"appo-lunarlander", "naf-hopper"} <= set(tuned)
    for preset in tuned.values():
        check_flags(preset.tune.params, preset.script, preset.name)
