"""Tests of algos/d4pg.py: the math against independent references (brute-force projection,
hand-computed n-step returns, sampling frequencies, a plain re-statement of one update with
Acme's DPG surrogate), then tiny runs: outputs, resume equivalence with the uninterrupted run,
same-seed determinism against a different-seed control, signals, W&B exit codes, bad input."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    ALGOS,
    check_error,
    check_eval_only_after_move,
    check_ok,
    copy_alone,
    run_script,
    scalars,
    sigterm_on_call,
    summary,
)

spec = importlib.util.spec_from_file_location("d4pg", ALGOS / "d4pg.py")
d4pg = importlib.util.module_from_spec(spec)
sys.modules["d4pg"] = d4pg  # dataclasses look the module up while it loads
spec.loader.exec_module(d4pg)
CPU = torch.device("cpu")

TINY = [
    "--total-steps",
    "600",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    "--hidden-dim",
    "32",
    "--buffer-size",
    "5000",
    "--eval-episodes",
    "1",
    "--eval-interval",
    "400",
]
# in-process runs: small networks, no periodic checkpoint or evaluation unless a test asks
SMALL = dict(
    learning_starts=100,
    batch_size=32,
    hidden_dim=32,
    buffer_size=5000,
    eval_episodes=1,
    eval_interval=0,
    checkpoint_interval=0,
)


# ---------------------------------------------------------------- categorical projection
def brute_force_projection(R, discount, p, z):
    """C51's Alg. 1 with a Python loop: each shifted atom gives its mass to its two neighbours."""
    out = np.zeros_like(p)
    dz = z[1] - z[0]
    for b in range(p.shape[0]):
        for j in range(len(z)):
            tz = min(max(R[b] + discount[b] * z[j], z[0]), z[-1])
            pos = (tz - z[0]) / dz
            lo, hi = math.floor(pos), math.ceil(pos)
            if lo == hi:
                out[b, lo] += p[b, j]
            else:
                out[b, lo] += p[b, j] * (hi - pos)
                out[b, hi] += p[b, j] * (pos - lo)
    return out


def test_projection_matches_brute_force():
    rng = np.random.default_rng(0)
    B, N = 64, 11
    z = np.linspace(-10.0, 10.0, N)
    R = rng.uniform(-15, 15, B)
    discount = rng.choice([0.0, 0.99**5, 0.99**2, 1.0], B)  # 0: terminal transitions
    p = rng.dirichlet(np.ones(N), B)
    shifted = R[:, None] + discount[:, None] * z
    assert (shifted < z[0]).any() and (shifted > z[-1]).any(), (
        "the case must include atoms outside the support"
    )
    assert (discount == 0).any()
    got = d4pg.categorical_projection(
        torch.tensor(R), torch.tensor(discount), torch.tensor(p), torch.tensor(z)
    ).numpy()
    np.testing.assert_allclose(got, brute_force_projection(R, discount, p, z), atol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)
    # float32 on the default path also sums to 1
    got32 = d4pg.categorical_projection(
        *(torch.tensor(x, dtype=torch.float32) for x in (R, discount, p, z))
    )
    np.testing.assert_allclose(got32.sum(-1).numpy(), 1.0, atol=1e-5)


def test_projection_terminal_cases():
    z = torch.linspace(-2.0, 2.0, 5)  # atoms -2, -1, 0, 1, 2
    p = torch.full((4, 5), 0.2)
    R = torch.tensor([1.0, 0.25, -7.0, 9.0])
    m = d4pg.categorical_projection(R, torch.zeros(4), p, z)  # terminal: all mass at R, whatever p'
    expected = torch.tensor(
        [[0, 0, 0, 1, 0], [0, 0, 0.75, 0.25, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 1.0]]
    )
    torch.testing.assert_close(m, expected)


# ---------------------------------------------------------------- n-step returns
def collect(windows, steps):
    """Feed (obs, action, reward, terminated, truncated, real_next_obs) rows; return emitted tuples."""
    out = []
    for s, r, term, trunc, nxt in steps:
        tr = windows.add(
            np.array([[s]], np.float32),
            np.array([[s / 100]], np.float32),
            np.array([r]),
            np.array([term]),
            np.array([trunc]),
            np.array([[nxt]], np.float32),
        )
        out += rows(tr)
    return out


def rows(tr):
    return [
        (float(o[0]), float(a[0]), float(R), float(d), float(n[0]))
        for o, a, R, d, n in zip(
            tr["obs"], tr["actions"], tr["returns"], tr["discounts"], tr["next_obs"]
        )
    ]


