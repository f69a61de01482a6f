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
    """D4PG's flags (tyro): the common ones first, then the algorithm's; the module
    docstring at the top of d4pg.py gives the reasons for their defaults."""

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
    """The training vector env in SAME_STEP autoreset mode (detail 5), and its first observations."""
    make_env(env_id).close()  # one-line errors for bad ids and spaces
    mode = gym.vector.AutoresetMode.SAME_STEP  # no reset step ever reaches the replay
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs, autoreset_mode=mode)
    obs, _ = envs.reset(seed=seed)
    return envs, obs.astype(np.float32)


def final_observations(next_obs: np.ndarray, infos: dict) -> np.ndarray:
    """s_{t+1} of every env: the real last observation where an episode ended (detail 5)."""
    ended = infos.get("_final_obs", np.zeros(len(next_obs), bool))
    real = [infos["final_obs"][i] if ended[i] else o for i, o in enumerate(next_obs)]
    return np.stack(real).astype(np.float32)


def scale_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The actor's [-1, 1] in the env's [low, high] (detail 2): the one place they meet."""
    return low + (action + 1.0) * 0.5 * (high - low)


# ---------------------------------------------------------------- networks
def layer_norm_mlp(in_dim: int, hidden_dim: int) -> nn.Sequential:
    """Acme's LayerNormMLP (detail 1): the first layer's LayerNorm + tanh keeps unscaled inputs in
    range."""
    first = [nn.Linear(in_dim, hidden_dim), nn.LayerNorm(hidden_dim), nn.Tanh()]
    return nn.Sequential(*first, nn.Linear(hidden_dim, hidden_dim), nn.ELU())


class Actor(nn.Module):
    """The deterministic policy pi_theta(s) in [-1, 1]^act_dim."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int):
        super().__init__()
        self.torso = layer_norm_mlp(obs_dim, hidden_dim)
        self.head = nn.Linear(hidden_dim, act_dim)
        # near-zero first actions, as Acme's NearZeroInitializedLinear
        nn.init.trunc_normal_(self.head.weight, std=1e-4)
        nn.init.zeros_(self.head.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, obs_dim] -> actions [B, act_dim]."""
        return torch.tanh(self.head(self.torso(obs)))


class Critic(nn.Module):
    """The logits f_w(s, a) of the categorical return distribution Z_w(s, a) over the atoms z."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int, num_atoms: int):
        super().__init__()
        self.torso = layer_norm_mlp(obs_dim + act_dim, hidden_dim)
        self.head = nn.Linear(hidden_dim, num_atoms)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """obs [B, obs_dim], actions [B, act_dim] -> logits [B, N]."""
        return self.head(self.torso(torch.cat([obs, actions], -1)))


# ---------------------------------------------------------------- algorithm
def categorical_projection(R, discount, p_next, z) -> torch.Tensor:
    """Phi(R + discount Z'): the target distribution on the atoms z (C51's Alg. 1, detail 3).

    R [B] and discount [B] (gamma^m, 0 after a termination) of each transition; p_next [B, N] the
    target distribution at s_{t+m}; z [N] the atoms. Each shifted atom Tz_j, clipped to
    [v_min, v_max], gives its mass p'_j to its two neighbours z_i in proportion to
    1 - |Tz_j - z_i| / dz: the triangular kernel, which for evenly spaced atoms is C51's
    floor/ceil split, written densely so that it is deterministic on a GPU too.
    """
    Tz = (R[:, None] + discount[:, None] * z[None, :]).clamp(z[0], z[-1])  # [B, N_j]
    b = (Tz - z[0]) / (z[1] - z[0])  # [B, N_j]: Tz_j's position in units of dz
    i = torch.arange(len(z), device=z.device, dtype=z.dtype)  # [N_i]
    distance = (b[:, None, :] - i[None, :, None]).abs_()  # [B, N_i, N_j]: |b_j - i|
    # [B, N_i, N_j]: 1 - |b_j - i| floored at 0, the share of p'_j that goes to z_i. In place:
    # this is the update's largest tensor, and two more copies of it cost d4pg 15% of its speed.
    kernel = distance.neg_().add_(1).clamp_(min=0)
    projected = torch.bmm(kernel, p_next[:, :, None])  # [B, N_i, 1] = sum_j kernel_ij p'_j
    return projected.squeeze(-1)  # [B, N_i]


