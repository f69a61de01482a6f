"""Tests of algos/appo.py: V-trace against the paper's sum written as a per-step loop (terminations,
truncations, clipped ratios), its on-policy reduction to bootstrapped returns, GAE, the clipped loss
by hand, update() against the plain minibatch loop, the rollout's NEXT_STEP handling and truncation
bootstrap on a counting env, the seqlock, resume equivalence and determinism in synchronous mode, the
actor processes (a tiny job with lag and dropped rollouts, actors ignoring SIGINT/SIGTERM, a killed actor,
an actor's error, SIGTERM to the learner; no process left behind in any case), the separate
policy-gradient truncation --pg-rho-bar, batches with one valid row or none, the learning-rate
horizon kept on resume, and bad input."""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial

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

try:
    import psutil
except ImportError:
    psutil = None
needs_psutil = pytest.mark.skipif(
    psutil is None, reason="the actor-process tests watch child processes with psutil"
)

spec = importlib.util.spec_from_file_location("appo", ALGOS / "appo.py")
appo = importlib.util.module_from_spec(spec)
sys.modules["appo"] = appo  # dataclasses look the module up while the file executes
spec.loader.exec_module(appo)

SMALL = dict(
    num_envs=4,
    num_steps=32,
    hidden_dim=16,
    eval_episodes=1,
    eval_interval=0,
    checkpoint_interval=0,
    device="cpu",
)
CLI_SMALL = ["--num-envs", "4", "--num-steps", "32", "--hidden-dim", "16", "--eval-episodes", "1"]


def random_rollout(T=9, N=6, seed=0, p_done=0.25):
    """Random rewards, values V(x_0..x_T), ratios on both sides of 1, and episode ends of both kinds (float64)."""
    g = torch.Generator().manual_seed(seed)
    dones = (torch.rand(T, N, generator=g) < p_done).double()
    terminated = (
        dones * (torch.rand(T, N, generator=g) < 0.5).double()
    )  # the others are truncations
    values = torch.randn(T + 1, N, generator=g, dtype=torch.float64)
    return dict(
        log_rho=torch.randn(T, N, generator=g, dtype=torch.float64),
        rewards=torch.randn(T, N, generator=g, dtype=torch.float64),
        values=values[:-1],
        next_values=values[1:],
        terminated=terminated,
        dones=dones,
    )


def vtrace_by_definition(d, gamma, lam, rho_bar, c_bar, pg_rho_bar):
    """The paper's n-step definition (Eq. 1), v_s = V(x_s) + sum_t gamma^(t-s) (prod_{i<t} c_i) delta_t up to the
    episode's end or the rollout's last step, and A_s = min(pg_rho_bar, ratio_s) (r_s + gamma v_{s+1} - V(x_s)),
    one number at a time."""
    T, N = d["rewards"].shape
    v_s, adv = np.zeros((T, N)), np.zeros((T, N))
    for i in range(N):
        ratio = [math.exp(d["log_rho"][t, i]) for t in range(T)]
        rho = [min(rho_bar, x) for x in ratio]
        c = [lam * min(c_bar, x) for x in ratio]
        V = [float(d["values"][t, i]) for t in range(T)]
        V_next = [0.0 if d["terminated"][t, i] else float(d["next_values"][t, i]) for t in range(T)]
        delta = [rho[t] * (float(d["rewards"][t, i]) + gamma * V_next[t] - V[t]) for t in range(T)]
        for s in range(T):
            total, weight, t = 0.0, 1.0, s
            while True:
                total += weight * delta[t]
                if d["dones"][t, i] or t == T - 1:
                    break
                weight *= gamma * c[t]
                t += 1
            v_s[s, i] = V[s] + total
        for s in range(T):
            v_next = V_next[s] if d["dones"][s, i] or s == T - 1 else v_s[s + 1, i]
            adv[s, i] = min(pg_rho_bar, ratio[s]) * (
                float(d["rewards"][s, i]) + gamma * v_next - V[s]
            )
    return v_s, adv


# ---------------------------------------------------------------- V-trace, GAE, loss
@pytest.mark.parametrize(
    "gamma, lam, rho_bar, c_bar, pg_rho_bar",
    [
        (0.99, 1.0, 1.0, 1.0, 1.0),
        (0.9, 0.8, 2.0, 0.5, 2.0),
        (0.97, 1.0, 1.5, 1.5, 1.5),
        (0.9, 0.8, 2.0, 0.5, 1.0),  # the references' separate policy-gradient threshold
    ],
)
def test_vtrace_matches_the_papers_sum(gamma, lam, rho_bar, c_bar, pg_rho_bar):
    for seed in range(3):
        d = random_rollout(seed=seed)
        assert (d["log_rho"].exp() > max(rho_bar, c_bar)).any() and (
            d["log_rho"] < 0
        ).any()  # clipping happens
        assert ((d["dones"] == 1) & (d["terminated"] == 0)).any() and d["terminated"].any()
        v_s, adv = appo.vtrace(
            d["log_rho"],
            d["rewards"],
            d["values"],
            d["next_values"],
            d["terminated"],
            d["dones"],
            gamma=gamma,
            lam=lam,
            rho_bar=rho_bar,
            c_bar=c_bar,
            pg_rho_bar=pg_rho_bar,
        )
        ref_v, ref_adv = vtrace_by_definition(d, gamma, lam, rho_bar, c_bar, pg_rho_bar)
        np.testing.assert_allclose(v_s.numpy(), ref_v, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-10, atol=1e-10)