# episode A terminates after 3 steps; episode B is truncated after 5; episode C is still running
SEQUENCE = [
    (0, 1, False, False, 1),
    (1, 2, False, False, 2),
    (2, 3, True, False, 3),
    (10, 10, False, False, 11),
    (11, 20, False, False, 12),
    (12, 30, False, False, 13),
    (13, 40, False, False, 14),
    (14, 50, False, True, 15),
    (20, 100, False, False, 21),
    (21, 200, False, False, 22),
]
# n = 3, gamma = 0.5, by hand: (s_t, a_t, R, gamma^m (1 - terminated), s_{t+m})
EXPECTED = [
    (0, 0.00, 1 + 0.5 * 2 + 0.25 * 3, 0.0, 3),
    (1, 0.01, 2 + 0.5 * 3, 0.0, 3),
    (2, 0.02, 3, 0.0, 3),
    (10, 0.10, 10 + 0.5 * 20 + 0.25 * 30, 0.125, 13),
    (11, 0.11, 20 + 0.5 * 30 + 0.25 * 40, 0.125, 14),
    (12, 0.12, 30 + 0.5 * 40 + 0.25 * 50, 0.125, 15),
    (13, 0.13, 40 + 0.5 * 50, 0.25, 15),
    (14, 0.14, 50, 0.5, 15),
]
FLUSHED = [(20, 0.20, 100 + 0.5 * 200, 0.25, 22), (21, 0.21, 200, 0.5, 22)]


def test_nstep_hand_computed():
    windows = d4pg.NStepWindows(1, n=3, gamma=0.5, obs_dim=1, act_dim=1)
    got = collect(windows, SEQUENCE)
    np.testing.assert_allclose(np.array(got), np.array(EXPECTED), rtol=1e-6)
    np.testing.assert_allclose(
        np.array(rows(windows.flush(np.array([[22.0]])))), np.array(FLUSHED), rtol=1e-6
    )
    assert rows(windows.flush(np.array([[0.0]]))) == []  # flushing empties the windows


def test_nstep_windows_checkpoint_roundtrip_and_vectorised():
    windows = d4pg.NStepWindows(1, n=3, gamma=0.5, obs_dim=1, act_dim=1)
    first = collect(windows, SEQUENCE[:4])
    restored = d4pg.NStepWindows(1, n=3, gamma=0.5, obs_dim=1, act_dim=1)
    restored.load_state_dict(windows.state_dict())
    assert first + collect(restored, SEQUENCE[4:]) == collect(
        d4pg.NStepWindows(1, 3, 0.5, 1, 1), SEQUENCE
    )
    # two envs stepping together emit what each would alone
    other = [
        (s + 50, r * 3, t, tr, n + 50) for s, r, t, tr, n in reversed(SEQUENCE)
    ]  # ends elsewhere
    both = d4pg.NStepWindows(2, n=3, gamma=0.5, obs_dim=1, act_dim=1)
    out = []
    for (s0, r0, t0, u0, n0), (s1, r1, t1, u1, n1) in zip(SEQUENCE, other):
        out += rows(
            both.add(
                np.array([[s0], [s1]], np.float32),
                np.array([[s0 / 100], [s1 / 100]], np.float32),
                np.array([r0, r1]),
                np.array([t0, t1]),
                np.array([u0, u1]),
                np.array([[n0], [n1]], np.float32),
            )
        )
    alone = collect(d4pg.NStepWindows(1, 3, 0.5, 1, 1), SEQUENCE) + collect(
        d4pg.NStepWindows(1, 3, 0.5, 1, 1), other
    )
    assert sorted(out) == sorted(alone)


class CountingEnv(gym.Env):
    """obs = steps taken in the episode, reward = that count; optional termination."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, terminate_at=None):
        self.terminate_at, self.t = terminate_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        return np.array([self.t], np.float32), float(self.t), terminated, False, {}


gym.register(
    "D4pgTestTerminate-v0",
    entry_point=CountingEnv,
    kwargs={"terminate_at": 4},
    max_episode_steps=100,
)
gym.register("D4pgTestTruncate-v0", entry_point=CountingEnv, max_episode_steps=6)


@pytest.mark.parametrize(
    "env_id, end, terminal", [("D4pgTestTerminate-v0", 4, True), ("D4pgTestTruncate-v0", 6, False)]
)
def test_autoreset_step_never_stored(env_id, end, terminal):
    """Through the file's own vector env: no transition starts at a final state or spans episodes."""
    n, gamma = 3, 0.9
    envs, obs = d4pg.make_envs(env_id, 2, seed=0)
    windows = d4pg.NStepWindows(2, n, gamma, 1, 1)
    got = []
    for _ in range(3 * end + 2):
        actions = np.zeros((2, 1), np.float32)
        next_obs, rewards, terminated, truncated, infos = envs.step(
            d4pg.scale_action(actions, -1, 1)
        )
        got += rows(
            windows.add(
                obs,
                actions,
                rewards,
                terminated,
                truncated,
                d4pg.final_observations(next_obs, infos),
            )
        )
        obs = next_obs
    envs.close()
    assert len(got) == 2 * 3 * end  # three whole episodes per env, the last 2 steps still pending
    for s, _, R, discount, s_next in got:
        t0 = int(s)
        assert (
            0 <= t0 < end
        )  # the final state never starts a transition (NEXT_STEP's reset step would)
        assert s_next == min(t0 + n, end)  # the real final observation, not the reset one
        m = int(s_next) - t0
        assert R == pytest.approx(sum(gamma**k * (t0 + k + 1) for k in range(m)), rel=1e-6)
        cut = terminal and s_next == end
        assert discount == pytest.approx(0.0 if cut else gamma**m, rel=1e-6)


