"""Tests for benchmark/datasets.py: the scripted controllers are experts, the datasets it writes load
with Minari as recorded (returns, terminations, truncations, actions within the bounds, noise
reproducible from the seed), a rerun of the same recipe leaves the dataset alone, another recipe
is refused unless --overwrite, and every bad argument stops with its one-line message. A dataset
from a checkpoint replays the policy of the file that wrote it (its episodes return what that
file's own evaluation returned from the same starts): a tiny real d4pg.py run, rlpd.py trained
on its dataset, then rlpd.py's own checkpoint as a source, and a NAF network saved by naf.py's
harness; each bad checkpoint is refused in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
from conftest import ALGOS, ROOT, check_ok, run_script

from benchmark import datasets as maker


def episode_returns(env_id: str, controller, episodes: int) -> list[float]:
    """The controller's noiseless returns on episodes seeded 0..episodes-1, by a loop of its own."""
    env = gym.make(env_id)
    returns = []
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        done, total = False, 0.0
        while not done:
            u = controller(obs)
            low, high = env.action_space.low, env.action_space.high
            obs, r, terminated, truncated, _ = env.step(
                (low + 0.5 * (u + 1) * (high - low)).astype(np.float32)
            )
            total, done = total + float(r), terminated or truncated
        returns.append(total)
    return returns


@pytest.mark.parametrize(
    "env_id, expert", [("MountainCarContinuous-v0", 90.0), ("Pendulum-v1", -200.0)]
)
def test_controllers_are_experts(env_id, expert):
    """MountainCarContinuous is solved at 90; Pendulum's tuned SAC/TD3 average about -150."""
    returns = episode_returns(env_id, maker.CONTROLLERS[env_id], 10)
    assert np.mean(returns) >= expert, returns
    if env_id == "MountainCarContinuous-v0":
        assert min(returns) > 90  # every episode reaches the flag


def make(tmp_path, **kwargs) -> minari.MinariDataset:
    args = maker.Args(
        **{
            "env_id": "MountainCarContinuous-v0",
            "dataset_id": "mc/expert-v0",
            "episodes": 2,
            "root": tmp_path,
            **kwargs,
        }
    )
    folder = maker.make_dataset(args)
    return minari.MinariDataset(folder / "data")


def test_dataset_holds_the_recorded_episodes(tmp_path, monkeypatch):
    monkeypatch.delenv("MINARI_DATASETS_PATH", raising=False)
    dataset = make(tmp_path)
    assert "MINARI_DATASETS_PATH" not in os.environ  # the maker put the variable back as it was
    assert dataset.total_episodes == 2 and dataset.spec.env_spec.id == "MountainCarContinuous-v0"
    returns = episode_returns("MountainCarContinuous-v0", maker.mountain_car_energy_pumping, 2)
    for ep, expected in zip(dataset.iterate_episodes(), returns):
        assert len(ep.observations) == len(ep.actions) + 1
        assert ep.rewards.sum() == pytest.approx(expected)
        assert ep.terminations.tolist() == [False] * (len(ep.actions) - 1) + [
            True
        ]  # reached the flag
        assert not ep.truncations.any()
        assert np.all(np.abs(ep.actions) == 0.5)
    assert not list(tmp_path.glob(".staging-*"))


def test_pendulum_episodes_are_truncated_and_noise_is_seeded(tmp_path):
    noisy = make(tmp_path, env_id="Pendulum-v1", dataset_id="pend/noisy-v0", noise=0.5)
    again = make(tmp_path, env_id="Pendulum-v1", dataset_id="pend/again-v0", noise=0.5)
    other = make(tmp_path, env_id="Pendulum-v1", dataset_id="pend/other-v0", noise=0.5, seed=1)
    first, second = next(noisy.iterate_episodes()), next(again.iterate_episodes())
    assert len(first.actions) == 200 and first.truncations[-1] and not first.terminations.any()
    np.testing.assert_array_equal(first.actions, second.actions)
    assert not np.array_equal(first.actions, next(other.iterate_episodes()).actions)
    assert np.abs(first.actions).max() <= 2.0
    clean = [maker.pendulum_swing_up(o) * 2.0 for o in first.observations[:-1]]
    assert not np.allclose(first.actions, clean, atol=1e-3)  # the noise is there