class NStepWindows:
    """The last n (s, a, r) of every env; `add` returns the finished n-step transitions (detail 4).

    Each transition is (s_t, a_t, R, discount, s_{t+m}) with R = sum_k gamma^k r_{t+k} over its m
    rewards and discount = gamma^m (1 - terminated), so the targets need no episode bookkeeping.
    A worked example, n = 3, one env, rewards r0 r1 r2 r3 and then a termination at r4:
      step 0-1: slots [s0 s1 -]            window not full: nothing is emitted
      step 2:   slots [s0 s1 s2], full     emit s0 with R = r0 + g r1 + g^2 r2, discount g^3, s3
                slide                      slots [s1 s2 -]
      step 3:   slots [s1 s2 s3], full     emit s1 with R = r1 + g r2 + g^2 r3, discount g^3, s4
      step 4:   slots [s2 s3 s4], ended    emit all three, toward s5 with discount 0:
                                           s2: r2 + g r3 + g^2 r4;  s3: r3 + g r4;  s4: r4
    At the default n = 1 every step emits its own one-step transition.
    """

    def __init__(self, num_envs: int, n: int, gamma: float, obs_dim: int, act_dim: int):
        self.n = n
        self.gamma = gamma
        self.count = np.zeros(num_envs, np.int64)  # items held per env
        self.obs = np.zeros((num_envs, n, obs_dim), np.float32)
        self.actions = np.zeros((num_envs, n, act_dim), np.float32)
        self.rewards = np.zeros((num_envs, n))
        # G[k, j] = gamma^(j - k) for j >= k: R of the item in slot k is sum_j G[k, j] r_j
        self.G = np.triu(float(gamma) ** (np.arange(n)[None, :] - np.arange(n)[:, None]))

    def _transitions(self, emit, terminated, real_next_obs) -> dict:
        """The transitions of the slots where `emit` [num_envs, n] is true, as flat arrays."""
        slots = np.arange(self.n)
        rewards = np.where(slots < self.count[:, None], self.rewards, 0.0)  # [num_envs, n]
        R = rewards @ self.G.T  # [num_envs, n]: the n-step return of each slot's item
        # the item in slot k has m = count - k rewards
        discount = self.gamma ** (self.count[:, None] - slots) * (1.0 - terminated[:, None])
        next_obs = np.broadcast_to(real_next_obs[:, None], self.obs.shape)  # [num_envs, n, obs]
        out = dict(obs=self.obs, actions=self.actions, returns=R, discounts=discount)
        out["next_obs"] = next_obs
        return {k: v[emit].astype(np.float32) for k, v in out.items()}

    def add(self, obs, actions, rewards, terminated, truncated, real_next_obs) -> dict:
        """Append one vector step; return the transitions it finished."""
        envs = np.arange(len(self.count))
        slots = np.arange(self.n)
        self.obs[envs, self.count] = obs
        self.actions[envs, self.count] = actions
        self.rewards[envs, self.count] = rewards
        self.count += 1
        done = terminated | truncated
        full = self.count == self.n
        # a full window gives its oldest item; an ended episode gives every item it holds
        oldest_of_full = full[:, None] & (slots == 0)
        emit = (slots < self.count[:, None]) & (done[:, None] | oldest_of_full)
        out = self._transitions(emit, terminated.astype(np.float64), real_next_obs)
        slide = full & ~done
        for array in (self.obs, self.actions, self.rewards):
            array[slide] = np.roll(array[slide], -1, axis=1)
        self.count = np.where(done, 0, self.count - slide)
        return out

    def flush(self, real_next_obs: np.ndarray) -> dict:
        """Cut every pending episode here, as a time limit would (detail 9)."""
        emit = np.arange(self.n) < self.count[:, None]
        out = self._transitions(emit, np.zeros(len(self.count)), real_next_obs)
        self.count[:] = 0
        return out

    def state_dict(self) -> dict:
        """The pending windows, as tensors for the checkpoint."""
        names = ("obs", "actions", "rewards", "count")
        return {k: torch.from_numpy(getattr(self, k).copy()) for k in names}

    def load_state_dict(self, state: dict) -> None:
        """Put back what state_dict() saved."""
        for k, v in state.items():
            getattr(self, k)[:] = v.numpy()


class SumTree:
    """Leaves hold p_i^alpha, every parent the sum of its children (Schaul et al. 2016, B.2.1); a
    batch costs one numpy operation per tree level."""

    def __init__(self, capacity: int):
        self.leaves = 1 << max(capacity - 1, 0).bit_length()
        self.nodes = np.zeros(2 * self.leaves)  # nodes[1] is the root

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set the leaves `idx` to `values` and recompute their ancestors."""
        i = np.asarray(idx) + self.leaves
        self.nodes[i] = values
        while i[0] > 1:
            # recompute (not add to) the parents, so that repeated indices stay exact
            i = np.unique(i // 2)
            self.nodes[i] = self.nodes[2 * i] + self.nodes[2 * i + 1]

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Stratified: one draw in each of batch_size equal slices of the total; indices, P(i)."""
        u = (np.arange(batch_size) + rng.random(batch_size)) * (self.nodes[1] / batch_size)
        i = np.ones(batch_size, np.int64)
        while i[0] < self.leaves:
            left = self.nodes[2 * i]
            right = (u >= left) & (
                self.nodes[2 * i + 1] > 0
            )  # rounding never reaches an empty leaf
            u = np.where(right, u - left, u)
            i = 2 * i + right
        return i - self.leaves, self.nodes[i] / self.nodes[1]


class ReplayBuffer:
    """Ring buffer of n-step transitions on the host; uniform, or prioritised with a sum tree
    (detail 7)."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, prioritized: bool, alpha: float):
        self.capacity = capacity
        self.alpha = alpha
        self.max_priority = 1.0
        self.pos = 0
        self.size = 0
        shapes = dict(
            obs=(obs_dim,), actions=(act_dim,), returns=(), discounts=(), next_obs=(obs_dim,)
        )
        self.data = {k: np.zeros((capacity, *shape), np.float32) for k, shape in shapes.items()}
        self.tree = SumTree(capacity) if prioritized else None

    def add(self, transitions: dict) -> None:
        """Store NStepWindows' transitions, overwriting the oldest when full."""
        n = len(transitions["returns"])
        idx = (self.pos + np.arange(n)) % self.capacity
        for key, array in self.data.items():
            array[idx] = transitions[key]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        if self.tree is not None and n:
            # new transitions get the largest priority so far, so each is seen at least once
            self.tree.update(idx, np.full(n, self.max_priority**self.alpha))

    def sample(self, batch_size: int, beta: float, rng: np.random.Generator):
        """Indices, the batch (numpy arrays) and the weights w_i = (N P(i))^-beta / max_j w_j."""
        if self.tree is None:
            idx = rng.integers(0, self.size, batch_size)
            weights = np.ones(batch_size, np.float32)
        else:
            idx, P = self.tree.sample(batch_size, rng)
            weights = (self.size * P) ** -beta
            weights = (weights / weights.max()).astype(np.float32)
        batch = {k: v[idx] for k, v in self.data.items()}
        return idx, batch, weights

    def update_priorities(self, idx: np.ndarray, priorities: torch.Tensor) -> None:
        """New priorities of the sampled transitions (with --prioritized only)."""
        if self.tree is None:
            return
        # the sum tree lives on the host: a copy and a sync; never zero, so that every
        # transition stays reachable
        p = priorities.abs().cpu().numpy() + 1e-6
        self.tree.update(idx, p**self.alpha)
        self.max_priority = max(self.max_priority, float(p.max()))

    def state_dict(self) -> dict:
        """The stored transitions (and priorities), as tensors for the checkpoint."""
        state = {k: torch.from_numpy(v[: self.size].copy()) for k, v in self.data.items()}
        if self.tree is not None:
            leaves = self.tree.nodes[self.tree.leaves : self.tree.leaves + self.size]
            state["priorities"] = torch.from_numpy(leaves.copy())
        return {**state, "pos": self.pos, "size": self.size, "max_priority": self.max_priority}

    def load_state_dict(self, state: dict) -> None:
        """Put back what state_dict() saved."""
        self.pos = state["pos"]
        self.size = state["size"]
        self.max_priority = state["max_priority"]
        for k, array in self.data.items():
            array[: self.size] = state[k].numpy()
        if self.tree is not None and self.size:
            self.tree.update(np.arange(self.size), state["priorities"].numpy())


