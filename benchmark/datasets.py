"""`python -m benchmark.datasets`: write a local Minari dataset of a scripted expert, without network access.

Rollouts of a scripted controller, with Gaussian action noise of standard deviation `--noise` added in
the action space scaled to [-1, 1] (then clipped), become a Minari dataset through
`minari.create_dataset_from_buffers` with `EpisodeBuffer` episodes (HDF5 storage: needs h5py, not
the jax that Minari's DataCollector needs). Episode i starts from `env.reset(seed=seed + i)`.

The dataset lands in <root>/<dataset-id>/ (root: --root, else MINARI_DATASETS_PATH, else Minari's
~/.minari/datasets), written beside it under a temporary name and renamed, so a failure leaves nothing
half-written. `algos/rlpd.py` reads it with `--dataset-path <root>/<dataset-id>`, or with
`--dataset-id <dataset-id>` and MINARI_DATASETS_PATH=<root>.

Running it again with the same recipe (controller, episodes, noise, seed) leaves the dataset as it
is and says so, so a benchmark runner may call it before every sweep; another recipe under the same
id is refused unless --overwrite.

Controllers (measured: 50 episodes, seeds 0..49, each dataset's own printout):
- MountainCarContinuous-v0, energy pumping: push with force 0.5 in the direction of the velocity
  (the car swings higher each time until it reaches the flag). Return 95.8 +- 0.9 (min 94.6); with
  --noise 0.3 / 0.5 / 1.0: 94.8 / 93.0 / 87.7. Full force reaches the flag sooner but pays more for
  the action (about 89).
- Pendulum-v1, energy-based swing-up and PD balance: below cos(theta) = 0.8 the torque pumps the
  energy E = theta_dot^2 / 2 + 15 (cos(theta) - 1) towards 0 (upright at rest; dE/dt = 3 u theta_dot),
  above it u = -(10 theta + 2 theta_dot). Return -137.6 +- 86.3 (min -348.6: starts that need two
  swings); with --noise 0.3 / 0.5 / 1.0: -152.4 / -158.0 / -425.6.

Example:
    python -m benchmark.datasets --env-id MountainCarContinuous-v0 --dataset-id mountaincar/expert-v0 \\
        --episodes 10 --root runs/datasets
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np
import tyro

PENDULUM_A = 15.0  # theta_ddot = A sin(theta) + 3 u for Pendulum-v1 (g = 10, m = l = 1: 3g / 2l)


def mountain_car_energy_pumping(obs: np.ndarray) -> np.ndarray:
    """Force 0.5 in the direction of the velocity (at rest: to the right), in [-1, 1]."""
    return np.array([0.5 if obs[1] >= 0 else -0.5])


def pendulum_swing_up(obs: np.ndarray) -> np.ndarray:
    """Energy pumping far from the top, PD control near it; the torque in [-2, 2] scaled to [-1, 1]."""
    cos, sin, theta_dot = obs
    if cos > 0.8:
        torque = -(10.0 * np.arctan2(sin, cos) + 2.0 * theta_dot)
    else:
        energy = 0.5 * theta_dot**2 + PENDULUM_A * (cos - 1.0)
        torque = -theta_dot * energy  # dE/dt = 3 torque theta_dot: drives E towards 0 from either side
    return np.array([np.clip(torque, -2.0, 2.0) / 2.0])


CONTROLLERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "MountainCarContinuous-v0": mountain_car_energy_pumping,
    "Pendulum-v1": pendulum_swing_up,
}


@dataclass
class Args:
    env_id: str
    """environment with a scripted controller: MountainCarContinuous-v0 or Pendulum-v1"""
    dataset_id: str
    """Minari dataset id, (namespace/)name-v<version>, e.g. mountaincar/expert-v0"""
    episodes: int = 10
    """episodes to record"""
    noise: float = 0.0
    """standard deviation of the Gaussian noise added to the controller's action in [-1, 1] (0: expert)"""
    seed: int = 0
    """episode i is reset with seed + i; the noise generator is seeded with seed"""
    root: Path | None = None
    """datasets folder (default MINARI_DATASETS_PATH, else ~/.minari/datasets)"""
    overwrite: bool = False
    """replace an existing dataset of another recipe"""