# ---------------------------------------------------------------- prioritised replay
def filled_buffer(size, capacity, alpha, priorities):
    buf = d4pg.ReplayBuffer(capacity, 1, 1, prioritized=True, alpha=alpha)
    buf.add(
        {
            "obs": np.arange(size, dtype=np.float32)[:, None],
            "actions": np.zeros((size, 1), np.float32),
            "returns": np.zeros(size, np.float32),
            "discounts": np.ones(size, np.float32),
            "next_obs": np.zeros((size, 1), np.float32),
        }
    )
    buf.update_priorities(np.arange(size), torch.as_tensor(priorities))
    return buf


def check_tree(tree):
    for i in range(1, tree.leaves):
        assert tree.nodes[i] == pytest.approx(tree.nodes[2 * i] + tree.nodes[2 * i + 1], rel=1e-12)


def test_prioritized_probabilities_and_weights():
    rng = np.random.default_rng(1)
    size, alpha, beta = 7, 0.6, 0.5
    p = rng.uniform(0.1, 5.0, size)
    buf = filled_buffer(size, 10, alpha, p)  # capacity 10: 16 leaves, 9 of them empty
    P = (p + 1e-6) ** alpha / ((p + 1e-6) ** alpha).sum()
    idx, batch, weights = buf.sample(200_000, beta, rng)
    assert idx.max() < size and np.array_equal(batch["obs"][:, 0], idx.astype(np.float32))
    np.testing.assert_allclose(np.bincount(idx, minlength=size) / len(idx), P, atol=2e-3)
    w = (size * P[idx]) ** -beta
    np.testing.assert_allclose(weights, w / w.max(), rtol=1e-5)
    # equal priorities and a batch of N: stratified sampling draws every transition exactly once
    idx, _, weights = filled_buffer(8, 8, alpha, np.ones(8)).sample(8, beta, rng)
    assert sorted(idx) == list(range(8)) and np.allclose(weights, np.ones(8))


