"""Tests of algos/ppg.py: GAE with truncation and autoreset, the rollout on a counting environment
(valid mask, truncation bootstrap), the auxiliary phase's losses and gradients per architecture,
resume equivalence (weights, optimizers, metrics, learning-rate horizon), determinism with a
different-seed control, and the end-to-end contract (tiny runs, copy-alone, signals, W&B exit
codes, bad input)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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

spec = importlib.util.spec_from_file_location("ppg", ALGOS / "ppg.py")
ppg = importlib.util.module_from_spec(spec)
sys.modules["ppg"] = ppg  # dataclasses look the module up while the file executes
spec.loader.exec_module(ppg)

TINY_ARGS = dict(
    num_envs=4,
    num_steps=16,
    num_minibatches=2,
    n_pi=3,
    e_pi=2,
    e_v=2,
    e_aux=2,
    aux_num_minibatches=4,
    eval_episodes=2,
    hidden_dim=16,
)
TINY = [f"--{k.replace('_', '-')}={v}" for k, v in TINY_ARGS.items()]  # for the command line
LOSS_TAGS = [
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/explained_variance",
    "losses/aux/kl",
    "losses/aux/aux_value",
    "losses/aux/value",
    "charts/learning_rate",
    "charts/episodic_return",
]


def run(run_dir, **kwargs):
    """train() in this process (the command line's code path without a torch import per run)."""
    ppg.train(ppg.Args(**{**TINY_ARGS, "run_dir": str(run_dir), "device": "cpu", **kwargs}))


def load(run_dir):
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)


def same_tags(dir_a, dir_b, tags=LOSS_TAGS) -> bool:
    for tag in tags:
        assert scalars(dir_a, tag), f"no {tag}"
    return all(scalars(dir_a, tag) == scalars(dir_b, tag) for tag in tags)


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------- math
def test_gae_truncation_termination_and_autoreset_step():
    g, lam = 0.9, 0.8
    # t0 ordinary, t1 truncated, t2 the autoreset step (not a transition), t3 ordinary, t4 terminated.
    r = torch.tensor([1.0, 2.0, 0.0, 3.0, 4.0]).unsqueeze(1)
    # v[2] = V(real final obs of episode 1)
    v = torch.tensor([0.5, 0.7, 0.9, 1.1, 1.3]).unsqueeze(1)
    term = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0]).unsqueeze(1)
    done = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0]).unsqueeze(1)
    A = ppg.gae(r, v, torch.tensor([5.0]), term, done, g, lam)[:, 0]
    a4 = 4.0 - 1.3  # termination: no bootstrap
    a3 = 3.0 + g * 1.3 - 1.1 + g * lam * a4
    a1 = 2.0 + g * 0.9 - 0.7  # truncation: bootstrap V(final obs), trace cut
    a0 = 1.0 + g * 0.7 - 0.5 + g * lam * a1
    for t, expected in [(0, a0), (1, a1), (3, a3), (4, a4)]:
        assert A[t].item() == pytest.approx(expected, abs=1e-6)


def test_gae_matches_per_env_loop():
    torch.manual_seed(0)
    T, N, g, lam = 7, 3, 0.97, 0.9
    r, v, nv = torch.randn(T, N), torch.randn(T, N), torch.randn(N)
    done = (torch.rand(T, N) < 0.3).float()
    term = done * (torch.rand(T, N) < 0.5).float()
    A = ppg.gae(r, v, nv, term, done, g, lam)
    for n in range(N):
        for t in range(T):  # forward sum of discounted TD errors until the episode ends
            total, coef, k = 0.0, 1.0, t
            while k < T:
                v_next = nv[n] if k == T - 1 else v[k + 1, n]
                total += coef * (r[k, n] + g * v_next * (1 - term[k, n]) - v[k, n])
                if done[k, n]:
                    break
                coef *= g * lam
                k += 1
            assert A[t, n].item() == pytest.approx(float(total), abs=1e-5)


def test_reward_scale_statistics_match_numpy():
    rewards = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 5.0]])
    dones = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    ret, carry = ppg.discounted_returns(rewards, dones, torch.tensor([10.0, 0.0]), 0.5)
    # env 0: 1 + 0.5*10 = 6, 3 + 0.5*6 = 6 (done), 0; env 1: 2 (done), 0, 5
    assert ret.tolist() == [[6.0, 2.0], [6.0, 0.0], [0.0, 5.0]] and carry.tolist() == [0.0, 5.0]
    # the moments of the samples with weight 1 (the valid ones) alone, across calls
    xs = [torch.randn(50) * 3 + 1, torch.randn(20) - 2, torch.randn(7) * 10]
    ws = [(torch.rand(len(x)) < 0.7).float() for x in xs]
    moments = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    for x, w in zip(xs, ws):
        moments = ppg.update_moments(moments, x, w)
    allx = torch.cat(xs)[torch.cat(ws).bool()].double()
    assert moments[0].item() == len(allx) < 77
    assert moments[1].item() == pytest.approx(allx.mean().item(), rel=1e-6)
    assert moments[2].item() == pytest.approx(allx.var(unbiased=False).item(), rel=1e-6)


def make_agent(arch, seed=0):
    torch.manual_seed(seed)
    return ppg.Agent(4, 3, 16, arch)


