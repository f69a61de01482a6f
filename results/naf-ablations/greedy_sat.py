"""How often a greedy policy acts at the bounds, per action component, and how it moves.

Replays the deterministic policy of naf.py checkpoints, or of RL Zoo TD3 models (.zip, needs
stable-baselines3), for 3 episodes on reset seeds 1000, 1001, 1002 and prints: the returns, the
episode lengths, the mean forward velocity (qvel[0], m/s), the share of steps at which each action
component is at its bound (|u| > 0.99 in [-1, 1] units) and, for naf, the median |mu before tanh|
of each component (tanh' < 0.01 past 3).

Usage (from the repository root):
    python results/naf-ablations/greedy_sat.py runs/<run>/checkpoints/latest.pt [more] [logs/td3/Hopper-v5_1/Hopper-v5.zip]
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import torch

from gait import load_algo


def naf_policy(path: str):
    """(env id, policy): the policy maps an observation to (u in [-1, 1], |mu before tanh|)."""
    ckpt, naf = torch.load(path, weights_only=True, map_location="cpu"), load_algo("naf")
    args, w = ckpt["args"], ckpt["net"]
    net = naf.NAFNetwork(w["trunk.0.weight"].shape[1], w["mu_head.weight"].shape[0], args["hidden_dim"],
                         normalize_obs=args.get("normalize_obs", False), layer_norm=args.get("layer_norm", False))
    net.load_state_dict(w)

    def act(obs):
        with torch.inference_mode():
            _, mu, _, pre_tanh = net(torch.as_tensor(obs, dtype=torch.float32)[None])
        return mu[0].numpy(), pre_tanh[0].abs().numpy()
    return args["env_id"], act


def td3_policy(path: str, env_id: str):
    from stable_baselines3 import TD3  # RL Zoo's venv
    model = TD3.load(path, device="cpu")
    low, high = model.action_space.low, model.action_space.high
    return env_id, lambda obs: (2 * (model.predict(obs, deterministic=True)[0] - low) / (high - low) - 1, None)


def replay(env_id: str, act) -> str:
    env = gym.make(env_id)
    low, high = env.action_space.low, env.action_space.high
    returns, lengths, speed, us, pres = [], [], [], [], []
    for seed in (1000, 1001, 1002):
        obs, _ = env.reset(seed=seed)
        done, total, n = False, 0.0, 0
        while not done:
            u, pre = act(obs)
            us.append(u), pres.append(pre)
            obs, r, terminated, truncated, _ = env.step(low + 0.5 * (u + 1.0) * (high - low))
            total, n, done = total + float(r), n + 1, terminated or truncated
            speed.append(env.unwrapped.data.qvel[0])
        returns.append(round(total)), lengths.append(n)
    env.close()
    at_bound = [round(float(x), 2) for x in (np.abs(np.array(us)) > 0.99).mean(0)]
    pre = "" if pres[0] is None else f" | median |mu before tanh| {[round(float(x), 1) for x in np.median(np.array(pres), 0)]}"
    return f"returns {returns} | lengths {lengths} | speed {np.mean(speed):.2f} m/s | at a bound {at_bound}{pre}"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    for path in sys.argv[1:]:
        env_id, act = td3_policy(path, path.split("/")[-1].removesuffix(".zip")) if path.endswith(".zip") else naf_policy(path)
        print(path, "|", replay(env_id, act))