def test_vtrace_on_policy_gives_bootstrapped_returns():
    """mu = pi, rho_bar = c_bar = lambda = 1: v_s is the discounted reward sum to the episode's end (plus
    gamma^k V of the real final observation after a truncation) or to the rollout's end (plus gamma^k V(x_T)),
    A_s = v_s - V(x_s), and v_s - V(x_s) is GAE with lambda = 1."""
    d, gamma = random_rollout(seed=4), 0.95
    T, N = d["rewards"].shape
    v_s, adv = appo.vtrace(
        torch.zeros(T, N, dtype=torch.float64),
        d["rewards"],
        d["values"],
        d["next_values"],
        d["terminated"],
        d["dones"],
        gamma=gamma,
    )
    for i in range(N):
        for s in range(T):
            ret, k = 0.0, 0
            for t in range(s, T):  # forward, reward by reward
                ret += gamma**k * float(d["rewards"][t, i])
                k += 1
                if d["dones"][t, i] or t == T - 1:
                    ret += (
                        0.0 if d["terminated"][t, i] else gamma**k * float(d["next_values"][t, i])
                    )
                    break
            assert v_s[s, i].item() == pytest.approx(ret, abs=1e-10)
    torch.testing.assert_close(adv, v_s - d["values"])
    gae = appo.gae(
        d["rewards"],
        d["values"],
        d["next_values"],
        d["terminated"],
        d["dones"],
        gamma=gamma,
        lam=1.0,
    )
    torch.testing.assert_close(v_s, gae + d["values"])


def test_gae_hand_computed():
    g, lam = 0.9, 0.8
    # t0 ordinary, t1 truncated, t2 the autoreset row, t3 ordinary (last row), one env.
    r, v = torch.tensor([[1.0], [2.0], [0.0], [3.0]]), torch.tensor([[0.5], [0.7], [0.9], [1.1]])
    next_v = torch.tensor(
        [[0.7], [0.9], [1.1], [5.0]]
    )  # next_v[1] = V(real final obs), next_v[3] = V(x_T)
    term, done = torch.zeros(4, 1), torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    A = appo.gae(r, v, next_v, term, done, gamma=g, lam=lam)[:, 0]
    a3 = 3.0 + g * 5.0 - 1.1
    a1 = 2.0 + g * 0.9 - 0.7  # the trace stops at the truncation, the bootstrap stays
    a0 = 1.0 + g * 0.7 - 0.5 + g * lam * a1
    for t, expected in [(0, a0), (1, a1), (3, a3)]:
        assert A[t].item() == pytest.approx(expected, abs=1e-6)
    term[1] = 1.0  # the same end as a termination: no bootstrap
    assert appo.gae(r, v, next_v, term, done, gamma=g, lam=lam)[1, 0].item() == pytest.approx(
        2.0 - 0.7, abs=1e-6
    )


def test_clipped_loss_hand_computed():
    """pi = (0.5, 0.5) everywhere. Samples: mu(a) = 0.25 (ratio 2, clipped to 1.2) with A = +1 and -1, and
    mu(a) = 1 (ratio 0.5, clipped to 0.8) with A = +1 and -1; a fifth of weight 0 (padding) changes nothing."""
    logits = torch.zeros(5, 2, requires_grad=True)
    actions = torch.tensor([0, 1, 0, 1, 0])
    logp_mu = torch.log(torch.tensor([0.25, 0.25, 1.0, 1.0, 0.01]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 100.0])
    value, v_s = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0]), torch.tensor([2.0, 2.0, 1.0, 4.0, 100.0])
    w = torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0])
    loss, stats = appo.appo_loss(
        logits, value, actions, logp_mu, adv, v_s, w, clip_coef=0.2, ent_coef=0.1, vf_coef=0.5
    )
    surrogate = [
        min(2 * 1, 1.2 * 1),
        min(2 * -1, 1.2 * -1),
        min(0.5 * 1, 0.8 * 1),
        min(0.5 * -1, 0.8 * -1),
    ]
    policy_loss = -sum(surrogate) / 4  # -(1.2 - 2 + 0.5 - 0.8) / 4
    value_loss = 0.5 * (1 + 0 + 4 + 0) / 4
    entropy = math.log(2)
    kl = ((2 - 1 - math.log(2)) * 2 + (0.5 - 1 - math.log(0.5)) * 2) / 4
    assert loss.item() == pytest.approx(policy_loss + 0.5 * value_loss - 0.1 * entropy, abs=1e-6)
    expected = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": kl,
        "clipfrac": 1.0,
    }
    assert list(stats) == list(expected)  # the order of the logged losses/* tags
    for name, value in expected.items():
        assert stats[name].item() == pytest.approx(value, abs=1e-6), name
        assert stats[name].dim() == 0 and not stats[name].requires_grad, name
    loss.backward()
    # Clipped terms pass no gradient (and the entropy's is 0 at the uniform policy): only samples 1 and 2 move pi.
    assert logits.grad[0].abs().max() < 1e-8 and logits.grad[3].abs().max() < 1e-8
    assert logits.grad[1].abs().min() > 1e-3 and logits.grad[2].abs().min() > 1e-3
    assert logits.grad[4].abs().max() == 0