def explore(mu: np.ndarray, global_step: int, rng: np.random.Generator, args: Args) -> np.ndarray:
    """Actions on the [-1, 1] scale: uniform before --learning-starts (deviation e), then
    mu + N(0, sigma^2) clipped to [-1, 1] (detail 6)."""
    if global_step < args.learning_starts:
        return rng.uniform(-1.0, 1.0, mu.shape).astype(np.float32)
    noise = args.sigma * rng.standard_normal(mu.shape)
    return np.clip(mu + noise, -1.0, 1.0).astype(np.float32)


def critic_loss(critic, critic_target, actor_target, b: dict, z, weights):
    """The weighted cross-entropy of p(s_t, a_t) against Phi Y, and each sample's priority.

    Paper: L(w) = E[-sum_i (Phi Y)_i log p_i(s_t, a_t)], Y = R + gamma^m Z_w'(s_{t+m}, pi'(s_{t+m})).
    """
    with torch.no_grad():
        p_next = critic_target(b["next_obs"], actor_target(b["next_obs"])).softmax(-1)  # [B, N]
        target = categorical_projection(b["returns"], b["discounts"], p_next, z)  # Phi Y [B, N]
    log_p = critic(b["obs"], b["actions"]).log_softmax(-1)  # [B, N]
    cross_entropy = -(target * log_p).sum(-1)  # [B]
    # prioritised replay's importance weights correct the critic loss only (detail 7)
    loss = (weights * cross_entropy).mean()
    # priority KL(Phi Y || p) = cross-entropy - entropy(Phi Y) (detail 7)
    kl = cross_entropy.detach() + torch.xlogy(target, target).sum(-1)
    return loss, kl


def actor_loss(actor, critic, obs, z, dqda_clip: float):
    """-Q(s, pi(s)), with Q the mean of Z: its gradient is the deterministic policy gradient; and
    Q for logging.

    Paper: grad_theta J = E[grad_theta pi_theta(s) grad_a Q_w(s, a) |a=pi_theta(s)].
    """
    a = actor(obs)  # [B, act_dim]
    if dqda_clip > 0:  # deviation d: Acme's clip of each sample's dQ/da
        # a_i receives -dQ/da_i / B: rescale it so that |dQ/da_i| <= dqda_clip
        a.register_hook(
            lambda g: g * (dqda_clip / (len(g) * g.norm(dim=-1, keepdim=True))).clamp(max=1.0)
        )
    q = (critic(obs, a).softmax(-1) * z).sum(-1).mean()  # sum_i p_i z_i, averaged over the batch
    return -q, q.detach()


def gradient_step(optimizer, loss, net, max_grad_norm: float) -> None:
    """One optimizer step on `loss`; with --max-grad-norm, Acme's global-norm clip (deviation d)."""
    optimizer.zero_grad()
    loss.backward()
    if max_grad_norm > 0:
        nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm)
    optimizer.step()


