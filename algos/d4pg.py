"""D4PG: Distributed Distributional Deterministic Policy Gradients, in one file.

Paper: Gabriel Barth-Maron, Matthew W. Hoffman, David Budden, Will Dabney, Dan Horgan, Dhruva TB,
Alistair Muldal, Nicolas Heess, Timothy Lillicrap, "Distributed Distributional Deterministic
Policy Gradients", ICLR 2018, arXiv:1804.08617. Reference code: DeepMind Acme (agents/tf/d4pg and
agents/jax/d4pg; "Acme" below means both, where they agree).

Idea. DDPG trains a deterministic actor pi_theta(s) by following the gradient of a learned
critic Q_w(s, a). D4PG keeps that and changes the critic: it learns the whole distribution of
the return Z_w(s, a) as a categorical distribution on fixed atoms (as C51), trained on n-step
targets gathered by many actors in parallel, optionally replayed with priorities. The actor
ascends the mean of that distribution.

Equations (paper Sec. 3; projection from Bellemare et al. 2017, arXiv:1707.06887, Alg. 1):
  atoms       z_i = v_min + i dz,  dz = (v_max - v_min) / (N - 1),  i = 0 .. N-1
  critic      p_i(s, a) = softmax_i f_w(s, a),  Q_w(s, a) = E[Z_w(s, a)] = sum_i p_i z_i
  n-step      R = sum_{k=0}^{m-1} gamma^k r_{t+k},  m = n, or fewer when the episode ended first
  target      Y = R + gamma^m (1 - terminated) Z_w'(s_{t+m}, pi_theta'(s_{t+m}))
  projection  (Phi Y)_i = sum_j p'_j [1 - |clip(R + gamma^m (1 - terminated) z_j) - z_i| / dz]_0^1
  critic      L(w) = E[ -sum_i (Phi Y)_i log p_i(s_t, a_t) ]                  (cross-entropy)
  actor       grad_theta J = E[ grad_theta pi_theta(s) grad_a Q_w(s, a) |a=pi_theta(s) ]
  targets     w' <- tau w + (1 - tau) w',  theta' <- tau theta + (1 - tau) theta'
  PER         P(i) = p_i^alpha / sum_k p_k^alpha,  w_i = (N P(i))^-beta / max_j w_j

Implementation details:
 1. Networks as Acme's LayerNormMLP: Linear -> LayerNorm -> tanh, then Linear -> ELU. Actor head
    Linear -> tanh, initialised near zero (Acme's NearZeroInitializedLinear); critic head gives N
    logits (Acme's DiscreteValuedHead) on the concatenation (s, a).
 2. `scale_action` is the one place where the actor's [-1, 1] meets the env's bounds.
 3. The projection uses the triangular-kernel form (Acme's l2_project). For evenly spaced atoms
    it equals C51's floor/ceil split, and it is dense, so it is deterministic on GPU too.
 4. n-step windows per environment: a full window emits its oldest transition; at the end of an
    episode the whole window is flushed. Termination bootstraps nothing (discount 0), truncation
    bootstraps from the real final observation (discount gamma^m). Windows never span episodes.
 5. Autoreset: the vector env runs in SAME_STEP mode, chosen deliberately. Every step() is then a
    real transition; for a finished env `next_obs` already belongs to the new episode and the real
    last observation is info["final_obs"]. The default NEXT_STEP mode would insert a reset step
    (action ignored, reward 0) after each episode; here it never exists, so it is never stored.
 6. The paper's parallel actors are `--num-envs` synchronous environments acting with the latest
    actor. Exploration: a + N(0, sigma^2) on the actor's [-1, 1] scale, clipped there; in the
    env's units that is a standard deviation of sigma (high - low) / 2 (see deviation f).
 7. Replay: uniform (Acme's default) or `--prioritized` (the paper's): a sum tree over p_i^alpha,
    stratified sampling, new transitions at the largest priority so far, priority = per-sample
    KL(Phi Y || p) (Rainbow's choice for a distributional critic; the cross-entropy would keep
    the entropy of Phi Y as a floor), weights normalised by the batch maximum, beta annealed
    linearly from `--per-beta` to 1 over the run's first `--total-steps` (kept in the checkpoint:
    a resume with a larger budget keeps beta on its course). Only the critic loss is weighted.
 8. `--updates-per-step` counts gradient updates per environment step summed over envs, so the
    replay ratio does not change with `--num-envs`. Each update: a critic step, then an actor
    step on the same batch's s_t through the critic just updated, then the Polyak update of both
    targets (the order of DDPG's Algorithm 1, TD3 and CleanRL). Acme differs (learning.py of
    both agents): it takes both gradients at the parameters before the update, so its actor
    follows the critic of the previous step, and it evaluates the actor loss at the batch's
    s_{t+n} (next observations), not s_t. No flag aligns this; a reader comparing runs should know.
 9. Checkpoints hold the replay buffer, its priorities, the pending n-step windows and the state
    of the two generators the file draws from: torch's (initialisation) and numpy's `rng` (noise,
    random actions, replay and PER sampling). Env states cannot be restored, so on resume the
    pending windows are flushed as truncated at the saved last observation (the episode was cut,
    as by a time limit) and the envs restart with seed `seed + global_step`.
10. The support must cover the task's discounted returns: a one-line warning (once per process)
    when the discounted return of an observed episode leaves [v_min, v_max].
11. Evaluation: the deterministic actor without noise, on a separate env, episode i seeded
    `seed + 10_000 + i`.
12. `--compile` runs `update` (both steps with their optimizer steps, the projection, the target
    update) through torch.compile, as CUDA graphs on a GPU. Off by default: it has not yet been
    measured to win on a GPU.
Deviations from the paper / Acme (b, c, e, g chosen for the zoo's 20k-step Pendulum budget; the
runs behind a, f and h are in results/d4pg-collapse, those behind d, f and h in
results/d4pg-measurements.md; these defaults on six tasks beside TD3: results/d4pg-defaults):
 a. Adam 1e-3 for the critic (Acme's 1e-4, set for millions of steps, left HalfCheetah-v5 at 265
    after 80k steps), 1e-4 for the actor as Acme (at 3e-4, InvertedDoublePendulum-v5 fell from
    its maximum when the policy drove the cart to the end of its rail).
 b. Soft target updates with tau = 0.005 (Acme copies every 100 updates); same effect, smoother.
 c. Two hidden layers of 256 for both nets (Acme: 256x3 actor, 512-512-256 critic).
 d. No clipping by default. Acme clips each network's gradient to norm 40 and each dQ/da to norm
    1 on the env's scale, which is `--max-grad-norm 40 --dqda-clip b` here for bounds [-b, b].
    InvertedPendulum-v5 held its maximum without them: the atoms bound Q, so it cannot diverge.
 e. Uniform random actions for the first `--learning-starts` steps (SB3/CleanRL practice; Acme
    acts with the untrained policy plus noise), which spreads the first data.
 f. `--sigma` is on the [-1, 1] scale, Acme's 0.3 on the env's: on Pendulum ([-2, 2]) Acme's is
    `--sigma 0.15`. The default is TD3's 0.1: it led on HalfCheetah-v5, tied on Pendulum, and let
    InvertedPendulum-v5 fall off a little more often than 0.3.
 g. Support [-1600, 0]: Pendulum rewards lie in [-16.3, 0], and time limits bootstrap, so
    values lie in [-16.3 / (1 - gamma), 0] = [-1630, 0]; a trained agent sees about [-400, 0].
    Other tasks need their own: HalfCheetah (about +12 per step at best): --v-min -500 --v-max 1500;
    Hopper [-100, 400], InvertedDoublePendulum [0, 940], Reacher [-60, 0] by the same rule.
 h. n = 1, not the paper's and Acme's 5, which is not corrected for being off-policy (an old
    transition's return follows older policies for n - 1 steps): n = 1 led on HalfCheetah-v5
    (above TD3) and tied on Pendulum; with n = 5, InvertedPendulum-v5 fell off less.

Checkpoints written while the width flag was --hidden-size resume with the d4pg.py that
wrote them.

Usage: python algos/d4pg.py --env-id Pendulum-v1 --total-steps 20000 --seed 1
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import random
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    env_id: str = "Pendulum-v1"
    """Gymnasium id with Box actions and flat Box observations"""
    seed: int = 1
    """seed of python, numpy, torch and the environments"""
    total_steps: int = 20_000
    """environment steps, summed over envs (may be raised on --resume)"""
    num_envs: int = 1
    """parallel environments (the paper's parallel actors)"""
    torch_deterministic: bool = True
    """use deterministic torch algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    compile: bool = False
    """torch.compile the updates (CUDA graphs on a GPU)"""
    exp_name: str = "d4pg"
    """experiment name, part of the default run dir"""
    run_dir: str | None = None
    """output folder (default runs/<env>__<exp>__<seed>__<time>)"""
    checkpoint_interval: int = 50_000
    """environment steps between checkpoints (0: at the end only)"""
    resume: str | None = None
    """checkpoint to continue from (its run dir is reused)"""
    eval_episodes: int = 10
    """episodes per evaluation"""
    eval_interval: int = 5_000
    """environment steps between evaluations (0: at the end only)"""
    eval_only: bool = False
    """only evaluate --checkpoint, write eval.json and exit"""
    checkpoint: str | None = None
    """checkpoint evaluated by --eval-only"""
    capture_video: bool = False
    """record the final evaluation into <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """W&B project"""
    # D4PG
    buffer_size: int = 1_000_000
    """replay capacity in n-step transitions"""
    batch_size: int = 256
    """transitions per gradient update"""
    actor_lr: float = 1e-4
    """Adam learning rate of the actor"""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 1
    """length n of the n-step returns"""
    num_atoms: int = 51
    """atoms N of the categorical critic"""
    v_min: float = -1600.0
    """lowest atom: the task's lowest discounted return"""
    v_max: float = 0.0
    """highest atom: the task's highest discounted return"""
    sigma: float = 0.1
    """exploration noise std on the [-1, 1] action scale"""
    tau: float = 0.005
    """Polyak coefficient of the target networks"""
    learning_starts: int = 1_000
    """steps of uniform random actions before learning"""
    updates_per_step: float = 1.0
    """gradient updates per environment step"""
    hidden_dim: int = 256
    """width of both networks' two hidden layers"""
    prioritized: bool = False
    """prioritised replay (the paper's), not uniform (Acme's)"""
    per_alpha: float = 0.6
    """priority exponent alpha"""
    per_beta: float = 0.4
    """initial importance-sampling exponent beta"""
    dqda_clip: float = 0.0
    """clip each sample's dQ/da to this norm (0: off)"""
    max_grad_norm: float = 0.0
    """clip each network's gradient to this norm (0: off)"""


# ---------------------------------------------------------------- environment
def make_envs(env_id: str, num_envs: int, seed: int) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    # one-line errors for bad ids and spaces
    make_env(env_id).close()
    # SAME_STEP autoreset (detail 5): no reset step ever reaches the replay
    mode = gym.vector.AutoresetMode.SAME_STEP
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs, autoreset_mode=mode)
    obs, _ = envs.reset(seed=seed)
    return envs, obs.astype(np.float32)