def test_gradient_clipping_keeps_policy_and_value_apart():
    agent = make_agent("dual")
    for name, p in agent.named_parameters():  # value side gets a huge gradient
        p.grad = torch.full_like(p, 1000.0 if name.startswith("v_") else 1e-3)
    policy_before = {
        n: p.grad.clone() for n, p in agent.named_parameters() if not n.startswith("v_")
    }
    ppg.clip_grads(agent, 0.5)
    for n, g in policy_before.items():  # small policy gradient untouched
        assert torch.equal(dict(agent.named_parameters())[n].grad, g)
    value_norm = torch.stack(
        [p.grad.norm() for n, p in agent.named_parameters() if n.startswith("v_")]
    ).norm()
    assert value_norm.item() == pytest.approx(0.5, rel=1e-4)


def test_kl_distillation_is_zero_when_policy_matches_pi_old():
    agent = make_agent("dual")
    obs = torch.randn(64, 4)
    logits_old = agent.logits(obs).detach()
    logits, value, aux = agent(obs)
    losses = ppg.aux_losses(logits, value, aux, logits_old, torch.zeros(64), torch.ones(64))
    kl = losses["kl"]
    assert abs(kl.item()) < 1e-6
    kl.backward()
    for name, p in agent.named_parameters():
        assert p.grad is None or p.grad.abs().max().item() < 1e-6, name
    # A gradient step on this loss leaves the policy where it is (float rounding aside; Adam
    # would rescale rounding noise, so plain SGD shows it) ...
    before = agent.logits(obs).detach()
    torch.optim.SGD(agent.parameters(), lr=1.0).step()
    assert torch.allclose(agent.logits(obs), before, atol=1e-6)
    # ... while a different pi_old gives a non-zero gradient (the check can fail).
    agent.zero_grad()
    logits, value, aux = agent(obs)
    ppg.aux_losses(
        logits,
        value,
        aux,
        logits_old + torch.randn_like(logits_old),
        torch.zeros(64),
        torch.ones(64),
    )["kl"].backward()
    assert agent.pi_head.weight.grad.abs().max().item() > 1e-4


def test_ppo_losses_match_torch_distributions():
    """ppo_losses writes Categorical's log-probability and entropy out (its argument checks wait
    for a GPU): the same numbers as torch.distributions, masked means over the valid samples."""
    torch.manual_seed(0)
    logits, value, v_targ = torch.randn(12, 3), torch.randn(12), torch.randn(12)
    actions, logprob_old, adv = torch.randint(0, 3, (12,)), -torch.rand(12) - 0.5, torch.randn(12)
    valid = torch.ones(12)
    valid[[2, 7]] = 0.0
    losses = ppg.ppo_losses(
        logits,
        value,
        actions=actions,
        logprob_old=logprob_old,
        advantages=adv,
        v_targ=v_targ,
        valid=valid,
        clip_coef=0.2,
    )
    assert list(losses) == ["policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac"]
    pg = losses["policy_loss"]
    v_loss = losses["value_loss"]
    entropy = losses["entropy"]
    approx_kl = losses["approx_kl"]
    clipfrac = losses["clipfrac"]
    dist, m = torch.distributions.Categorical(logits=logits), valid.bool()
    ratio = (dist.log_prob(actions) - logprob_old).exp()
    ref_pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)[m].mean()
    torch.testing.assert_close(pg, ref_pg)
    torch.testing.assert_close(entropy, dist.entropy()[m].mean())
    torch.testing.assert_close(v_loss, 0.5 * ((value - v_targ)[m] ** 2).mean())
    torch.testing.assert_close(approx_kl, ((ratio - 1) - ratio.log())[m].mean())
    torch.testing.assert_close(clipfrac, ((ratio - 1).abs() > 0.2)[m].float().mean())


def test_categorical_kl_matches_torch():
    a, b = torch.randn(10, 5), torch.randn(10, 5)
    ref = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=a), torch.distributions.Categorical(logits=b)
    )
    assert torch.allclose(ppg.categorical_kl(a, b), ref, atol=1e-6)


@pytest.mark.parametrize("arch", ["dual", "detach", "shared"])
def test_auxiliary_phase_fits_value_targets_and_keeps_policy(arch):
    agent = make_agent(arch)
    obs = torch.randn(512, 4)
    v_targ = 3.0 * obs[:, 0] - 2.0 * obs[:, 1] ** 2 + 5.0
    valid = torch.ones(512)
    valid[::7] = 0.0  # autoreset steps carry no target
    logits_old = agent.logits(obs).detach()

    def errors():
        with torch.no_grad():
            _, value, aux = agent(obs)
            m = valid.bool()
            return ((aux - v_targ)[m] ** 2).mean().item(), ((value - v_targ)[m] ** 2).mean().item()

    aux_before, v_before = errors()
    args = ppg.Args(e_aux=6, aux_num_minibatches=8, max_grad_norm=10.0)
    opt = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
    stored = ppg.AuxBuffer(
        obs=obs.view(2, 256, 4), vtarg=v_targ.view(2, 256), valid=valid.view(2, 256)
    )
    stats = ppg.auxiliary_phase(agent, opt, stored, args)
    aux_after, v_after = errors()
    assert aux_after < 0.5 * aux_before and v_after < 0.5 * v_before
    # the means of the phase's minibatch losses
    assert list(stats) == ["kl", "aux_value", "value"] and stats["kl"] < 0.05
    kl = ppg.categorical_kl(logits_old, agent.logits(obs).detach()).mean().item()
    assert kl < 0.05  # beta_clone keeps the policy close to pi_old