def test_valid_rows_first_orders_each_epoch_with_the_valid_rows_first():
    """Each epoch's order is a permutation of all rows, the valid ones first; the orders differ
    between epochs and follow torch's generator."""
    valid = (torch.arange(40) % 3 != 0).float()
    n = int(valid.sum())
    torch.manual_seed(0)
    orders = appo.valid_rows_first(valid, 5)
    assert orders.shape == (5, 40)
    for order in orders:
        assert sorted(order.tolist()) == list(range(40))
        assert valid[order[:n]].all() and not valid[order[n:]].any()
    assert len({tuple(order.tolist()) for order in orders}) == 5
    torch.manual_seed(0)
    assert torch.equal(appo.valid_rows_first(valid, 5), orders)


@pytest.mark.parametrize("ent_coef", [0.0, 0.05])
def test_update_equals_the_plain_minibatch_loop(ent_coef):
    """update()'s layout (the valid rows first in a random order, minibatches of fixed size, the last
    padded with invalid rows of weight 0, every epoch gathered at once) and learn_step's cheaper ops
    (log_softmax, the entropy differentiated only when used, foreach clipping, fused Adam) train as the
    plain loop over the valid rows alone: the same order cut into minibatches of 32 rows and a last,
    smaller one, torch.distributions, nn.utils.clip_grad_norm_ per network, Adam's default loop."""
    from torch.distributions import Categorical

    torch.manual_seed(0)
    ours = appo.Agent(4, 3, 16)
    ref = appo.Agent(4, 3, 16)
    ref.load_state_dict(ours.state_dict())
    size, args = (
        128,
        appo.Args(update_epochs=3, num_minibatches=4, ent_coef=ent_coef, clip_coef=0.2),
    )
    valid = torch.rand(size) < 0.7
    n = int(valid.sum())
    assert 64 < n < 96 and n % 32  # two full minibatches of 32 valid rows, then a partial one
    batch = {
        "obs": torch.randn(size, 4),
        "actions": torch.randint(0, 3, (size,)),
        "logp_mu": -1 - torch.rand(size),
        "advantages": 5 * torch.randn(size),
        "v_s": 10 * torch.randn(size),
        "valid": valid.float(),
    }  # large: the clipping acts
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    torch.manual_seed(1)
    orders = (torch.rand(args.update_epochs, size) - batch["valid"]).argsort()
    for order in orders:
        rows = order[:n]
        assert valid[rows].all() and sorted(rows.tolist()) == valid.nonzero().flatten().tolist()
        for mb in rows.split(size // args.num_minibatches):
            logits, value = ref(batch["obs"][mb])
            dist = Categorical(logits=logits)
            ratio = (dist.log_prob(batch["actions"][mb]) - batch["logp_mu"][mb]).exp()
            adv = batch["advantages"][mb]
            policy_loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
            loss = (
                policy_loss
                + 0.5 * 0.5 * (value - batch["v_s"][mb]).pow(2).mean()
                - ent_coef * dist.entropy().mean()
            )
            ref_opt.zero_grad()
            loss.backward()
            assert (
                torch.nn.utils.clip_grad_norm_(ref.actor.parameters(), args.max_grad_norm)
                > args.max_grad_norm
            )
            torch.nn.utils.clip_grad_norm_(ref.critic.parameters(), args.max_grad_norm)
            ref_opt.step()
    torch.manual_seed(1)
    lr = torch.tensor(1e-2)
    opt = torch.optim.Adam(ours.parameters(), lr=lr, eps=1e-5, fused=True)
    appo.update(partial(appo.learn_step, ours, opt, args), batch, n, args)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=name)


def test_seqlock_round_trip_and_torn_read():
    a, b = appo.Agent(3, 2, 8), appo.Agent(3, 2, 8)
    weights = torch.zeros(sum(p.numel() for p in a.parameters()))
    seq = torch.tensor([0, 0])
    appo.publish_weights(weights, seq, a, 7)
    assert seq.tolist() == [2, 7]
    assert appo.read_weights(weights, seq, b) == 7
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    seq[0] += 1  # a write in progress: the reader must not take these weights
    assert appo.read_weights(weights, seq, b) is None