def final_observations(next_obs: np.ndarray, infos: dict) -> np.ndarray:
    # s_{t+1}: the real last observation where an episode ended.
    ended = infos.get("_final_obs", np.zeros(len(next_obs), bool))
    real = [infos["final_obs"][i] if ended[i] else o for i, o in enumerate(next_obs)]
    return np.stack(real).astype(np.float32)


def scale_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return low + (action + 1.0) * 0.5 * (high - low)


# ---------------------------------------------------------------- networks
def layer_norm_mlp(in_dim: int, hidden_dim: int) -> nn.Sequential:
    # Acme's LayerNormMLP: the LayerNorm + tanh of the first layer keeps unscaled inputs in range
    first = [nn.Linear(in_dim, hidden_dim), nn.LayerNorm(hidden_dim), nn.Tanh()]
    return nn.Sequential(*first, nn.Linear(hidden_dim, hidden_dim), nn.ELU())


class Actor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int):
        super().__init__()
        self.torso, self.head = layer_norm_mlp(obs_dim, hidden_dim), nn.Linear(hidden_dim, act_dim)
        # near-zero first actions, as Acme's NearZeroInitializedLinear
        nn.init.trunc_normal_(self.head.weight, std=1e-4)
        nn.init.zeros_(self.head.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.torso(obs)))