def grad_groups(agent, loss):
    """Names of the parameter groups that receive a non-zero gradient from `loss`."""
    agent.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    groups = set()
    for name, p in agent.named_parameters():
        if p.grad is not None and p.grad.abs().max().item() > 0:
            groups.add(name.split(".")[0])
    return groups


@pytest.mark.parametrize(
    "arch, value_groups",
    [
        ("dual", {"v_body", "v_head"}),  # separate value network
        ("detach", {"v_head"}),  # reference `detach`: the value gradient stops at the trunk
        ("shared", {"pi_body", "v_head"}),  # reference `shared`: the value loss trains the trunk
    ],
)
def test_each_loss_trains_only_its_parameters(arch, value_groups):
    agent = make_agent(arch)
    obs = torch.randn(32, 4)
    ones = torch.ones(32)
    logits, value, aux = agent(obs)
    ppo = ppg.ppo_losses(
        logits,
        value,
        actions=torch.randint(0, 3, (32,)),
        logprob_old=torch.full((32,), -1.1),
        advantages=torch.randn(32),
        v_targ=torch.randn(32),
        valid=ones,
        clip_coef=0.2,
    )
    aux_phase = ppg.aux_losses(logits, value, aux, torch.randn(32, 3), torch.randn(32), ones)
    policy = {"pi_body", "pi_head"}
    assert grad_groups(agent, ppo["policy_loss"]) == policy
    assert grad_groups(agent, ppo["entropy"]) == policy
    assert grad_groups(agent, ppo["value_loss"]) == value_groups
    assert grad_groups(agent, aux_phase["kl"]) == policy
    assert grad_groups(agent, aux_phase["aux_value"]) == {"pi_body", "aux_head"}
    assert grad_groups(agent, aux_phase["value"]) == value_groups


def test_policy_phase_trains_policy_for_e_pi_epochs_only():
    torch.manual_seed(1)
    n = 64
    batch = {
        "obs": torch.randn(n, 4),
        "actions": torch.randint(0, 3, (n,)),
        "logprobs": torch.full((n,), -1.1),
        "advantages": torch.randn(n),
        "returns": torch.randn(n),
        "valid": torch.ones(n),
    }
    results = []
    for e_v in (1, 3):
        agent = make_agent("dual")
        opt = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
        torch.manual_seed(2)
        ppg.policy_phase(agent, opt, batch, ppg.Args(e_pi=1, e_v=e_v, num_minibatches=2))
        results.append(agent.state_dict())
    for name in results[0]:
        same = torch.equal(results[0][name], results[1][name])
        assert same == (not name.startswith("v_")), name


# ------------------------------------------------------- rollout on a counting environment
class CounterEnv(gym.Env):
    """obs = [t, L]: t counts the episode's steps, reward t at step t; the episode terminates at
    t = L, L drawn in {2, ..., 5} at reset. Registered with a 4-step time limit, so L = 5 is
    truncated at t = 4 (and L = 4 ends terminated and truncated at once: terminated wins)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.L = 0, int(self.np_random.integers(2, 6))
        return np.array([0, self.L], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, self.L], np.float32), float(self.t), self.t == self.L, False, {}


gym.register("PpgCounter-v0", entry_point=CounterEnv, max_episode_steps=4)


class CountingValue(torch.nn.Module):
    """Stands in for the Agent: uniform policy, V([t, L]) = 100 t + L, so V of a final
    observation differs from V of the reset observation that follows it."""

    def forward(self, x):
        return torch.zeros(len(x), 2), 100 * x[:, 0] + x[:, 1], torch.zeros(len(x))


def cpu_run():
    """The harness's staging helpers (host_buffer, upload) for a CPU run, without a whole run."""
    run = ppg.Run.__new__(ppg.Run)
    run.device = torch.device("cpu")
    return run


