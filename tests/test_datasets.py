"""Tests for benchmark/datasets.py: the scripted controllers are experts, the datasets it writes load
with Minari as recorded (returns, terminations, truncations, actions within the bounds, noise
reproducible from the seed), a rerun of the same recipe leaves the dataset alone, another recipe
is refused unless --overwrite, and every bad argument stops with its one-line message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest

from benchmark import datasets as maker
from conftest import ROOT


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
            obs, r, terminated, truncated, _ = env.step((low + 0.5 * (u + 1) * (high - low)).astype(np.float32))
            total, done = total + float(r), terminated or truncated
        returns.append(total)
    return returns


@pytest.mark.parametrize("env_id, expert", [("MountainCarContinuous-v0", 90.0), ("Pendulum-v1", -200.0)])
def test_controllers_are_experts(env_id, expert):
    """MountainCarContinuous is solved at 90; Pendulum's tuned SAC/TD3 average about -150."""
    returns = episode_returns(env_id, maker.CONTROLLERS[env_id], 10)
    assert np.mean(returns) >= expert, returns
    if env_id == "MountainCarContinuous-v0":
        assert min(returns) > 90  # every episode reaches the flag


def make(tmp_path, **kwargs) -> minari.MinariDataset:
    args = maker.Args(**{"env_id": "MountainCarContinuous-v0", "dataset_id": "mc/expert-v0", "episodes": 2,
                         "root": tmp_path, **kwargs})
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
        assert ep.terminations.tolist() == [False] * (len(ep.actions) - 1) + [True]  # reached the flag
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
    with pytest.raises(SystemExit, match="exists, made by benchmark.datasets mountain_car_energy_pumping episodes=2 "
                                         "noise=0.0 seed=0; pass --overwrite"):
        make(tmp_path, episodes=3)
    assert make(tmp_path, episodes=3, overwrite=True).total_episodes == 3


@pytest.mark.parametrize("argv, fragment", [
    (["--env-id", "CartPole-v1"], "no scripted controller for 'CartPole-v1'; choose one of MountainCarContinuous-v0, Pendulum-v1"),
    (["--episodes", "0"], "--episodes must be at least 1, got 0"),
    (["--noise", "-0.1"], "--noise must be a finite number >= 0, got -0.1"),
    (["--noise", "nan"], "--noise must be a finite number >= 0, got nan"),
    (["--dataset-id", "bad id"], "Malformed dataset ID: bad id"),
])
def test_bad_arguments_one_line(tmp_path, capsys, argv, fragment):
    base = {"--env-id": "MountainCarContinuous-v0", "--dataset-id": "mc/expert-v0", "--root": str(tmp_path)}
    base.update(dict(zip(argv[::2], argv[1::2])))
    assert maker.main([x for kv in base.items() for x in kv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("benchmark.datasets: error: ") and fragment in err and "\n" not in err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmark.datasets", "--env-id", "MountainCarContinuous-v0",
                           "--dataset-id", "mc/expert-v0", "--episodes", "1", "--root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {tmp_path / 'mc/expert-v0'}: 1 episodes, ") and "return 9" in proc.stdout