def fail(message: str) -> SystemExit:
    return SystemExit(f"benchmark.datasets: error: {message}")


def recipe(args: Args) -> str:
    """What made the dataset, stored as its algorithm_name; a rerun compares it."""
    controller = CONTROLLERS[args.env_id].__name__
    return f"benchmark.datasets {controller} episodes={args.episodes} noise={args.noise} seed={args.seed}"


def rollout(env: gym.Env, controller: Callable[[np.ndarray], np.ndarray], noise: float, seed: int,
            rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One episode: observations [T + 1], actions in the env's units [T], rewards, terminations, truncations."""
    low, high = env.action_space.low, env.action_space.high
    obs, _ = env.reset(seed=seed)
    observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
    done = False
    while not done:
        u = np.clip(controller(obs) + noise * rng.standard_normal(low.shape), -1.0, 1.0)
        action = (low + 0.5 * (u + 1.0) * (high - low)).astype(env.action_space.dtype)
        obs, reward, terminated, truncated, _ = env.step(action)
        for store, value in zip((observations, actions, rewards, terminations, truncations),
                                (obs, action, reward, terminated, truncated)):
            store.append(value)
        done = terminated or truncated
    return {"observations": np.array(observations), "actions": np.array(actions), "rewards": np.array(rewards),
            "terminations": np.array(terminations), "truncations": np.array(truncations)}


def make_dataset(args: Args) -> Path:
    """Record the episodes and write the dataset; returns its folder. Raises `fail` on bad input."""
    if args.env_id not in CONTROLLERS:
        raise fail(f"no scripted controller for {args.env_id!r}; choose one of {', '.join(CONTROLLERS)}")
    if args.episodes < 1:
        raise fail(f"--episodes must be at least 1, got {args.episodes}")
    if not (args.noise >= 0 and np.isfinite(args.noise)):
        raise fail(f"--noise must be a finite number >= 0, got {args.noise}")
    import minari  # after the checks above, which need no Minari
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(args.dataset_id)
    except ValueError as e:
        raise fail(f"{e}".replace("\n", " "))
    # Absolute: Minari joins a relative datasets path onto itself when it writes.
    root = Path(args.root or os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets").resolve()
    folder = root / args.dataset_id
    metadata = folder / "data" / "metadata.json"
    if folder.exists() and not args.overwrite:
        made_by = json.loads(metadata.read_text()).get("algorithm_name") if metadata.is_file() else "an unknown recipe"
        if made_by == recipe(args):
            print(f"up to date: {folder} ({made_by})")
            return folder
        raise fail(f"{folder} exists, made by {made_by}; pass --overwrite or another --dataset-id")

    env = gym.make(args.env_id)
    rng = np.random.default_rng(args.seed)
    episodes = [rollout(env, CONTROLLERS[args.env_id], args.noise, args.seed + i, rng) for i in range(args.episodes)]
    buffers = [EpisodeBuffer(id=i, seed=args.seed + i, **ep) for i, ep in enumerate(episodes)]
    staging = root / f".staging-{os.getpid()}"
    saved = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(staging)  # where create_dataset_from_buffers writes
    try:
        with warnings.catch_warnings():  # Minari warns about every optional metadata field left empty
            warnings.simplefilter("ignore", UserWarning)
            minari.create_dataset_from_buffers(args.dataset_id, buffers, env=args.env_id, algorithm_name=recipe(args),
                                               description=f"scripted {args.env_id} controller, benchmark/datasets.py")
        if folder.exists():
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / args.dataset_id, folder)
    finally:
        os.environ.pop("MINARI_DATASETS_PATH") if saved is None else os.environ.update(MINARI_DATASETS_PATH=saved)
        shutil.rmtree(staging, ignore_errors=True)
        env.close()
    returns = [float(ep["rewards"].sum()) for ep in episodes]
    steps = sum(len(ep["rewards"]) for ep in episodes)
    print(f"wrote {folder}: {args.episodes} episodes, {steps:,} steps, return {np.mean(returns):.1f} "
          f"+- {np.std(returns):.1f} (min {np.min(returns):.1f}, max {np.max(returns):.1f})")
    return folder


def main(argv: list[str] | None = None) -> int:
    try:
        make_dataset(tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0]))
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