@dataclass
class Learner:
    """The four networks and two optimizers one update changes (their names are the checkpoint's
    keys)."""

    actor: Actor
    critic: Critic
    actor_target: Actor
    critic_target: Critic
    actor_optim: torch.optim.Optimizer
    critic_optim: torch.optim.Optimizer

    def parts(self) -> dict:
        """Every field by name: what a checkpoint saves and a resume loads."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def update(learner: Learner, b: dict, weights: torch.Tensor, z: torch.Tensor, args: Args):
    """Critic step, actor step, Polyak update of both targets (detail 8); metrics, priorities."""
    loss_c, priorities = critic_loss(
        learner.critic, learner.critic_target, learner.actor_target, b, z, weights
    )
    gradient_step(learner.critic_optim, loss_c, learner.critic, args.max_grad_norm)
    # the actor step needs dQ/da only: no gradient into the critic's parameters
    learner.critic.requires_grad_(False)
    loss_a, q = actor_loss(learner.actor, learner.critic, b["obs"], z, args.dqda_clip)
    gradient_step(learner.actor_optim, loss_a, learner.actor, args.max_grad_norm)
    learner.critic.requires_grad_(True)
    # w' <- tau w + (1 - tau) w' and theta' <- tau theta + (1 - tau) theta', in one fused call
    targets = [*learner.actor_target.parameters(), *learner.critic_target.parameters()]
    online = [*learner.actor.parameters(), *learner.critic.parameters()]
    Run.polyak(targets, online, args.tau)
    metrics = {"losses/critic_loss": loss_c.detach(), "losses/actor_loss": -q, "losses/q_values": q}
    return metrics, priorities


@dataclass
class Episodes:
    """The running return, length and discounted return of every env's current episode."""

    ep_return: np.ndarray
    ep_length: np.ndarray
    ep_discounted: np.ndarray
    discount: np.ndarray  # gamma^t of each env's current step

    @classmethod
    def start(cls, num_envs: int) -> Episodes:
        """Every env at the start of an episode."""
        zeros = np.zeros((3, num_envs))
        return cls(zeros[0], zeros[1], zeros[2], np.ones(num_envs))

    def add(self, rewards: np.ndarray, gamma: float) -> None:
        """One step's rewards."""
        self.ep_return = self.ep_return + rewards
        self.ep_length = self.ep_length + 1
        self.ep_discounted = self.ep_discounted + self.discount * rewards
        self.discount = self.discount * gamma

    def restart(self, i: int) -> None:
        """Env i begins a new episode."""
        self.ep_return[i] = 0.0
        self.ep_length[i] = 0
        self.ep_discounted[i] = 0.0
        self.discount[i] = 1.0


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    """D4PG (Barth-Maron et al. 2018, Algorithm 1) with --num-envs synchronous actors."""
    # Algorithm 1, as this loop runs it (every env step):
    #  1. act: a = pi(s) + N(0, sigma^2), clipped to [-1, 1]              -> explore, scale_action
    #  2. store the finished n-step transitions (s_t, a_t, R, gamma^m, s_{t+m})
    #                                                      -> NStepWindows.add, ReplayBuffer.add
    #  3. for each update due (--updates-per-step per env step):
    #     a. sample a batch, uniform or prioritised                        -> ReplayBuffer.sample
    #     b. critic: cross-entropy to the projected target Phi Y   -> critic_loss (projection)
    #     c. actor: ascend the mean of Z(s, pi(s))                          -> actor_loss
    #     d. Polyak-average both targets                                    -> update
    #     e. new priorities KL(Phi Y || p)                      -> ReplayBuffer.update_priorities
    #  4. log episodes and losses; evaluate and checkpoint as their intervals pass (run.*)
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)
    rng = np.random.default_rng(args.seed)  # every numpy draw of the run (detail 9)
    ckpt = run.resume_checkpoint(same=SAME)
    global_step = ckpt["global_step"] if ckpt else 0

    # set-up: envs, networks, optimizers, replay
    envs, obs = make_envs(args.env_id, args.num_envs, args.seed + global_step)
    obs_dim = envs.single_observation_space.shape[0]
    act_dim = envs.single_action_space.shape[0]
    low = envs.single_action_space.low
    high = envs.single_action_space.high
    actor = Actor(obs_dim, act_dim, args.hidden_dim).to(run.device)
    critic = Critic(obs_dim, act_dim, args.hidden_dim, args.num_atoms).to(run.device)
    learner = Learner(
        actor=actor,
        critic=critic,
        actor_target=copy.deepcopy(actor),
        critic_target=copy.deepcopy(critic),
        actor_optim=torch.optim.Adam(actor.parameters(), lr=args.actor_lr, fused=True),
        critic_optim=torch.optim.Adam(critic.parameters(), lr=args.critic_lr, fused=True),
    )
    z = torch.linspace(args.v_min, args.v_max, args.num_atoms, device=run.device)  # atoms z_i
    buffer = ReplayBuffer(args.buffer_size, obs_dim, act_dim, args.prioritized, args.per_alpha)
    windows = NStepWindows(args.num_envs, args.n_step, args.gamma, obs_dim, act_dim)
    counters = restore(ckpt, args, learner, buffer, windows, rng)
    learn = run.compile(update)

    def state() -> dict:
        """The checkpoint: everything detail 9 lists, at this moment."""
        return checkpoint_state(learner, buffer, windows, obs, rng, counters)

    def evaluate_policy(video_dir: Path | None) -> list[float]:
        """The deterministic actor's returns (detail 11)."""
        return evaluate(actor, args.env_id, args.eval_episodes, args.seed, run.device, video_dir)

    with run.start(global_step, args.total_steps, state=state, evaluate=evaluate_policy):
        episodes = Episodes.start(args.num_envs)
        metrics = {}
        warned = False
        while global_step < args.total_steps and not run.stop:
            # 1. act
            with torch.inference_mode():
                mu = actor(run.to_device(obs)).cpu().numpy()
            actions = explore(mu, global_step, rng, args)
            next_obs, rewards, terminated, truncated, infos = envs.step(
                scale_action(actions, low, high)
            )
            # 2. store
            real_next_obs = final_observations(next_obs, infos)
            buffer.add(windows.add(obs, actions, rewards, terminated, truncated, real_next_obs))
            previous_step = global_step
            global_step += args.num_envs
            obs = next_obs.astype(np.float32)
            episodes.add(rewards, args.gamma)
            for i in np.flatnonzero(terminated | truncated):
                run.episode(global_step, episodes.ep_return[i], episodes.ep_length[i])
                discounted = episodes.ep_discounted[i]
                if not warned and not args.v_min <= discounted <= args.v_max:  # detail 10
                    warned = warn_support(discounted, args)
                episodes.restart(i)

            # 3. learn: the updates this step made due (detail 8)
            if global_step >= args.learning_starts and buffer.size >= args.batch_size:
                counters.updates_due += args.num_envs * args.updates_per_step
            beta = args.per_beta + (1.0 - args.per_beta) * min(1.0, global_step / counters.horizon)
            while counters.updates_due >= 1:
                counters.updates_due -= 1
                counters.num_updates += 1
                idx, batch, weights = buffer.sample(args.batch_size, beta, rng)
                batch = {k: run.to_device(v) for k, v in batch.items()}
                run.graph_step()
                metrics, priorities = learn(learner, batch, run.to_device(weights), z, args)
                run.check_finite(torch.stack([*metrics.values()]), global_step)
                buffer.update_priorities(idx, priorities)

            # 4. log
            due = Run.every(global_step, previous_step, 200)
            if due or global_step >= args.total_steps or run.stop:
                log_charts(run, global_step, counters.num_updates, metrics, args)
            run.end_iteration(global_step)
        envs.close()
        run.finish(global_step, num_updates=counters.num_updates)