# ---------------------------------------------------------------- rollouts on a counting env
class CounterEnv(gym.Env):
    """obs = [t, T]: t counts steps, the episode terminates at t = T, T drawn in {2, 3, 4} at reset."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.T = 0, int(self.np_random.integers(2, 5))
        return np.array([0, self.T], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, self.T], np.float32), 1.0, self.t == self.T, False, {}


gym.register(
    "AppoCounter-v0", entry_point=CounterEnv, max_episode_steps=3
)  # T = 4 is truncated at t = 3


class CountingAgent:
    """Uniform policy and V(x) = 10 t + T, a value that tells observations apart."""

    def __call__(self, x):
        return torch.zeros(*x.shape[:-1], 2), 10 * x[..., 0] + x[..., 1]

    def actor(self, x):
        return torch.zeros(*x.shape[:-1], 2)

    def scale(self):  # V in the return's units already
        return torch.tensor(0.0), torch.tensor(1.0)


def test_merge_moments_equals_the_moments_of_all_rows_so_far():
    g = torch.Generator().manual_seed(0)
    moments, seen = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), []
    for n in (5, 1, 12):
        x = torch.randn(n, generator=g, dtype=torch.float64) * 7 + 3
        w = (torch.rand(n, generator=g) < 0.7).double()
        w[0] = 1.0  # at least one row
        moments = appo.merge_moments(moments, x, w)
        seen.append(x[w.bool()])
        everything = torch.cat(seen).numpy()
        expected = [len(everything), everything.mean(), everything.var()]
        np.testing.assert_allclose(moments.numpy(), expected, rtol=1e-12)


def test_norm_values_trains_the_critic_on_standardised_targets():
    """V-trace reads V in the return's units (mean + std * critic); the critic's targets are v_s
    standardised by the moments of every target so far, the new ones included."""
    torch.manual_seed(0)
    agent, T, N = appo.Agent(2, 2, 8), 5, 3
    agent.moments.copy_(torch.tensor([40.0, 20.0, 9.0], dtype=torch.float64))
    rollout = appo.new_rollout(T, N, 2)
    rollout["obs"].normal_()
    rollout["rewards"].uniform_(0, 10)
    rollout["valid"][:] = True
    rollout["valid"][2, 1] = False
    rollout["logprobs"][:] = math.log(0.5)
    with torch.no_grad():
        logits, out = agent(rollout["obs"])
    V = 20.0 + 3.0 * out
    log_pi = logits[:-1].log_softmax(-1).gather(-1, rollout["actions"].unsqueeze(-1)).squeeze(-1)
    steps = [rollout[k] for k in ("rewards",)] + [V[:-1], V[1:]]
    steps += [rollout["terminated"], rollout["dones"]]
    v_s, _ = appo.vtrace(log_pi - rollout["logprobs"], *steps, gamma=0.9, lam=0.95)
    batch, _ = appo.prepare_batch(agent, rollout, appo.Args(gamma=0.9, lam=0.95))
    valid = rollout["valid"]
    new = v_s[valid].double()
    count, mean = 40 + len(new), (40 * 20.0 + new.sum()) / (40 + len(new))
    var = (40 * (9.0 + 20.0**2) + (new**2).sum()) / count - mean**2
    np.testing.assert_allclose(agent.moments.numpy(), [count, mean, var], rtol=1e-6)
    expected = ((v_s.double() - mean) / (var + 1e-8).sqrt()).float()
    torch.testing.assert_close(batch["v_s"][valid.flatten()], expected[valid])


def test_rollout_masks_autoreset_rows_and_bootstraps_truncation():
    collector, T, N, gamma = appo.Collector("AppoCounter-v0", 3, seed=0), 30, 3, 0.5
    agent, rollout = CountingAgent(), appo.new_rollout(T, N, 2)
    collector.collect(agent.actor, rollout)
    obs, valid, dones, term = (
        rollout["obs"],
        rollout["valid"],
        rollout["dones"].bool(),
        rollout["terminated"].bool(),
    )
    t_now, t_next, horizon = obs[:-1, :, 0], obs[1:, :, 0], obs[:-1, :, 1]
    assert (
        valid == ~torch.cat([torch.zeros(1, N, dtype=torch.bool), dones[:-1]])
    ).all()  # after an end, one reset row
    assert (rollout["rewards"][~valid] == 0).all() and not dones[~valid].any()
    assert (
        t_next[valid] == t_now[valid] + 1
    ).all()  # x_{s+1} of a valid row is its real next state, final ones included
    assert (term == valid & (t_next == horizon)).all()
    truncated = dones & ~term
    assert truncated.any() and (t_next[truncated] == 3).all() and (horizon[truncated] == 4).all()
    assert torch.allclose(rollout["logprobs"], torch.full((T, N), math.log(0.5)))

    args = appo.Args(gamma=gamma, lam=1.0, norm_values=False)
    batch, ratio = appo.prepare_batch(agent, rollout, args)
    assert ratio.item() == pytest.approx(1.0)
    flat = valid.flatten()
    torch.testing.assert_close(batch["valid"], flat.float())
    V = 10 * obs[..., 0] + obs[..., 1]
    v_s, _ = appo.vtrace(
        torch.zeros(T, N),
        rollout["rewards"],
        V[:-1],
        V[1:],
        rollout["terminated"],
        rollout["dones"],
        gamma=gamma,
    )
    torch.testing.assert_close(batch["v_s"][flat], v_s[valid])
    torch.testing.assert_close(
        v_s[term], torch.ones(int(term.sum()))
    )  # termination: the reward alone
    torch.testing.assert_close(
        v_s[truncated], 1 + gamma * (10 * 3 + 4) * torch.ones(int(truncated.sum()))
    )  # V(real final obs)
    last = ~dones[-1] & valid[-1]  # the rollout's last row bootstraps from x_T
    torch.testing.assert_close(v_s[-1][last], 1 + gamma * V[-1][last])
    assert len(batch["obs"]) == T * N > int(valid.sum())
    torch.testing.assert_close(batch["obs"][flat], obs[:-1][valid])

    args = appo.Args(gamma=gamma, lam=0.7, vtrace=False, norm_values=False)
    batch, _ = appo.prepare_batch(agent, rollout, args)
    gae = appo.gae(
        rollout["rewards"],
        V[:-1],
        V[1:],
        rollout["terminated"],
        rollout["dones"],
        gamma=gamma,
        lam=0.7,
    )
    torch.testing.assert_close(batch["v_s"][flat], (gae + V[:-1])[valid])
    # the advantages normalised over the valid rows alone, as the valid rows picked out first
    torch.testing.assert_close(
        batch["advantages"][flat], (gae[valid] - gae[valid].mean()) / (gae[valid].std() + 1e-8)
    )


def test_finished_episodes_carry_over_rollouts():
    r = {
        "rewards": torch.tensor([[1.0], [2.0], [0.0], [4.0]]),
        "valid": torch.tensor([[True], [True], [False], [True]]),
        "dones": torch.tensor([[0.0], [1.0], [0.0], [0.0]]),
    }
    ret, length = (
        torch.tensor([10.0], dtype=torch.float64),
        torch.tensor([5]),
    )  # an episode in progress
    assert appo.finished_episodes(r, ret, length) == [(13.0, 7)]
    assert (ret.item(), length.item()) == (4.0, 1)


# ---------------------------------------------------------------- synchronous runs in this process
def run(run_dir, **kwargs):
    appo.train(appo.Args(**{**SMALL, "total_steps": 1024, "run_dir": str(run_dir), **kwargs}))


def load(run_dir):
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)


TAGS = [
    "charts/episodic_return",
    "losses/value_loss",
    "losses/approx_kl",
    "charts/importance_ratio",
]


@pytest.mark.slow
def test_resume_equals_uninterrupted_run_and_seeds_decide(tmp_path, restore_signals, monkeypatch):
    """A SIGTERM in the 3rd rollout, then --resume: the same weights, optimizer and metrics as one run;
    the same seed twice gives identical runs, another seed does not."""
    a, b, c, d = (tmp_path / n for n in "abcd")
    run(a)
    run(c)
    run(d, seed=2)
    wrapper, calls = sigterm_on_call(3, appo.LocalSource.next)
    monkeypatch.setattr(appo.LocalSource, "next", wrapper)
    run(b)
    assert (
        len(calls) == 3 and load(b)["global_step"] == 3 * 128 and not (b / "summary.json").exists()
    )
    monkeypatch.undo()
    run(b, resume=str(b / "checkpoints" / "latest.pt"))
    ca, cb, cc, cd = (load(x) for x in (a, b, c, d))
    for key in ca["agent"]:
        assert torch.equal(ca["agent"][key], cb["agent"][key]) and torch.equal(
            ca["agent"][key], cc["agent"][key]
        )
    assert not all(torch.equal(ca["agent"][k], cd["agent"][k]) for k in ca["agent"])
    assert torch.equal(
        ca["optimizer"]["state"][0]["exp_avg_sq"], cb["optimizer"]["state"][0]["exp_avg_sq"]
    )
    assert (cb["global_step"], cb["version"]) == (ca["global_step"], ca["version"]) == (1024, 8)
    assert summary(a)["eval_returns"] == summary(b)["eval_returns"] == summary(c)["eval_returns"]
    for tag in TAGS:
        assert scalars(a, tag) and scalars(a, tag) == scalars(b, tag) == scalars(c, tag), tag
    assert scalars(a, "charts/episodic_return") != scalars(d, "charts/episodic_return")
    assert {v for _, v in scalars(a, "charts/policy_lag")} == {0.0}  # synchronous: no lag
    assert all(v == pytest.approx(1.0, abs=1e-5) for _, v in scalars(a, "charts/importance_ratio"))
    check_eval_only_after_move(
        a,
        lambda ckpt: appo.train(appo.Args(eval_only=True, checkpoint=ckpt, eval_episodes=1)),
        seed=1,
    )


def test_resume_reads_a_checkpoint_with_a_float_learning_rate(tmp_path, restore_signals):
    """Checkpoints written before the tensor learning rate hold a float in Adam's group: a resume
    reads them and trains as from the new layout (the same weights), with the run's tensor rate."""
    new, old = tmp_path / "new", tmp_path / "old"
    run(new, total_steps=256, schedule_steps=512)
    shutil.copytree(new, old)
    ckpt = load(old)
    group = ckpt["optimizer"]["param_groups"][0]
    group["lr"] = float(group["lr"])
    torch.save(ckpt, old / "checkpoints" / "latest.pt")
    for run_dir in (new, old):
        run(run_dir, total_steps=512, resume=str(run_dir / "checkpoints" / "latest.pt"))
    a, b = load(new), load(old)
    assert all(torch.equal(a["agent"][k], b["agent"][k]) for k in a["agent"])
    assert isinstance(b["optimizer"]["param_groups"][0]["lr"], torch.Tensor)


