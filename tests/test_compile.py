"""`--compile` changes how the updates run, not what they compute: every algorithm file trains a
tiny run eager and compiled on the CPU from the same seed, and the two runs' final weights and
logged losses agree to float tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import check_ok, run_script, scalars

from benchmark.events import read_points

OFF = ["--eval-interval", "0", "--checkpoint-interval", "0", "--eval-episodes", "1"]
ATARI = ["--max-episode-frames", "2000", "--num-minibatches", "2"]
# Each run makes a few updates: enough that a wrong compiled update shows, short enough to compile.
RUNS = {
    "appo.py": [
        "--num-envs",
        "4",
        "--num-steps",
        "32",
        "--hidden-dim",
        "16",
        "--total-steps",
        "256",
    ],
    "d4pg.py": ["--total-steps", "300", "--learning-starts", "200", "--batch-size", "32"]
    + ["--hidden-dim", "32", "--buffer-size", "1000"],
    "dqn_atari.py": ["--total-steps", "300", "--learning-starts", "200", "--batch-size", "8"]
    + ["--buffer-size", "1000", "--max-episode-frames", "2000"],
    "naf.py": ["--total-steps", "300", "--learning-starts", "200", "--batch-size", "32"]
    + ["--hidden-dim", "32"],
    "ppg.py": ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--n-pi", "2"]
    + ["--e-pi", "1", "--e-v", "1", "--e-aux", "1", "--aux-num-minibatches", "2"]
    + ["--hidden-dim", "16", "--total-steps", "128"],
    "ppo_atari.py": ["--num-envs", "2", "--num-steps", "32", "--update-epochs", "1", *ATARI]
    + ["--total-steps", "128"],
    "recurrent_ppo_atari.py": ["--num-envs", "2", "--num-steps", "32", "--seq-len", "8", *ATARI]
    + ["--update-epochs", "1", "--hidden-dim", "32", "--total-steps", "128"],
    "rlpd.py": ["--offline-ratio", "0", "--total-steps", "150", "--learning-starts", "100"]
    + ["--utd-ratio", "2", "--hidden-dim", "16", "--batch-size", "16"],
}


def tensors(tree, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every floating-point tensor in a checkpoint, by its path of keys."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree} if tree.is_floating_point() else {}
    if not isinstance(tree, dict | list | tuple):
        return {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    return {k: v for key, sub in items for k, v in tensors(sub, f"{prefix}/{key}").items()}


def loss_tags(run_dir: Path) -> list[str]:
    return sorted(tag for tag in read_points(run_dir) if tag.startswith("losses/"))


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(RUNS))
def test_compiled_run_matches_the_eager_run(script, tmp_path):
    runs = {}
    for mode in ("eager", "compiled"):
        run_dir = tmp_path / mode
        flags = ["--compile"] if mode == "compiled" else []
        args = [*RUNS[script], *OFF, "--device", "cpu", "--run-dir", str(run_dir), *flags]
        check_ok(run_script(script, *args, timeout=600))
        runs[mode] = run_dir
    eager, compiled = (torch.load(runs[m] / "checkpoints" / "latest.pt") for m in runs)
    assert eager["args"]["compile"] is False and compiled["args"]["compile"] is True
    a, b = tensors(eager), tensors(compiled)
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-4, msg=key)
    tags = loss_tags(runs["eager"])
    assert tags and tags == loss_tags(runs["compiled"])
    for tag in tags:
        (steps_a, values_a), (steps_b, values_b) = (
            zip(*scalars(runs[m], tag), strict=True) for m in runs
        )
        assert steps_a == steps_b, tag
        torch.testing.assert_close(values_b, values_a, rtol=1e-3, atol=1e-4, msg=tag)
