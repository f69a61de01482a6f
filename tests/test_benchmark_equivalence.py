"""`python -m benchmark equivalence --against COMMIT` (benchmark/equivalence.py): a change in text
only is equivalent, a changed checkpoint tensor or logged scalar is DIFFERENT and named, a crashed
run is FAILED with its last lines, bad input is refused in one line, and `readme` says which
changed files a committed report proved equivalent.

The fake zoo is a git repository of four copies of one small algorithm file (torch, TensorBoard,
a checkpoint with nested tensors, a replay buffer beside it, summary.json, timings that differ
from run to run); its working tree changes each copy in one way, and one invocation compares
them all."""

from __future__ import annotations

import io
import json
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
from test_benchmark import _git, _repository, committed_sweep, preset_toml

from benchmark.__main__ import main
from benchmark.equivalence import EQUIVALENT, proof
from benchmark.events import read_scalars

FAKE = textwrap.dedent("""
    import argparse, json, sys, time
    from pathlib import Path
    import numpy as np
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    began = time.time()
    p = argparse.ArgumentParser()
    for flag in ("--env-id", "--run-dir", "--device"):
        p.add_argument(flag, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--total-steps", type=int, required=True)
    p.add_argument("--torch-deterministic", action=argparse.BooleanOptionalAction, required=True)
    args = p.parse_args()
    import torch  # after the arguments, so that a crash there costs no import

    LOSS_SCALE, WEIGHT_SCALE = 1.0, [1.0, 1.0, 1.0, 1.0]
    generator = torch.Generator().manual_seed(args.seed)
    weights = torch.randn(3, 4, generator=generator)
    run = Path(args.run_dir)
    writer = EventFileWriter(str(run))

    def log(tag, value, step):
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(Event(step=step, wall_time=time.time(), summary=summary))

    for step in range(1, args.total_steps + 1):
        loss = float(weights.square().sum()) * LOSS_SCALE / step
        log("losses/loss", loss, step)
        log("charts/SPS", step / (time.time() - began), step)
    final = float(weights.mean())
    log("eval/episodic_return", final, args.total_steps)
    writer.close()
    (run / "checkpoints").mkdir()
    state = {
        "net": {"w": weights * torch.tensor(WEIGHT_SCALE), "b": torch.zeros(4)},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]},
        "args": vars(args),
        "global_step": args.total_steps,
        "rng": generator.get_state(),
        "train_time_s": time.time() - began,
    }
    torch.save(state, run / "checkpoints" / "latest.pt")
    np.savez(run / "checkpoints" / "buffer.npz", obs=np.arange(6.0).reshape(2, 3))
    (run / "summary.json").write_text(json.dumps({
        "script": Path(__file__).name, "env_id": args.env_id, "seed": args.seed,
        "global_step": args.total_steps, "eval_mean": final, "eval_std": 0.0,
        "eval_episodes": 1, "eval_returns": [final], "sps": args.total_steps / (time.time() - began),
    }))
""")
# Each file's change in the working tree.
CHANGES = {
    "same": lambda text: (
        "# a comment that changes nothing\n"
        + text.replace("loss = float(", "value = float(").replace('loss", loss,', 'loss", value,')
    ),
    "tensor": lambda text: text.replace("[1.0, 1.0, 1.0, 1.0]", "[1.0, 1.0, 1.5, 1.0]"),
    "scalar": lambda text: text.replace(
        "LOSS_SCALE, WEIGHT_SCALE = 1.0,", "LOSS_SCALE, WEIGHT_SCALE = 2.0,"
    ),
    "crash": lambda text: text.replace(
        "args = p.parse_args()\n",
        'args = p.parse_args()\nsys.exit("crash.py: error: deliberate")\n',
    ),
    "racing": lambda text: "# a comment that changes nothing\n" + text,
    "flaky": lambda text: text.replace("else 1.0)", "else 1.5)"),
}
# The committed text of a file, where it is not FAKE: "racing" saves a weight that differs from
# run to run at both versions, as runs whose processes race do; "flaky" one that differs between
# a copy's first run and the later ones.
BASES = {
    "racing": FAKE.replace(
        "[1.0, 1.0, 1.0, 1.0]",
        "[1.0, 1.0, 1.0, 1.0 + int.from_bytes(__import__('os').urandom(4), 'big')]",
    ),
    # "flaky": the first run of a copy of the file differs from every later one, which agree
    # with each other: the commit's two rechecks agree, but not with its first run.
    "flaky": FAKE.replace(
        "[1.0, 1.0, 1.0, 1.0]",
        "[1.0, 1.0, 1.0, (lambda ran: 2.0 if ran.exists() or ran.touch() else 1.0)"
        "(__import__('pathlib').Path(__file__ + '.ran'))]",
    ),
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """The fake zoo committed, its working tree changed, and one `equivalence --against HEAD` over
    it, run from the repository with its run folders kept in kept/: (repository, first commit,
    exit status, output line by preset, the whole output)."""
    root = tmp_path_factory.mktemp("equivalence")
    (root / "algos").mkdir()
    for name in CHANGES:
        (root / "algos" / f"{name}.py").write_text(BASES.get(name, FAKE))
    (root / "zoo.toml").write_text("".join(preset_toml(f"{n}-fake", algo=n) for n in CHANGES))
    _, first = _repository(root)
    for name, change in CHANGES.items():
        path = root / "algos" / f"{name}.py"
        path.write_text(change(path.read_text()))
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(out):
        patch.chdir(root)
        code = main(
            ["equivalence", "--against", "HEAD", *FLAGS, "--workers", "2", "--keep", "kept"]
        )
    text = out.getvalue()
    lines = {line.split()[1][:-1]: line for line in text.splitlines() if "-fake: " in line}
    return root, first, code, lines, text


FLAGS = ["--zoo", "zoo.toml", "--algos-dir", "algos"]


def kept(root: Path, side: str, preset: str) -> Path:
    return root / "kept" / side / preset / "seed1"


def test_a_change_in_text_only_is_equivalent(compared):
    root, _, code, lines, text = compared
    assert code == 1, text  # the other presets are not equivalent
    line = lines["same-fake"]
    # the timings (charts/SPS, sps, train_time_s) and the run folder in the stored args differ,
    # and are left out; the rest was compared
    assert line.startswith(
        "equivalent same-fake: 5 tensors and 15 other values in the checkpoints, 101 points of 2 "
        "scalar tags, 8 summary fields ["
    ), line
    commit, tree = (kept(root, side, "same-fake") for side in ("commit", "working-tree"))
    assert scalars(commit, "charts/SPS") != scalars(tree, "charts/SPS")


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    return read_scalars(run, [tag])[tag]


def test_a_changed_tensor_is_named_with_its_largest_difference_and_first_index(compared):
    root, _, _, lines, _ = compared
    a, b = (
        torch.load(kept(root, side, "tensor-fake") / "checkpoints/latest.pt", weights_only=True)
        for side in ("commit", "working-tree")
    )
    largest = float((a["net"]["w"] - b["net"]["w"]).abs().max())
    first = a["net"]["w"][0, 2].item(), b["net"]["w"][0, 2].item()
    assert lines["tensor-fake"].startswith(
        'DIFFERENT  tensor-fake: checkpoints/latest.pt["net"]["w"]: 3 of 12 values differ, '
        f"max abs difference {largest:.6g}; first at index (0, 2): {first[0]!r} vs {first[1]!r} ["
    ), lines["tensor-fake"]


def test_a_changed_scalar_alone_is_named_with_its_step_and_both_values(compared):
    root, _, _, lines, _ = compared
    (step, before), *_ = scalars(kept(root, "commit", "scalar-fake"), "losses/loss")
    (_, after), *_ = scalars(kept(root, "working-tree", "scalar-fake"), "losses/loss")
    assert after == pytest.approx(2 * before)
    assert lines["scalar-fake"].startswith(
        f"DIFFERENT  scalar-fake: scalar losses/loss at step 1: {before!r} vs {after!r} ["
    ), lines["scalar-fake"]
    assert "more difference" not in lines["scalar-fake"]  # nothing else changed


def test_a_failed_run_is_failed_with_its_last_lines(compared):
    _, _, _, lines, _ = compared
    line = lines["crash-fake"]
    assert line.startswith("FAILED     crash-fake: the working tree's run: exit status 1"), line
    assert line.split(" [")[0].endswith("| crash.py: error: deliberate"), line


def test_the_report_names_the_commit_the_tree_the_commands_and_each_verdict(compared):
    root, first, _, _, text = compared
    report = (root / "results" / f"equivalence-{first[:7]}.md").read_text()
    assert f"- commit: `{first}`" in report
    assert (
        "uncommitted changes to crash.py, flaky.py, racing.py, same.py, scalar.py, tensor.py"
        in (report)
    )
    assert "python -m benchmark equivalence --against HEAD --zoo zoo.toml" in report
    assert (
        "python algos/crash.py --env-id Fake-v0 --seed 1 --total-steps 100 --run-dir '<run-dir>' "
        "--device cpu --torch-deterministic" in report
    )
    rows = [line for line in report.splitlines() if line.startswith("| ") and "-fake |" in line]
    assert [row.split(" | ")[:2] for row in rows] == [  # in the zoo's order
        ["| same-fake", "equivalent"],
        ["| tensor-fake", "DIFFERENT"],
        ["| scalar-fake", "DIFFERENT"],
        ["| crash-fake", "FAILED"],
        ["| racing-fake", "IRREPRODUCIBLE"],
        ["| flaky-fake", "IRREPRODUCIBLE"],
    ]
    assert "1 equivalent, 2 different, 1 failed, 2 irreproducible of 6 presets" in text
    files = json.loads((root / "results" / f"equivalence-{first[:7]}.json").read_text())["files"]
    blob = _git(root, "rev-parse", f"{first}:algos/same.py")
    assert files["same.py"] | {"presets": None} == {
        "before": blob,
        "after": _git(root, "hash-object", "algos/same.py"),
        "dirty": True,
        "verdict": EQUIVALENT,
        "presets": None,
    }
    assert (files["tensor.py"]["verdict"], files["crash.py"]["verdict"]) == ("DIFFERENT", "FAILED")


def test_readme_says_which_changed_files_a_committed_report_proved_equivalent(compared):
    root, first, _, _, _ = compared
    results = root / "results"
    committed_sweep(results, "s", {f"{n}-fake": [1.0] for n in CHANGES})
    data = json.loads((results / "s/results.json").read_text())
    for run in data["runs"]:
        run["provenance"]["commit"] = first
    (results / "s/results.json").write_text(json.dumps(data))
    (results / "latest").write_text(json.dumps({"sweep": "s"}))
    readme = root / "README.md"
    readme.write_text("# T\n<!-- results:start -->\n<!-- results:end -->\n")
    flags = ["readme", "--readme", str(readme), "--results-dir", str(results)]
    flags += ["--zoo", str(root / "zoo.toml"), "--algos-dir", str(root / "algos")]
    commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q"]
    _git(root, *commit, "-am", "the change")
    assert main(flags) == 0
    text = readme.read_text()
    assert "changed since commit" in text
    assert "  - behaviour-equivalent by `python -m benchmark equivalence`: not checked\n" in text
    report = f"results/equivalence-{first[:7]}.json"
    _git(root, "add", report)
    _git(root, *commit, "-m", "the report")
    assert main(flags) == 0
    text = readme.read_text()
    assert (
        f"  - behaviour-equivalent by `python -m benchmark equivalence` ({report}): `same.py`; "
        "found DIFFERENT: `scalar.py`, `tensor.py`; not checked: `crash.py`"
    ) in text, text


def test_equivalence_is_proved_through_a_chain_of_reports():
    def report(before: str, after: str, verdict: str = EQUIVALENT) -> dict:
        return {"files": {"f.py": {"before": before, "after": after, "verdict": verdict}}}

    reports = [("r1", report("a", "b")), ("r2", report("c", "b")), ("r3", report("c", "d", "x"))]
    assert proof("a", "c", "f.py", reports) == (EQUIVALENT, ["r1", "r2"])
    assert proof("a", "d", "f.py", reports) == ("not checked", [])
    assert proof("c", "d", "f.py", [("r4", report("d", "c", "DIFFERENT"))]) == ("DIFFERENT", ["r4"])
    assert proof(None, "c", "f.py", reports) == ("not checked", [])
    # a report that left a file's irreproducible presets out proves it only where runs repeat
    partly = [("r1", report("a", "b")), ("r5", report("b", "e", "equivalent where reproducible"))]
    assert proof("a", "e", "f.py", partly) == ("equivalent where reproducible", ["r1", "r5"])
    assert proof("a", "b", "f.py", partly) == (EQUIVALENT, ["r1"])


def test_bad_input_is_refused_in_one_line(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "algos").mkdir()
    (tmp_path / "algos" / "same.py").write_text(FAKE)
    (tmp_path / "zoo.toml").write_text(preset_toml("same-fake", algo="same"))
    _git(tmp_path, "init", "-q")
    (tmp_path / "notes.txt").write_text("no algorithm yet\n")
    _git(tmp_path, "add", "notes.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "notes")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "old").write_text("")
    cases = {
        ("--against", "no-such-commit"): "--against no-such-commit: not a commit",
        ("--against", "HEAD"): "has no algos/ folder",
        ("--against", "HEAD", "--preset", "same-fake", "nope"): "--preset nope: no such preset",
        ("--against", "HEAD", "--keep", "kept"): "--keep kept: not an empty folder",
        ("--against", "HEAD", "--workers", "0"): "--workers and --timeout-scale must be positive",
    }
    for args, message in cases.items():
        assert main(["equivalence", *FLAGS, *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("benchmark: error: ") and message in err, err
        assert err.count("\n") == 1, err
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_real_preset_is_equivalent_to_itself_at_head(tmp_path: Path):
    """appo-cartpole (synchronous: deterministic on CPU; the zoo's fastest smoke run, about 10 s)
    with the committed file and the working tree's, side by side: nothing that depends on the run
    folder or the clock is compared."""
    out = tmp_path / "appo.md"
    args = ["equivalence", "--against", "HEAD", "--preset", "appo-cartpole", "--workers", "2"]
    assert main([*args, "--out", str(out)]) == 0, out.read_text() if out.exists() else "no report"
    assert "| appo-cartpole | equivalent |" in out.read_text()


def test_a_flag_only_the_working_tree_stores_is_noted_and_a_removed_one_is_a_difference(
    tmp_path: Path,
):
    """A change that adds a flag stores one more argument: noted with its default, not counted as
    a difference (every other value shows whether the default keeps the old behaviour); a stored
    argument the change dropped, or a changed one, is a difference."""
    from benchmark.equivalence import CHECKPOINT, Comparison, compare_checkpoints

    def run(name: str, args: dict) -> Path:
        folder = tmp_path / name
        (folder / CHECKPOINT.parent).mkdir(parents=True)
        torch.save({"args": args, "weights": torch.ones(2)}, folder / CHECKPOINT)
        return folder

    old = run("old", {"seed": 1, "run_dir": "a"})
    added = run("added", {"seed": 1, "run_dir": "b", "max_grad_norm": 0.5})
    result = Comparison()
    compare_checkpoints(old, added, result)
    assert result.differences == []
    assert result.new_flags == [("max_grad_norm", 0.5)]
    assert "new flags at their defaults: --max-grad-norm 0.5" in result.extent()

    result = Comparison()
    compare_checkpoints(added, old, result)  # the change removed a flag
    assert result.differences == [
        'checkpoints/latest.pt["args"]["max_grad_norm"]: only in the commit\'s run'
    ]


def test_a_preset_whose_runs_do_not_repeat_at_the_commit_gets_no_verdict(compared):
    """A DIFFERENT preset is run twice more with the commit's file: where those runs differ too,
    the difference says nothing of the change (IRREPRODUCIBLE, and its file gets no verdict);
    where they agree (the changed tensor), DIFFERENT stands."""
    root, _, code, lines, text = compared
    assert lines["racing-fake"].startswith("IRREPRODUCIBLE racing-fake: the commit's own runs")
    assert '["net"]["w"]' in lines["racing-fake"]
    # The two rechecks agree with each other but not with the commit's first run: no verdict.
    assert lines["flaky-fake"].startswith("IRREPRODUCIBLE flaky-fake: the commit's own runs"), text
    assert '["net"]["w"]' in lines["flaky-fake"]
    assert lines["tensor-fake"].startswith("DIFFERENT"), text
    assert "checking that the commit's runs repeat themselves" in text
    record = json.loads(next((root / "results").glob("equivalence-*.json")).read_text())
    assert record["files"]["racing.py"]["verdict"] == "IRREPRODUCIBLE"
    assert record["files"]["tensor.py"]["verdict"] == "DIFFERENT"