# ---------------------------------------------------------------- the file's own plumbing
# the sizes a checkpoint fixes: a resume must keep them
SAME = "num_envs hidden_dim num_atoms v_min v_max n_step gamma buffer_size prioritized".split()


def check_args(args: Args) -> list[tuple[bool, str]]:
    """The file's own argument checks, as (condition, message) rows for Run."""
    sizes = min(args.num_envs, args.batch_size, args.n_step, args.hidden_dim)
    rates = min(args.actor_lr, args.critic_lr, args.updates_per_step)
    nonneg = min(args.sigma, args.learning_starts, args.per_alpha)
    clips = min(args.dqda_clip, args.max_grad_norm)
    return [
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


def log_charts(run: Run, global_step: int, num_updates: int, metrics: dict, args: Args) -> None:
    """The charts (SPS, updates, learning rates) and the last update's losses."""
    charts = {"SPS": run.sps(global_step), "num_updates": num_updates}
    charts["learning_rate"] = args.critic_lr
    charts["actor_learning_rate"] = args.actor_lr
    run.log(global_step, {"charts/" + k: v for k, v in charts.items()} | metrics)


def warn_support(discounted_return: float, args: Args) -> bool:
    """Detail 10's one-line warning; it returns True, so that the loop warns once."""
    where = f"lies outside the critic support [{args.v_min:g}, {args.v_max:g}]"
    message = f"an episode's discounted return {discounted_return:.1f} {where}"
    print(f"{SCRIPT}: warning: {message}; set --v-min/--v-max to cover it", file=sys.stderr)
    return True


@dataclass
class Counters:
    """The update counters a checkpoint keeps: updates done, updates owed, and beta's horizon
    (the first run's --total-steps, detail 7)."""

    num_updates: int
    updates_due: float
    horizon: int


def checkpoint_state(learner, buffer, windows, obs, rng, counters: Counters) -> dict:
    """Everything detail 9 lists, as plain tensors and numbers."""
    state = {name: part.state_dict() for name, part in learner.parts().items()}
    state["buffer"] = buffer.state_dict()
    state["windows"] = windows.state_dict()
    state["last_obs"] = torch.from_numpy(obs.copy())
    state["rng"] = Run.rng_state(torch=torch.default_generator, numpy=rng)
    state["num_updates"] = counters.num_updates
    state["updates_due"] = counters.updates_due
    state["beta_horizon"] = counters.horizon
    return state


def restore(ckpt, args, learner, buffer, windows, rng) -> Counters:
    """Load what checkpoint_state saved (the pending episodes end at the saved observation) and
    return the counters; fresh ones without a checkpoint."""
    if ckpt is None:
        return Counters(num_updates=0, updates_due=0.0, horizon=args.total_steps)
    parts = {**learner.parts(), "buffer": buffer, "windows": windows}
    for key, part in parts.items():
        part.load_state_dict(ckpt[key])  # modules and optimizers copy the tensors to their device
    Run.set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    buffer.add(windows.flush(ckpt["last_obs"].numpy()))
    return Counters(ckpt["num_updates"], ckpt["updates_due"], ckpt["beta_horizon"])


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """One env (evaluation, video); an unknown id or an unsupported space stops with one line."""
    if env_id.startswith("ALE/") and importlib.util.find_spec("ale_py"):
        # register the Atari ids, so that the message below names the file to use
        gym.register_envs(importlib.import_module("ale_py"))
    try:
        env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise Run.fail(
            f"cannot make environment {env_id!r} ({why}); pass an id such as Pendulum-v1"
        )
    obs_space = env.observation_space
    act_space = env.action_space
    flat = isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
    box = isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1
    if not (flat and box and np.isfinite([act_space.low, act_space.high]).all()):
        env.close()
        spaces = f"{env_id} has {obs_space} observations and {act_space} actions"
        need = "d4pg.py needs a flat Box and a Box with finite bounds"
        raise Run.fail(f"{spaces}; {need} (images: ppo_atari.py or dqn_atari.py; discrete: ppg.py)")
    return env


def evaluate(actor, env_id: str, episodes: int, seed: int, device, video_dir=None) -> list[float]:
    """Returns of the deterministic actor without exploration noise (detail 11)."""
    env = make_env(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(
            env, str(video_dir), lambda _: True, name_prefix="eval", disable_logger=True
        )
    returns = []
    low = env.action_space.low
    high = env.action_space.high
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done = False
        returns.append(0.0)
        while not done:
            with torch.inference_mode():
                action = actor(torch.as_tensor(obs[None].astype(np.float32), device=device))
            action = scale_action(action[0].cpu().numpy(), low, high)
            obs, reward, terminated, truncated, _ = env.step(action)
            returns[-1] += float(reward)
            done = terminated or truncated
    env.close()
    return returns


def eval_only(args: Args, run: Run) -> None:
    """--checkpoint's own env, network and seed: this repeats the run's final evaluation."""
    ckpt = Run.load_checkpoint(args.checkpoint)
    act_dim, hidden_dim = ckpt["actor"]["head.weight"].shape
    obs_dim = ckpt["actor"]["torso.0.weight"].shape[1]
    actor = Actor(obs_dim, act_dim, hidden_dim).to(run.device)
    actor.load_state_dict(ckpt["actor"])
    seed = ckpt["args"]["seed"]
    returns = evaluate(actor, ckpt["env_id"], args.eval_episodes, seed, run.device, run.video_dir)
    run.write_eval_only(ckpt, returns)


# ===== run harness: the same text in every file of algos/, written from benchmark/run_harness.py
# by `python -m benchmark harness`. No algorithm knowledge: flag checks, seeding and the device,
# checkpoints, stop signals and the run's outputs (README.md's "Usage" says what a run writes).
# The code above reaches all of it through one name, `run` (the class `Run`): skip those lines
# to read the algorithm alone.
SCRIPT = Path(__file__).name
ALGO = Path(__file__).stem


class Run:
    """One training run's plumbing: checks, seeding, device, signals, logs and checkpoints.

    run = Run(args, checks)                    # check the flags, seed, pick run.device,
                                               # catch SIGINT/SIGTERM in run.stop
    ckpt = run.resume_checkpoint(same=(...))   # --resume's checkpoint, or None
    with run.start(step, total, state=..., evaluate=...):   # config.json, TensorBoard
        while step < total and not run.stop:
            ...                                # the algorithm; run.episode(...), run.log(...)
            run.end_iteration(step)            # evaluations, checkpoints, progress as due
        run.finish(step)                       # checkpoint, final evaluation, summary.json

    `state()` returns the file's checkpoint dict; `evaluate(video_dir)` returns the evaluation's
    returns, or (returns, {"eval_<name>": value}).
    """

    def __init__(self, args, checks: list[tuple[bool, str]] = ()) -> None:
        """Stop if --run-dir names a file, or at the first failed check (the common flags'
        first); then seed and pick the device."""
        self.run_dir = Run.run_dir_for(args, args.checkpoint if args.eval_only else args.resume)
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise Run.fail(f"--run-dir {self.run_dir} is a file; pass a folder's path")
        Run.check_flags(args, list(checks))
        self.args = args
        self.device = Run.seed_and_pick_device(args)
        self.checkpoint = self.run_dir / "checkpoints" / "latest.pt"
        self.stop: list[int] = []  # made true by the first SIGINT or SIGTERM
        if not args.eval_only:
            catch_stop_signals(self.stop)

    # ------------------------------------------------------------ errors and checks
    @staticmethod
    def fail(message: str) -> SystemExit:
        """`raise Run.fail(...)`: one line on stderr and exit status 1."""
        return SystemExit(f"{SCRIPT}: error: {message}")

    @staticmethod
    def check_flags(args, rows: list[tuple[bool, str]]) -> None:
        """Stop at the first false (condition, message) row, the common flags' rows first."""
        intervals = min(args.eval_interval, args.checkpoint_interval)
        cuda = args.device != "cuda" or torch.cuda.is_available()
        wandb = not args.track or importlib.util.find_spec("wandb")
        common = [
            (args.total_steps > 0, f"--total-steps must be positive, got {args.total_steps}"),
            (
                args.eval_episodes >= 1,
                f"--eval-episodes must be at least 1, got {args.eval_episodes}",
            ),
            (intervals >= 0, "--eval-interval and --checkpoint-interval must be >= 0"),
            (not args.eval_only or args.checkpoint, "--eval-only needs --checkpoint PATH"),
            (not (args.eval_only and args.resume), "--eval-only cannot --resume; drop one"),
            (cuda, "--device cuda but CUDA is not available; use --device cpu or auto"),
            (wandb, "--track needs wandb (pip install)"),
        ]
        for ok, message in common + rows:
            if not ok:
                raise Run.fail(message)

    @staticmethod
    def every(step: int, previous_step: int, interval: int) -> bool:
        """True when a multiple of `interval` lies in (previous_step, step]; never when it is 0."""
        return interval > 0 and step // interval != previous_step // interval

    # ------------------------------------------------------------ seeding, device, speed
    @staticmethod
    def seed_and_pick_device(args) -> torch.device:
        """Seed python, numpy's global generator and torch (CPU and every GPU); the device."""
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when CUDA starts
        for seed in (random.seed, np.random.seed, torch.manual_seed):
            seed(args.seed)
        torch.use_deterministic_algorithms(args.torch_deterministic, warn_only=True)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        return torch.device("cuda" if cuda else "cpu")

    def compile(self, fn):
        """`fn`, or with --compile torch.compile's `fn`; on CUDA its fixed shapes run as CUDA graphs."""
        if not self.args.compile:
            return fn
        mode = "reduce-overhead" if self.device.type == "cuda" else "default"
        return torch.compile(fn, mode=mode)

    def graph_step(self) -> None:
        """Before a compiled step on CUDA: the previous step's outputs have been read, so its CUDA
        graph may overwrite them."""
        if self.args.compile and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()

    def to_device(self, array: np.ndarray | torch.Tensor, dtype: torch.dtype | None = None):
        """`array` as a tensor on the run's device (converted to `dtype` on the host first). To a
        GPU it goes through pinned memory, so the host does not wait for the copy; the caching
        host allocator keeps the pinned block until the copy is done."""
        x = torch.as_tensor(array)
        if dtype is not None:
            x = x.to(dtype)
        if self.device.type == "cuda":
            x = x.pin_memory()
        return x.to(self.device, non_blocking=True)

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32):
        """A zeroed host tensor to stage data for the device (pinned on a GPU run)."""
        return torch.zeros(shape, dtype=dtype, pin_memory=self.device.type == "cuda")

    def upload(self, host: torch.Tensor, copy: bool = False) -> torch.Tensor:
        """A host (staging) tensor on the run's device, without waiting for the copy; `copy`
        makes a new tensor even where no copy is needed (the CPU), so the host may be refilled."""
        return host.to(self.device, non_blocking=True, copy=copy)

    @staticmethod
    def polyak(target, source, tau: float) -> None:
        """theta_target <- (1 - tau) theta_target + tau theta_source, for two modules or two lists
        of tensors, in one fused call."""
        if isinstance(target, torch.nn.Module):
            target, source = target.parameters(), source.parameters()
        with torch.no_grad():
            torch._foreach_lerp_(list(target), list(source), tau)

    # ------------------------------------------------------------ checkpoints
    @staticmethod
    def rng_state(**generators) -> dict:
        """The states of exactly the numpy or torch generators a file draws from, and CUDA's."""
        state = {}
        for name, generator in generators.items():
            generator = getattr(generator, "bit_generator", generator)
            if hasattr(generator, "get_state"):
                state[name] = generator.get_state()
            else:
                state[name] = generator.state
        if torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    @staticmethod
    def set_rng_state(state: dict, **generators) -> None:
        """Restore what rng_state() saved into the same generators."""
        for name, generator in generators.items():
            if hasattr(generator, "set_state"):
                generator.set_state(state[name])
            else:
                generator.bit_generator.state = state[name]
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])

    @staticmethod
    def load_checkpoint(path: str, env_id: str | None = None) -> dict:
        """On the CPU with weights_only: a stranger's checkpoint cannot run code."""
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except FileNotFoundError:
            message = f"checkpoint {path} does not exist; pass the path of a checkpoints/latest.pt"
            raise Run.fail(message)
        except Exception as e:
            raise Run.fail(
                f"cannot read checkpoint {path} ({type(e).__name__}): corrupt or not one"
            )
        if (
            not isinstance(ckpt, dict)
            or not {"algo", "env_id", "args", "global_step"} <= ckpt.keys()
        ):
            raise Run.fail(f"{path} is not a checkpoint written by this library")
        if ckpt["algo"] != ALGO:
            raise Run.fail(
                f"checkpoint {path} was written by {ckpt['algo']}.py; use {ckpt['algo']}.py"
            )
        if env_id is not None and ckpt["env_id"] != env_id:
            raise Run.fail(
                f"checkpoint {path} is for {ckpt['env_id']}; pass --env-id {ckpt['env_id']}"
            )
        return ckpt

    def resume_checkpoint(self, same: tuple[str, ...] | list[str]) -> dict | None:
        """--resume's checkpoint (None without --resume); refused below its step or when a flag
        in `same` differs."""
        args = self.args
        if not args.resume:
            return None
        ckpt = Run.load_checkpoint(args.resume, args.env_id)
        if ckpt.get("harness") != 1:
            raise Run.fail(
                f"checkpoint {args.resume} was written by an older {SCRIPT}; resume it there"
            )
        if args.total_steps < ckpt["global_step"]:
            raise Run.fail(
                f"--total-steps is below the checkpoint's step; pass {ckpt['global_step']}+"
            )
        for key in same:
            flag = "--" + key.replace("_", "-")
            theirs = ckpt["args"].get(key)
            if key not in ckpt["args"]:
                raise Run.fail(
                    f"checkpoint {args.resume} predates {flag}; use the {SCRIPT} that wrote it"
                )
            was = f"{flag} {theirs}"
            if isinstance(theirs, bool):  # tyro spells a boolean --x / --no-x
                was = flag if theirs else "--no-" + flag[2:]
            if theirs != getattr(args, key):
                raise Run.fail(f"checkpoint {args.resume} was made with {was}; pass {was}")
        return ckpt

    @staticmethod
    def run_dir_for(args, checkpoint: str | None) -> Path:
        """--run-dir; else the folder above a checkpoint's checkpoints/; else a new one in runs/."""
        if args.run_dir:
            return Path(args.run_dir)
        if checkpoint:
            folder = Path(checkpoint).resolve().parent
            return folder.parent if folder.name == "checkpoints" else folder
        name = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        return Path("runs", name)

    @property
    def video_dir(self) -> Path | None:
        """Where evaluation videos go, with --capture-video."""
        return self.run_dir / "videos" if self.args.capture_video else None

    # ------------------------------------------------------------ the run's life
    def start(self, step: int, total_steps: int, state, evaluate, **about) -> Run:
        """Write config.json (the flags, the device and `about`), open TensorBoard (and W&B);
        `with` closes them."""
        args = self.args
        self.state, self.evaluate = state, evaluate
        self.total_steps = total_steps
        self.start_step = self.step = step
        resumed = args.resume is not None
        config = {**asdict(args), "run_dir": str(self.run_dir)}
        config |= {"resolved_device": str(self.device), **about}
        write_atomic(self.run_dir / "config.json", config)
        self.wandb = importlib.import_module("wandb") if args.track else None  # only when asked
        if self.wandb is not None:
            init = dict(project=args.wandb_project_name, config=config, sync_tensorboard=True)
            self.wandb.init(**init, dir=str(self.run_dir), name=self.run_dir.name, resume="allow")
        # on resume, TensorBoard hides what an earlier attempt logged after the checkpoint
        purge_step = step + 1 if resumed else None
        self.writer = SummaryWriter(str(self.run_dir), purge_step=purge_step)
        if not resumed:
            table = "\n".join(f"|{k}|{v}|" for k, v in config.items())
            self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        self.recent = deque(maxlen=20)
        self.loop_start = time.time()
        self.last_print = 0.0
        self.bad_step = torch.tensor(-1)  # the first step with a non-finite loss
        return self

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, error, _traceback) -> None:
        self.writer.close()
        if self.wandb is not None:
            failed = kind is not None and not (kind is SystemExit and error.code in (0, None))
            self.wandb.finish(exit_code=int(failed))

    def log(self, step: int, values: dict) -> None:
        """TensorBoard scalars {tag: number or 0-dim tensor} at `step`."""
        for tag, value in values.items():
            self.writer.add_scalar(tag, float(value), step)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        """A finished training episode: logged, and kept for the progress line."""
        self.recent.append(float(episodic_return))
        self.log(step, {"charts/episodic_return": self.recent[-1]})
        self.log(step, {"charts/episodic_length": length})

    def sps(self, step: int) -> float:
        """Environment steps per second of the training loop so far."""
        return (step - self.start_step) / max(time.time() - self.loop_start, 1e-9)

    def check_finite(self, value: torch.Tensor, step: int) -> None:
        """Stop at a non-finite loss: on the CPU at once; a GPU's flag is read as progress prints."""
        bad = ~torch.isfinite(value).all()
        self.bad_step = torch.where(bad & (self.bad_step < 0), step, self.bad_step)
        if value.device.type == "cpu":
            self.stop_if_bad()

    def stop_if_bad(self) -> None:
        """Raise the non-finite loss's error, if one was seen (on a GPU this waits for it)."""
        if (step := int(self.bad_step)) >= 0:
            raise Run.fail(f"non-finite loss at step {step:,}; try lower learning rates")

    def evaluate_and_log(self, step: int, video_dir: Path | None = None) -> dict | None:
        """`evaluate(video_dir)`, logged as eval/*; None when a signal cut it short."""
        result, extra = eval_fields(self.evaluate(video_dir))
        if self.stop:
            return None
        extra = {"eval/" + k.removeprefix("eval_"): v for k, v in extra.items()}
        self.log(step, {"eval/episodic_return": result["eval_mean"], **extra})
        return result

    def end_iteration(self, step: int) -> None:
        """Evaluate and save as their intervals pass (finish() does both at the end); progress."""
        previous = self.step
        self.step = step
        if self.stop or step >= self.total_steps:
            return
        if Run.every(step, previous, self.args.eval_interval):
            self.evaluate_and_log(step)
        if Run.every(step, previous, self.args.checkpoint_interval) and not self.stop:
            self.save(step)  # (a signal during the evaluation: finish() saves)
        if time.time() - self.last_print >= 5:
            self.stop_if_bad()
            self.last_print = time.time()
            sps = self.sps(step)
            recent = f"{np.mean(self.recent):.1f}" if self.recent else "n/a"
            eta = int((self.total_steps - step) / max(sps, 1e-9))
            line = f"step {step:,}/{self.total_steps:,} | {sps:.0f} SPS | return {recent}"
            print(f"{line} | eta {eta // 3600}h{eta % 3600 // 60:02d}m", flush=True)

    def save(self, step: int) -> None:
        """checkpoints/latest.pt: the file's state() and what a resume checks."""
        self.stop_if_bad()  # no checkpoint of non-finite weights
        args = self.args
        meta = {"algo": ALGO, "harness": 1, "env_id": args.env_id, "args": asdict(args)}
        write_atomic(self.checkpoint, {**meta, "global_step": step, **self.state()})

    def finish(self, step: int, **extra) -> None:
        """Save; unless a signal came, evaluate (with videos) and write summary.json: finished."""
        sps = self.sps(step)
        self.save(step)
        result = None if self.stop else self.evaluate_and_log(step, self.video_dir)
        if result is None:
            print(f"interrupted: continue with --resume {self.checkpoint}", flush=True)
            return
        args = self.args
        info = {"script": SCRIPT, "algo": ALGO, "env_id": args.env_id, "seed": args.seed}
        info |= {"global_step": step, "sps": sps, **result, **extra}
        write_atomic(self.run_dir / "summary.json", info)
        print(f"done: {step:,} steps, eval {result['eval_mean']:.2f} -> {self.run_dir}", flush=True)

    def write_eval_only(self, ckpt: dict, result, **extra) -> None:
        """--eval-only's eval.json beside the checkpoint's run: `evaluate`'s result and `extra`."""
        path = self.run_dir / "eval.json"
        info = {
            "script": SCRIPT,
            "algo": ALGO,
            "env_id": ckpt["env_id"],
            "seed": ckpt["args"]["seed"],
        }
        info |= {"checkpoint": str(self.args.checkpoint), "global_step": ckpt["global_step"]}
        info |= {**eval_fields(result)[0], **extra}
        write_atomic(path, info)
        print(f"eval at step {ckpt['global_step']:,}: {info['eval_mean']:.2f} -> {path}")


def catch_stop_signals(caught: list[int]) -> None:
    """Make `caught` true at the first SIGINT or SIGTERM; a second one kills at once."""

    def on_signal(signum, _frame) -> None:
        caught.append(signum)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def write_atomic(path: Path, data: dict) -> None:
    """JSON or torch.save through a temporary file: a kill mid-write leaves the last one whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".json":
        tmp.write_text(json.dumps(data, indent=2))
    else:
        torch.save(data, tmp)
    os.replace(tmp, path)


def eval_fields(result: list[float] | tuple[list[float], dict]) -> tuple[dict, dict]:
    """summary.json's eval_* fields of `evaluate`'s returns or (returns, {"eval_<name>": value}),
    and the extra ones alone."""
    returns, extra = result if isinstance(result, tuple) else (result, {})
    returns = [float(r) for r in returns]
    stats = {"eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns))}
    return {**stats, "eval_episodes": len(returns), "eval_returns": returns, **extra}, extra


if __name__ == "__main__":
    train(tyro.cli(Args))
