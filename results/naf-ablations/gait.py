"""How a HalfCheetah policy of naf.py or d4pg.py runs: upright or flipped onto its back.

Replays a checkpoint's deterministic policy for a few episodes, seeded as the run's own
evaluation (seed + 10_000 + i), and reports per episode: the return, the share of steps with the
torso turned more than 90 degrees from upright (cos(pitch) < 0, pitch = qpos[2], 0 at reset), the
first such step, the mean forward speed (qvel[0], m/s) and the share of action components at
|u| > 0.95 of the bound.

Usage (from the repository root):
    python results/naf-ablations/gait.py runs/<run>/checkpoints/latest.pt [more checkpoints]
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np
import torch

ALGOS = Path(__file__).resolve().parents[2] / "algos"
Policy = Callable[[np.ndarray], np.ndarray]  # observation -> action in the env's bounds


@functools.cache  # one import per algorithm file, however many checkpoints
def load_algo(name: str):
    spec = importlib.util.spec_from_file_location(name, ALGOS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def greedy_policy(ckpt: dict, env: gym.Env) -> Policy:
    """The checkpoint's noise-free policy: d4pg's actor, or naf's mu(x)."""
    args, low, high = ckpt["args"], env.action_space.low, env.action_space.high
    if "actor" in ckpt:
        d4pg = load_algo("d4pg")
        net = d4pg.Actor(ckpt["actor"]["torso.0.weight"].shape[1], ckpt["actor"]["head.weight"].shape[0], args["hidden_size"])
        net.load_state_dict(ckpt["actor"])
        head = lambda x: net(x)[0]
    else:
        naf = load_algo("naf")
        obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
        net = naf.NAFNetwork(obs_dim, act_dim, args["hidden_dim"], normalize_obs=args.get("normalize_obs", False),
                             layer_norm=args.get("layer_norm", False))
        net.load_state_dict(ckpt["net"])
        head = lambda x: net(x)[1][0]

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            u = head(torch.as_tensor(obs, dtype=torch.float32)[None]).numpy()
        return low + (u + 1.0) * 0.5 * (high - low)  # both files act in [-1, 1]

    return act


def episode_gait(env: gym.Env, act: Policy, seed: int) -> dict:
    obs, _ = env.reset(seed=seed)
    total, pitch, speed, saturated, done = 0.0, [], [], [], False
    low, high = env.action_space.low, env.action_space.high
    while not done:
        action = act(obs)
        obs, reward, terminated, truncated, _ = env.step(action)
        total, done = total + float(reward), terminated or truncated
        data = env.unwrapped.data
        pitch.append(data.qpos[2])
        speed.append(data.qvel[0])
        saturated.append(np.mean(np.abs(2.0 * (action - low) / (high - low) - 1.0) > 0.95))
    flipped = np.cos(np.asarray(pitch)) < 0
    first = np.flatnonzero(flipped)
    return {
        "return": total,
        "flipped": float(flipped.mean()),
        "first_flipped_step": int(first[0]) if first.size else None,
        "speed": float(np.mean(speed)),
        "saturated": float(np.mean(saturated)),
    }


def main(paths: list[str], episodes: int = 3) -> None:
    for path in paths:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
        env = gym.make(ckpt["env_id"])
        act = greedy_policy(ckpt, env)
        rows = [episode_gait(env, act, ckpt["args"]["seed"] + 10_000 + i) for i in range(episodes)]
        env.close()
        cells = [
            f"return {r['return']:.0f}, flipped {r['flipped']:.0%} (from step {r['first_flipped_step']}), "
            f"speed {r['speed']:.2f}, saturated {r['saturated']:.0%}"
            for r in rows
        ]
        print(f"{path} (step {ckpt.get('global_step')}): " + " | ".join(cells))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