def test_rollout_valid_mask_and_truncation_bootstrap_on_a_counting_env():
    T, N, gamma, lam = 9, 3, 0.9, 0.8
    envs = ppg.make_envs("PpgCounter-v0", N)
    torch.manual_seed(0)
    carry = ppg.reset_carry(envs, seed=3, device="cpu")
    agent, ends = CountingValue(), {"terminated": 0, "truncated": 0}
    for _ in range(3):  # episodes cross rollout boundaries: carry holds the running episode
        storage = ppg.rollout_storage(T, N, obs_dim=2, run=cpu_run())
        episodes = ppg.rollout(envs, agent, storage, carry, cpu_run())
        # obs[t + 1]: what step t returned
        obs = torch.cat([storage["obs"], carry.next_obs.unsqueeze(0)])
        t_now, L = obs[:-1, :, 0], obs[:-1, :, 1]
        # The autoreset step is the one taken from an episode's final observation (t = L or t = 4).
        final = (t_now == L) | (t_now == 4)
        assert torch.equal(storage["valid"], (~final).float())
        assert torch.all(storage["rewards"][final] == 0) and torch.all(storage["dones"][final] == 0)
        A = ppg.gae(
            storage["rewards"],
            storage["values"],
            agent(carry.next_obs)[1],
            storage["terminated"],
            storage["dones"],
            gamma,
            lam,
        )
        for t in range(T):
            for i in range(N):
                if not storage["dones"][t, i]:
                    continue
                # s_next: the real final observation, not a reset one
                s, s_next = obs[t, i], obs[t + 1, i]
                assert (
                    s_next[0] == s[0] + 1
                    and s_next[1] == s[1]
                    and storage["rewards"][t, i] == s_next[0]
                )
                if storage["terminated"][t, i]:
                    assert s_next[0] == s_next[1]
                    assert A[t, i].item() == pytest.approx(
                        float(s_next[0] - (100 * s[0] + s[1])), rel=1e-6
                    )
                    ends["terminated"] += 1
                else:
                    assert s_next[0] == 4 and s_next[1] == 5
                    bootstrap = gamma * (100 * s_next[0] + s_next[1])
                    assert A[t, i].item() == pytest.approx(
                        float(s_next[0] + bootstrap - (100 * s[0] + s[1])), rel=1e-6
                    )
                    ends["truncated"] += 1
        for _, ret, length in episodes:  # an episode of n steps returns 1 + ... + n
            assert ret == length * (length + 1) / 2 and 2 <= length <= 4
        batch = ppg.make_batch(
            storage, agent, carry.next_obs, None, ppg.Args(gamma=gamma, gae_lambda=lam)
        )
        w = batch["valid"].bool()
        assert torch.equal(
            batch["returns"], (A + storage["values"]).flatten()
        )  # V_targ = A_hat + V
        assert batch["advantages"][w].mean().abs() < 1e-5  # normalised over the valid samples only
        assert batch["advantages"][w].std(unbiased=False).item() == pytest.approx(1.0, rel=1e-3)
    envs.close()
    assert ends["terminated"] >= 3 and ends["truncated"] >= 2