def test_nonfinite_loss_stops_in_one_line(tmp_path, restore_signals, monkeypatch):
    real = appo.appo_loss

    def nan_loss(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        return loss * float("nan"), {name: value * float("nan") for name, value in stats.items()}

    monkeypatch.setattr(appo, "appo_loss", nan_loss)
    with pytest.raises(SystemExit, match="non-finite loss at step 128") as e:
        run(tmp_path / "run", total_steps=512)
    assert "\n" not in str(e.value) and not (tmp_path / "run" / "summary.json").exists()


def test_pg_rho_bar_truncates_only_the_policy_advantage():
    """--pg-rho-bar (IMPALA's clip_pg_rho_threshold) bounds the advantage's weight min(pg_rho_bar, pi/mu)
    alone: the value targets keep rho_bar, and prepare_batch passes the flag through."""
    d = random_rollout(seed=5)
    steps = [d[k] for k in ("rewards", "values", "next_values", "terminated", "dones")]
    v_1, adv_1 = appo.vtrace(
        d["log_rho"], *steps, gamma=0.9, lam=0.8, rho_bar=2.0, c_bar=1.0, pg_rho_bar=1.0
    )
    v_2, adv_2 = appo.vtrace(
        d["log_rho"], *steps, gamma=0.9, lam=0.8, rho_bar=2.0, c_bar=1.0, pg_rho_bar=2.0
    )
    ratio = d["log_rho"].exp()
    torch.testing.assert_close(v_1, v_2)
    torch.testing.assert_close(adv_1 * ratio.clamp(max=2.0), adv_2 * ratio.clamp(max=1.0))
    assert not torch.allclose(adv_1, adv_2) and appo.Args().pg_rho_bar == 1.0

    agent, T, N = CountingAgent(), 4, 3
    rollout = appo.new_rollout(T, N, 2)
    g = torch.Generator().manual_seed(0)
    rollout["obs"].uniform_(0, 3, generator=g)
    rollout["rewards"].uniform_(-1, 1, generator=g)
    rollout["valid"][:] = True
    rollout["logprobs"] = torch.log(torch.rand(T, N, generator=g))  # pi = 0.5: ratios 0.5 to large
    adv = {
        bar: appo.prepare_batch(
            agent, rollout, appo.Args(rho_bar=4.0, pg_rho_bar=bar, norm_values=False)
        )[0]["advantages"]
        for bar in (1.0, 4.0)
    }
    assert not torch.allclose(adv[1.0], adv[4.0])


def test_batch_with_one_valid_row_or_none_trains(tmp_path, restore_signals):
    """--num-envs 1 --num-steps 1: each batch holds one valid row (its advantage has no std, so it is
    not normalised) or, right after an episode end, none (that rollout trains nothing and counts as
    dropped); the run finishes instead of stopping at a NaN advantage."""
    run_dir = tmp_path / "run"
    run(run_dir, num_envs=1, num_steps=1, num_minibatches=1, total_steps=64)
    s, episodes = summary(run_dir), len(scalars(run_dir, "charts/episodic_return"))
    assert s["global_step"] == 64 and s["updates"] + s["dropped_rollouts"] == 64
    assert 1 <= s["dropped_rollouts"] <= episodes
    assert all(math.isfinite(v) for _, v in scalars(run_dir, "losses/policy_loss"))


def test_resume_keeps_the_lr_schedule_and_refuses_to_run_past_it(tmp_path, restore_signals):
    """The anneal's horizon is the first run's --total-steps, kept in the checkpoint: a longer
    resume is refused in one line until --schedule-steps re-plans it or --no-anneal-lr drops it."""
    run_dir = tmp_path / "run"
    ckpt = str(run_dir / "checkpoints" / "latest.pt")
    run(run_dir, total_steps=512)
    with pytest.raises(SystemExit, match="pass --schedule-steps 1024 or --no-anneal-lr") as e:
        run(run_dir, total_steps=1024, resume=ckpt)
    assert "\n" not in str(e.value) and load(run_dir)["global_step"] == 512
    assert load(run_dir)["schedule_steps"] == 512
    run(run_dir, total_steps=1024, resume=ckpt, schedule_steps=1024)
    assert load(run_dir)["schedule_steps"] == 1024
    run(run_dir, total_steps=1280, resume=ckpt, anneal_lr=False)
    lrs = scalars(run_dir, "charts/learning_rate")
    assert [step for step, _ in lrs] == list(range(128, 1281, 128))
    assert lrs[3][1] == pytest.approx(5e-4 * (1 - 384 / 512))  # the first run's schedule
    assert lrs[4][1] == pytest.approx(5e-4 * (1 - 512 / 1024))  # re-planned at the resume
    assert lrs[8][1] == lrs[9][1] == pytest.approx(5e-4)  # --no-anneal-lr


# ---------------------------------------------------------------- command line
@pytest.mark.slow
def test_tiny_run_outputs_and_no_vtrace(tmp_path):
    run_dir = tmp_path / "run"
    check_ok(
        run_script(
            "appo.py",
            *CLI_SMALL,
            "--total-steps",
            "1024",
            "--no-vtrace",
            "--eval-interval",
            "512",
            "--run-dir",
            str(run_dir),
        )
    )
    s = summary(run_dir)
    for key in (
        "script",
        "algo",
        "env_id",
        "seed",
        "global_step",
        "eval_mean",
        "eval_std",
        "eval_episodes",
        "sps",
        "updates",
        "dropped_rollouts",
        "policy_lag_mean",
    ):
        assert key in s, key
    assert (
        s["script"],
        s["global_step"],
        s["updates"],
        s["dropped_rollouts"],
        s["policy_lag_mean"],
    ) == ("appo.py", 1024, 8, 0, 0.0)
    assert [step for step, _ in scalars(run_dir, "eval/episodic_return")] == [512, 1024]
    assert len(scalars(run_dir, "charts/SPS")) == 8 and scalars(run_dir, "charts/episodic_return")
    assert scalars(run_dir, "charts/learning_rate")[0] == (128, pytest.approx(5e-4))


@pytest.mark.slow
def test_copy_alone_runs(tmp_path):
    script = copy_alone("appo.py", tmp_path)
    check_ok(run_script(script, *CLI_SMALL, "--total-steps", "256", cwd=tmp_path))
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (
        run_dir.name.startswith("CartPole-v1__appo__1__") and summary(run_dir)["global_step"] == 256
    )


# ---------------------------------------------------------------- actor processes
@pytest.fixture
def start():
    """Start appo.py with the small settings; a learner still running when the test ends (a failed
    assertion) is killed, and its actors then exit on their own (detail 4)."""
    procs = []

    def launch(*args, env=None):
        procs.append(
            subprocess.Popen(
                [sys.executable, str(ALGOS / "appo.py"), *CLI_SMALL, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env or {**os.environ, "OMP_NUM_THREADS": "1"},
            )
        )
        return procs[-1]

    yield launch
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def watch(proc, until=lambda: False, timeout=120) -> set[int]:
    """Poll until the process ends or `until()` holds; returns the pids of every descendant seen."""
    seen, deadline = set(), time.time() + timeout
    while proc.poll() is None and not until() and time.time() < deadline:
        try:
            seen |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.1)
    return seen


def actors_of(proc) -> list[int]:
    return [
        p.pid for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())
    ]