class Critic(nn.Module):
    # Logits of the categorical return distribution Z_w(s, a) over the atoms z.
    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int, num_atoms: int):
        super().__init__()
        self.torso = layer_norm_mlp(obs_dim + act_dim, hidden_dim)
        self.head = nn.Linear(hidden_dim, num_atoms)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(torch.cat([obs, actions], -1)))


# ---------------------------------------------------------------- algorithm
def categorical_projection(R, discount, p_next, z) -> torch.Tensor:
    # Phi(R + discount Z'): R [B], discount [B] (gamma^m, 0 after a termination), p_next [B, N].
    # Each shifted atom Tz_j, clipped to [v_min, v_max], gives its mass p'_j to its two neighbours
    # z_i in proportion to 1 - |Tz_j - z_i| / dz (the triangular kernel; C51's Alg. 1, detail 3).
    Tz = (R.unsqueeze(-1) + discount.unsqueeze(-1) * z).clamp(z[0], z[-1])
    b = (Tz - z[0]) / (z[1] - z[0])
    i = torch.arange(len(z), device=z.device, dtype=z.dtype)
    kernel = (b.unsqueeze(-2) - i.unsqueeze(-1)).abs_().neg_().add_(1).clamp_(min=0)
    return torch.bmm(kernel, p_next.unsqueeze(-1)).squeeze(-1)


class NStepWindows:
    # The last n (s, a, r) of every env; `add` returns the finished n-step transitions (detail 4):
    # (s_t, a_t, R, discount, s_{t+m}) with R = sum_k gamma^k r_{t+k} over its m rewards and
    # discount = gamma^m (1 - terminated), so the targets need no episode bookkeeping.
    def __init__(self, num_envs: int, n: int, gamma: float, obs_dim: int, act_dim: int):
        self.n, self.gamma, self.count = n, gamma, np.zeros(num_envs, np.int64)
        self.obs = np.zeros((num_envs, n, obs_dim), np.float32)
        self.actions = np.zeros((num_envs, n, act_dim), np.float32)
        self.rewards = np.zeros((num_envs, n))
        # G[k, j] = gamma^(j - k) for j >= k: R of the item in slot k is sum_j G[k, j] r_j
        self.G = np.triu(float(gamma) ** (np.arange(n)[None, :] - np.arange(n)[:, None]))

    def _transitions(self, emit, terminated, real_next_obs) -> dict:
        slots = np.arange(self.n)
        R = np.where(slots < self.count[:, None], self.rewards, 0.0) @ self.G.T
        # the item in slot k has m = count - k rewards
        discount = self.gamma ** (self.count[:, None] - slots) * (1.0 - terminated[:, None])
        next_obs = np.broadcast_to(real_next_obs[:, None], self.obs.shape)
        out = dict(obs=self.obs, actions=self.actions, returns=R, discounts=discount)
        return {k: v[emit].astype(np.float32) for k, v in {**out, "next_obs": next_obs}.items()}

    def add(self, obs, actions, rewards, terminated, truncated, real_next_obs) -> dict:
        envs, slots = np.arange(len(self.count)), np.arange(self.n)
        self.obs[envs, self.count], self.actions[envs, self.count] = obs, actions
        self.rewards[envs, self.count] = rewards
        self.count += 1
        done, full = terminated | truncated, self.count == self.n
        # a full window gives its oldest item; an ended episode gives every item it holds
        emit = (slots < self.count[:, None]) & (done[:, None] | (full[:, None] & (slots == 0)))
        out = self._transitions(emit, terminated.astype(np.float64), real_next_obs)
        slide = full & ~done
        for array in (self.obs, self.actions, self.rewards):
            array[slide] = np.roll(array[slide], -1, axis=1)
        self.count = np.where(done, 0, self.count - slide)
        return out

    def flush(self, real_next_obs: np.ndarray) -> dict:
        # Cut every pending episode here, as a time limit would (detail 9).
        emit = np.arange(self.n) < self.count[:, None]
        out = self._transitions(emit, np.zeros(len(self.count)), real_next_obs)
        self.count[:] = 0
        return out

    def state_dict(self) -> dict:
        names = ("obs", "actions", "rewards", "count")
        return {k: torch.from_numpy(getattr(self, k).copy()) for k in names}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            getattr(self, k)[:] = v.numpy()


