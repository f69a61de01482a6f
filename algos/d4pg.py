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
 9. Checkpoints hold the networks, optimizers, replay buffer, priorities, pending n-step windows,
    counters and the state of the two generators the file draws from: torch's (initialisation)
    and numpy's `rng` (noise, random actions, replay and PER sampling); everything is loaded on
    the CPU and copied onto the device by load_state_dict. Env states cannot be restored, so on
    resume the pending windows are flushed as truncated at the saved last observation (the
    episode was cut, as by a time limit) and the envs restart with seed `seed + global_step`.
    SIGINT/SIGTERM skip any evaluation still due, save a checkpoint and exit 0 without
    summary.json; a second one kills at once. Resume and --eval-only write into --run-dir, else
    the folder above the checkpoint's checkpoints/ folder.
10. The support must cover the task's discounted returns: a one-line warning (once per process)
    when the discounted return of an observed episode leaves [v_min, v_max].
11. Evaluation: the deterministic actor without noise, on a separate env, episode i seeded
    `seed + 10_000 + i`.
Deviations from the paper / Acme (a, b, c, e, g chosen for the zoo's 20k-step Pendulum budget):
 a. Adam 3e-4 for the actor and 1e-3 for the critic (Acme 1e-4 for both, set for runs of
    millions of steps). With an actor at 1e-3 too, one Pendulum seed of two kept a start state
    it could not swing up from (final eval -210); at 3e-4 the actor moves after a settled critic.
 b. Soft target updates with tau = 0.005 (Acme copies every 100 updates); same effect, smoother.
 c. Two hidden layers of 256 for both nets (Acme: 256x3 actor, 512-512-256 critic).
 d. No clipping by default; Pendulum needs none. Acme (clipping=True) clips each network's
    gradient to global norm 40 and each sample's dQ/da to L2 norm 1 before the actor step (TF:
    losses.dpg with clip_norm; JAX: rlax.dpg_loss); for a 1-D action such as Pendulum's that is
    the elementwise clip to [-1, 1]. Acme's dQ/da is taken w.r.t. env-scale actions, ours w.r.t.
    [-1, 1]: with bounds [-b, b] Acme's clip 1 is `--dqda-clip b` here (Pendulum: 2; most
    MuJoCo tasks: 1). `--max-grad-norm 40 --dqda-clip b` align with Acme; 0 turns either off.
    On InvertedPendulum-v5 (issue 13; results/issue13-ablations; 30k steps, support [0, 100])
    neither was needed: the defaults held 1000 in every evaluation from 5k-7.5k steps on, one
    938 aside (5 seeds), as did Acme's clips with its noise scale (`--max-grad-norm 40
    --dqda-clip 3 --sigma 0.1`, 3 seeds). Unlike NAF's, this critic cannot diverge: the atoms
    bound Q to [v_min, v_max] (batch mean Q 91-99 after 30k steps, where returns are <= 100).
    Continued to 50k steps (the length of issue 13's run; seeds 1-3 resumed from their 30k
    checkpoints), every evaluation after 30k was 1000 but one 927 at 32.5k (seed 2), with Q at
    98-99: the collapse issue 13 reports was not reproduced on this task.
 e. Uniform random actions for the first `--learning-starts` steps (SB3/CleanRL practice; Acme
    acts with the untrained policy plus noise), which spreads the first data.
 f. Noise scale: `--sigma` is on the [-1, 1] scale, Acme's sigma 0.3 on the env's (its actor ends
    in TanhToSpec). On Pendulum (actions in [-2, 2]) our 0.3 is 0.6 torque units, twice Acme's;
    Acme's noise is `--sigma 0.15` there, and equals ours on tasks with bounds [-1, 1]. Issue 13
    ran TD3's scale 0.1 beside 0.3 on three tasks (results/issue13-ablations), and neither wins
    on all of them, so the default stays 0.3 (Acme's on [-1, 1] tasks):
      HalfCheetah-v5 (100k steps, support [-500, 1500]): 0.1 led 0.3 at every evaluation from
        15k steps on the seed run with both (final 4,424 against 3,708). The zoo's
        d4pg-halfcheetah sets 0.1 for that reason; one seed at 0.3 is too few to conclude.
        With 0.1 its five seeds ended at 4,424, 5,166, 3,665, 3,050 and 4,968 (IQM 4,352;
        RL Zoo's TD3 there: 5,787, 5,940, 4,753, 3,804, 5,886, IQM 5,476); with 1-step
        returns as well (deviation h) they end above TD3's IQM.
      Pendulum-v1 (20k steps, 5 seeds): final IQM -135 with 0.1, -129 with 0.3; every seed
        above -200 with both. No difference beyond seed noise.
      InvertedPendulum-v5 (30k steps, 5 seeds, support [0, 100]): after first reaching 950,
        0.1 fell below it in 6 of 55 evaluations (268 to 908), 0.3 in 1 of 55 (938); the last
        three evaluations held >= 950 on 4 of 5 seeds with 0.1 (seed 5 ended at 908), 5 of 5
        with 0.3.
 g. Support [-1600, 0]: Pendulum rewards lie in [-16.3, 0], and time limits bootstrap, so
    values lie in [-16.3 / (1 - gamma), 0] = [-1630, 0]; a trained agent sees about [-400, 0].
    Other tasks need their own: HalfCheetah (about +12 per step at best): --v-min -500 --v-max 1500.
 h. Horizon n = 5, the paper's and Acme's, is the default. Its returns are not corrected for being
    off-policy: the replay keeps the whole run, so the return of an old transition follows the
    older, noisier policies for n - 1 steps; in exchange, rewards reach the critic n times
    faster. Issue 13 ran `--n-step 1` beside 5 on three tasks (results/issue13-ablations):
      HalfCheetah-v5 (100k steps, `--sigma 0.1`, 5 seeds): final IQM 6,530 with n = 1 against
        4,352 with n = 5 (RL Zoo's TD3 there: 5,476). Seeds: 6,994, 6,714, 6,649, 6,226, 5,639
        against 4,424, 5,166, 3,665, 3,050, 4,968. n = 1 starts slower (IQM at 20k steps
        75 against 1,384) and leads at every 10k evaluation from 40k on.
      Pendulum-v1 (20k steps, 5 seeds): final IQM -141 with n = 1, -129 with n = 5;
        every seed above -160 with both.
      InvertedPendulum-v5 (30k steps, 5 seeds, support [0, 100]): n = 1 first reached 950 at
        7.5k-12.5k steps (n = 5: 5k), then fell below it in 4 of 46 evaluations (50 to 552;
        n = 5: 1 of 55), and held the last three on 4 of 5 seeds (n = 5: 5 of 5).
    Neither n wins on all three, so the default stays the paper's and the zoo's d4pg-halfcheetah
    sets `--n-step 1`. That the bias of old returns is what costs n = 5 on the longer task is
    our reading, not a measurement.

Usage: python algos/d4pg.py --env-id Pendulum-v1 --total-steps 20000 --seed 1
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle OpenMP threads sleep instead of spinning

import copy
import importlib.util
import json
import random
import resource
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
    env_id: str = "Pendulum-v1"
    """Gymnasium id of an environment with Box actions and flat Box observations"""
    seed: int = 1
    """seed of python, numpy, torch and the environments"""
    total_steps: int = 20_000
    """environment steps to train for, summed over envs (may be raised on --resume)"""
    num_envs: int = 1
    """parallel environments, in the role of the paper's parallel actors"""
    torch_deterministic: bool = True
    """use deterministic torch algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    exp_name: str = "d4pg"
    """experiment name, part of the default run dir"""
    run_dir: str | None = None
    """output folder (default runs/<env>__<exp>__<seed>__<unixtime>)"""
    checkpoint_interval: int = 50_000
    """environment steps between checkpoints (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from (its run dir is reused)"""
    eval_episodes: int = 10
    """episodes per deterministic evaluation"""
    eval_interval: int = 5_000
    """environment steps between evaluations (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint (its env, network and seed), write eval.json and exit"""
    checkpoint: str | None = None
    """checkpoint evaluated by --eval-only"""
    capture_video: bool = False
    """record mp4s of the final (or --eval-only) evaluation into <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases (WANDB_MODE=offline works)"""
    wandb_project_name: str = "rl-training"
    """W&B project"""
    # D4PG
    buffer_size: int = 1_000_000
    """replay capacity in n-step transitions"""
    batch_size: int = 256
    """transitions per gradient update"""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor (Acme 1e-4)"""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic (Acme 1e-4)"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 5
    """length n of the n-step returns"""
    num_atoms: int = 51
    """atoms N of the categorical critic"""
    v_min: float = -1600.0
    """lowest atom; cover the task's lowest discounted return"""
    v_max: float = 0.0
    """highest atom; cover the task's highest discounted return"""
    sigma: float = 0.3
    """std of the Gaussian exploration noise on the [-1, 1] action scale (Acme's 0.3 is on the env's scale)"""
    tau: float = 0.005
    """Polyak coefficient of the target networks"""
    learning_starts: int = 1_000
    """environment steps of uniform random actions before the first update"""
    updates_per_step: float = 1.0
    """gradient updates per environment step (summed over envs)"""
    hidden_size: int = 256
    """width of the two hidden layers of both networks"""
    prioritized: bool = False
    """prioritised replay (the paper's variant) instead of uniform (Acme's)"""
    per_alpha: float = 0.6
    """priority exponent alpha"""
    per_beta: float = 0.4
    """initial importance-sampling exponent beta, annealed to 1"""
    dqda_clip: float = 0.0
    """clip each sample's dQ/da to this L2 norm before the actor step (0: off; Acme: the action bound)"""
    max_grad_norm: float = 0.0
    """clip each network's gradient to this global norm (0: off; Acme: 40)"""


# ---------------------------------------------------------------- environment
def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:  # unknown ids and unsupported spaces: one-line errors
    if env_id.startswith("ALE/") and importlib.util.find_spec("ale_py"):  # register the Atari ids, so the message names the fix
        gym.register_envs(importlib.import_module("ale_py"))
    try:
        env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))  # envs without rendering take no render_mode
    except Exception as e:  # unknown id, missing dependency, ...
        raise fail(f"cannot make environment {env_id!r} ({(str(e).strip().splitlines() or [type(e).__name__])[0]}); pass a Gymnasium id such as Pendulum-v1")
    obs_space, act_space, problem = env.observation_space, env.action_space, None
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        problem = f"has {obs_space} observations; d4pg.py needs a flat Box (for images use ppo_atari.py or dqn_atari.py)"
    elif not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1 or not np.isfinite([act_space.low, act_space.high]).all():
        problem = f"has {act_space} actions; d4pg.py needs a 1-D Box with finite bounds (for discrete actions use ppg.py)"
    if problem:
        env.close()
        raise fail(f"{env_id} {problem}")
    return env


def make_envs(env_id: str, num_envs: int, seed: int) -> tuple[gym.vector.SyncVectorEnv, np.ndarray]:
    make_env(env_id).close()  # validate once, before building the copies
    # SAME_STEP autoreset (detail 5): no reset step ever reaches the replay.
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs, _ = envs.reset(seed=seed)
    return envs, obs.astype(np.float32)


def final_observations(next_obs: np.ndarray, infos: dict) -> np.ndarray:  # s_{t+1}: the real last obs where an episode ended
    ended = infos.get("_final_obs", np.zeros(len(next_obs), bool))
    return np.stack([infos["final_obs"][i] if ended[i] else next_obs[i] for i in range(len(next_obs))]).astype(np.float32)


def scale_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:  # the one place [-1, 1] meets the env
    return low + (action + 1.0) * 0.5 * (high - low)


# ---------------------------------------------------------------- networks
def layer_norm_mlp(in_dim: int, hidden: int) -> nn.Sequential:
    # Acme's LayerNormMLP: the LayerNorm + tanh on the first layer keeps unscaled inputs in range.
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.ELU())


class Actor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: int):
        super().__init__()
        self.torso, self.head = layer_norm_mlp(obs_dim, hidden), nn.Linear(hidden, act_dim)
        nn.init.trunc_normal_(self.head.weight, std=1e-4)  # near-zero first actions, as Acme
        nn.init.zeros_(self.head.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.torso(obs)))


class Critic(nn.Module):  # logits of the categorical return distribution Z_w(s, a) over the atoms z
    def __init__(self, obs_dim: int, act_dim: int, hidden: int, num_atoms: int):
        super().__init__()
        self.torso, self.head = layer_norm_mlp(obs_dim + act_dim, hidden), nn.Linear(hidden, num_atoms)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(torch.cat([obs, action], -1)))


# ---------------------------------------------------------------- algorithm
def categorical_projection(R: torch.Tensor, discount: torch.Tensor, p_next: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Phi(R + discount Z'), R [B], discount [B] (gamma^m, or 0 after a termination), p_next [B, N] -> [B, N]."""
    # Each shifted atom Tz_j, clipped to [v_min, v_max], gives its mass p'_j to its two neighbours z_i
    # in proportion to 1 - |Tz_j - z_i| / dz (the triangular kernel; C51's Alg. 1, detail 3).
    b = ((R.unsqueeze(-1) + discount.unsqueeze(-1) * z).clamp(z[0], z[-1]) - z[0]) / (z[1] - z[0])  # Tz_j in atom units
    i = torch.arange(len(z), device=z.device, dtype=z.dtype)  # atom indices
    kernel = (b.unsqueeze(-2) - i.unsqueeze(-1)).abs_().neg_().add_(1).clamp_(min=0)  # [B, N_i, N_j]
    return torch.bmm(kernel, p_next.unsqueeze(-1)).squeeze(-1)


class NStepWindows:
    # The last n (s, a, r) of every env; `add` returns the finished n-step transitions (detail 4).
    # A transition is (s_t, a_t, R, discount, s_{t+m}) with R = sum_k gamma^k r_{t+k} over its m rewards
    # and discount = gamma^m (1 - terminated), so targets need no episode bookkeeping.

    def __init__(self, num_envs: int, n: int, gamma: float, obs_dim: int, act_dim: int):
        self.n, self.gamma = n, gamma
        self.obs, self.actions = np.zeros((num_envs, n, obs_dim), np.float32), np.zeros((num_envs, n, act_dim), np.float32)
        self.rewards, self.count = np.zeros((num_envs, n), np.float64), np.zeros(num_envs, np.int64)
        # G[k, j] = gamma^(j - k) for j >= k: R of the item in slot k is sum_j G[k, j] r_j
        self.G = np.triu(float(gamma) ** (np.arange(n)[None, :] - np.arange(n)[:, None]).astype(np.float64))

    def _transitions(self, emit: np.ndarray, terminated: np.ndarray, real_next_obs: np.ndarray) -> dict:
        slots = np.arange(self.n)
        R = np.where(slots < self.count[:, None], self.rewards, 0.0) @ self.G.T
        discount = self.gamma ** (self.count[:, None] - slots) * (1.0 - terminated[:, None])  # m = count - slot rewards
        return {"obs": self.obs[emit], "actions": self.actions[emit], "returns": R[emit].astype(np.float32), "discounts": discount[emit].astype(np.float32),
                "next_obs": np.broadcast_to(real_next_obs[:, None], self.obs.shape)[emit].astype(np.float32)}

    def add(self, obs, actions, rewards, terminated, truncated, real_next_obs) -> dict:
        envs, slots = np.arange(len(self.count)), np.arange(self.n)
        self.obs[envs, self.count], self.actions[envs, self.count], self.rewards[envs, self.count] = obs, actions, rewards
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

    def flush(self, real_next_obs: np.ndarray) -> dict:  # cut every pending episode here, as a truncation (detail 9)
        out = self._transitions(np.arange(self.n) < self.count[:, None], np.zeros(len(self.count)), real_next_obs)
        self.count[:] = 0
        return out

    def state_dict(self) -> dict:
        return {k: torch.from_numpy(getattr(self, k).copy()) for k in ("obs", "actions", "rewards", "count")}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            getattr(self, k)[:] = v.numpy()


class SumTree:
    # Leaves hold p_i^alpha, every parent the sum of its children (Schaul et al. 2016, App. B.2.1).
    # Sampling and updating a batch cost O(log N) numpy operations: one per tree level.

    def __init__(self, capacity: int):
        self.leaves = 1 << max(capacity - 1, 0).bit_length()
        self.nodes = np.zeros(2 * self.leaves)  # nodes[1] is the root

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        i = np.asarray(idx) + self.leaves
        self.nodes[i] = values
        while i[0] > 1:  # recompute (not add to) parents, so repeated indices stay exact
            i = np.unique(i // 2)
            self.nodes[i] = self.nodes[2 * i] + self.nodes[2 * i + 1]

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        # Stratified: one uniform draw in each of batch_size equal slices of [0, total); returns indices and P(i).
        u, i = (np.arange(batch_size) + rng.random(batch_size)) * (self.nodes[1] / batch_size), np.ones(batch_size, np.int64)
        while i[0] < self.leaves:
            left = self.nodes[2 * i]
            right = (u >= left) & (self.nodes[2 * i + 1] > 0)  # rounding never reaches an empty leaf
            u, i = np.where(right, u - left, u), 2 * i + right
        return i - self.leaves, self.nodes[i] / self.nodes[1]


class ReplayBuffer:
    # Ring buffer of n-step transitions; uniform, or prioritised with a sum tree (detail 7).

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, prioritized: bool, alpha: float):
        self.capacity, self.alpha, self.pos, self.size, self.max_priority = capacity, alpha, 0, 0, 1.0
        shapes = {"obs": (obs_dim,), "actions": (act_dim,), "returns": (), "discounts": (), "next_obs": (obs_dim,)}
        self.data = {k: np.zeros((capacity, *shape), np.float32) for k, shape in shapes.items()}
        self.tree = SumTree(capacity) if prioritized else None

    def add(self, transitions: dict) -> None:
        idx = (self.pos + np.arange(len(transitions["returns"]))) % self.capacity
        for key, array in self.data.items():
            array[idx] = transitions[key]
        self.pos, self.size = (self.pos + len(idx)) % self.capacity, min(self.size + len(idx), self.capacity)
        if self.tree is not None and len(idx):  # new transitions get the largest priority, so each is seen once
            self.tree.update(idx, np.full(len(idx), self.max_priority**self.alpha))

    def sample(self, batch_size: int, beta: float, rng: np.random.Generator, device) -> tuple[np.ndarray, dict, torch.Tensor]:
        # Returns indices, the batch on `device`, and the importance weights w_i = (N P(i))^-beta / max_j w_j.
        if self.tree is None:
            idx, weights = rng.integers(0, self.size, batch_size), np.ones(batch_size, np.float32)
        else:
            idx, P = self.tree.sample(batch_size, rng)
            weights = (self.size * P) ** -beta
            weights = (weights / weights.max()).astype(np.float32)
        batch = {k: torch.from_numpy(v[idx]).to(device) for k, v in self.data.items()}
        return idx, batch, torch.from_numpy(weights).to(device)

    def update_priorities(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        p = np.abs(priorities) + 1e-6  # never zero: every transition stays reachable
        self.tree.update(idx, p**self.alpha)
        self.max_priority = max(self.max_priority, float(p.max()))

    def state_dict(self) -> dict:
        state = {k: torch.from_numpy(v[: self.size].copy()) for k, v in self.data.items()}
        if self.tree is not None:
            state["priorities"] = torch.from_numpy(self.tree.nodes[self.tree.leaves : self.tree.leaves + self.size].copy())
        return {**state, "pos": self.pos, "size": self.size, "max_priority": self.max_priority}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size, self.max_priority = state["pos"], state["size"], state["max_priority"]
        for k, array in self.data.items():
            array[: self.size] = state[k].numpy()
        if self.tree is not None and self.size:
            self.tree.update(np.arange(self.size), state["priorities"].numpy())


def critic_loss(critic: Critic, critic_target: Critic, actor_target: Actor, b: dict, z: torch.Tensor, weights: torch.Tensor):
    # The weighted cross-entropy of p(s_t, a_t) against Phi Y, and each sample's new priority (detail 7).
    with torch.no_grad():  # the target distribution Phi(R + gamma^m Z'(s', pi'(s')))
        p_next = critic_target(b["next_obs"], actor_target(b["next_obs"])).softmax(-1)
        target = categorical_projection(b["returns"], b["discounts"], p_next, z)
    cross_entropy = -(target * critic(b["obs"], b["actions"]).log_softmax(-1)).sum(-1)
    # priority KL(Phi Y || p) = cross-entropy - entropy(Phi Y)
    return (weights * cross_entropy).mean(), cross_entropy.detach() + (target * target.clamp(min=1e-12).log()).sum(-1)


def actor_loss(actor: Actor, critic: Critic, obs: torch.Tensor, z: torch.Tensor, dqda_clip: float):
    # -Q(s, pi(s)) with Q the mean of Z: its gradient is the deterministic policy gradient. Returns it and Q.
    a = actor(obs)
    if dqda_clip > 0:  # a_i receives -dQ/da_i / B: rescale it so that |dQ/da_i| <= dqda_clip, as Acme (deviation d)
        a.register_hook(lambda g: g * (dqda_clip / (len(g) * g.norm(dim=-1, keepdim=True))).clamp(max=1.0))
    q = (critic(obs, a).softmax(-1) * z).sum(-1).mean()
    return -q, q.detach()


def gradient_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, net: nn.Module, max_grad_norm: float) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm > 0:  # Acme's global-norm clip (deviation d)
        nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm)
    optimizer.step()


def update(actor, critic, actor_target, critic_target, actor_optim, critic_optim, b: dict, weights: torch.Tensor, z: torch.Tensor, args: Args):
    # Critic step, actor step, Polyak update of both targets (detail 8); returns the logged metrics and the priorities.
    loss_c, priorities = critic_loss(critic, critic_target, actor_target, b, z, weights)
    gradient_step(critic_optim, loss_c, critic, args.max_grad_norm)
    critic.requires_grad_(False)  # the actor step needs dQ/da only, not critic weight gradients
    loss_a, q = actor_loss(actor, critic, b["obs"], z, args.dqda_clip)
    gradient_step(actor_optim, loss_a, actor, args.max_grad_norm)
    critic.requires_grad_(True)
    with torch.no_grad():
        for p, p_target in zip([*actor.parameters(), *critic.parameters()], [*actor_target.parameters(), *critic_target.parameters()]):
            p_target.lerp_(p, args.tau)
    return {"losses/critic_loss": loss_c.detach(), "losses/actor_loss": loss_a.detach(), "losses/q_values": q}, priorities


def checkpoint_state(nets: dict, buffer, windows, obs: np.ndarray, rng, num_updates: int, updates_due: float, beta_horizon: int) -> dict:
    # Everything detail 9 lists, as plain tensors and numbers.
    return {**{k: v.state_dict() for k, v in nets.items()}, "buffer": buffer.state_dict(), "windows": windows.state_dict(), "last_obs": torch.from_numpy(obs.copy()),
            "rng": rng_state(torch=torch.default_generator, numpy=rng), "num_updates": num_updates, "updates_due": updates_due, "beta_horizon": beta_horizon}


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    check_args(args, [
        (min(args.num_envs, args.batch_size, args.n_step, args.hidden_size) >= 1,
         "--num-envs, --batch-size, --n-step and --hidden-size must be at least 1"),
        (args.buffer_size >= args.batch_size, "--buffer-size must be at least --batch-size"),
        (args.num_atoms >= 2 and args.v_min < args.v_max, "the support needs --num-atoms of at least 2 and --v-min below --v-max"),
        (0 < args.gamma <= 1 and 0 < args.tau <= 1 and 0 <= args.per_beta <= 1, "--gamma and --tau must lie in (0, 1], --per-beta in [0, 1]"),
        (min(args.actor_lr, args.critic_lr, args.updates_per_step) > 0, "--actor-lr, --critic-lr and --updates-per-step must be positive"),
        (min(args.sigma, args.learning_starts, args.per_alpha, args.dqda_clip, args.max_grad_norm) >= 0,
         "--sigma, --learning-starts, --per-alpha, --dqda-clip and --max-grad-norm must be >= 0"),
    ])
    if args.eval_only:
        return eval_only(args)
    seed_everything(args.seed, args.torch_deterministic)
    device, rng = pick_device(args.device), np.random.default_rng(args.seed)  # rng: noise, random actions, replay and PER sampling
    same = ("num_envs", "hidden_size", "num_atoms", "v_min", "v_max", "n_step", "gamma", "buffer_size", "prioritized")  # what the checkpoint's sizes fix
    ckpt = resume_checkpoint(args, same) if args.resume else None
    global_step = ckpt["global_step"] if ckpt else 0
    envs, obs = make_envs(args.env_id, args.num_envs, args.seed + global_step)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    actor = Actor(obs_dim, act_dim, args.hidden_size).to(device)
    critic = Critic(obs_dim, act_dim, args.hidden_size, args.num_atoms).to(device)
    nets = {"actor": actor, "critic": critic, "actor_target": copy.deepcopy(actor), "critic_target": copy.deepcopy(critic),
            "actor_optim": torch.optim.Adam(actor.parameters(), lr=args.actor_lr), "critic_optim": torch.optim.Adam(critic.parameters(), lr=args.critic_lr)}
    z = torch.linspace(args.v_min, args.v_max, args.num_atoms, device=device)  # the atoms z_i
    buffer = ReplayBuffer(args.buffer_size, obs_dim, act_dim, args.prioritized, args.per_alpha)
    windows = NStepWindows(args.num_envs, args.n_step, args.gamma, obs_dim, act_dim)
    num_updates, updates_due, beta_horizon = (ckpt["num_updates"], ckpt["updates_due"], ckpt["beta_horizon"]) if ckpt else (0, 0.0, args.total_steps)
    if ckpt:
        for key, part in {**nets, "buffer": buffer, "windows": windows}.items():
            part.load_state_dict(ckpt[key])  # modules and optimizers copy the CPU tensors onto their device
        set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
        buffer.add(windows.flush(ckpt["last_obs"].numpy()))  # detail 9: the cut episodes end here
    stop = StopSignal()
    with RunLogger(args, run_dir_for(args, args.resume), global_step, resumed=ckpt is not None, device=str(device)) as log:
        (ep_return, ep_length, ep_discounted), discount, metrics, warned = np.zeros((3, args.num_envs)), np.ones(args.num_envs), {}, False
        while global_step < args.total_steps and not stop:
            with torch.inference_mode():
                mu = actor(torch.from_numpy(obs).to(device)).cpu().numpy()
            actions = (rng.uniform(-1.0, 1.0, mu.shape) if global_step < args.learning_starts  # deviation e, then detail 6
                       else np.clip(mu + args.sigma * rng.standard_normal(mu.shape), -1.0, 1.0)).astype(np.float32)
            next_obs, rewards, terminated, truncated, infos = envs.step(scale_action(actions, envs.single_action_space.low, envs.single_action_space.high))
            buffer.add(windows.add(obs, actions, rewards, terminated, truncated, final_observations(next_obs, infos)))
            obs, prev_step, global_step = next_obs.astype(np.float32), global_step, global_step + args.num_envs
            ep_return, ep_length, ep_discounted, discount = ep_return + rewards, ep_length + 1, ep_discounted + discount * rewards, discount * args.gamma
            for i in np.flatnonzero(terminated | truncated):
                log.episode(global_step, ep_return[i], ep_length[i])
                if not warned and not args.v_min <= ep_discounted[i] <= args.v_max:  # detail 10
                    warned = True
                    print(f"{SCRIPT}: warning: an episode's discounted return {ep_discounted[i]:.1f} lies outside the critic support "
                          f"[{args.v_min:g}, {args.v_max:g}]; set --v-min/--v-max to cover the task's returns", file=sys.stderr)
                ep_return[i], ep_length[i], ep_discounted[i], discount[i] = 0.0, 0.0, 0.0, 1.0

            if global_step >= args.learning_starts and buffer.size >= args.batch_size:
                updates_due += args.num_envs * args.updates_per_step
            beta = args.per_beta + (1.0 - args.per_beta) * min(1.0, global_step / beta_horizon)
            while updates_due >= 1:
                updates_due, num_updates = updates_due - 1, num_updates + 1
                idx, batch, weights = buffer.sample(args.batch_size, beta, rng, device)
                metrics, priorities = update(**nets, b=batch, weights=weights, z=z, args=args)
                log.check_finite(metrics["losses/critic_loss"] + metrics["losses/actor_loss"], global_step)
                if buffer.tree is not None:
                    buffer.update_priorities(idx, priorities.cpu().numpy())
            if every(global_step, prev_step, 200) or global_step >= args.total_steps or stop:
                log.scalars(global_step, {"charts/SPS": log.sps(global_step), "charts/learning_rate": args.critic_lr,
                                          "charts/actor_learning_rate": args.actor_lr, "charts/num_updates": num_updates, **metrics})
            if stop:  # save right away: no evaluation, no periodic checkpoint
                break
            if every(global_step, prev_step, args.eval_interval) and global_step < args.total_steps:
                log.scalars(global_step, {"eval/episodic_return": np.mean(evaluate(actor, args.env_id, args.eval_episodes, args.seed, device))})
            if every(global_step, prev_step, args.checkpoint_interval):
                save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(nets, buffer, windows, obs, rng, num_updates, updates_due, beta_horizon))
            log.progress(global_step, args.total_steps)
        envs.close()
        save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(nets, buffer, windows, obs, rng, num_updates, updates_due, beta_horizon))
        if stop:
            return log.interrupted(global_step)
        returns = evaluate(actor, args.env_id, args.eval_episodes, args.seed, device, log.run_dir / "videos" if args.capture_video else None)
        log.scalars(global_step, {"eval/episodic_return": np.mean(returns)})
        log.summary(global_step, returns, num_updates=num_updates)


# ---------------------------------------------------------------- evaluation
def evaluate(actor: Actor, env_id: str, episodes: int, seed: int, device, video_dir: Path | None = None) -> list[float]:
    # Returns of `episodes` episodes of the deterministic actor, without exploration noise (detail 11).
    env = make_env(env_id, render_mode="rgb_array" if video_dir else None)
    env = gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True, name_prefix="eval", disable_logger=True) if video_dir else env
    returns = []
    for i in range(episodes):
        (obs, _), done, returns = env.reset(seed=seed + 10_000 + i), False, returns + [0.0]
        while not done:
            with torch.inference_mode():
                action = actor(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])[0].cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(scale_action(action, env.action_space.low, env.action_space.high))
            returns[-1], done = returns[-1] + float(reward), terminated or truncated
    env.close()
    return returns


def eval_only(args: Args) -> None:
    # With --checkpoint's own env, network and seed: this repeats the run's final evaluation.
    ckpt, device = load_checkpoint(args.checkpoint), pick_device(args.device)
    actor = Actor(ckpt["actor"]["torso.0.weight"].shape[1], ckpt["actor"]["head.weight"].shape[0], ckpt["args"]["hidden_size"]).to(device)
    actor.load_state_dict(ckpt["actor"])
    run_dir = run_dir_for(args, args.checkpoint)
    returns = evaluate(actor, ckpt["env_id"], args.eval_episodes, ckpt["args"]["seed"], device, run_dir / "videos" if args.capture_video else None)
    write_eval_only(run_dir, args, ckpt, returns)


# ===== run harness: the same text, byte for byte, in every file of algos/ (tests/test_harness.py compares them). No algorithm
# knowledge below (errors, checks, device, seeding, checkpoints, RNG state, signals, intervals, logger). Change it in one file, copy to all.
SCRIPT, ALGO = Path(__file__).name, Path(__file__).stem
PROCESS_START = time.time()  # summary.json's wall_time_s counts from here (imports done)


def fail(message: str) -> SystemExit:
    """`raise fail(...)`: one line on stderr, exit status 1 (bad input stops before training)."""
    return SystemExit(f"{SCRIPT}: error: {message}")


def check_args(args, rows: list[tuple[bool, str]]) -> None:
    """Stop at the first false (condition, message) row, common flags first; all rows are computed first, so each must be safe on bad input."""
    common = [
        (args.total_steps > 0, f"--total-steps must be positive, got {args.total_steps}"),
        (args.eval_episodes >= 1, f"--eval-episodes must be at least 1, got {args.eval_episodes}"),
        (min(args.eval_interval, args.checkpoint_interval) >= 0, "--eval-interval and --checkpoint-interval must be >= 0 (0: only at the end)"),
        (not args.eval_only or args.checkpoint is not None, "--eval-only needs --checkpoint PATH"),
        (not (args.eval_only and args.resume), "--eval-only evaluates --checkpoint and cannot --resume; drop one"),
        (args.device != "cuda" or torch.cuda.is_available(), "--device cuda but CUDA is not available; use --device cpu or auto"),
        (not args.track or importlib.util.find_spec("wandb") is not None, "--track needs wandb (pip install wandb), or drop --track"),
    ]
    for ok, message in common + rows:
        if not ok:
            raise fail(message)


def pick_device(name: str) -> torch.device:  # "cuda" without CUDA is refused by check_args
    return torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed the global generators; --torch-deterministic asks for deterministic kernels."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, read when CUDA starts
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic


def rng_state(**generators) -> dict:
    """Exactly the generators a file draws from (numpy or torch ones), plus CUDA's when CUDA is in use."""
    state = {name: g.bit_generator.state if isinstance(g, np.random.Generator) else g.get_state()
             for name, g in generators.items()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, **generators) -> None:
    for name, g in generators.items():  # a numpy Generator's state is a dict, a torch Generator's a tensor
        g.set_state(state[name]) if isinstance(g, torch.Generator) else setattr(g.bit_generator, "state", state[name])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def save_checkpoint(path: Path, args, global_step: int, state: dict) -> None:
    """Plain tensors and containers, written to a temporary file and renamed: a kill leaves the last one whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"algo": ALGO, "harness": 1, "env_id": args.env_id, "args": asdict(args), "global_step": global_step, **state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, env_id: str | None = None) -> dict:
    """Loaded on the CPU with weights_only=True (a stranger's checkpoint cannot run code); the algorithm
    moves what it needs to its device. Refuses another script's or another environment's checkpoint."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # mapped: a replay is read when used
    except FileNotFoundError:
        raise fail(f"checkpoint {path} does not exist; pass the path of a checkpoints/latest.pt")
    except Exception as e:
        raise fail(f"cannot read checkpoint {path} ({type(e).__name__}); it is corrupt or not a checkpoint")
    if not isinstance(ckpt, dict) or not {"algo", "env_id", "args", "global_step"} <= ckpt.keys():
        raise fail(f"{path} is not a checkpoint written by this library; pass a checkpoints/latest.pt")
    elif ckpt["algo"] != ALGO:
        raise fail(f"checkpoint {path} was written by {ckpt['algo']}.py, not {SCRIPT}; use {ckpt['algo']}.py")
    if env_id is not None and ckpt["env_id"] != env_id:
        raise fail(f"checkpoint {path} is for {ckpt['env_id']}, not {env_id}; pass --env-id {ckpt['env_id']}")
    return ckpt


def resume_checkpoint(args, same: tuple[str, ...]) -> dict:
    """--resume's checkpoint; refused below its step or when an argument in `same` (sizes of what it holds) differs."""
    ckpt = load_checkpoint(args.resume, args.env_id)
    if ckpt.get("harness") != 1:
        raise fail(f"checkpoint {args.resume} was written by an older {SCRIPT} whose checkpoints this one cannot continue; resume it with that version")
    if args.total_steps < ckpt["global_step"]:
        raise fail(f"--total-steps {args.total_steps} is below the checkpoint's step {ckpt['global_step']}; pass at least that")
    for key in same:
        flag, theirs = "--" + key.replace("_", "-"), ckpt["args"].get(key)
        was = (flag if theirs else "--no-" + flag[2:]) if isinstance(theirs, bool) else f"{flag} {theirs}"  # tyro spells a boolean --x / --no-x
        if theirs != getattr(args, key):  # an older checkpoint may lack a flag added since: say so, no KeyError
            raise fail(f"checkpoint {args.resume} " + (f"was made with {was}, not {getattr(args, key)}; pass {was}" if key in ckpt["args"]
                                                        else f"predates {flag}; continue it with the {SCRIPT} that wrote it"))
    return ckpt


def run_dir_for(args, checkpoint: str | None) -> Path:
    """--run-dir if given; for a resume or --eval-only, the folder that holds the checkpoint's
    checkpoints/ folder where it lies now; else runs/<env>__<exp>__<seed>__<unix time>."""
    if args.run_dir:
        return Path(args.run_dir)
    if checkpoint:
        folder = Path(checkpoint).resolve().parent
        return folder.parent if folder.name == "checkpoints" else folder
    return Path(f"runs/{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}")


def write_eval_only(run_dir: Path, args, ckpt: dict, returns: list[float], **extra) -> None:
    """eval.json of --eval-only, beside the run's own outputs."""
    result = {"script": SCRIPT, "algo": ALGO, "env_id": ckpt["env_id"], "seed": ckpt["args"]["seed"],
              "checkpoint": str(args.checkpoint), "global_step": ckpt["global_step"], **eval_stats(returns), **extra}
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "eval.json", result)
    print(f"eval at step {ckpt['global_step']:,}: {result['eval_mean']:.2f} +- {result['eval_std']:.2f} -> {run_dir / 'eval.json'}")


def eval_stats(returns: list[float]) -> dict:  # the evaluation fields of summary.json and eval.json
    return {"eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)),
            "eval_episodes": len(returns), "eval_returns": [float(r) for r in returns]}


class StopSignal:
    """True after the first SIGINT or SIGTERM (the loop checkpoints and leaves); a second one kills at once."""

    def __init__(self):
        self.signum = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        self.signum = signum
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    def __bool__(self) -> bool:
        return self.signum is not None


def every(step: int, previous_step: int, interval: int) -> bool:
    """True when a multiple of `interval` lies in (previous_step, step]; never when interval is 0."""
    return interval > 0 and step // interval != previous_step // interval


class RunLogger:
    """TensorBoard events (and W&B with --track), config.json, the progress line and summary.json of
    one run. `with RunLogger(...) as log:` finishes the W&B run with the right exit code on every way out.
    SPS counts this process's env steps over its training loop: the last sps() call marks the loop's end."""

    def __init__(self, args, run_dir: Path, start_step: int, resumed: bool, **config):
        self.args, self.run_dir, self.start_step = args, run_dir, start_step
        self.checkpoint = run_dir / "checkpoints" / "latest.pt"
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "config.json", {**asdict(args), "run_dir": str(run_dir), **config})
        self.wandb = importlib.import_module("wandb") if args.track else None  # optional: imported only when asked
        if self.wandb is not None:
            self.wandb.init(project=args.wandb_project_name, config={**asdict(args), **config}, sync_tensorboard=True,
                            dir=str(run_dir), name=run_dir.name, mode=os.environ.get("WANDB_MODE", "online"), resume="allow")
        # purge_step: points after the checkpoint's step came from after the save; hide them on resume.
        self.writer = SummaryWriter(str(run_dir), purge_step=start_step + 1 if resumed else None)
        if not resumed:
            table = "\n".join(f"|{k}|{v}|" for k, v in {**asdict(args), **config}.items())
            self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        self.recent: deque = deque(maxlen=20)
        self.loop_start = self.loop_end = self.last_print = time.time()

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, kind, error, _traceback) -> None:
        self.writer.close()
        if self.wandb is not None:
            failed = kind is not None and not (kind is SystemExit and error.code in (0, None))
            self.wandb.finish(exit_code=1 if failed else 0)

    def scalars(self, step: int, values: dict) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, float(value), step)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        self.scalars(step, {"charts/episodic_return": episodic_return, "charts/episodic_length": length})
        self.recent.append(float(episodic_return))

    def sps(self, step: int) -> float:
        self.loop_end = time.time()
        return (step - self.start_step) / max(self.loop_end - self.loop_start, 1e-9)

    def progress(self, step: int, total_steps: int) -> None:
        if time.time() - self.last_print < 5:
            return
        self.last_print = time.time()
        sps, ret = self.sps(step), f"{np.mean(self.recent):.1f}" if self.recent else "n/a"
        eta = (total_steps - step) / max(sps, 1e-9)
        print(f"step {step:,}/{total_steps:,} | {sps:.0f} SPS | return {ret} | eta {int(eta // 3600)}h{int(eta % 3600 // 60):02d}m", flush=True)

    def check_finite(self, value: torch.Tensor, step: int) -> None:
        if not torch.isfinite(value).all():
            raise fail(f"non-finite loss at step {step:,} (the last good checkpoint, if any, is kept: {self.checkpoint}); try lower learning rates")

    def interrupted(self, step: int) -> None:
        print(f"interrupted: checkpoint saved at step {step:,} to {self.checkpoint}; continue with --resume {self.checkpoint}", flush=True)

    def summary(self, step: int, returns: list[float], **extra) -> None:
        """summary.json, written only by a finished run (its presence means "finished")."""
        write_json(self.run_dir / "summary.json", {
            "script": SCRIPT, "algo": ALGO, "env_id": self.args.env_id, "seed": self.args.seed, "global_step": step,
            **eval_stats(returns), "wall_time_s": time.time() - PROCESS_START,
            "sps": (step - self.start_step) / max(self.loop_end - self.loop_start, 1e-9),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra})
        print(f"done: {step:,} steps, eval {np.mean(returns):.2f} +- {np.std(returns):.2f} -> {self.run_dir}", flush=True)

if __name__ == "__main__":
    train(tyro.cli(Args))