def check_none_left(pids: set[int], within: float = 10.0) -> None:
    def running(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + within
    while any(running(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if running(p)], "processes left behind"


@pytest.mark.slow
@needs_psutil
def test_two_actors_tiny_job_with_lag_and_dropped_rollouts(tmp_path, start):
    """--max-policy-lag 0: every rollout that arrives after an update of the learner is dropped, and counted."""
    run_dir = tmp_path / "run"
    proc = start(
        "--num-actors",
        "2",
        "--total-steps",
        "2048",
        "--max-policy-lag",
        "0",
        "--run-dir",
        str(run_dir),
    )
    children = watch(proc)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len(children) >= 2
    check_none_left(children)
    lags = [v for _, v in scalars(run_dir, "charts/policy_lag")]
    s = summary(run_dir)
    assert len(lags) == 16 and max(lags) >= 1
    assert (
        s["dropped_rollouts"] == sum(lag > 0 for lag in lags) == 16 - s["updates"]
        and s["updates"] >= 1
    )
    assert s["policy_lag_mean"] == pytest.approx(np.mean(lags)) and s["global_step"] == 2048
    assert [v for _, v in scalars(run_dir, "charts/dropped_rollouts")][-1] == s["dropped_rollouts"]


@pytest.mark.slow
@needs_psutil
def test_killed_actor_stops_the_learner_within_seconds(tmp_path, start):
    """SIGINT and SIGTERM to an actor change nothing (a Ctrl-C reaches the whole process group; the learner
    decides); SIGKILL to the other stops the learner with one line naming it."""
    run_dir = tmp_path / "run"
    proc = start(
        "--num-actors",
        "2",
        "--total-steps",
        "10000000",
        "--checkpoint-interval",
        "256",
        "--run-dir",
        str(run_dir),
    )
    children = watch(proc, until=lambda: (run_dir / "checkpoints" / "latest.pt").exists())
    assert proc.poll() is None, proc.communicate()[1]
    survivor, victim = actors_of(proc)
    os.kill(survivor, signal.SIGINT)
    os.kill(survivor, signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None and survivor in actors_of(proc)
    os.kill(victim, signal.SIGKILL)
    t0 = time.time()
    children |= watch(proc, timeout=30)
    elapsed = time.time() - t0
    _, err = proc.communicate(timeout=30)
    check_error(
        subprocess.CompletedProcess([], proc.returncode, "", err),
        "appo.py: error: actor",
        f"(pid {victim}) died (killed by SIGKILL)",
    )
    assert elapsed < 10
    check_none_left(children)


FAULTY_ENV = """
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class Faulty(CartPoleEnv):
    steps = 0

    def step(self, action):
        Faulty.steps += 1
        if Faulty.steps > 300:  # in the actor's process: the learner only makes and closes one
            raise RuntimeError("the simulator crashed\\nwith a second line")
        return super().step(action)


gym.register("Faulty-v0", entry_point=Faulty, max_episode_steps=500)
"""


@pytest.mark.slow
@needs_psutil
def test_actor_error_stops_the_learner_with_its_message(tmp_path, start):
    (tmp_path / "faulty_env.py").write_text(FAULTY_ENV)
    proc = start(
        "--num-actors",
        "1",
        "--env-id",
        "faulty_env:Faulty-v0",
        "--total-steps",
        "10000000",
        "--run-dir",
        str(tmp_path / "run"),
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path)},
    )
    children = watch(proc)
    _, err = proc.communicate(timeout=30)
    check_error(
        subprocess.CompletedProcess([], proc.returncode, "", err),
        "appo.py: error: actor 0 failed: RuntimeError: the simulator crashed",
    )
    assert "second line" not in err
    check_none_left(children)


@pytest.mark.slow
@needs_psutil
def test_sigterm_during_async_run_checkpoints_and_leaves_nothing(tmp_path, start):
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "latest.pt"
    proc = start(
        "--num-actors",
        "1",
        "--total-steps",
        "10000000",
        "--checkpoint-interval",
        "256",
        "--run-dir",
        str(run_dir),
    )
    children = watch(proc, until=ckpt.exists)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    children |= watch(proc, timeout=60)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "interrupted: continue with --resume" in out and not (run_dir / "summary.json").exists()
    assert torch.load(ckpt, weights_only=True)["global_step"] >= 256
    check_none_left(children)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "env_id, fragment",
    [
        (
            "CarRacing-v3",
            "CarRacing-v3 has image observations; use ppo_atari.py",
        ),
        # Unregistered (ale_py not imported) or registered by another test in this worker: either way, ppo_atari.py.
        ("ALE/Pong-v5", "use ppo_atari.py"),
        ("Pendulum-v1", "continuous actions; use d4pg.py or naf.py"),
        (
            "Blackjack-v1",
            "Tuple observations, Discrete actions; appo.py needs flat Box and Discrete ones",
        ),
        ("NoSuchEnv-v0", "cannot make environment 'NoSuchEnv-v0'"),
    ],
)
def test_unsupported_env_refused(env_id, fragment):
    with pytest.raises(SystemExit) as e:
        appo.check_env(env_id)
    assert (
        str(e.value).startswith("appo.py: error:")
        and fragment in str(e.value)
        and "\n" not in str(e.value)
    )