class SumTree:
    # Leaves hold p_i^alpha, every parent the sum of its children (Schaul et al. 2016, B.2.1);
    # a batch costs one numpy operation per tree level.
    def __init__(self, capacity: int):
        self.leaves = 1 << max(capacity - 1, 0).bit_length()
        # nodes[1] is the root
        self.nodes = np.zeros(2 * self.leaves)

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        i = np.asarray(idx) + self.leaves
        self.nodes[i] = values
        while i[0] > 1:
            # recompute (not add to) the parents, so that repeated indices stay exact
            i = np.unique(i // 2)
            self.nodes[i] = self.nodes[2 * i] + self.nodes[2 * i + 1]

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        # Stratified: one draw in each of batch_size equal slices of the total; indices, P(i).
        u = (np.arange(batch_size) + rng.random(batch_size)) * (self.nodes[1] / batch_size)
        i = np.ones(batch_size, np.int64)
        while i[0] < self.leaves:
            left = self.nodes[2 * i]
            # rounding never reaches an empty leaf
            right = (u >= left) & (self.nodes[2 * i + 1] > 0)
            u, i = np.where(right, u - left, u), 2 * i + right
        return i - self.leaves, self.nodes[i] / self.nodes[1]


class ReplayBuffer:
    # Ring buffer of n-step transitions; uniform, or prioritised with a sum tree (detail 7).
    def __init__(self, capacity: int, obs_dim: int, act_dim: int, prioritized: bool, alpha: float):
        self.capacity, self.alpha, self.max_priority = capacity, alpha, 1.0
        self.pos = self.size = 0
        shapes = dict(
            obs=(obs_dim,), actions=(act_dim,), returns=(), discounts=(), next_obs=(obs_dim,)
        )
        self.data = {k: np.zeros((capacity, *shape), np.float32) for k, shape in shapes.items()}
        self.tree = SumTree(capacity) if prioritized else None

    def add(self, transitions: dict) -> None:
        n = len(transitions["returns"])
        idx = (self.pos + np.arange(n)) % self.capacity
        for key, array in self.data.items():
            array[idx] = transitions[key]
        self.pos, self.size = (self.pos + n) % self.capacity, min(self.size + n, self.capacity)
        if self.tree is not None and n:
            # new transitions get the largest priority so far, so each is seen at least once
            self.tree.update(idx, np.full(n, self.max_priority**self.alpha))

    def sample(self, batch_size: int, beta: float, rng: np.random.Generator, device):
        # Indices, the batch on `device`, and the weights w_i = (N P(i))^-beta / max_j w_j.
        if self.tree is None:
            idx, weights = rng.integers(0, self.size, batch_size), np.ones(batch_size, np.float32)
        else:
            idx, P = self.tree.sample(batch_size, rng)
            weights = (self.size * P) ** -beta
            weights = (weights / weights.max()).astype(np.float32)
        batch = {k: to_device(v[idx], device) for k, v in self.data.items()}
        return idx, batch, to_device(weights, device)

    def update_priorities(self, idx: np.ndarray, priorities: torch.Tensor) -> None:
        if self.tree is None:
            return
        # the sum tree lives on the host: a copy and a sync, with --prioritized only; never zero,
        # so that every transition stays reachable
        p = priorities.abs().cpu().numpy() + 1e-6
        self.tree.update(idx, p**self.alpha)
        self.max_priority = max(self.max_priority, float(p.max()))

    def state_dict(self) -> dict:
        state = {k: torch.from_numpy(v[: self.size].copy()) for k, v in self.data.items()}
        if self.tree is not None:
            leaves = self.tree.nodes[self.tree.leaves : self.tree.leaves + self.size]
            state["priorities"] = torch.from_numpy(leaves.copy())
        return {**state, "pos": self.pos, "size": self.size, "max_priority": self.max_priority}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size, self.max_priority = state["pos"], state["size"], state["max_priority"]
        for k, array in self.data.items():
            array[: self.size] = state[k].numpy()
        if self.tree is not None and self.size:
            self.tree.update(np.arange(self.size), state["priorities"].numpy())


def critic_loss(critic, critic_target, actor_target, b: dict, z, weights):
    # The weighted cross-entropy of p(s_t, a_t) against Phi Y, and each sample's priority.
    with torch.no_grad():
        # the target distribution Phi(R + gamma^m Z'(s', pi'(s')))
        p_next = critic_target(b["next_obs"], actor_target(b["next_obs"])).softmax(-1)
        target = categorical_projection(b["returns"], b["discounts"], p_next, z)
    cross_entropy = -(target * critic(b["obs"], b["actions"]).log_softmax(-1)).sum(-1)
    # priority KL(Phi Y || p) = cross-entropy - entropy(Phi Y) (detail 7)
    kl = cross_entropy.detach() + torch.xlogy(target, target).sum(-1)
    return (weights * cross_entropy).mean(), kl


def actor_loss(actor, critic, obs, z, dqda_clip: float):
    # -Q(s, pi(s)), Q the mean of Z: its gradient is the deterministic policy gradient; and Q.
    a = actor(obs)
    if dqda_clip > 0:
        # a_i receives -dQ/da_i / B: rescale it so that |dQ/da_i| <= dqda_clip (deviation d)
        a.register_hook(
            lambda g: g * (dqda_clip / (len(g) * g.norm(dim=-1, keepdim=True))).clamp(max=1.0)
        )
    q = (critic(obs, a).softmax(-1) * z).sum(-1).mean()
    return -q, q.detach()


def gradient_step(optimizer, loss, net, max_grad_norm) -> None:
    optimizer.zero_grad()
    loss.backward()
    # Acme's global-norm clip (deviation d)
    if max_grad_norm > 0:
        nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm)
    optimizer.step()


