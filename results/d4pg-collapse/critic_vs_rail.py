"""Final actor and critic of a run: the critic's Q(s, pi(s)) along the evaluation episodes,
by steps left before the episode terminates at the rail, against the realised discounted return."""
import sys

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, "results/d4pg-collapse")
from d4pg_diag import Actor, Critic, scale_action  # noqa: E402

for run in sys.argv[1:]:
    ck = torch.load(f"{run}/checkpoints/latest.pt", map_location="cpu", weights_only=True)
    a_ = ck["args"]
    act_dim, hid = ck["actor"]["head.weight"].shape
    obs_dim = ck["actor"]["torso.0.weight"].shape[1]
    actor, critic = Actor(obs_dim, act_dim, hid), Critic(obs_dim, act_dim, hid, a_["num_atoms"])
    actor.load_state_dict(ck["actor"]); critic.load_state_dict(ck["critic"])
    z = torch.linspace(a_["v_min"], a_["v_max"], a_["num_atoms"])
    env = gym.make("InvertedDoublePendulum-v5")
    rows = []  # (steps left, |x|, Q, realised discounted return)
    for i in range(10):
        obs, _ = env.reset(seed=a_["seed"] + 10_000 + i)
        qs, xs, rs, done = [], [], [], False
        while not done:
            with torch.inference_mode():
                o = torch.as_tensor(obs, dtype=torch.float32)[None]
                a = actor(o)
                qs.append(float((critic(o, a).softmax(-1) * z).sum()))
            xs.append(abs(float(obs[0])))
            obs, r, term, trunc, _ = env.step(scale_action(a[0].numpy(), env.action_space.low, env.action_space.high))
            rs.append(r); done = term or trunc
        if not term:
            continue
        G = np.zeros(len(rs)); g = 0.0
        for t in reversed(range(len(rs))):
            g = rs[t] + a_["gamma"] * g; G[t] = g
        for t in range(len(rs)):
            rows.append((len(rs) - t, xs[t], qs[t], G[t]))
    rows = np.array(rows)
    print(run, f"terminated episodes' states: {len(rows)}")
    print("| steps left | n | mean |x| | critic Q(s, pi(s)) | realised discounted return |")
    for lo, hi in [(1, 5), (6, 20), (21, 50), (51, 100), (101, 200), (201, 400), (401, 1000)]:
        m = (rows[:, 0] >= lo) & (rows[:, 0] <= hi)
        if m.any():
            print(f"| {lo}-{hi} | {m.sum()} | {rows[m, 1].mean():.2f} | {rows[m, 2].mean():.0f} | {rows[m, 3].mean():.0f} |")