def test_priority_updates():
    alpha = 0.7
    buf = filled_buffer(5, 6, alpha, np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    buf.update_priorities(
        np.array([0, 3, 0]), torch.tensor([9.0, 0.5, 7.0], dtype=torch.float64)
    )  # a repeated index keeps its last value
    leaves = buf.tree.nodes[buf.tree.leaves : buf.tree.leaves + 5]
    np.testing.assert_allclose(leaves, (np.array([7.0, 2.0, 3.0, 0.5, 5.0]) + 1e-6) ** alpha)
    check_tree(buf.tree)
    assert buf.tree.nodes[1] == pytest.approx(leaves.sum())
    assert buf.max_priority == pytest.approx(9.0 + 1e-6)
    # new transitions enter at the largest priority so far; the ring overwrites the oldest slot
    buf.add({k: v[:2] for k, v in filled_buffer(2, 2, alpha, np.ones(2)).data.items()})
    assert buf.size == 6 and buf.pos == 1
    np.testing.assert_allclose(
        buf.tree.nodes[buf.tree.leaves + np.array([5, 0])], (9.0 + 1e-6) ** alpha
    )
    check_tree(buf.tree)
    restored = d4pg.ReplayBuffer(
        6, 1, 1, prioritized=True, alpha=alpha
    )  # and the priorities survive a checkpoint
    restored.load_state_dict(buf.state_dict())
    np.testing.assert_array_equal(restored.tree.nodes, buf.tree.nodes)
    assert restored.max_priority == buf.max_priority
    assert (
        restored.sample(4, 0.4, np.random.default_rng(3))[0].tolist()
        == buf.sample(4, 0.4, np.random.default_rng(3))[0].tolist()
    )


# ---------------------------------------------------------------- one update, against a plain re-statement
def small_nets(seed=0, obs_dim=3, act_dim=2, hidden=16, atoms=11, lr=0.1):
    """Random networks (targets different from the online ones) with SGD, so that a step is -lr * gradient
    and a clipped gradient shows in the parameters (Adam's first step would hide its scale)."""
    torch.manual_seed(seed)
    actor, critic = (
        d4pg.Actor(obs_dim, act_dim, hidden),
        d4pg.Critic(obs_dim, act_dim, hidden, atoms),
    )
    with torch.no_grad():
        actor.head.weight.normal_(0, 1.0)  # not the near-zero init: a = tanh(.) away from 0
    nets = {
        "actor": actor,
        "critic": critic,
        "actor_target": d4pg.Actor(obs_dim, act_dim, hidden),
        "critic_target": d4pg.Critic(obs_dim, act_dim, hidden, atoms),
    }
    nets["actor_optim"] = torch.optim.SGD(actor.parameters(), lr=lr)
    nets["critic_optim"] = torch.optim.SGD(critic.parameters(), lr=lr)
    B = 64
    batch = {
        "obs": torch.randn(B, obs_dim),
        "actions": torch.rand(B, act_dim) * 2 - 1,
        "returns": torch.randn(B) * 20,
        "discounts": torch.tensor([0.0, 0.9**3] * (B // 2)),
        "next_obs": torch.randn(B, obs_dim),
    }
    return nets, batch, torch.rand(B) + 0.5, torch.linspace(-100.0, 100.0, atoms)


def reference_update(nets, b, weights, z, dqda_clip, max_grad_norm, tau, lr=0.1):
    """Detail 8 written out with explicit gradients: a critic SGD step on the weighted cross-entropy against
    the brute-force projection; then an actor step through the updated critic on Acme's DPG surrogate
    0.5 |stop_grad(a + clip(dQ/da)) - a|^2 (dQ/da clipped per sample to L2 norm dqda_clip); each
    network's gradient clipped to global norm max_grad_norm; then the Polyak update of both targets."""
    actor, critic = nets["actor"], nets["critic"]

    def sgd(net, loss):
        grads = torch.autograd.grad(loss, list(net.parameters()))
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        scale = min(1.0, max_grad_norm / (norm.item() + 1e-6)) if max_grad_norm else 1.0
        with torch.no_grad():
            for p, g in zip(net.parameters(), grads):
                p -= lr * scale * g
        return norm.item()

    with torch.no_grad():
        p_next = nets["critic_target"](b["next_obs"], nets["actor_target"](b["next_obs"])).softmax(
            -1
        )
    target = torch.tensor(
        brute_force_projection(
            b["returns"].double().numpy(),
            b["discounts"].double().numpy(),
            p_next.double().numpy(),
            z.double().numpy(),
        ),
        dtype=torch.float32,
    )
    log_p = torch.log_softmax(critic(b["obs"], b["actions"]), -1)
    critic_norm = sgd(critic, (weights * -(target * log_p).sum(-1)).mean())
    a = actor(b["obs"])
    dqda = torch.autograd.grad((critic(b["obs"], a).softmax(-1) * z).sum(), a, retain_graph=True)[0]
    norms = dqda.norm(dim=-1, keepdim=True)
    if dqda_clip:
        dqda = torch.where(norms > dqda_clip, dqda * dqda_clip / norms, dqda)
    actor_norm = sgd(actor, 0.5 * ((a + dqda).detach() - a).pow(2).sum(-1).mean())
    with torch.no_grad():
        for net, target_net in ((actor, nets["actor_target"]), (critic, nets["critic_target"])):
            for p, p_target in zip(net.parameters(), target_net.parameters()):
                p_target.copy_(tau * p + (1 - tau) * p_target)
    return critic_norm, actor_norm, norms.squeeze(-1)


@pytest.mark.parametrize(
    "dqda_clip, max_grad_norm", [(0.0, 0.0), (1.0, 0.0), (0.0, 0.05), (1.0, 0.05)]
)
def test_update_matches_reference(dqda_clip, max_grad_norm):
    """Default (no clipping) and each of Acme's two clips: d4pg.update leaves the same parameters as the
    re-statement, so the order (critic step first, actor through the updated critic) is pinned too."""
    args = d4pg.Args(dqda_clip=dqda_clip, max_grad_norm=max_grad_norm, tau=0.1)
    nets, batch, weights, z = small_nets()
    ref_nets, _, _, _ = small_nets()
    metrics, priorities = d4pg.update(d4pg.Learner(**nets), batch, weights, z, args)
    critic_norm, actor_norm, dqda_norms = reference_update(
        ref_nets, batch, weights, z, dqda_clip, max_grad_norm, tau=0.1
    )
    # the clips must bind for the comparison to mean something: some samples' dQ/da beyond 1, not all
    assert 0 < (dqda_norms > 1.0).float().mean() < 1 and min(critic_norm, actor_norm) > 0.05
    for key in ("actor", "critic", "actor_target", "critic_target"):
        for (name, got), want in zip(
            nets[key].state_dict().items(), ref_nets[key].state_dict().values()
        ):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=f"{key}.{name}")
    assert metrics["losses/q_values"] == pytest.approx(-metrics["losses/actor_loss"].item())
    assert priorities.shape == (64,) and (priorities > -1e-5).all()  # KL(Phi Y || p) >= 0


@pytest.mark.slow
def test_compiled_update_matches_the_eager_update():
    """--compile: the compiled update (fused Adam, both clips binding, so the dQ/da hook is traced)
    leaves the eager update's parameters, metrics and priorities, step after step; once Adam's
    state exists (the second call), later calls compile nothing new."""
    from torch._dynamo.utils import counters

    args = d4pg.Args(compile=True, dqda_clip=1.0, max_grad_norm=0.05, tau=0.1)
    runs = [small_nets()[0] for _ in range(2)]
    for nets in runs:
        for name in ("actor", "critic"):
            nets[f"{name}_optim"] = torch.optim.Adam(nets[name].parameters(), lr=1e-3, fused=True)
    _, batch, weights, z = small_nets()
    learn, graphs = torch.compile(d4pg.update), []
    for _ in range(4):
        want = d4pg.update(d4pg.Learner(**runs[0]), batch, weights, z, args)
        got = learn(d4pg.Learner(**runs[1]), batch, weights, z, args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[1] == graphs[-1]
    for key in ("actor", "critic", "actor_target", "critic_target", "actor_optim"):
        want, got = (nets[key].state_dict() for nets in runs)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.slow
def test_cpu_resumes_a_checkpoint_whose_adam_is_capturable(tmp_path):
    """torch.compile on CUDA sets Adam's `capturable` (the step count lives on the GPU) and a
    checkpoint keeps that flag; resumed on the CPU, d4pg.py's fused Adam still steps with it."""
    run, flags = tmp_path / "run", [*TINY, "--checkpoint-interval", "0", "--device", "cpu"]
    check_ok(run_script("d4pg.py", *flags, "--total-steps", "300", "--run-dir", str(run)))
    path = run / "checkpoints" / "latest.pt"
    ckpt = torch.load(path, weights_only=True)
    for key in ("actor_optim", "critic_optim"):
        for group in ckpt[key]["param_groups"]:
            group["capturable"] = True
    torch.save(ckpt, path)
    check_ok(run_script("d4pg.py", *flags, "--total-steps", "400", "--resume", str(path)))
    assert summary(run)["global_step"] == 400


def test_clips_change_the_update():
    """Control for the test above: each clip, when it binds, moves the parameters elsewhere."""
    finals = []
    for dqda_clip, max_grad_norm in ((0.0, 0.0), (1.0, 0.0), (0.0, 0.05)):
        nets, batch, weights, z = small_nets()
        args = d4pg.Args(dqda_clip=dqda_clip, max_grad_norm=max_grad_norm)
        d4pg.update(d4pg.Learner(**nets), batch, weights, z, args)
        finals.append(torch.cat([p.flatten() for p in nets["actor"].parameters()]))
    assert not torch.allclose(finals[0], finals[1]) and not torch.allclose(finals[0], finals[2])


# ---------------------------------------------------------------- bad input (in process: same message, no subprocess)
def error_of(**kwargs) -> str:
    with pytest.raises(SystemExit) as e:
        d4pg.train(d4pg.Args(**kwargs))
    message = str(e.value.code)
    assert message.startswith("d4pg.py: error:") and "\n" not in message
    return message


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"env_id": "CartPole-v1"}, "ppg.py"),
        ({"env_id": "CarRacing-v3"}, "ppo_atari.py or dqn_atari.py"),
        ({"env_id": "NoSuchEnv-v0"}, "cannot make environment 'NoSuchEnv-v0'"),
        (
            {"num_envs": 0},
            "--num-envs, --batch-size, --n-step and --hidden-dim must be at least 1",
        ),
        ({"n_step": 0}, "--num-envs, --batch-size, --n-step and --hidden-dim must be at least 1"),
        ({"buffer_size": 10, "batch_size": 32}, "--buffer-size must be at least --batch-size"),
        ({"num_atoms": 1}, "--num-atoms of at least 2"),
        ({"v_min": 5.0, "v_max": 5.0}, "--v-min below --v-max"),
        ({"gamma": 1.5}, "--gamma and --tau must lie in (0, 1]"),
        ({"tau": 0.0}, "--gamma and --tau must lie in (0, 1]"),
        ({"per_beta": 2.0}, "--per-beta must lie in [0, 1]"),
        ({"critic_lr": 0.0}, "--actor-lr, --critic-lr and --updates-per-step must be positive"),
        (
            {"updates_per_step": 0.0},
            "--actor-lr, --critic-lr and --updates-per-step must be positive",
        ),
        ({"sigma": -0.1}, "must be >= 0"),
        ({"dqda_clip": -1.0}, "--dqda-clip and --max-grad-norm must be >= 0"),
        ({"max_grad_norm": -1.0}, "--dqda-clip and --max-grad-norm must be >= 0"),
        ({"total_steps": 0}, "--total-steps must be positive"),
        pytest.param(
            {"device": "cuda"},
            "CUDA is not available",
            marks=pytest.mark.skipif(
                torch.cuda.is_available(), reason="the error needs a machine without CUDA"
            ),
        ),
        ({"eval_only": True}, "--eval-only needs --checkpoint"),
        ({"resume": "/nonexistent/latest.pt"}, "does not exist"),
    ],
)
def test_bad_input_messages(kwargs, fragment, tmp_path):
    assert fragment in error_of(run_dir=str(tmp_path / "run"), **kwargs)
    assert not (tmp_path / "run").exists()  # nothing written