def update(
    actor, critic, actor_target, critic_target, actor_optim, critic_optim, b, weights, z, args
):
    # Critic step, actor step, Polyak update of both targets (detail 8); metrics, priorities.
    loss_c, priorities = critic_loss(critic, critic_target, actor_target, b, z, weights)
    gradient_step(critic_optim, loss_c, critic, args.max_grad_norm)
    # the actor step needs dQ/da only
    critic.requires_grad_(False)
    loss_a, q = actor_loss(actor, critic, b["obs"], z, args.dqda_clip)
    gradient_step(actor_optim, loss_a, actor, args.max_grad_norm)
    critic.requires_grad_(True)
    with torch.no_grad():  # one fused Polyak update of both targets
        targets = [*actor_target.parameters(), *critic_target.parameters()]
        torch._foreach_lerp_(targets, [*actor.parameters(), *critic.parameters()], args.tau)
    metrics = {"losses/critic_loss": loss_c.detach(), "losses/actor_loss": -q}
    return metrics | {"losses/q_values": q}, priorities


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    check_args(args)
    if args.eval_only:
        return eval_only(args)
    device, rng = seed_and_pick_device(args), np.random.default_rng(args.seed)  # rng: detail 9
    ckpt = resume_checkpoint(args, SAME) if args.resume else None
    global_step = ckpt["global_step"] if ckpt else 0
    envs, obs = make_envs(args.env_id, args.num_envs, args.seed + global_step)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    low, high = envs.single_action_space.low, envs.single_action_space.high
    actor = Actor(obs_dim, act_dim, args.hidden_dim).to(device)
    critic = Critic(obs_dim, act_dim, args.hidden_dim, args.num_atoms).to(device)
    nets = {"actor": actor, "critic": critic}
    nets |= {f"{name}_target": copy.deepcopy(net) for name, net in nets.items()}
    for name, lr in (("actor", args.actor_lr), ("critic", args.critic_lr)):
        nets[f"{name}_optim"] = torch.optim.Adam(nets[name].parameters(), lr=lr, fused=True)
    z = torch.linspace(args.v_min, args.v_max, args.num_atoms, device=device)  # the atoms z_i
    buffer = ReplayBuffer(args.buffer_size, obs_dim, act_dim, args.prioritized, args.per_alpha)
    windows = NStepWindows(args.num_envs, args.n_step, args.gamma, obs_dim, act_dim)
    # beta reaches 1 at step `horizon`, the first run's --total-steps (detail 7)
    num_updates, updates_due, horizon = restore(ckpt, args, nets, buffer, windows, rng)
    stop, run_dir = stop_signal(), run_dir_for(args, args.resume)
    evaluate_policy = partial(evaluate, actor, args.env_id, args.eval_episodes, args.seed, device)

    def state() -> dict:
        return checkpoint_state(nets, buffer, windows, obs, rng, num_updates, updates_due, horizon)

    config, learn = {"resolved_device": str(device)}, compiled(update, args, device)
    with RunLogger(args, run_dir, global_step, args.total_steps, ckpt is not None, **config) as log:
        ep_return, ep_length, ep_discounted = np.zeros((3, args.num_envs))
        discount, metrics, warned = np.ones(args.num_envs), {}, False
        while global_step < args.total_steps and not stop:
            with torch.inference_mode():
                mu = actor(to_device(obs, device)).cpu().numpy()
            if global_step < args.learning_starts:  # deviation e
                actions = rng.uniform(-1.0, 1.0, mu.shape).astype(np.float32)
            else:  # detail 6
                noise = args.sigma * rng.standard_normal(mu.shape)
                actions = np.clip(mu + noise, -1.0, 1.0).astype(np.float32)
            env_actions = scale_action(actions, low, high)
            next_obs, rewards, terminated, truncated, infos = envs.step(env_actions)
            real_next_obs = final_observations(next_obs, infos)
            buffer.add(windows.add(obs, actions, rewards, terminated, truncated, real_next_obs))
            prev_step, global_step = global_step, global_step + args.num_envs
            obs = next_obs.astype(np.float32)
            ep_return, ep_length = ep_return + rewards, ep_length + 1
            ep_discounted, discount = ep_discounted + discount * rewards, discount * args.gamma
            for i in np.flatnonzero(terminated | truncated):
                log.episode(global_step, ep_return[i], ep_length[i])
                if not warned and not args.v_min <= ep_discounted[i] <= args.v_max:  # detail 10
                    warned = warn_support(ep_discounted[i], args)
                ep_return[i], ep_length[i], ep_discounted[i], discount[i] = 0.0, 0, 0.0, 1.0
            if global_step >= args.learning_starts and buffer.size >= args.batch_size:
                updates_due += args.num_envs * args.updates_per_step
            beta = args.per_beta + (1.0 - args.per_beta) * min(1.0, global_step / horizon)
            while updates_due >= 1:
                updates_due, num_updates = updates_due - 1, num_updates + 1
                idx, batch, weights = buffer.sample(args.batch_size, beta, rng, device)
                if args.compile:  # CUDA graphs: the last update's outputs are read by now
                    torch.compiler.cudagraph_mark_step_begin()
                metrics, priorities = learn(**nets, b=batch, weights=weights, z=z, args=args)
                log.check_finite(torch.stack([*metrics.values()]), global_step)
                buffer.update_priorities(idx, priorities)
            if every(global_step, prev_step, 200) or global_step >= args.total_steps or stop:
                charts = {"SPS": log.sps(global_step), "num_updates": num_updates}
                charts |= {"learning_rate": args.critic_lr, "actor_learning_rate": args.actor_lr}
                log.scalars(global_step, {"charts/" + k: v for k, v in charts.items()} | metrics)
            log.end_iteration(global_step, stop, evaluate_policy, state)
        envs.close()
        log.finish(global_step, stop, evaluate_policy, state, num_updates=num_updates)


# ---------------------------------------------------------------- the file's own plumbing
# the sizes a checkpoint fixes: a resume must keep them
SAME = "num_envs hidden_dim num_atoms v_min v_max n_step gamma buffer_size prioritized".split()