# ------------------------------------------------------------ end to end
@pytest.mark.slow
def test_tiny_run_outputs_checkpoint_and_eval_only(tmp_run):
    check_ok(
        run_script(
            "ppg.py",
            "--total-steps",
            "640",
            "--eval-interval",
            "320",
            "--run-dir",
            str(tmp_run),
            *TINY,
        )
    )
    s = summary(tmp_run)
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
        "aux_phase_time_fraction",
    ):
        assert key in s, key
    assert s["sps"] > 0
    assert (s["script"], s["global_step"], s["eval_episodes"], s["arch"]) == (
        "ppg.py",
        640,
        2,
        "dual",
    )
    assert s["aux_phases"] == 3  # 10 iterations, N_pi 3
    assert json.loads((tmp_run / "config.json").read_text())["n_pi"] == 3
    for tag in (
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/SPS",
        "charts/learning_rate",
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "charts/aux_phase_time_fraction",
    ):
        assert scalars(tmp_run, tag), tag
    assert [step for step, _ in scalars(tmp_run, "losses/aux/kl")] == [192, 384, 576]
    assert [step for step, _ in scalars(tmp_run, "eval/episodic_return")] == [320, 640]
    ckpt = load(tmp_run)
    assert ckpt["algo"] == "ppg" and ckpt["global_step"] == 640 and ckpt["phase_iteration"] == 1
    assert ckpt["aux_obs"].shape == (1, 64, 4) and ckpt["schedule_steps"] == 640
    # The default Adam eps is 1e-5, a documented deviation from the reference's 1e-8 (deviation g).
    assert (
        ckpt["optimizer"]["param_groups"][0]["eps"]
        == ckpt["aux_optimizer"]["param_groups"][0]["eps"]
        == 1e-5
    )
    assert set(ckpt["rng"]) == {"torch"}  # the only generator drawn from (CUDA's joins it on a GPU)

    # --seed and --env-id are the checkpoint's, so this repeats the run's own final evaluation.
    proc = run_script(
        "ppg.py",
        "--eval-only",
        "--checkpoint",
        str(tmp_run / "checkpoints" / "latest.pt"),
        "--eval-episodes",
        "1",
        "--capture-video",
        "--seed",
        "7",
        "--env-id",
        "Acrobot-v1",
    )
    check_ok(proc)
    result = json.loads((tmp_run / "eval.json").read_text())
    assert (
        result["eval_episodes"] == 1
        and result["global_step"] == 640
        and result["env_id"] == "CartPole-v1"
    )
    assert result["eval_returns"] == s["eval_returns"][:1]
    assert list((tmp_run / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_copy_alone_detach_arch(tmp_path):
    script = copy_alone("ppg.py", tmp_path / "alone")
    check_ok(
        run_script(
            script,
            "--total-steps",
            "128",
            "--arch",
            "detach",
            "--eval-interval",
            "0",
            *TINY,
            cwd=tmp_path / "alone",
        )
    )
    (run_dir,) = (tmp_path / "alone" / "runs").iterdir()
    assert run_dir.name.startswith("CartPole-v1__ppg__1__")
    assert summary(run_dir)["global_step"] == 128 and summary(run_dir)["arch"] == "detach"


@pytest.mark.slow
def test_resume_mid_phase_matches_uninterrupted_run(tmp_path, restore_signals):
    """Stopped at step 448 (mid-phase: 7 iterations, N_pi 3), moved, resumed to 1024: the same
    weights, optimizer states, reward statistics, metrics and learning rates as one run to 1024.
    The first part runs with --schedule-steps 1024, the resume without it: the schedule's horizon
    comes from the checkpoint."""
    common = dict(norm_reward=True, eval_interval=0, checkpoint_interval=0)
    full, first, part = tmp_path / "full", tmp_path / "first", tmp_path / "part"
    run(full, total_steps=1024, **common)
    run(first, total_steps=448, schedule_steps=1024, **common)
    ckpt = load(first)
    assert ckpt["phase_iteration"] == 1 and ckpt["aux_phases"] == 2
    shutil.move(first, part)  # the output follows the checkpoint's folder, not a stored path
    ppg.train(
        ppg.Args(
            **{**TINY_ARGS, **common},
            total_steps=1024,
            device="cpu",
            resume=str(part / "checkpoints" / "latest.pt"),
        )
    )
    assert summary(part)["global_step"] == 1024 and not first.exists()
    assert [s for s, _ in scalars(part, "losses/aux/kl")] == [192, 384, 576, 768, 960]
    assert_same_run(full, part, "reward_ret")


def assert_same_run(full: Path, part: Path, also: str) -> None:
    """An interrupted and resumed run ends as the uninterrupted one: the same tags, weights,
    optimizer states, reward statistics, the checkpoint entry `also`, and evaluation."""
    assert same_tags(full, part)
    a, b = load(full), load(part)
    assert same_tensors(a["agent"], b["agent"])
    for opt in ("optimizer", "aux_optimizer"):
        for key, state in a[opt]["state"].items():
            assert same_tensors(state, b[opt]["state"][key]), opt
    assert torch.equal(a["reward_moments"], b["reward_moments"])
    assert torch.equal(a[also], b[also])
    assert summary(part)["eval_returns"] == summary(full)["eval_returns"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "signal_at, step, phase_iteration, aux_phases",
    [
        (5, 320, 2, 1),  # the phase's 2nd iteration: the loop leaves the policy phase early
        (6, 384, 0, 2),  # its last (N_pi = 3): the auxiliary phase still runs before the stop
    ],
)
def test_signal_mid_phase_then_resume_matches_uninterrupted_run(
    tmp_path, restore_signals, monkeypatch, signal_at, step, phase_iteration, aux_phases
):
    """SIGTERM during a policy iteration stops the nested loop after that iteration (and after the
    auxiliary phase if the iteration filled B); the checkpoint resumes the phase where it stopped,
    to the same weights, optimizer states, reward statistics, metrics and evaluation as one run."""
    common = dict(norm_reward=True, eval_interval=0, checkpoint_interval=0, total_steps=1024)
    full, part = tmp_path / "full", tmp_path / "part"
    run(full, **common)
    phase_then_sigterm, calls = sigterm_on_call(signal_at, ppg.policy_phase)
    monkeypatch.setattr(ppg, "policy_phase", phase_then_sigterm)
    run(part, **common)
    monkeypatch.undo()
    ckpt = load(part)
    assert len(calls) == signal_at and not (part / "summary.json").exists()
    assert (ckpt["global_step"], ckpt["phase_iteration"], ckpt["aux_phases"]) == (
        step,
        phase_iteration,
        aux_phases,
    )
    assert ckpt["aux_obs"].shape[0] == phase_iteration  # the rollouts of B so far
    run(part, resume=str(part / "checkpoints" / "latest.pt"), **common)
    assert [s for s, _ in scalars(part, "losses/aux/kl")] == [192, 384, 576, 768, 960]
    assert_same_run(full, part, "aux_obs")


def test_resume_reads_a_checkpoint_of_the_earlier_layout(tmp_path, restore_signals):
    """Checkpoints written before the GPU path hold the reward moments as a list of floats and
    float learning rates in unfused Adam groups: a resume reads them and trains as from the new
    layout (the same weights and statistics), with the run's fused optimizers and tensor rates."""
    common = dict(norm_reward=True, eval_interval=0, checkpoint_interval=0)
    new, old = tmp_path / "new", tmp_path / "old"
    run(new, total_steps=256, schedule_steps=512, **common)
    shutil.copytree(new, old)
    ckpt = load(old)
    ckpt["reward_moments"] = ckpt["reward_moments"].tolist()
    for name in ("optimizer", "aux_optimizer"):
        group = ckpt[name]["param_groups"][0]
        group |= {"lr": float(group["lr"]), "fused": None}
    torch.save(ckpt, old / "checkpoints" / "latest.pt")
    for run_dir in (new, old):
        run(run_dir, total_steps=512, resume=str(run_dir / "checkpoints" / "latest.pt"), **common)
    a, b = load(new), load(old)
    assert same_tensors(a["agent"], b["agent"])
    assert torch.equal(a["reward_moments"], b["reward_moments"])
    group = b["optimizer"]["param_groups"][0]
    assert group["fused"] and isinstance(group["lr"], torch.Tensor)


def test_resume_beyond_the_learning_rate_horizon(tmp_path, restore_signals):
    """A resume keeps the horizon at which the annealed rates reach 0: extending the run is refused
    unless --schedule-steps stretches the schedule (or --no-anneal-lr), never silently restarted."""
    run(tmp_path / "run", total_steps=128, eval_interval=0)
    ckpt = str(tmp_path / "run" / "checkpoints" / "latest.pt")
    message = refused(tmp_path, resume=ckpt, total_steps=256, **TINY_ARGS)
    assert (
        "--total-steps 256 runs past the learning-rate schedule, which reaches 0 at step 128"
        in message
    )
    assert "--schedule-steps 256" in message
    ppg.train(
        ppg.Args(
            **TINY_ARGS,
            total_steps=256,
            schedule_steps=256,
            eval_interval=0,
            device="cpu",
            resume=ckpt,
        )
    )
    lrs = scalars(tmp_path / "run", "charts/learning_rate")
    assert [s for s, _ in lrs] == [64, 128, 192, 256]
    assert [v for _, v in lrs] == pytest.approx([1e-3, 5e-4, 1e-3 * 2 / 4, 1e-3 * 1 / 4])


def test_same_seed_same_metrics_and_python_numpy_generators_unused(
    tmp_path, restore_signals, monkeypatch
):
    """Same seed: identical metrics and weights, even with python's and numpy's global generators
    reseeded after seeding (the file draws from neither); another seed differs (the control)."""
    run(tmp_path / "a", total_steps=256, eval_interval=0)
    real_seed = ppg.Run.seed_and_pick_device

    def seed_then_disturb(args):
        device = real_seed(args)
        random.seed(12345)
        np.random.seed(12345)
        return device

    monkeypatch.setattr(ppg.Run, "seed_and_pick_device", staticmethod(seed_then_disturb))
    run(tmp_path / "b", total_steps=256, eval_interval=0)
    monkeypatch.undo()
    run(tmp_path / "c", total_steps=256, eval_interval=0, seed=2)
    a, b, c = (tmp_path / n for n in "abc")
    assert same_tags(a, b) and same_tensors(load(a)["agent"], load(b)["agent"])
    assert summary(a)["eval_returns"] == summary(b)["eval_returns"]
    assert not same_tags(a, c) and not same_tensors(load(a)["agent"], load(c)["agent"])


@pytest.mark.slow
def test_sigterm_saves_checkpoint_and_exits_cleanly(tmp_run):
    cmd = [
        sys.executable,
        str(ALGOS / "ppg.py"),
        "--total-steps",
        "10000000",
        "--run-dir",
        str(tmp_run),
        "--checkpoint-interval",
        "0",
        "--eval-interval",
        "0",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.stdout.readline().startswith("step ")  # training has started
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "interrupted: continue with --resume" in out
    assert 0 < load(tmp_run)["global_step"] < 10_000_000
    assert not (tmp_run / "summary.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a GPU machine)")
def test_cuda_train_resume_on_cuda_and_evaluate_on_cpu(tmp_path):
    """The CUDA resume crash (a checkpoint loaded onto the GPU, then turned into numpy) stays fixed."""
    run_dir = tmp_path / "run"
    ckpt = str(run_dir / "checkpoints" / "latest.pt")
    check_ok(
        run_script(
            "ppg.py",
            "--device",
            "cuda",
            "--total-steps",
            "256",
            "--schedule-steps",
            "512",
            "--norm-reward",
            "--run-dir",
            str(run_dir),
            *TINY,
        )
    )
    assert load(run_dir)["phase_iteration"] == 1 and "cuda" in load(run_dir)["rng"]
    check_ok(
        run_script(
            "ppg.py",
            "--device",
            "cuda",
            "--total-steps",
            "512",
            "--norm-reward",
            "--resume",
            ckpt,
            *TINY,
        )
    )
    assert summary(run_dir)["global_step"] == 512
    check_ok(
        run_script(
            "ppg.py", "--eval-only", "--checkpoint", ckpt, "--device", "cpu", "--eval-episodes", "2"
        )
    )
    assert (
        json.loads((run_dir / "eval.json").read_text())["eval_returns"]
        == summary(run_dir)["eval_returns"]
    )


@pytest.mark.filterwarnings("ignore:.*meta parameter")  # the agent's weights are not the point here
def test_restore_moves_every_tensor_to_the_device(tmp_path, restore_signals):
    """The checkpoint is read on the CPU; restore() moves what it holds to the run's device. Checked
    with the meta device, which CPU-only machines have: any tensor left on the CPU shows."""
    run(tmp_path / "run", total_steps=256, eval_interval=0, norm_reward=True)
    ckpt = ppg.Run.load_checkpoint(str(tmp_path / "run" / "checkpoints" / "latest.pt"))
    meta = torch.device("meta")
    agent = ppg.Agent(4, 2, TINY_ARGS["hidden_dim"], "dual").to(meta)
    optimizers = [torch.optim.Adam(agent.parameters(), lr=1e-3) for _ in range(2)]
    learner = ppg.Learner(agent=agent, optimizer=optimizers[0], aux_optimizer=optimizers[1])
    envs = ppg.make_envs("CartPole-v1", TINY_ARGS["num_envs"])
    batch_size = TINY_ARGS["num_envs"] * TINY_ARGS["num_steps"]
    aux_buffer = ppg.AuxBuffer.empty(3, batch_size, 4, device=meta)
    carry = ppg.Carry(next_obs=None, autoreset=None, ep_return=None, ep_length=None)
    reward_stats = ppg.RewardStats(moments=None, ret=torch.zeros(4, device=meta))
    counters = ppg.Counters()
    ppg.restore(ckpt, learner, envs, carry, aux_buffer, reward_stats, counters)
    envs.close()
    assert carry.next_obs.device == reward_stats.ret.device == reward_stats.moments.device == meta
    assert aux_buffer.obs.device == meta
    assert all(
        state.device == meta
        for opt in optimizers
        for s in opt.state.values()
        for k, state in s.items()
        if k != "step"
    )
    assert counters.phase_iteration == 1 and isinstance(carry.autoreset, np.ndarray)


# ------------------------------------------- in process: signals, W&B exit codes, intervals
def test_wandb_finishes_with_0_on_success(tmp_path, fake_wandb, restore_signals):
    run(tmp_path / "run", total_steps=128, eval_interval=0, track=True, adam_eps=1e-8)
    assert fake_wandb.calls == [("init", []), ("finish", 0)]  # init before the SummaryWriter exists
    ckpt = load(tmp_path / "run")
    assert (
        ckpt["optimizer"]["param_groups"][0]["eps"]
        == ckpt["aux_optimizer"]["param_groups"][0]["eps"]
        == 1e-8
    )
    check_eval_only_after_move(
        tmp_path / "run",
        lambda path: ppg.train(ppg.Args(eval_only=True, checkpoint=path, eval_episodes=2)),
        seed=1,
    )


def test_non_finite_loss_stops_keeps_checkpoint_and_finishes_wandb_with_1(
    tmp_path, fake_wandb, restore_signals, monkeypatch
):
    real_phase, calls = ppg.policy_phase, []

    def nan_on_third(*a):  # iterations 1 and 2 are fine; the checkpoint of step 128 is saved
        calls.append(1)
        losses = real_phase(*a)
        if len(calls) == 3:
            return {name: value * math.nan for name, value in losses.items()}
        return losses

    monkeypatch.setattr(ppg, "policy_phase", nan_on_third)
    with pytest.raises(SystemExit, match="non-finite loss at step 192") as e:
        run(tmp_path / "run", total_steps=640, eval_interval=0, checkpoint_interval=128, track=True)
    assert "\n" not in str(e.value.code)
    assert fake_wandb.calls == [("init", []), ("finish", 1)]
    assert (
        load(tmp_path / "run")["global_step"] == 128
        and not (tmp_path / "run" / "summary.json").exists()
    )


def test_signal_skips_evaluations_saves_and_second_signal_kills(
    tmp_path, fake_wandb, restore_signals, monkeypatch
):
    real_eval, evals = ppg.evaluate, []
    monkeypatch.setattr(ppg, "evaluate", lambda *a, **k: evals.append(1) or real_eval(*a, **k))
    # SIGTERM during the first update, when an evaluation is due at step 64
    phase_then_sigterm, calls = sigterm_on_call(1, ppg.policy_phase)
    monkeypatch.setattr(ppg, "policy_phase", phase_then_sigterm)
    run(tmp_path / "run", total_steps=6400, eval_interval=64, track=True)
    assert len(calls) == 1 and evals == []
    assert (
        load(tmp_path / "run")["global_step"] == 64
        and not (tmp_path / "run" / "summary.json").exists()
    )
    assert (
        signal.getsignal(signal.SIGINT) == signal.SIG_DFL
        and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    )
    assert fake_wandb.calls[-1] == ("finish", 0)


def test_checkpoint_interval_saves_once_per_crossing_and_once_at_the_end(
    tmp_path, restore_signals, monkeypatch
):
    real_save, saved = ppg.Run.save, []

    def save(run, step):
        saved.append(step)
        real_save(run, step)

    monkeypatch.setattr(ppg.Run, "save", save)
    # 3 iterations of 64 steps
    run(tmp_path / "run", total_steps=192, eval_interval=0, checkpoint_interval=64)
    assert saved == [64, 128, 192]  # the last crossing is the final save, not a second one


def test_sps_counts_only_the_training_loop(tmp_path, restore_signals, monkeypatch):
    real_check_env, real_save = ppg.check_env, ppg.Run.save

    def slow(seconds, fn=lambda *a: [1.0]):
        return lambda *a, **kw: time.sleep(seconds) or fn(*a, **kw)

    # 1 s of startup, 0.5 s final checkpoint (the only one), 1 s final evaluation (--eval-interval 0)
    monkeypatch.setattr(ppg, "check_env", slow(1.0, real_check_env))
    monkeypatch.setattr(ppg.Run, "save", slow(0.5, real_save))
    monkeypatch.setattr(ppg, "evaluate", slow(1.0))
    start = time.time()
    run(tmp_path / "run", total_steps=128, eval_interval=0, checkpoint_interval=0)
    wall_time = time.time() - start
    s = summary(tmp_path / "run")
    loop_time = s["global_step"] / s["sps"]
    assert s["sps"] > 0 and wall_time >= 2.5 and loop_time <= wall_time - 2.5


# ------------------------------------------------------------- bad input
def refused(tmp_path, **kwargs) -> str:
    """The SystemExit message of train(Args(**kwargs)), in process (the command line's code path);
    nothing may be written."""
    run_dir = tmp_path / "refused"
    with pytest.raises(SystemExit) as exc:
        ppg.train(ppg.Args(**{"run_dir": str(run_dir), "device": "cpu", **kwargs}))
    assert not run_dir.exists()
    message = str(exc.value.code)
    assert message.startswith("ppg.py: error: ") and "\n" not in message
    return message


@pytest.mark.parametrize(
    "kwargs, fragments",
    [
        ({"env_id": "Pendulum-v1"}, ["continuous actions", "d4pg.py", "naf.py", "rlpd.py"]),
        ({"env_id": "CarRacing-v3"}, ["image observations", "ppo_atari.py"]),
        ({"env_id": "FrozenLake-v1"}, ["flat Box"]),
        ({"env_id": "ALE/Pong-v5"}, ["ppo_atari.py"]),
        ({"num_minibatches": 3}, ["--num-minibatches 3 does not divide", "256"]),
        ({"aux_num_minibatches": 3}, ["--aux-num-minibatches 3 does not divide"]),
        ({"total_steps": 100}, ["--total-steps 100 is below one rollout"]),
        ({"n_pi": 0}, ["--n-pi must be at least 1, got 0"]),
        ({"e_pi": 0}, ["--e-pi must be at least 1"]),
        ({"num_envs": 0}, ["--num-envs must be at least 1"]),
        ({"num_steps": 0}, ["--num-steps must be at least 1"]),
        # refused in one line (the divisibility rows would divide by zero)
        ({"num_minibatches": 0}, ["--num-minibatches must be at least 1"]),
        ({"aux_num_minibatches": 0}, ["--aux-num-minibatches must be at least 1"]),
        ({"hidden_dim": 0}, ["--hidden-dim must be at least 1"]),
        ({"e_aux": -1}, ["--e-aux", "must not be negative"]),
        ({"e_v": -1}, ["--e-v", "must not be negative"]),
        ({"schedule_steps": 0}, ["--schedule-steps", "must be positive"]),
        # The value function would never be trained; tiny sizes so that code which accepted it
        # fails this test quickly instead of training 50k steps.
        (
            {
                "e_v": 0,
                "e_aux": 0,
                "total_steps": 256,
                **{k: v for k, v in TINY_ARGS.items() if k not in ("e_v", "e_aux")},
            },
            ["--e-v 0 with --e-aux 0 never trains the value function"],
        ),
        ({"learning_rate": 0.0}, ["--learning-rate", "must be positive"]),
        ({"aux_learning_rate": -1.0}, ["--aux-learning-rate", "must be positive"]),
        ({"adam_eps": 0.0}, ["--adam-eps", "must be positive"]),
        (
            {"total_steps": 60_000, "schedule_steps": 50_000},
            ["--total-steps 60000 runs past the learning-rate schedule", "--schedule-steps 60000"],
        ),
        ({"eval_only": True}, ["--checkpoint"]),
        ({"resume": "/nonexistent/latest.pt"}, ["does not exist"]),
    ],
)
def test_bad_input(kwargs, fragments, tmp_path):
    message = refused(tmp_path, **kwargs)
    for fragment in fragments:
        assert fragment in message


@pytest.mark.slow
def test_bad_input_cli_is_one_line(tmp_path):
    check_error(
        run_script("ppg.py", "--env-id", "NoSuchEnv-v9", "--run-dir", str(tmp_path / "a")),
        "unknown environment",
        "NoSuchEnv-v9",
    )
    check_error(
        run_script("ppg.py", "--e-v", "0", "--e-aux", "0", "--run-dir", str(tmp_path / "b")),
        "never trains the value function",
    )
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    check_error(
        run_script("ppg.py", "--resume", str(corrupt), "--run-dir", str(tmp_path / "c")), "corrupt"
    )
    assert not any((tmp_path / d).exists() for d in "abc")


def test_incompatible_checkpoints_are_refused(tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"algo": "dqn_atari", "env_id": "CartPole-v1", "args": {}, "global_step": 0}, other)
    assert "dqn_atari.py" in refused(tmp_path, eval_only=True, checkpoint=str(other))
    mine = tmp_path / "mine.pt"
    torch.save(
        {
            "algo": "ppg",
            "harness": 1,
            "env_id": "CartPole-v1",
            "args": ppg.asdict(ppg.Args()),
            "global_step": 4096,
            "schedule_steps": 50_000,
        },
        mine,
    )
    for change, fragment in [
        ({"arch": "detach"}, "--arch dual"),
        ({"num_envs": 4}, "--num-envs 8"),
        ({"n_pi": 4}, "--n-pi 8"),
        ({"env_id": "Acrobot-v1"}, "--env-id CartPole-v1"),
        ({"e_aux": 0}, "--e-aux 6"),
        ({"total_steps": 4000}, "--total-steps is below the checkpoint's step; pass 4096"),
    ]:
        assert fragment in refused(tmp_path, resume=str(mine), **change)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error needs a machine without CUDA")
def test_cuda_requested_without_cuda(tmp_path):
    assert "CUDA" in refused(tmp_path, device="cuda")