@pytest.mark.parametrize(
    "flags, fragment",
    [
        ({"num_steps": 0}, "--num-steps"),
        (
            {"num_minibatches": 0},
            "--num-minibatches must divide the rollout's 2048 steps",
        ),
        (
            {"num_minibatches": 3},
            "--num-minibatches must divide the rollout's 2048 steps",
        ),
        ({"num_actors": -1}, "--num-actors"),
        ({"max_policy_lag": -1}, "--max-policy-lag"),
        ({"rho_bar": 0.5}, "0 < c-bar <= rho-bar"),
        ({"c_bar": 0.0}, "0 < c-bar <= rho-bar"),
        ({"lam": 1.5}, "--lam"),
        ({"gamma": -0.1}, "--gamma"),
        ({"learning_rate": 0.0}, "--learning-rate"),
        ({"clip_coef": -0.2}, "--clip-coef"),
        ({"ent_coef": -0.01}, "--ent-coef"),
        ({"target_kl": 0.0}, "--target-kl"),
        ({"max_grad_norm": 0.0}, "--max-grad-norm must be positive"),
        ({"max_grad_norm": -0.5}, "--max-grad-norm must be positive"),
        ({"pg_rho_bar": 0.0}, "--pg-rho-bar"),
        ({"schedule_steps": 0}, "--schedule-steps"),
        (
            {"total_steps": 100},
            "--total-steps is below one rollout (2048 steps)",
        ),
    ],
)
def test_bad_hyperparameters(tmp_path, flags, fragment):
    with pytest.raises(SystemExit) as e:
        appo.train(appo.Args(run_dir=str(tmp_path / "run"), **flags))
    assert fragment in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_bad_input_cli_is_one_line(tmp_path):
    check_error(
        run_script("appo.py", "--env-id", "Pendulum-v1", "--run-dir", str(tmp_path / "a")),
        "appo.py: error",
        "naf.py",
    )
    assert not (tmp_path / "a").exists()