def check_args(args: Args) -> None:
    sizes = min(args.num_envs, args.batch_size, args.n_step, args.hidden_dim)
    rates = min(args.actor_lr, args.critic_lr, args.updates_per_step)
    nonneg = min(args.sigma, args.learning_starts, args.per_alpha)
    clips = min(args.dqda_clip, args.max_grad_norm)
    rows = [
        (sizes >= 1, "--num-envs, --batch-size, --n-step and --hidden-dim must be at least 1"),
        (args.buffer_size >= args.batch_size, "--buffer-size must be at least --batch-size"),
        (args.num_atoms >= 2, "the support needs --num-atoms of at least 2"),
        (args.v_min < args.v_max, "the support needs --v-min below --v-max"),
        (0 < args.gamma <= 1 and 0 < args.tau <= 1, "--gamma and --tau must lie in (0, 1]"),
        (0 <= args.per_beta <= 1, "--per-beta must lie in [0, 1]"),
        (rates > 0, "--actor-lr, --critic-lr and --updates-per-step must be positive"),
        (nonneg >= 0, "--sigma, --learning-starts and --per-alpha must be >= 0"),
        (clips >= 0, "--dqda-clip and --max-grad-norm must be >= 0"),
    ]
    check_flags(args, rows)


def warn_support(discounted_return: float, args: Args) -> bool:
    # detail 10: one line; it returns True, so that the loop warns once
    where = f"lies outside the critic support [{args.v_min:g}, {args.v_max:g}]"
    message = f"an episode's discounted return {discounted_return:.1f} {where}"
    print(f"{SCRIPT}: warning: {message}; set --v-min/--v-max to cover it", file=sys.stderr)
    return True


def checkpoint_state(nets, buffer, windows, obs, rng, num_updates, updates_due, horizon) -> dict:
    # everything detail 9 lists, as plain tensors and numbers
    state = {k: v.state_dict() for k, v in nets.items()}
    state |= {"buffer": buffer.state_dict(), "windows": windows.state_dict()}
    state["last_obs"] = torch.from_numpy(obs.copy())
    state["rng"] = rng_state(torch=torch.default_generator, numpy=rng)
    counters = {"num_updates": num_updates, "updates_due": updates_due, "beta_horizon": horizon}
    return state | counters


def restore(ckpt, args, nets, buffer, windows, rng) -> tuple[int, float, int]:
    # Loads what checkpoint_state saved (the pending episodes end at the saved observation) and
    # returns the counters num_updates, updates_due and beta's horizon; fresh ones without ckpt.
    if ckpt is None:
        return 0, 0.0, args.total_steps
    for key, part in {**nets, "buffer": buffer, "windows": windows}.items():
        # modules and optimizers copy the tensors to their device
        part.load_state_dict(ckpt[key])
    set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    buffer.add(windows.flush(ckpt["last_obs"].numpy()))
    return ckpt["num_updates"], ckpt["updates_due"], ckpt["beta_horizon"]


def to_device(x, device):
    # Through pinned memory on a GPU, so that the copy does not block the host; the caching host
    # allocator keeps the pinned block until the copy is done.
    x = torch.from_numpy(x)
    return (x.pin_memory() if device.type == "cuda" else x).to(device, non_blocking=True)


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    # One env (evaluation, video); an unknown id or an unsupported space stops with one line.
    if env_id.startswith("ALE/") and importlib.util.find_spec("ale_py"):
        # register the Atari ids, so that the message below names the file to use
        gym.register_envs(importlib.import_module("ale_py"))
    try:
        env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise fail(f"cannot make environment {env_id!r} ({why}); pass an id such as Pendulum-v1")
    obs_space, act_space = env.observation_space, env.action_space
    flat = isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
    box = isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1
    if not (flat and box and np.isfinite([act_space.low, act_space.high]).all()):
        env.close()
        spaces = f"{env_id} has {obs_space} observations and {act_space} actions"
        need = "d4pg.py needs a flat Box and a Box with finite bounds"
        raise fail(f"{spaces}; {need} (images: ppo_atari.py or dqn_atari.py; discrete: ppg.py)")
    return env


