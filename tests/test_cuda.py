"""The CUDA path of every algorithm file, in one command on a GPU machine:

    pytest -m cuda tests/test_cuda.py

For each file: a tiny run with --device cuda, a resume of it on CUDA (the checkpoint is loaded on
the CPU and moved to the GPU by the file: the class of "can't convert cuda:0 tensor to numpy"
resume bugs), and --eval-only of its checkpoint with --device cpu. Without CUDA these tests are
skipped (CI has no GPU). `RL_CUDA_TEST_DEVICE=cpu pytest -m cuda tests/test_cuda.py` runs the same
sequence on the CPU, to check the flags and the sequence itself on a machine without a GPU."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import check_ok, run_script, summary

DEVICE = os.environ.get("RL_CUDA_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"
    ),
]

# Tiny runs: (script, flags of a first run of `steps`, the step count the resume continues to).
CASES = {
    "ppo_atari.py": (
        [
            "--num-envs",
            "2",
            "--num-steps",
            "32",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--eval-episodes",
            "1",
            "--max-episode-frames",
            "2000",
            "--schedule-steps",
            "128",
            "--compile",  # CUDA graphs: their hazards only show on a GPU
        ],
        64,
        128,
    ),
    "dqn_atari.py": (
        [
            "--learning-starts",
            "100",
            "--buffer-size",
            "1000",
            "--max-episode-frames",
            "2000",
            "--eval-episodes",
            "1",
            "--compile",  # CUDA graphs: their hazards only show on a GPU
        ],
        300,
        400,
    ),
    "ppg.py": (
        [
            "--num-envs",
            "4",
            "--num-steps",
            "16",
            "--num-minibatches",
            "2",
            "--n-pi",
            "3",
            "--e-pi",
            "2",
            "--e-v",
            "2",
            "--e-aux",
            "2",
            "--aux-num-minibatches",
            "4",
            "--eval-episodes",
            "2",
            "--schedule-steps",
            "320",
            "--compile",  # CUDA graphs: their hazards only show on a GPU
        ],
        192,
        320,
    ),
    "naf.py": (
        [
            "--learning-starts",
            "100",
            "--batch-size",
            "32",
            "--hidden-dim",
            "32",
            "--eval-episodes",
            "1",
            "--compile",  # CUDA graphs: their hazards only show on a GPU
        ],
        300,
        400,
    ),
    "d4pg.py": (
        [
            "--learning-starts",
            "100",
            "--batch-size",
            "32",
            "--hidden-dim",
            "32",
            "--buffer-size",
            "5000",
            "--eval-episodes",
            "1",
            "--compile",  # CUDA graphs: their hazards only show on a GPU
        ],
        300,
        400,
    ),
    "appo.py": (
        [
            "--num-envs",
            "4",
            "--num-steps",
            "16",
            "--num-minibatches",
            "2",
            "--eval-episodes",
            "2",
            "--no-anneal-lr",
            "--compile",  # CUDA graphs: their hazards only show on a GPU
        ],
        128,
        256,
    ),
    "rlpd.py": (
        [
            "--offline-ratio",
            "0",
            "--learning-starts",
            "100",
            "--utd-ratio",
            "2",
            "--batch-size",
            "32",
            "--hidden-dim",
            "32",
            "--eval-episodes",
            "1",
            "--compile",  # CUDA graphs: their hazards only show on a GPU
        ],
        300,
        400,
    ),
    "recurrent_ppo_atari.py": (
        [
            "--num-envs",
            "2",
            "--num-steps",
            "32",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--seq-len",
            "16",
            "--eval-episodes",
            "1",
            "--max-episode-frames",
            "2000",
            "--schedule-steps",
            "128",
            "--compile",  # CUDA graphs: their hazards only show on a GPU
        ],
        64,
        128,
    ),
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_train_resume_on_device_then_evaluate_on_cpu(script, tmp_path):
    flags, steps, more = CASES[script]
    run = tmp_path / "run"
    common = [*flags, "--checkpoint-interval", "0", "--eval-interval", "0"]
    check_ok(
        run_script(
            script, *common, "--total-steps", str(steps), "--device", DEVICE, "--run-dir", str(run)
        )
    )
    assert json.loads((run / "summary.json").read_text())["global_step"] == steps
    ckpt = run / "checkpoints" / "latest.pt"
    check_ok(
        run_script(
            script, *common, "--total-steps", str(more), "--device", DEVICE, "--resume", str(ckpt)
        )
    )
    assert summary(run)["global_step"] == more
    check_ok(
        run_script(
            script,
            "--eval-only",
            "--checkpoint",
            str(ckpt),
            "--device",
            "cpu",
            "--eval-episodes",
            "1",
        )
    )
    result = json.loads((run / "eval.json").read_text())
    assert result["global_step"] == more and result["eval_episodes"] == 1