def test_refuses_foreign_and_incompatible_checkpoints(tmp_path):
    path = tmp_path / "latest.pt"

    def refusal(ckpt, **kwargs):
        torch.save(
            {
                "harness": 1,
                "env_id": "Pendulum-v1",
                "global_step": 100,
                "args": asdict(d4pg.Args()),
                **ckpt,
            },
            path,
        )
        return error_of(resume=str(path), **kwargs)

    assert "was written by naf.py; use naf.py" in refusal({"algo": "naf"})
    assert "is for HalfCheetah-v5; pass --env-id HalfCheetah-v5" in refusal(
        {"algo": "d4pg", "env_id": "HalfCheetah-v5"}
    )
    assert "was made with --num-atoms 11; pass --num-atoms 11" in refusal(
        {"algo": "d4pg", "args": asdict(d4pg.Args(num_atoms=11))}
    )
    assert "was made with --prioritized; pass --prioritized" in refusal(
        {"algo": "d4pg", "args": asdict(d4pg.Args(prioritized=True))}
    )
    assert "below the checkpoint's step; pass 30000+" in refusal(
        {"algo": "d4pg", "global_step": 30_000}
    )
    torch.save({"algo": "d4pg"}, path)
    assert "not a checkpoint written by this library" in error_of(resume=str(path))