def evaluate(actor, env_id: str, episodes: int, seed: int, device, video_dir=None) -> list[float]:
    # Returns of the deterministic actor without exploration noise (detail 11).
    env = make_env(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(
            env, str(video_dir), lambda _: True, name_prefix="eval", disable_logger=True
        )
    returns, low, high = [], env.action_space.low, env.action_space.high
    for i in range(episodes):
        (obs, _), done = env.reset(seed=seed + 10_000 + i), False
        returns.append(0.0)
        while not done:
            with torch.inference_mode():
                action = actor(to_device(obs[None].astype(np.float32), device))
            action = scale_action(action[0].cpu().numpy(), low, high)
            obs, reward, terminated, truncated, _ = env.step(action)
            returns[-1], done = returns[-1] + float(reward), terminated or truncated
    env.close()
    return returns


def eval_only(args: Args) -> None:
    # --checkpoint's own env, network and seed: this repeats the run's final evaluation.
    ckpt, device = load_checkpoint(args.checkpoint), seed_and_pick_device(args)
    act_dim, hidden_dim = ckpt["actor"]["head.weight"].shape
    actor = Actor(ckpt["actor"]["torso.0.weight"].shape[1], act_dim, hidden_dim).to(device)
    actor.load_state_dict(ckpt["actor"])
    video_dir = run_dir_for(args, args.checkpoint) / "videos" if args.capture_video else None
    seed = ckpt["args"]["seed"]
    returns = evaluate(actor, ckpt["env_id"], args.eval_episodes, seed, device, video_dir)
    write_eval_only(args, ckpt, returns)


# ===== run harness: the same text in every file of algos/ (tests/test_harness.py compares them),
# no algorithm knowledge: errors, checks, seeding, checkpoints, signals and the run's outputs
# (README.md's "Usage" says what a run writes). Change it in one file, then copy it to the others.
SCRIPT, ALGO = Path(__file__).name, Path(__file__).stem


def fail(message: str) -> SystemExit:
    """`raise fail(...)`: one line on stderr and exit status 1."""
    return SystemExit(f"{SCRIPT}: error: {message}")


def check_flags(args, rows: list[tuple[bool, str]]) -> None:
    """Stop at the first false (condition, message) row, the common flags' rows first."""
    intervals = min(args.eval_interval, args.checkpoint_interval)
    cuda = args.device != "cuda" or torch.cuda.is_available()
    common = [
        (args.total_steps > 0, f"--total-steps must be positive, got {args.total_steps}"),
        (args.eval_episodes >= 1, f"--eval-episodes must be at least 1, got {args.eval_episodes}"),
        (intervals >= 0, "--eval-interval and --checkpoint-interval must be >= 0"),
        (not args.eval_only or args.checkpoint, "--eval-only needs --checkpoint PATH"),
        (not (args.eval_only and args.resume), "--eval-only cannot --resume; drop one"),
        (cuda, "--device cuda but CUDA is not available; use --device cpu or auto"),
        (not args.track or importlib.util.find_spec("wandb"), "--track needs wandb (pip install)"),
    ]
    for ok, message in common + rows:
        if not ok:
            raise fail(message)


def seed_and_pick_device(args) -> torch.device:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when CUDA starts
    for seed in (random.seed, np.random.seed, torch.manual_seed):  # torch: CPU and every GPU
        seed(args.seed)
    torch.use_deterministic_algorithms(args.torch_deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    return torch.device("cuda" if cuda else "cpu")


def compiled(fn, args, device: torch.device):
    """`fn`, or with --compile torch.compile's `fn`; on CUDA its fixed shapes run as CUDA graphs."""
    if not args.compile:
        return fn
    return torch.compile(fn, mode="reduce-overhead" if device.type == "cuda" else "default")


def rng_state(**generators) -> dict:
    """The states of exactly the numpy or torch generators a file draws from, and CUDA's."""
    state = {k: getattr(g, "bit_generator", g) for k, g in generators.items()}
    state = {k: g.get_state() if hasattr(g, "get_state") else g.state for k, g in state.items()}
    cuda = torch.cuda.is_initialized()
    return state | ({"cuda": torch.cuda.get_rng_state_all()} if cuda else {})


def set_rng_state(state: dict, **generators) -> None:
    for name, g in generators.items():
        if hasattr(g, "set_state"):
            g.set_state(state[name])
        else:
            g.bit_generator.state = state[name]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


def write_atomic(path: Path, data: dict) -> None:  # a kill mid-write leaves the last one whole
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2)) if path.suffix == ".json" else torch.save(data, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, env_id: str | None = None) -> dict:
    """On the CPU with weights_only: a stranger's checkpoint cannot run code."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        raise fail(f"checkpoint {path} does not exist; pass the path of a checkpoints/latest.pt")
    except Exception as e:
        raise fail(f"cannot read checkpoint {path} ({type(e).__name__}): corrupt or not one")
    if not isinstance(ckpt, dict) or not {"algo", "env_id", "args", "global_step"} <= ckpt.keys():
        raise fail(f"{path} is not a checkpoint written by this library")
    if ckpt["algo"] != ALGO:
        raise fail(f"checkpoint {path} was written by {ckpt['algo']}.py; use {ckpt['algo']}.py")
    if env_id is not None and ckpt["env_id"] != env_id:
        raise fail(f"checkpoint {path} is for {ckpt['env_id']}; pass --env-id {ckpt['env_id']}")
    return ckpt


def resume_checkpoint(args, same: tuple[str, ...]) -> dict:
    """--resume's checkpoint; refused below its step or when a flag in `same` differs."""
    ckpt = load_checkpoint(args.resume, args.env_id)
    if ckpt.get("harness") != 1:
        raise fail(f"checkpoint {args.resume} was written by an older {SCRIPT}; resume it there")
    if args.total_steps < ckpt["global_step"]:
        raise fail(f"--total-steps is below the checkpoint's step; pass {ckpt['global_step']}+")
    for key in same:
        flag, theirs = "--" + key.replace("_", "-"), ckpt["args"].get(key)
        if key not in ckpt["args"]:
            raise fail(f"checkpoint {args.resume} predates {flag}; use the {SCRIPT} that wrote it")
        was = f"{flag} {theirs}"
        if isinstance(theirs, bool):  # tyro spells a boolean --x / --no-x
            was = flag if theirs else "--no-" + flag[2:]
        if theirs != getattr(args, key):
            raise fail(f"checkpoint {args.resume} was made with {was}; pass {was}")
    return ckpt


def run_dir_for(args, checkpoint: str | None) -> Path:
    if args.run_dir:
        return Path(args.run_dir)
    if checkpoint:  # --resume, --eval-only: the folder above the checkpoint's checkpoints/
        folder = Path(checkpoint).resolve().parent
        return folder.parent if folder.name == "checkpoints" else folder
    name = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    return Path("runs", name)


