"""The run harness: the block from `# ===== run harness` to the line before
`if __name__ == "__main__":` is the same text, byte for byte, in every file of algos/, and it ends
iterations and runs as CONTRIBUTING.md says; each file keeps the size budgets of
benchmark/sizes.py (`python -m benchmark sizes`): the reader meets the algorithm, not the
plumbing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import ALGOS, scalars

from benchmark import sizes
from benchmark.__main__ import main

MARKER, MAIN = sizes.MARKER, sizes.MAIN
FILES = sorted(p.name for p in ALGOS.glob("*.py"))


def harness_block(path: Path) -> str:
    lines = path.read_text().splitlines(keepends=True)
    start, end = sizes.harness_span(lines, path.name)
    return "".join(lines[start:end])


def test_every_algorithm_file_has_the_same_harness():
    assert len(FILES) >= 5
    blocks = {name: harness_block(ALGOS / name) for name in FILES}
    reference_name = FILES[0]
    for name, block in blocks.items():
        assert block == blocks[reference_name], (
            f"the run harness of {name} differs from {reference_name}'s; change it in one file and copy it to the others"
        )


def test_the_comparison_detects_a_one_character_change(tmp_path):
    original = (ALGOS / FILES[0]).read_text()
    changed = tmp_path / "changed.py"
    changed.write_text(original.replace("def every(", "def every_(", 1))
    assert harness_block(changed) != harness_block(ALGOS / FILES[0])


def test_harness_stays_within_its_line_budget():
    block = harness_block(ALGOS / FILES[0])
    assert len(block.splitlines()) <= sizes.HARNESS_LINES == 249


def test_every_file_has_a_counterpart():
    assert sorted(sizes.COUNTERPARTS) == FILES


@pytest.mark.parametrize("name", FILES)
def test_algorithm_file_keeps_its_size_budgets(name):
    """Docstring, code characters against the CleanRL counterpart (whole file and algorithm
    section), train()'s length and the harness's: `python -m benchmark sizes` shows the table."""
    assert sizes.problems(sizes.measure(ALGOS / name)) == []


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


def test_sizes_counts_what_the_budget_says(tmp_path):
    path = tmp_path / "ppg.py"
    path.write_text(SAMPLE)
    lines = SAMPLE.splitlines()
    code = [lines[i - 1] for i in (5, 9, 10, 11, 14, 15, 22, 23)]
    size = sizes.measure(path)
    assert (size.docstring_lines, size.code_lines, size.code_chars) == (3, 8, sum(map(len, code)))
    assert size.algorithm_chars == sum(map(len, code[:6]))  # up to the end of train()
    assert (size.train_lines, size.first_def_line, size.harness_lines) == (2, 9, 4)
    assert size.widest_line == len("    return os.sep  # a trailing comment counts with its line")
    assert size.counterpart == "ppg_procgen.py" and sizes.problems(size) == []


def test_sizes_reports_each_broken_budget(tmp_path, capsys):
    wide = "\n".join(f"    x{i} = {i}" for i in range(4000))  # code far over the budget
    long_doc = '"""' + "line\n" * 120 + '"""\n'
    text = SAMPLE.replace('"""Doc.\n\nMore."""', long_doc).replace("    return f()", wide)
    (tmp_path / "ppg.py").write_text(text)
    found = sizes.problems(sizes.measure(tmp_path / "ppg.py"))
    assert [p.split(": ")[1].split(" ")[0] for p in found] == [
        "docstring",
        "code",
        "algorithm",
        "train()",
    ]
    assert main(["sizes", "--algos-dir", str(tmp_path), "--check"]) == 1
    assert "over budget: ppg.py: docstring 121 lines" in capsys.readouterr().out
    (tmp_path / "ppg.py").write_text(SAMPLE)
    assert main(["sizes", "--algos-dir", str(tmp_path), "--check"]) == 0


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


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"harness_{name}", ALGOS / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while it loads
    spec.loader.exec_module(module)
    return module


def test_end_iteration_evaluates_and_saves_as_their_intervals_pass(tmp_path):
    """Evaluations at each multiple of --eval-interval, checkpoints at each multiple of
    --checkpoint-interval, neither at the last step (finish() does both there) nor after a signal."""
    algo = load(FILES[0])
    args = algo.Args(run_dir=str(tmp_path), total_steps=100, eval_interval=30)
    args.checkpoint_interval = 50
    now, evaluated, saved = [0], [], []
    with algo.RunLogger(args, tmp_path, 0, 100, False) as log:
        log.save = lambda step, state: saved.append((step, state))
        for step in range(10, 101, 10):
            now[0] = step
            log.end_iteration(step, [], lambda _: evaluated.append(now[0]) or [1.0], lambda: "s")
        assert (evaluated, saved) == ([30, 60, 90], [(50, "s")])
        log.end_iteration(120, [15], lambda _: evaluated.append(120) or [1.0], lambda: "s")
    assert (evaluated, saved) == ([30, 60, 90], [(50, "s")])
    assert [step for step, _ in scalars(tmp_path, "eval/episodic_return")] == [30, 60, 90]


def test_finish_saves_evaluates_and_counts_sps_over_the_loop_only(tmp_path):
    """summary.json's sps divides the loop's steps by the loop's time, without the final
    evaluation (0.6 s here, after a 0.3 s loop); its extras keep their eval_ names and go to
    TensorBoard as eval/<name>; after a signal there is no evaluation and no summary.json."""
    algo = load(FILES[0])
    args = algo.Args(run_dir=str(tmp_path), total_steps=300)
    state = {"weights": torch.arange(3.0)}
    with algo.RunLogger(args, tmp_path, 0, 300, False) as log:
        time.sleep(0.3)
        result = ([1.0, 3.0], {"eval_capped_games": 1})
        log.finish(300, [], lambda _: time.sleep(0.6) or result, lambda: state, extra=7)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert 0.3 <= 300 / summary["sps"] < 0.6
    assert (summary["eval_mean"], summary["eval_std"], summary["eval_returns"]) == (
        2.0,
        1.0,
        [1, 3],
    )
    assert (summary["eval_capped_games"], summary["extra"], summary["global_step"]) == (1, 7, 300)
    assert scalars(tmp_path, "eval/capped_games") == [(300, 1.0)]
    ckpt = torch.load(tmp_path / "checkpoints" / "latest.pt", weights_only=True)
    assert ckpt["global_step"] == 300 and torch.equal(ckpt["weights"], state["weights"])

    stopped = tmp_path / "stopped"
    with algo.RunLogger(args, stopped, 0, 300, False) as log:
        log.finish(150, [15], lambda _: pytest.fail("evaluated after a signal"), lambda: state)
    assert not (stopped / "summary.json").exists()
    assert (
        torch.load(stopped / "checkpoints" / "latest.pt", weights_only=True)["global_step"] == 150
    )