def test_track_without_wandb_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails
    assert "--track needs wandb" in error_of(track=True, run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_bad_input_by_subprocess(tmp_path):
    check_error(
        run_script("d4pg.py", "--env-id", "NoSuchEnv-v0", "--run-dir", str(tmp_path / "a")),
        "d4pg.py: error",
        "NoSuchEnv-v0",
    )
    corrupt = tmp_path / "latest.pt"
    corrupt.write_bytes(b"not a checkpoint")
    check_error(
        run_script("d4pg.py", "--resume", str(corrupt), "--run-dir", str(tmp_path / "b")), "corrupt"
    )
    assert not list(tmp_path.glob("?"))


# ---------------------------------------------------------------- tiny runs
def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_copy_alone_run_outputs_and_eval_only(tmp_path):
    script = copy_alone("d4pg.py", tmp_path)
    proc = run_script(script, *TINY, "--run-dir", "run", "--v-min", "-100", cwd=tmp_path)
    check_ok(proc)
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert (
        len(warnings) == 1 and "outside the critic support [-100, 0]" in warnings[0]
    )  # once, three episodes
    run = tmp_path / "run"
    s = summary(run)
    for key in (
        "script",
        "algo",
        "env_id",
        "seed",
        "global_step",
        "eval_mean",
        "eval_std",
        "eval_episodes",
        "eval_returns",
        "sps",
    ):
        assert key in s
    assert (s["script"], s["algo"], s["global_step"], s["eval_episodes"]) == (
        "d4pg.py",
        "d4pg",
        600,
        1,
    )
    assert json.loads((run / "config.json").read_text())["total_steps"] == 600
    for tag in (
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/SPS",
        "charts/learning_rate",
        "losses/critic_loss",
        "losses/actor_loss",
        "losses/q_values",
    ):
        assert scalars(run, tag), tag
    assert [step for step, _ in scalars(run, "eval/episodic_return")] == [400, 600]
    assert scalars(run, "eval/episodic_return")[-1][1] == pytest.approx(s["eval_mean"])
    ckpt = load(run / "checkpoints" / "latest.pt")
    assert (
        ckpt["algo"] == "d4pg" and ckpt["global_step"] == 600 and ckpt["num_updates"] == 401
    )  # one per step from step 200
    assert ckpt["buffer"]["size"] == 600 and ckpt["windows"]["count"].tolist() == [
        0
    ]  # 3 whole episodes of 200
    assert set(ckpt["rng"]) == {
        "torch",
        "numpy",
    }  # exactly the generators the file draws from (no CUDA here)

    proc = run_script(
        script,
        "--eval-only",
        "--checkpoint",
        str(run / "checkpoints" / "latest.pt"),
        "--eval-episodes",
        "1",
        "--capture-video",
        cwd=tmp_path,
    )
    check_ok(proc)
    result = json.loads((run / "eval.json").read_text())
    assert result["eval_returns"] == s["eval_returns"]  # same seeds, same deterministic actor
    assert list((run / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_resume_flushes_windows_and_continues_curve(tmp_path, restore_signals):
    """Resume in the middle of episodes (2 envs, 250 vector steps): the buffer keeps its data, the pending
    windows become transitions truncated at the saved last observation, the curve continues without
    duplicates, and the PER beta keeps the first run's horizon."""
    run, first = tmp_path / "run", tmp_path / "first.pt"
    flags = dict(
        SMALL, num_envs=2, n_step=5, learning_starts=200, eval_interval=400, run_dir=str(run)
    )
    d4pg.train(d4pg.Args(total_steps=500, **flags))
    shutil.copy(run / "checkpoints" / "latest.pt", first)
    d4pg.train(d4pg.Args(total_steps=1000, resume=str(first), **flags))
    a, b = load(first), load(run / "checkpoints" / "latest.pt")
    assert (
        summary(run)["global_step"] == b["global_step"] == 1000
        and b["num_updates"] > a["num_updates"]
    )
    assert a["beta_horizon"] == b["beta_horizon"] == 500
    n_a = a["buffer"]["size"]
    assert n_a == 500 - 2 * 4 and a["windows"]["count"].tolist() == [4, 4]
    for key in ("obs", "actions", "returns", "discounts", "next_obs"):
        torch.testing.assert_close(b["buffer"][key][:n_a], a["buffer"][key])  # the same data
    flushed = {
        k: b["buffer"][k][n_a : n_a + 8] for k in ("obs", "returns", "discounts", "next_obs")
    }
    torch.testing.assert_close(flushed["obs"], a["windows"]["obs"][:, :4].reshape(8, -1))
    torch.testing.assert_close(flushed["next_obs"], a["last_obs"].repeat_interleave(4, 0))
    gamma, r = 0.99, a["windows"]["rewards"][:, :4].double()
    expected = torch.stack(
        [sum(gamma**k * r[e, j + k] for k in range(4 - j)) for e in range(2) for j in range(4)]
    )
    torch.testing.assert_close(flushed["returns"].double(), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        flushed["discounts"], torch.tensor([gamma ** (4 - j) for _ in range(2) for j in range(4)])
    )
    assert [step for step, _ in scalars(run, "charts/episodic_return")] == [400, 400, 900, 900]
    assert [step for step, _ in scalars(run, "losses/critic_loss")] == [
        200,
        400,
        500,
        600,
        800,
        1000,
    ]
    assert [step for step, _ in scalars(run, "eval/episodic_return")] == [400, 500, 800, 1000]


class LineEnv(gym.Env):
    """x moves by 0.2 a, reward -x^2; every episode starts at x = 0.5 whatever the seed, so a resumed
    run whose checkpoint lies on an episode boundary sees what the uninterrupted run sees."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 0.5, 0
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        self.x, self.t = float(np.clip(self.x + 0.2 * action[0], -2, 2)), self.t + 1
        return np.array([self.x, self.t / 25], np.float32), -(self.x**2), False, False, {}


gym.register("D4pgTestLine-v0", entry_point=LineEnv, max_episode_steps=25)
LINE = dict(
    SMALL,
    env_id="D4pgTestLine-v0",
    num_envs=2,
    total_steps=200,
    learning_starts=50,
    batch_size=16,
    hidden_dim=16,
    n_step=3,
    v_min=-100.0,
    checkpoint_interval=100,
)


def run_with_checkpoint_copy(monkeypatch, args, step, copy_to):
    real_save = d4pg.Run.save

    def save_and_copy(run, global_step):
        real_save(run, global_step)
        if global_step == step:
            shutil.copy(run.checkpoint, copy_to)

    monkeypatch.setattr(d4pg.Run, "save", save_and_copy)
    d4pg.train(args)
    monkeypatch.setattr(d4pg.Run, "save", real_save)


def after(run, step):
    tags = (
        "losses/critic_loss",
        "losses/actor_loss",
        "losses/q_values",
        "charts/num_updates",
        "charts/episodic_return",
        "eval/episodic_return",
    )
    return {tag: [(s, v) for s, v in scalars(run, tag) if s > step] for tag in tags}


@pytest.mark.slow
@pytest.mark.parametrize("prioritized", [False, True])
def test_resume_equals_uninterrupted_run(tmp_path, monkeypatch, restore_signals, prioritized):
    """Checkpointed at step 100 (an episode boundary of both envs) and resumed, a run ends with the
    same networks, optimizer moments, targets, replay, priorities, windows and generator states, and
    logs the same metrics after step 100, as the run that never stopped."""
    whole, resumed, mid = tmp_path / "whole", tmp_path / "resumed", tmp_path / "step100.pt"
    run_with_checkpoint_copy(
        monkeypatch, d4pg.Args(run_dir=str(whole), prioritized=prioritized, **LINE), 100, mid
    )
    assert load(mid)["num_updates"] > 0 and load(mid)["windows"]["count"].tolist() == [0, 0]
    d4pg.train(d4pg.Args(run_dir=str(resumed), resume=str(mid), prioritized=prioritized, **LINE))
    a, b = load(whole / "checkpoints" / "latest.pt"), load(resumed / "checkpoints" / "latest.pt")
    for key in ("actor", "critic", "actor_target", "critic_target", "buffer", "windows"):
        for name in a[key]:
            torch.testing.assert_close(
                b[key][name], a[key][name], rtol=0, atol=0, msg=f"{key}.{name}"
            )
    if prioritized:
        assert a["buffer"]["priorities"].std() > 0
    for key in ("actor_optim", "critic_optim"):
        for i, moments in a[key]["state"].items():
            for name, value in moments.items():
                torch.testing.assert_close(b[key]["state"][i][name], value, rtol=0, atol=0)
    assert (a["num_updates"], a["updates_due"], a["rng"]["numpy"]) == (
        b["num_updates"],
        b["updates_due"],
        b["rng"]["numpy"],
    )
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    logged = after(whole, 100)
    assert (
        logged["losses/critic_loss"]
        and logged["charts/episodic_return"]
        and logged["eval/episodic_return"]
    )
    assert after(resumed, 100) == logged


@pytest.mark.slow
def test_resume_equivalence_detects_an_unrestored_generator(tmp_path, monkeypatch, restore_signals):
    """Control: the same resume with the numpy generator left at its fresh seed ends elsewhere."""
    whole, resumed, mid = tmp_path / "whole", tmp_path / "resumed", tmp_path / "step100.pt"
    run_with_checkpoint_copy(monkeypatch, d4pg.Args(run_dir=str(whole), **LINE), 100, mid)
    real_set = d4pg.Run.set_rng_state
    monkeypatch.setattr(
        d4pg.Run,
        "set_rng_state",
        staticmethod(lambda state, **gens: real_set(state, torch=gens["torch"])),
    )
    d4pg.train(d4pg.Args(run_dir=str(resumed), resume=str(mid), **LINE))
    a, b = load(whole / "checkpoints" / "latest.pt"), load(resumed / "checkpoints" / "latest.pt")
    assert not torch.equal(a["actor"]["head.weight"], b["actor"]["head.weight"])
    assert after(resumed, 100)["losses/critic_loss"] != after(whole, 100)["losses/critic_loss"]


@pytest.mark.slow
def test_same_seed_same_run_other_seed_other_run(tmp_path, restore_signals):
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        d4pg.train(
            d4pg.Args(
                seed=seed,
                total_steps=400,
                prioritized=True,
                num_envs=2,
                run_dir=str(tmp_path / name),
                **SMALL,
            )
        )
        ckpt = load(tmp_path / name / "checkpoints" / "latest.pt")
        runs[name] = (
            scalars(tmp_path / name, "losses/critic_loss"),
            summary(tmp_path / name)["eval_returns"],
            ckpt["buffer"]["priorities"],
            ckpt["actor"]["head.weight"],
        )
    (loss_a, eval_a, prio_a, w_a), (loss_b, eval_b, prio_b, w_b), (loss_c, eval_c, prio_c, w_c) = (
        runs.values()
    )
    assert (
        loss_a
        and loss_a == loss_b
        and eval_a == eval_b
        and torch.equal(prio_a, prio_b)
        and torch.equal(w_a, w_b)
    )
    assert (
        len(prio_a) == 400 and prio_a.std() > 0
    )  # both envs' second episode ends at step 400: nothing pending
    # the seed matters, so the equalities above mean something
    assert (
        loss_a != loss_c
        and eval_a != eval_c
        and not torch.equal(prio_a, prio_c)
        and not torch.equal(w_a, w_c)
    )


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ALGOS / "d4pg.py"),
            *TINY,
            "--total-steps",
            "1000000",
            "--checkpoint-interval",
            "100",
            "--run-dir",
            str(run),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.time() + 120
    while (
        not (run / "checkpoints" / "latest.pt").exists()
        and time.time() < deadline
        and proc.poll() is None
    ):
        time.sleep(0.2)  # the loop is running once the first periodic checkpoint exists
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    latest = run / "checkpoints" / "latest.pt"
    assert f"interrupted: continue with --resume {latest}" in out
    assert not (run / "summary.json").exists()
    assert 100 <= load(latest)["global_step"] < 1_000_000


# ---------------------------------------------------------------- in process: outputs, signals, W&B
@pytest.mark.slow
def test_in_process_run_sps_wandb_and_eval_only(tmp_path, fake_wandb, restore_signals):
    run = tmp_path / "run"
    d4pg.train(d4pg.Args(seed=3, total_steps=300, track=True, run_dir=str(run), **SMALL))
    s = summary(run)
    assert s["sps"] > 0 and s["global_step"] == 300
    assert [step for step, _ in scalars(run, "losses/q_values")] == [200, 300]
    assert fake_wandb.calls == [
        ("init", []),
        ("finish", 0),
    ]  # init before the SummaryWriter, finish 0 on success
    check_eval_only_after_move(
        run,
        lambda ckpt: d4pg.train(d4pg.Args(eval_only=True, checkpoint=ckpt, eval_episodes=1)),
        seed=3,
    )


def test_signal_skips_due_evaluation_and_saves_at_once(
    tmp_path, fake_wandb, restore_signals, monkeypatch
):
    """A SIGTERM during the env step that reaches step 100, where an evaluation is due: no evaluation
    (periodic or final), no summary, the checkpoint holds step 100, a second Ctrl-C would kill at
    once, and the W&B run is finished with exit code 0."""
    real_eval, evals = d4pg.evaluate, []
    final_then_signal, steps = sigterm_on_call(
        100, d4pg.final_observations
    )  # called once per vector step
    monkeypatch.setattr(d4pg, "final_observations", final_then_signal)
    monkeypatch.setattr(d4pg, "evaluate", lambda *a, **k: evals.append(1) or real_eval(*a, **k))
    run = tmp_path / "run"
    d4pg.train(
        d4pg.Args(total_steps=1000, track=True, run_dir=str(run), **{**SMALL, "eval_interval": 100})
    )
    assert len(steps) == 100 and evals == [] and not (run / "summary.json").exists()
    assert load(run / "checkpoints" / "latest.pt")["global_step"] == 100
    assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    assert fake_wandb.calls[-1] == ("finish", 0)


def test_nonfinite_loss_stops_and_keeps_last_checkpoint(
    tmp_path, fake_wandb, restore_signals, monkeypatch
):
    """A NaN target from the first update (step 150) stops training there in one line; the checkpoint
    of step 100 stays as it was, no summary.json is written, and W&B is told the run failed."""
    real_projection = d4pg.categorical_projection
    monkeypatch.setattr(
        d4pg, "categorical_projection", lambda *a: real_projection(*a) * float("nan")
    )
    run = tmp_path / "run"
    message = error_of(
        total_steps=300,
        track=True,
        run_dir=str(run),
        **{**SMALL, "learning_starts": 150, "checkpoint_interval": 100},
    )
    assert "non-finite loss at step 150" in message
    assert load(run / "checkpoints" / "latest.pt")["global_step"] == 100
    assert not (run / "summary.json").exists()
    assert fake_wandb.calls == [("init", []), ("finish", 1)]