def eval_fields(result: list[float] | tuple[list[float], dict]) -> tuple[dict, dict]:
    """summary.json's eval_* fields of `evaluate`'s returns or (returns, {"eval_<name>": value})."""
    returns, extra = result if isinstance(result, tuple) else (result, {})
    returns = [float(r) for r in returns]
    stats = {"eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns))}
    return {**stats, "eval_episodes": len(returns), "eval_returns": returns, **extra}, extra


def write_eval_only(args, ckpt: dict, result, **extra) -> None:
    path = run_dir_for(args, args.checkpoint) / "eval.json"
    info = {"script": SCRIPT, "algo": ALGO, "env_id": ckpt["env_id"], "seed": ckpt["args"]["seed"]}
    info |= {"checkpoint": str(args.checkpoint), "global_step": ckpt["global_step"]}
    write_atomic(path, info := {**info, **eval_fields(result)[0], **extra})
    print(f"eval at step {ckpt['global_step']:,}: {info['eval_mean']:.2f} -> {path}")


def stop_signal() -> list[int]:
    """A list that the first SIGINT or SIGTERM makes true; a second one kills at once."""
    caught = []

    def on_signal(signum, _frame) -> None:
        caught.append(signum)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return caught


def every(step: int, previous_step: int, interval: int) -> bool:
    """True when a multiple of `interval` lies in (previous_step, step]; never when it is 0."""
    return interval > 0 and step // interval != previous_step // interval


class RunLogger:
    """config.json, TensorBoard (and W&B), progress, evaluations, checkpoints and summary.json."""

    def __init__(self, args, run_dir: Path, start_step: int, total_steps: int, resumed, **config):
        self.args, self.run_dir, self.total_steps = args, run_dir, total_steps
        self.start_step = self.step = start_step
        self.checkpoint = run_dir / "checkpoints" / "latest.pt"
        config = {**asdict(args), "run_dir": str(run_dir), **config}
        write_atomic(run_dir / "config.json", config)
        self.wandb = importlib.import_module("wandb") if args.track else None  # only when asked
        if self.wandb is not None:
            init = dict(project=args.wandb_project_name, config=config, sync_tensorboard=True)
            self.wandb.init(**init, dir=str(run_dir), name=run_dir.name, resume="allow")
        # on resume, TensorBoard hides what an earlier attempt logged after the checkpoint
        self.writer = SummaryWriter(str(run_dir), purge_step=start_step + 1 if resumed else None)
        if not resumed:
            table = "\n".join(f"|{k}|{v}|" for k, v in config.items())
            self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        self.recent, self.loop_start, self.last_print = deque(maxlen=20), time.time(), 0.0
        self.bad_step = torch.tensor(-1)  # the first step with a non-finite loss

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, kind, error, _traceback) -> None:
        self.writer.close()
        if self.wandb is not None:
            failed = kind is not None and not (kind is SystemExit and error.code in (0, None))
            self.wandb.finish(exit_code=int(failed))

    def scalars(self, step: int, values: dict) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, float(value), step)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        self.recent.append(float(episodic_return))
        self.scalars(step, {"charts/episodic_return": self.recent[-1]})
        self.scalars(step, {"charts/episodic_length": length})

    def sps(self, step: int) -> float:
        return (step - self.start_step) / max(time.time() - self.loop_start, 1e-9)

    def check_finite(self, value: torch.Tensor, step: int) -> None:
        """Stop at a non-finite loss: on the CPU at once; a GPU's flag is read as progress prints."""
        bad = ~torch.isfinite(value).all()
        self.bad_step = torch.where(bad & (self.bad_step < 0), step, self.bad_step)
        if value.device.type == "cpu":
            self.stop_if_bad()

    def stop_if_bad(self) -> None:
        if (step := int(self.bad_step)) >= 0:  # on a GPU this waits for the device
            raise fail(f"non-finite loss at step {step:,}; try lower learning rates")

    def evaluate(self, step: int, evaluate, stop, video_dir: Path | None = None) -> dict | None:
        """`evaluate(video_dir)`, logged as eval/*; None when a signal cut it short."""
        result, extra = eval_fields(evaluate(video_dir))
        if not stop:
            extra = {"eval/" + k.removeprefix("eval_"): v for k, v in extra.items()}
            self.scalars(step, {"eval/episodic_return": result["eval_mean"], **extra})
            return result

    def end_iteration(self, step: int, stop, evaluate, state) -> None:
        """Evaluate and save as their intervals pass (finish() does both at the end); progress."""
        previous, self.step = self.step, step
        if stop or step >= self.total_steps:
            return
        if every(step, previous, self.args.eval_interval):
            self.evaluate(step, evaluate, stop)
        if every(step, previous, self.args.checkpoint_interval) and not stop:
            self.save(step, state())  # (a signal during the evaluation: finish() saves)
        if time.time() - self.last_print >= 5:
            self.stop_if_bad()
            self.last_print, sps = time.time(), self.sps(step)
            ret = f"{np.mean(self.recent):.1f}" if self.recent else "n/a"
            eta = int((self.total_steps - step) / max(sps, 1e-9))
            line = f"step {step:,}/{self.total_steps:,} | {sps:.0f} SPS | return {ret}"
            print(f"{line} | eta {eta // 3600}h{eta % 3600 // 60:02d}m", flush=True)

    def save(self, step: int, state: dict) -> None:
        self.stop_if_bad()  # no checkpoint of non-finite weights
        meta = {"algo": ALGO, "harness": 1, "env_id": self.args.env_id, "args": asdict(self.args)}
        write_atomic(self.checkpoint, {**meta, "global_step": step, **state})

    def finish(self, step: int, stop, evaluate, state, **extra) -> None:
        """Save; unless a signal came, evaluate (with videos) and write summary.json: finished."""
        sps = self.sps(step)
        self.save(step, state())
        video_dir = self.run_dir / "videos" if self.args.capture_video else None
        result = None if stop else self.evaluate(step, evaluate, stop, video_dir)
        if result is None:
            return print(f"interrupted: continue with --resume {self.checkpoint}", flush=True)
        info = {"script": SCRIPT, "algo": ALGO, "env_id": self.args.env_id, "seed": self.args.seed}
        info |= {"global_step": step, "sps": sps, **result, **extra}
        write_atomic(self.run_dir / "summary.json", info)
        print(f"done: {step:,} steps, eval {result['eval_mean']:.2f} -> {self.run_dir}", flush=True)


if __name__ == "__main__":
    train(tyro.cli(Args))