def test_rerun_same_recipe_is_up_to_date_other_recipe_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)
    make(Path(tmp_path.name))  # a relative --root, as the zoo's commands use
    data_file = tmp_path / "mc/expert-v0/data/main_data.hdf5"
    before = data_file.stat().st_mtime_ns
    make(tmp_path)
    assert "up to date" in capsys.readouterr().out and data_file.stat().st_mtime_ns == before
    with pytest.raises(
        SystemExit,
        match="exists, made by benchmark.datasets mountain_car_energy_pumping episodes=2 "
        "noise=0.0 seed=0; pass --overwrite",
    ):
        make(tmp_path, episodes=3)
    assert make(tmp_path, episodes=3, overwrite=True).total_episodes == 3


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (
            ["--env-id", "CartPole-v1"],
            "no scripted controller for 'CartPole-v1'; choose one of MountainCarContinuous-v0, Pendulum-v1, or pass --checkpoint",
        ),
        (["--episodes", "0"], "--episodes must be at least 1, got 0"),
        (["--noise", "-0.1"], "--noise must be a finite number >= 0, got -0.1"),
        (["--noise", "nan"], "--noise must be a finite number >= 0, got nan"),
        (["--dataset-id", "bad id"], "Malformed dataset ID: bad id"),
    ],
)
def test_bad_arguments_one_line(tmp_path, capsys, argv, fragment):
    base = {
        "--env-id": "MountainCarContinuous-v0",
        "--dataset-id": "mc/expert-v0",
        "--root": str(tmp_path),
    }
    base.update(dict(zip(argv[::2], argv[1::2])))
    assert maker.main([x for kv in base.items() for x in kv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("benchmark.datasets: error: ") and fragment in err and "\n" not in err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_command_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmark.datasets",
            "--env-id",
            "MountainCarContinuous-v0",
            "--dataset-id",
            "mc/expert-v0",
            "--episodes",
            "1",
            "--root",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.startswith(f"wrote {tmp_path / 'mc/expert-v0'}: 1 episodes, ")
        and "return 9" in proc.stdout
    )


# ---------------------------------------------------------------- checkpoints as the source policy


def load_algo(name: str):
    """An algorithm file as a module of its own (not the maker's copy)."""
    spec = importlib.util.spec_from_file_location(f"test_datasets_{name}", ALGOS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while it loads
    spec.loader.exec_module(module)
    return module


def save_with_harness(module, path: Path, args, step: int, state: dict) -> None:
    """A checkpoint as the file's own run harness writes one (Run.save), without a run."""
    run = SimpleNamespace(args=args, checkpoint=path, stop_if_bad=lambda: None, state=lambda: state)
    module.Run.save(run, step)


def returns_of(folder: Path) -> list[float]:
    return [
        float(ep.rewards.sum()) for ep in minari.MinariDataset(folder / "data").iterate_episodes()
    ]


def recipe_of(folder: Path) -> str:
    return json.loads((folder / "data" / "metadata.json").read_text())["algorithm_name"]


@pytest.fixture(scope="module")
def d4pg_run(tmp_path_factory) -> Path:
    """A real d4pg.py run of 400 Pendulum steps, seed 2, its final evaluation over 2 episodes."""
    cwd = tmp_path_factory.mktemp("d4pg")
    check_ok(
        run_script(
            "d4pg.py",
            "--env-id",
            "Pendulum-v1",
            "--seed",
            "2",
            "--total-steps",
            "400",
            "--learning-starts",
            "200",
            "--batch-size",
            "32",
            "--hidden-dim",
            "32",
            "--buffer-size",
            "5000",
            "--eval-episodes",
            "2",
            "--eval-interval",
            "0",
            "--run-dir",
            "run",
            cwd=cwd,
        )
    )
    return cwd / "run"


@pytest.mark.slow
def test_d4pg_checkpoint_dataset_replays_its_policy_and_trains_rlpd(
    d4pg_run, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    ckpt = d4pg_run / "checkpoints" / "latest.pt"
    # Episode i starts from reset(seed + i); d4pg.py's evaluation from reset(run seed + 10,000 + i): same starts,
    # so without noise the episodes return exactly what d4pg.py's own final evaluation returned.
    args = maker.Args(
        env_id="Pendulum-v1",
        dataset_id="pend/d4pg-v0",
        episodes=2,
        seed=10_002,
        root=Path("data"),
        checkpoint=ckpt,
    )
    folder = maker.make_dataset(args)
    assert returns_of(folder) == pytest.approx(
        json.loads((d4pg_run / "summary.json").read_text())["eval_returns"], rel=1e-4
    )
    assert (
        recipe_of(folder)
        == f"benchmark.datasets checkpoint d4pg.py {ckpt} step=400 episodes=2 noise=0.0 seed=10002"
    )
    made = (folder / "data" / "main_data.hdf5").stat().st_mtime_ns
    assert (
        maker.make_dataset(args) == folder
        and (folder / "data" / "main_data.hdf5").stat().st_mtime_ns == made
    )
    noisy = maker.make_dataset(
        maker.Args(**{**vars(args), "dataset_id": "pend/d4pg-noisy-v0", "noise": 0.5})
    )
    assert returns_of(noisy) != pytest.approx(returns_of(folder), rel=1e-4)

    # rlpd.py reads it through --dataset-path and keeps it in its checkpoint (400 transitions, as recorded).
    check_ok(
        run_script(
            "rlpd.py",
            "--env-id",
            "Pendulum-v1",
            "--seed",
            "4",
            "--dataset-path",
            str(folder),
            "--total-steps",
            "150",
            "--learning-starts",
            "100",
            "--utd-ratio",
            "2",
            "--hidden-dim",
            "16",
            "--batch-size",
            "16",
            "--eval-episodes",
            "1",
            "--eval-interval",
            "0",
            "--checkpoint-interval",
            "0",
            "--run-dir",
            "rlpd",
            cwd=tmp_path,
        )
    )
    rlpd_ckpt = torch.load(tmp_path / "rlpd/checkpoints/latest.pt", weights_only=True)
    assert rlpd_ckpt["offline_data"]["size"] == 400
    recorded = np.concatenate(
        [ep.rewards for ep in minari.MinariDataset(folder / "data").iterate_episodes()]
    )
    np.testing.assert_allclose(rlpd_ckpt["offline_data"]["rewards"].numpy(), recorded, rtol=1e-6)

    # rlpd.py's checkpoint is a source in turn: tanh of its actor's mean, as its own evaluation.
    again = maker.make_dataset(
        maker.Args(
            env_id="Pendulum-v1",
            dataset_id="pend/rlpd-v0",
            episodes=1,
            seed=10_004,
            root=Path("data"),
            checkpoint=Path("rlpd/checkpoints/latest.pt"),
        )
    )
    assert returns_of(again) == pytest.approx(
        json.loads((tmp_path / "rlpd/summary.json").read_text())["eval_returns"], rel=1e-4
    )
    assert "checkpoint rlpd.py rlpd/checkpoints/latest.pt step=150 " in recipe_of(
        again
    )  # relative inside the cwd


@pytest.mark.parametrize("normalize_obs, layer_norm", [(False, False), (True, False), (True, True)])
def test_naf_checkpoint_dataset_acts_with_mu(tmp_path, normalize_obs, layer_norm):
    """A NAF network saved by naf.py's own harness: the dataset returns what naf.py's evaluate() returns,
    also when the network standardises its input with the moments its checkpoint carries (--normalize-obs)
    and has a LayerNorm in each hidden layer (--layer-norm)."""
    naf = load_algo("naf")
    torch.manual_seed(0)
    net = naf.NAFNetwork(3, 1, 16, normalize_obs=normalize_obs, layer_norm=layer_norm)
    net.observe(np.random.default_rng(0).normal([0.5, -0.5, 3.0], [0.1, 0.2, 2.0], size=(50, 3)))
    ckpt = tmp_path / "naf.pt"
    save_with_harness(
        naf,
        ckpt,
        naf.Args(
            env_id="Pendulum-v1",
            hidden_dim=16,
            seed=5,
            normalize_obs=normalize_obs,
            layer_norm=layer_norm,
        ),
        7,
        {"net": net.state_dict()},
    )
    folder = maker.make_dataset(
        maker.Args(
            env_id="Pendulum-v1",
            dataset_id="pend/naf-v0",
            episodes=2,
            seed=10_005,
            root=tmp_path,
            checkpoint=ckpt,
        )
    )
    assert returns_of(folder) == pytest.approx(
        naf.evaluate(net, "Pendulum-v1", 2, 5, "cpu"), rel=1e-4
    )
    assert f"checkpoint naf.py {ckpt} step=7 " in recipe_of(folder)


def bad_checkpoints(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """(extra argv, fragment of the one-line refusal) per case."""

    def save(name: str, data) -> str:
        torch.save(data, tmp_path / name)
        return str(tmp_path / name)

    header = {"env_id": "Pendulum-v1", "args": {"hidden_dim": 16}, "global_step": 3}
    (tmp_path / "text.pt").write_text("not a checkpoint")
    return {
        "missing": (
            ["--checkpoint", str(tmp_path / "none.pt")],
            f"checkpoint {tmp_path / 'none.pt'} does not exist",
        ),
        "unreadable": (["--checkpoint", str(tmp_path / "text.pt")], "cannot read checkpoint"),
        "foreign": (
            ["--checkpoint", save("foreign.pt", {"weights": torch.zeros(2)})],
            "is not a checkpoint written by a file of algos/",
        ),
        "other env": (
            [
                "--checkpoint",
                save("env.pt", {**header, "algo": "naf"}),
                "--env-id",
                "MountainCarContinuous-v0",
            ],
            "is for Pendulum-v1, not MountainCarContinuous-v0; pass --env-id Pendulum-v1",
        ),
        "ppo_atari": (
            ["--checkpoint", save("ppo.pt", {**header, "algo": "ppo_atari"})],
            "was written by ppo_atari.py, which has no deterministic continuous-action policy; pass a "
            "checkpoint of d4pg.py, naf.py, rlpd.py",
        ),
        "dqn_atari": (
            ["--checkpoint", save("dqn.pt", {**header, "algo": "dqn_atari"})],
            "was written by dqn_atari.py, which has no deterministic continuous-action policy",
        ),
        "wrong weights": (
            ["--checkpoint", save("weights.pt", {**header, "algo": "naf", "net": {}})],
            "does not fit naf.py's networks (Error(s) in loading state_dict for NAFNetwork:",
        ),
        "no algorithm file": (
            [
                "--checkpoint",
                save("nofile.pt", {**header, "algo": "naf", "net": {}}),
                "--algos-dir",
                str(tmp_path),
            ],
            f"was written by naf.py, which is not in {tmp_path}",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "unreadable",
        "foreign",
        "other env",
        "ppo_atari",
        "dqn_atari",
        "wrong weights",
        "no algorithm file",
    ],
)
def test_bad_checkpoint_one_line(tmp_path, capsys, case):
    argv, fragment = bad_checkpoints(tmp_path)[case]
    base = {
        "--env-id": "Pendulum-v1",
        "--dataset-id": "pend/x-v0",
        "--root": str(tmp_path / "data"),
    }
    base.update(dict(zip(argv[::2], argv[1::2])))
    assert maker.main([x for kv in base.items() for x in kv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("benchmark.datasets: error: ") and fragment in err and "\n" not in err, (
        err
    )
    assert not (tmp_path / "data").exists()


def test_checkpoint_replaces_the_missing_controller_in_the_message(tmp_path, capsys):
    assert (
        maker.main(
            ["--env-id", "HalfCheetah-v5", "--dataset-id", "hc/x-v0", "--root", str(tmp_path)]
        )
        == 1
    )
    assert (
        "no scripted controller for 'HalfCheetah-v5'; choose one of MountainCarContinuous-v0, Pendulum-v1, "
        "or pass --checkpoint" in capsys.readouterr().err
    )