def test_resume_refuses_other_network(tmp_path, restore_signals):
    run(tmp_path / "run", total_steps=128)
    with pytest.raises(SystemExit, match="made with --hidden-dim 16; pass --hidden-dim 16"):
        appo.train(
            appo.Args(
                **{**SMALL, "hidden_dim": 64},
                resume=str(tmp_path / "run" / "checkpoints" / "latest.pt"),
            )
        )


def test_resume_refuses_a_checkpoint_without_value_normalisation(tmp_path, restore_signals):
    """A checkpoint from before --norm-values has no moments: its critic learned raw returns, so
    resuming it with the moments at their start would rescale V mid-run. It is refused in one line;
    its --eval-only still works (acting does not read the moments)."""
    run(tmp_path / "run", total_steps=128)
    path = tmp_path / "run" / "checkpoints" / "latest.pt"
    ckpt = torch.load(path, weights_only=True)
    del ckpt["args"]["norm_values"], ckpt["agent"]["moments"]
    torch.save(ckpt, path)
    with pytest.raises(SystemExit, match="predates --norm-values; use the appo.py that wrote it"):
        appo.train(appo.Args(**{**SMALL, "total_steps": 256}, resume=str(path)))
    appo.train(appo.Args(eval_only=True, checkpoint=str(path), eval_episodes=1))
    assert (tmp_path / "run" / "eval.json").exists()
