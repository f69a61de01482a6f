"""Final actors of the screening runs: where the evaluation episodes end, against the replay."""
import json
import sys

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, "results/d4pg-collapse")
from d4pg_diag import Actor, scale_action  # noqa: E402

out = {}
for run in sys.argv[1:]:
    ck = torch.load(f"{run}/checkpoints/latest.pt", map_location="cpu", weights_only=True)
    act_dim, hid = ck["actor"]["head.weight"].shape
    actor = Actor(ck["actor"]["torso.0.weight"].shape[1], act_dim, hid)
    actor.load_state_dict(ck["actor"])
    seed = ck["args"]["seed"]
    env = gym.make("InvertedDoublePendulum-v5")
    eps = []
    for i in range(10):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        xs, ret, done, t = [], 0.0, False, 0
        while not done:
            with torch.inference_mode():
                a = actor(torch.as_tensor(obs, dtype=torch.float32)[None])[0].numpy()
            obs, r, term, trunc, _ = env.step(scale_action(a, env.action_space.low, env.action_space.high))
            xs.append(float(obs[0])); ret += r; t += 1; done = term or trunc
        eps.append({"return": round(ret, 1), "length": t, "terminated": bool(term),
                    "x_end": round(xs[-1], 3), "x_absmax": round(max(map(abs, xs)), 3)})
    x = ck["buffer"]["obs"][:, 0].numpy()
    q = np.quantile(np.abs(x), [0.5, 0.9, 0.99, 1.0])
    out[run] = {"episodes": eps, "replay_abs_x_quantiles_50_90_99_100": [round(float(v), 3) for v in q],
                "replay_size": int(len(x))}
    print(run, json.dumps(out[run], indent=None))
