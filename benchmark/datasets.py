"""`python -m benchmark.datasets`: write a local Minari dataset of a scripted expert or of a trained
checkpoint, without network access.

Rollouts of a scripted controller, or of the deterministic policy of a checkpoint written by
`algos/d4pg.py`, `algos/naf.py` or `algos/rlpd.py` (`--checkpoint`: d4pg's actor, NAF's mu(x), RLPD's
tanh of the actor's mean, built by importing that algorithm file from --algos-dir, so the networks are
its own), with Gaussian action noise of standard deviation `--noise` added in
the action space scaled to [-1, 1] (then clipped), become a Minari dataset through
`minari.create_dataset_from_buffers` with `EpisodeBuffer` episodes (HDF5 storage: needs h5py, not
the jax that Minari's DataCollector needs). Episode i starts from `env.reset(seed=seed + i)`.

The dataset lands in <root>/<dataset-id>/ (root: --root, else MINARI_DATASETS_PATH, else Minari's
~/.minari/datasets), written beside it under a temporary name and renamed, so a failure leaves nothing
half-written. `algos/rlpd.py` reads it with `--dataset-path <root>/<dataset-id>`, or with
`--dataset-id <dataset-id>` and MINARI_DATASETS_PATH=<root>.

Running it again with the same recipe (controller, or checkpoint path and global step; episodes,
noise, seed) leaves the dataset as it is and says so, so the benchmark runner calls it before every
sweep (a preset's `dataset` table); another recipe under the same id is refused unless --overwrite.
A checkpoint of another environment than --env-id, of a file without a deterministic
continuous-action policy (ppo_atari.py, dqn_atari.py, ppg.py, ...), or a missing or unreadable one
is refused in one line.

Controllers (measured: 50 episodes, seeds 0..49, each dataset's own printout):
- MountainCarContinuous-v0, energy pumping: push with force 0.5 in the direction of the velocity
  (the car swings higher each time until it reaches the flag). Return 95.8 +- 0.9 (min 94.6); with
  --noise 0.3 / 0.5 / 1.0: 94.8 / 93.0 / 87.7. Full force reaches the flag sooner but pays more for
  the action (about 89).
- Pendulum-v1, energy-based swing-up and PD balance: below cos(theta) = 0.8 the torque pumps the
  energy E = theta_dot^2 / 2 + 15 (cos(theta) - 1) towards 0 (upright at rest; dE/dt = 3 u theta_dot),
  above it u = -(10 theta + 2 theta_dot). Return -137.6 +- 86.3 (min -348.6: starts that need two
  swings); with --noise 0.3 / 0.5 / 1.0: -152.4 / -158.0 / -425.6.

Examples:
    python -m benchmark.datasets --env-id MountainCarContinuous-v0 --dataset-id mountaincar/expert-v0 \\
        --episodes 10 --root runs/datasets
    python -m benchmark.datasets --env-id Pendulum-v1 --dataset-id pendulum/d4pg-v0 --episodes 10 \\
        --noise 0.2 --checkpoint runs/Pendulum-v1__d4pg__1__1700000000/checkpoints/latest.pt --root runs/datasets
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        torque = (
            -theta_dot * energy
        )  # dE/dt = 3 torque theta_dot: drives E towards 0 from either side
    return np.array([np.clip(torque, -2.0, 2.0) / 2.0])


CONTROLLERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "MountainCarContinuous-v0": mountain_car_energy_pumping,
    "Pendulum-v1": pendulum_swing_up,
}
ALGOS_DIR = Path(__file__).resolve().parents[1] / "algos"


# Each algorithm file's deterministic policy, from its own classes and its checkpoint's keys: obs [1, obs_dim]
# -> action in [-1, 1]^act_dim (the files map [-1, 1] onto the env's bounds, as `rollout` does).
def d4pg_policy(algo: Any, ckpt: dict, obs_dim: int, act_dim: int) -> Callable:
    args = ckpt["args"]
    actor = algo.Actor(obs_dim, act_dim, args.get("hidden_dim", args.get("hidden_size")))
    actor.load_state_dict(ckpt["actor"])
    return actor  # tanh of its head: d4pg.py's evaluate()


def naf_policy(algo: Any, ckpt: dict, obs_dim: int, act_dim: int) -> Callable:
    # --normalize-obs: the network standardises its input with the moments in its state dict.
    args = ckpt["args"]
    net = algo.NAFNetwork(
        obs_dim,
        act_dim,
        args["hidden_dim"],
        normalize_obs=args.get("normalize_obs", False),
        layer_norm=args.get("layer_norm", False),
    )
    net.load_state_dict(ckpt["net"])
    return lambda obs: net(obs)[1]  # mu(x), the argmax of NAF's quadratic Q: naf.py's evaluate()


def rlpd_policy(algo: Any, ckpt: dict, obs_dim: int, act_dim: int) -> Callable:
    agent = algo.Agent(obs_dim, act_dim, ckpt["args"]["hidden_dim"], ckpt["args"]["num_qs"])
    agent.load_state_dict(ckpt["agent"])
    return lambda obs: agent.actor(obs)[
        0
    ].tanh()  # tanh of the Gaussian's mean: rlpd.py's evaluate()


POLICIES: dict[str, Callable[[Any, dict, int, int], Callable]] = {
    "d4pg": d4pg_policy,
    "naf": naf_policy,
    "rlpd": rlpd_policy,
}


@dataclass
class Args:
    env_id: str
    """environment: MountainCarContinuous-v0 or Pendulum-v1 (scripted controllers), or the env of --checkpoint"""
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
    checkpoint: Path | None = None
    """act with the deterministic policy of this checkpoint of d4pg.py, naf.py or rlpd.py (a
    checkpoints/latest.pt) instead of a scripted controller; it must be of --env-id"""
    algos_dir: Path | None = None
    """where the algorithm file that wrote --checkpoint lies (default: algos/ beside benchmark/)"""
    overwrite: bool = False
    """replace an existing dataset of another recipe"""


def fail(message: str) -> SystemExit:
    return SystemExit(f"benchmark.datasets: error: {message}")


def recipe(args: Args, source: str) -> str:
    """What made the dataset (`source`: the controller's name, or the checkpoint's file, path and
    step), stored as its algorithm_name; a rerun compares it."""
    return (
        f"benchmark.datasets {source} episodes={args.episodes} noise={args.noise} seed={args.seed}"
    )


def shown_path(path: Path) -> str:
    """A checkpoint's path as the recipe records it: relative to the working directory (the
    repository) when inside it, so the same checkpoint reads the same on every clone."""
    resolved, cwd = path.resolve(), Path.cwd().resolve()
    return str(resolved.relative_to(cwd)) if resolved.is_relative_to(cwd) else str(resolved)


def read_checkpoint(path: Path, env_id: str) -> dict:
    """A checkpoint of d4pg.py, naf.py or rlpd.py for `env_id`; anything else is refused in one line."""
    import torch  # only checkpoint-sourced datasets need it

    if not path.is_file():
        raise fail(f"checkpoint {path} does not exist; pass the path of a checkpoints/latest.pt")
    try:  # as the files load theirs: weights only, so a stranger's file cannot run code
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise fail(
            f"cannot read checkpoint {path} ({type(e).__name__}); it is corrupt or not a checkpoint"
        )
    if not isinstance(ckpt, dict) or not {"algo", "env_id", "args", "global_step"} <= ckpt.keys():
        raise fail(
            f"{path} is not a checkpoint written by a file of algos/; pass a checkpoints/latest.pt"
        )
    if ckpt["algo"] not in POLICIES:
        raise fail(
            f"checkpoint {path} was written by {ckpt['algo']}.py, which has no deterministic continuous-action "
            f"policy; pass a checkpoint of {', '.join(f'{a}.py' for a in POLICIES)}"
        )
    if ckpt["env_id"] != env_id:
        raise fail(
            f"checkpoint {path} is for {ckpt['env_id']}, not {env_id}; pass --env-id {ckpt['env_id']} "
            "or a checkpoint of this environment"
        )
    return ckpt


def checkpoint_policy(args: Args, ckpt: dict, env: gym.Env) -> Callable[[np.ndarray], np.ndarray]:
    """The checkpoint's deterministic policy, built from the classes of the file that wrote it."""
    import torch

    name = ckpt["algo"]
    path = (args.algos_dir or ALGOS_DIR) / f"{name}.py"
    if not path.is_file():
        raise fail(
            f"checkpoint {args.checkpoint} was written by {name}.py, which is not in {path.parent}; "
            "pass --algos-dir"
        )
    spec = importlib.util.spec_from_file_location(f"_dataset_source_{name}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # dataclasses look the module up while it loads
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    obs_dim, act_dim = int(np.prod(env.observation_space.shape)), env.action_space.shape[0]
    try:
        net = POLICIES[name](module, ckpt, obs_dim, act_dim)
    except (KeyError, RuntimeError) as e:  # a missing key, or weights of other shapes or names
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise fail(
            f"checkpoint {args.checkpoint} does not fit {name}.py's networks ({first}); "
            f"make the dataset with the {name}.py that wrote it"
        )

    def policy(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.as_tensor(obs, dtype=torch.float32).reshape(1, -1))[0].numpy()

    return policy


def rollout(
    env: gym.Env,
    controller: Callable[[np.ndarray], np.ndarray],
    noise: float,
    seed: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """One episode: observations [T + 1], actions in the env's units [T], rewards, terminations, truncations."""
    low, high = env.action_space.low, env.action_space.high
    obs, _ = env.reset(seed=seed)
    observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
    done = False
    while not done:
        u = np.clip(controller(obs) + noise * rng.standard_normal(low.shape), -1.0, 1.0)
        action = (low + 0.5 * (u + 1.0) * (high - low)).astype(env.action_space.dtype)
        obs, reward, terminated, truncated, _ = env.step(action)
        for store, value in zip(
            (observations, actions, rewards, terminations, truncations),
            (obs, action, reward, terminated, truncated),
        ):
            store.append(value)
        done = terminated or truncated
    return {
        "observations": np.array(observations),
        "actions": np.array(actions),
        "rewards": np.array(rewards),
        "terminations": np.array(terminations),
        "truncations": np.array(truncations),
    }


def make_dataset(args: Args) -> Path:
    """Record the episodes and write the dataset; returns its folder. Raises `fail` on bad input."""
    if args.checkpoint is None and args.env_id not in CONTROLLERS:
        raise fail(
            f"no scripted controller for {args.env_id!r}; choose one of {', '.join(CONTROLLERS)}, "
            "or pass --checkpoint"
        )
    if args.episodes < 1:
        raise fail(f"--episodes must be at least 1, got {args.episodes}")
    if not (args.noise >= 0 and np.isfinite(args.noise)):
        raise fail(f"--noise must be a finite number >= 0, got {args.noise}")
    ckpt = read_checkpoint(args.checkpoint, args.env_id) if args.checkpoint is not None else None
    source = (
        CONTROLLERS[args.env_id].__name__
        if ckpt is None
        else f"checkpoint {ckpt['algo']}.py {shown_path(args.checkpoint)} step={ckpt['global_step']}"
    )  # type: ignore[arg-type]
    import minari  # after the checks above, which need no Minari
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(args.dataset_id)
    except ValueError as e:
        raise fail(f"{e}".replace("\n", " "))
    # Absolute: Minari joins a relative datasets path onto itself when it writes.
    root = Path(
        args.root or os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets"
    ).resolve()
    folder = root / args.dataset_id
    metadata = folder / "data" / "metadata.json"
    if folder.exists() and not args.overwrite:
        made_by = (
            json.loads(metadata.read_text()).get("algorithm_name")
            if metadata.is_file()
            else "an unknown recipe"
        )
        if made_by == recipe(args, source):
            print(f"up to date: {folder} ({made_by})")
            return folder
        raise fail(f"{folder} exists, made by {made_by}; pass --overwrite or another --dataset-id")

    try:
        env = gym.make(args.env_id)
    except Exception as e:  # a checkpoint's env whose dependency this machine lacks
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise fail(f"cannot make environment {args.env_id!r} ({first})")
    try:
        controller = checkpoint_policy(args, ckpt, env) if ckpt else CONTROLLERS[args.env_id]
    except SystemExit:
        env.close()
        raise
    rng = np.random.default_rng(args.seed)
    episodes = [
        rollout(env, controller, args.noise, args.seed + i, rng) for i in range(args.episodes)
    ]
    buffers = [EpisodeBuffer(id=i, seed=args.seed + i, **ep) for i, ep in enumerate(episodes)]
    staging = root / f".staging-{os.getpid()}"
    saved = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(staging)  # where create_dataset_from_buffers writes
    try:
        with (
            warnings.catch_warnings()
        ):  # Minari warns about every optional metadata field left empty
            warnings.simplefilter("ignore", UserWarning)
            minari.create_dataset_from_buffers(
                args.dataset_id,
                buffers,
                env=args.env_id,
                algorithm_name=recipe(args, source),
                description=f"{source} on {args.env_id}, benchmark/datasets.py",
            )
        if folder.exists():
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / args.dataset_id, folder)
    finally:
        os.environ.pop("MINARI_DATASETS_PATH") if saved is None else os.environ.update(
            MINARI_DATASETS_PATH=saved
        )
        shutil.rmtree(staging, ignore_errors=True)
        env.close()
    returns = [float(ep["rewards"].sum()) for ep in episodes]
    steps = sum(len(ep["rewards"]) for ep in episodes)
    print(
        f"wrote {folder}: {args.episodes} episodes, {steps:,} steps, return {np.mean(returns):.1f} "
        f"+- {np.std(returns):.1f} (min {np.min(returns):.1f}, max {np.max(returns):.1f})"
    )
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
