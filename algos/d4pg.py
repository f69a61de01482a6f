"""D4PG: Distributed Distributional Deterministic Policy Gradients, in one file.

Paper: Gabriel Barth-Maron, Matthew W. Hoffman, David Budden, Will Dabney, Dan Horgan, Dhruva TB,
Alistair Muldal, Nicolas Heess, Timothy Lillicrap, "Distributed Distributional Deterministic
Policy Gradients", ICLR 2018, arXiv:1804.08617. Reference code: DeepMind Acme (agents/tf/d4pg).

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
    actor. Exploration: a + N(0, sigma^2) on the [-1, 1] scale, clipped (paper, Acme sigma 0.3).
 7. Replay: uniform (Acme's default) or `--prioritized` (the paper's): a sum tree over p_i^alpha,
    stratified sampling, new transitions at the largest priority so far, priority = per-sample
    KL(Phi Y || p) (Rainbow's choice for a distributional critic; the cross-entropy would keep
    the entropy of Phi Y as a floor), weights normalised by the batch maximum, beta annealed
    linearly from `--per-beta` to 1 over `--total-steps`. Only the critic loss is weighted.
 8. `--updates-per-step` counts gradient updates per environment step summed over envs, so the
    replay ratio does not change with `--num-envs`. Each update: a critic step, then an actor
    step on the same batch, then the Polyak update of both target networks.
 9. Checkpoints hold the replay buffer, its priorities and the pending n-step windows. Env states
    cannot be restored, so on resume the pending windows are flushed as truncated at the saved
    last observation (the episode was cut, as by a time limit) and the envs restart with seed
    `seed + global_step`. SIGINT/SIGTERM skip any evaluation still due, save a checkpoint and
    exit 0 without summary.json; a second Ctrl-C kills at once. Resume and --eval-only write into
    --run-dir, else the folder above the checkpoint's checkpoints/ folder.
10. The support must cover the task's discounted returns: a one-line warning (once) when the
    discounted return of an observed episode leaves [v_min, v_max].
11. Evaluation: the deterministic actor without noise, on a separate env, episode i seeded
    `seed + 10_000 + i`.
Deviations from the paper / Acme, all for a 20k-step Pendulum budget (the zoo preset):
 a. Adam 3e-4 for the actor and 1e-3 for the critic (Acme 1e-4 for both, set for runs of
    millions of steps). With an actor at 1e-3 too, one Pendulum seed of two kept a start state
    it could not swing up from (final eval -210); at 3e-4 the actor moves after a settled critic.
 b. Soft target updates with tau = 0.005 (Acme copies every 100 updates); same effect, smoother.
 c. Two hidden layers of 256 for both nets (Acme: 256x3 actor, 512-512-256 critic), and no
    gradient clipping (Acme clips at 40): Pendulum needs no more, and updates are cheaper.
 d. Uniform random actions for the first `--learning-starts` steps (SB3/CleanRL practice; Acme
    acts with the untrained policy plus noise), which spreads the first data.
 e. Support [-1600, 0]: Pendulum rewards lie in [-16.3, 0], and time limits bootstrap, so
    values lie in [-16.3 / (1 - gamma), 0] = [-1630, 0]; a trained agent sees about [-400, 0].
    Other tasks need their own: HalfCheetah (about +12 per step at best): --v-min -500 --v-max 1500.

Usage: python algos/d4pg.py --env-id Pendulum-v1 --total-steps 20000 --seed 1
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter

SCRIPT = os.path.basename(__file__)


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
    run_dir: Optional[str] = None
    """output folder (default runs/<env>__<exp>__<seed>__<unixtime>)"""
    checkpoint_interval: int = 50_000
    """environment steps between checkpoints (0: only at the end)"""
    resume: Optional[str] = None
    """checkpoint to continue from (its run dir is reused)"""
    eval_episodes: int = 10
    """episodes per deterministic evaluation"""
    eval_interval: int = 5_000
    """environment steps between evaluations (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint (its env, network and seed), write eval.json and exit"""
    checkpoint: Optional[str] = None
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
    """std of the Gaussian exploration noise on the [-1, 1] action scale"""
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


def fail(message: str) -> SystemExit:
    """The one-line error of a bad input: `raise fail(...)`."""
    return SystemExit(f"{SCRIPT}: error: {message}")


def validate(args: Args) -> None:
    checks = [
        (args.total_steps >= 1, "--total-steps must be at least 1"),
        (args.num_envs >= 1, "--num-envs must be at least 1"),
        (args.batch_size >= 1, "--batch-size must be at least 1"),
        (args.buffer_size >= args.batch_size, "--buffer-size must be at least --batch-size"),
        (args.n_step >= 1, "--n-step must be at least 1"),
        (args.num_atoms >= 2, "--num-atoms must be at least 2"),
        (args.v_min < args.v_max, "--v-min must be below --v-max"),
        (0 < args.gamma <= 1, "--gamma must lie in (0, 1]"),
        (0 < args.tau <= 1, "--tau must lie in (0, 1]"),
        (args.sigma >= 0, "--sigma must be non-negative"),
        (args.actor_lr > 0 and args.critic_lr > 0, "--actor-lr and --critic-lr must be positive"),
        (args.learning_starts >= 0, "--learning-starts must be non-negative"),
        (args.updates_per_step > 0, "--updates-per-step must be positive"),
        (args.hidden_size >= 1, "--hidden-size must be at least 1"),
        (args.per_alpha >= 0, "--per-alpha must be non-negative"),
        (0 <= args.per_beta <= 1, "--per-beta must lie in [0, 1]"),
        (args.eval_episodes >= 1, "--eval-episodes must be at least 1"),
        (args.eval_interval >= 0 and args.checkpoint_interval >= 0,
         "--eval-interval and --checkpoint-interval must be non-negative (0: only at the end)"),
        (args.device in ("auto", "cpu", "cuda"), f"--device must be auto, cpu or cuda, not {args.device!r}"),
        (not (args.device == "cuda" and not torch.cuda.is_available()), "--device cuda but no CUDA device is visible"),
        (not args.eval_only or args.checkpoint, "--eval-only needs --checkpoint PATH"),
    ]
    for ok, message in checks:
        if not ok:
            raise fail(f"{message}; fix the value and rerun")


# ---------------------------------------------------------------- environment
def env_spaces(env_id: str) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Make one env to check its spaces; returns obs_dim, act_dim and the action bounds."""
    if env_id.startswith("ALE/"):  # register the Atari ids so that the message below names the fix
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            pass
    try:
        env = gym.make(env_id)
    except Exception as e:  # unknown id, missing dependency, ...
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise fail(f"cannot make environment {env_id!r} ({reason}); pass a Gymnasium id such as Pendulum-v1")
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) >= 2:
        raise fail(f"{env_id} has image observations {obs_space.shape}; d4pg.py takes flat vectors, use ppo_atari.py or dqn_atari.py for image/Atari envs")
    if not isinstance(act_space, gym.spaces.Box):
        raise fail(f"{env_id} has a {type(act_space).__name__} action space; d4pg.py needs continuous (Box) actions, use ppg.py for discrete actions with vector observations")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise fail(f"{env_id} has a {type(obs_space).__name__} observation space; d4pg.py needs a flat Box, flatten it with a wrapper")
    if len(act_space.shape) != 1 or not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        raise fail(f"{env_id} has an unbounded or non-flat action space; d4pg.py needs a 1-D Box with finite bounds")
    return obs_space.shape[0], act_space.shape[0], act_space.low.astype(np.float32), act_space.high.astype(np.float32)


def make_envs(env_id: str, num_envs: int) -> gym.vector.SyncVectorEnv:
    # SAME_STEP autoreset (detail 5): no reset step ever reaches the replay.
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def final_observations(next_obs: np.ndarray, infos: dict) -> np.ndarray:
    """s_{t+1} of every env: for an env whose episode just ended, the real last observation."""
    real_next_obs = next_obs.copy()
    if "_final_obs" in infos:
        for i in np.flatnonzero(infos["_final_obs"]):
            real_next_obs[i] = infos["final_obs"][i]
    return real_next_obs


def scale_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The one place where actions in [-1, 1] become the env's [low, high]."""
    return low + (action + 1.0) * 0.5 * (high - low)


# ---------------------------------------------------------------- networks
def layer_norm_mlp(in_dim: int, hidden: int) -> nn.Sequential:
    # Acme's LayerNormMLP: the LayerNorm + tanh on the first layer keeps unscaled inputs in range.
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.ELU())


class Actor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: int):
        super().__init__()
        self.torso = layer_norm_mlp(obs_dim, hidden)
        self.head = nn.Linear(hidden, act_dim)
        nn.init.trunc_normal_(self.head.weight, std=1e-4)  # near-zero first actions, as Acme
        nn.init.zeros_(self.head.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.torso(obs)))


class Critic(nn.Module):
    """Logits of the categorical return distribution Z_w(s, a) over the atoms z."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, num_atoms: int):
        super().__init__()
        self.torso = layer_norm_mlp(obs_dim + act_dim, hidden)
        self.head = nn.Linear(hidden, num_atoms)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(torch.cat([obs, action], -1)))


# ---------------------------------------------------------------- algorithm
def categorical_projection(R: torch.Tensor, discount: torch.Tensor, p_next: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Phi(R + discount * Z'): the shifted target distribution projected back onto the atoms z.

    R [B], discount [B] (gamma^m, or 0 after a termination), p_next [B, N] -> [B, N].
    Each shifted atom Tz_j, clipped to [v_min, v_max], gives its mass p'_j to its two neighbours
    z_i in proportion to 1 - |Tz_j - z_i| / dz (the triangular kernel; C51's Alg. 1).
    """
    dz = z[1] - z[0]
    b = ((R.unsqueeze(-1) + discount.unsqueeze(-1) * z).clamp(z[0], z[-1]) - z[0]) / dz  # Tz_j in atom units
    i = torch.arange(len(z), device=z.device, dtype=z.dtype)
    kernel = (b.unsqueeze(-2) - i.unsqueeze(-1)).abs_().neg_().add_(1).clamp_(min=0)  # [B, N_i, N_j]
    return torch.bmm(kernel, p_next.unsqueeze(-1)).squeeze(-1)


class NStepWindows:
    """The last n (s, a, r) of every env; `add` returns the finished n-step transitions.

    A transition is (s_t, a_t, R, discount, s_{t+m}) with R = sum_k gamma^k r_{t+k} over its m
    rewards and discount = gamma^m (1 - terminated), so targets need no episode bookkeeping.
    """

    def __init__(self, num_envs: int, n: int, gamma: float, obs_dim: int, act_dim: int):
        self.n, self.gamma = n, gamma
        self.obs = np.zeros((num_envs, n, obs_dim), np.float32)
        self.actions = np.zeros((num_envs, n, act_dim), np.float32)
        self.rewards = np.zeros((num_envs, n), np.float64)
        self.count = np.zeros(num_envs, np.int64)
        k = np.arange(n)
        # G[k, j] = gamma^(j - k) for j >= k: R of the item in slot k is sum_j G[k, j] r_j
        self.G = np.triu(float(gamma) ** (k[None, :] - k[:, None]).astype(np.float64))

    def _transitions(self, emit: np.ndarray, terminated: np.ndarray, real_next_obs: np.ndarray) -> dict:
        slots = np.arange(self.n)
        valid = slots < self.count[:, None]
        R = np.where(valid, self.rewards, 0.0) @ self.G.T
        m = self.count[:, None] - slots  # number of rewards in each slot's return
        discount = self.gamma ** m * (1.0 - terminated[:, None])
        next_obs = np.broadcast_to(real_next_obs[:, None], self.obs.shape)
        return {"obs": self.obs[emit], "actions": self.actions[emit], "returns": R[emit].astype(np.float32),
                "discounts": discount[emit].astype(np.float32), "next_obs": next_obs[emit].astype(np.float32)}

    def add(self, obs, actions, rewards, terminated, truncated, real_next_obs) -> dict:
        envs = np.arange(len(self.count))
        self.obs[envs, self.count], self.actions[envs, self.count] = obs, actions
        self.rewards[envs, self.count] = rewards
        self.count += 1
        done, full = terminated | truncated, self.count == self.n
        slots = np.arange(self.n)
        # a full window gives its oldest item; an ended episode gives every item it holds
        emit = (slots < self.count[:, None]) & (done[:, None] | (full[:, None] & (slots == 0)))
        out = self._transitions(emit, terminated.astype(np.float64), real_next_obs)
        slide = full & ~done
        for array in (self.obs, self.actions, self.rewards):
            array[slide] = np.roll(array[slide], -1, axis=1)
        self.count[slide] -= 1
        self.count[done] = 0
        return out

    def flush(self, real_next_obs: np.ndarray) -> dict:
        """Cut every pending episode here, as a truncation bootstrapped from `real_next_obs`."""
        out = self._transitions(np.arange(self.n) < self.count[:, None], np.zeros(len(self.count)), real_next_obs)
        self.count[:] = 0
        return out

    def state_dict(self) -> dict:
        return {k: torch.from_numpy(getattr(self, k).copy()) for k in ("obs", "actions", "rewards", "count")}

    def load_state_dict(self, state: dict) -> None:
        for k in ("obs", "actions", "rewards", "count"):
            getattr(self, k)[:] = state[k].numpy()


class SumTree:
    """Leaves hold p_i^alpha, every parent the sum of its children (Schaul et al. 2016, App. B.2.1).

    Sampling and updating a batch cost O(log N) numpy operations: one per tree level.
    """

    def __init__(self, capacity: int):
        self.leaves = 1 << max(capacity - 1, 0).bit_length()
        self.nodes = np.zeros(2 * self.leaves)  # nodes[1] is the root

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        i = np.asarray(idx) + self.leaves
        self.nodes[i] = values
        while i[0] > 1:  # recompute (not add to) parents, so repeated indices stay exact
            i = np.unique(i // 2)
            self.nodes[i] = self.nodes[2 * i] + self.nodes[2 * i + 1]

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Stratified: one uniform draw in each of batch_size equal slices of [0, total)."""
        u = (np.arange(batch_size) + rng.random(batch_size)) * (self.total / batch_size)
        i = np.ones(batch_size, np.int64)
        while i[0] < self.leaves:
            left = self.nodes[2 * i]
            right = (u >= left) & (self.nodes[2 * i + 1] > 0)  # rounding never reaches an empty leaf
            u = np.where(right, u - left, u)
            i = 2 * i + right
        return i - self.leaves, self.nodes[i] / self.total


class ReplayBuffer:
    """Ring buffer of n-step transitions; uniform, or prioritised with a sum tree."""

    KEYS = ("obs", "actions", "returns", "discounts", "next_obs")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, prioritized: bool, alpha: float):
        self.capacity, self.alpha, self.pos, self.size = capacity, alpha, 0, 0
        shapes = {"obs": (obs_dim,), "actions": (act_dim,), "returns": (), "discounts": (), "next_obs": (obs_dim,)}
        self.data = {k: np.zeros((capacity, *shapes[k]), np.float32) for k in self.KEYS}
        self.tree = SumTree(capacity) if prioritized else None
        self.max_priority = 1.0

    def add(self, transitions: dict) -> None:
        k = len(transitions["returns"])
        if k == 0:
            return
        idx = (self.pos + np.arange(k)) % self.capacity
        for key in self.KEYS:
            self.data[key][idx] = transitions[key]
        self.pos, self.size = (self.pos + k) % self.capacity, min(self.size + k, self.capacity)
        if self.tree is not None:  # new transitions get the largest priority, so each is seen once
            self.tree.update(idx, np.full(k, self.max_priority**self.alpha))

    def sample(self, batch_size: int, beta: float, rng: np.random.Generator):
        """Indices, the batch, and the importance weights w_i = (N P(i))^-beta / max_j w_j."""
        if self.tree is None:
            idx = rng.integers(0, self.size, batch_size)
            weights = np.ones(batch_size, np.float32)
        else:
            idx, P = self.tree.sample(batch_size, rng)
            weights = (self.size * P) ** -beta
            weights = (weights / weights.max()).astype(np.float32)
        return idx, {k: v[idx] for k, v in self.data.items()}, weights

    def update_priorities(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        p = np.abs(priorities) + 1e-6  # never zero: every transition stays reachable
        self.tree.update(idx, p**self.alpha)
        self.max_priority = max(self.max_priority, float(p.max()))

    def state_dict(self) -> dict:
        state = {k: torch.from_numpy(v[: self.size].copy()) for k, v in self.data.items()}
        state.update(pos=self.pos, size=self.size, max_priority=self.max_priority)
        if self.tree is not None:
            state["priorities"] = torch.from_numpy(self.tree.nodes[self.tree.leaves : self.tree.leaves + self.size].copy())
        return state

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size, self.max_priority = state["pos"], state["size"], state["max_priority"]
        for k in self.KEYS:
            self.data[k][: self.size] = state[k].numpy()
        if self.tree is not None and self.size:
            self.tree.update(np.arange(self.size), state["priorities"].numpy())


# ---------------------------------------------------------------- checkpoints and evaluation
COMPATIBLE = ("env_id", "num_envs", "hidden_size", "num_atoms", "v_min", "v_max", "n_step", "gamma", "buffer_size", "prioritized")


def checkpoint_run_dir(path: str) -> str:
    """The run dir of a checkpoint: the folder above its checkpoints/ folder (else its own folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.dirname(folder) if os.path.basename(folder) == "checkpoints" else folder


def load_checkpoint(path: str) -> dict:
    if not os.path.isfile(path):
        raise fail(f"checkpoint {path} does not exist; pass a checkpoints/latest.pt written by {SCRIPT}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise fail(f"cannot read checkpoint {path} ({type(e).__name__}); the file is corrupt or not a checkpoint")
    if not isinstance(ckpt, dict) or ckpt.get("algo") != "d4pg":
        algo = ckpt.get("algo") if isinstance(ckpt, dict) else None
        raise fail(f"checkpoint {path} was written by {algo!r}, not d4pg; pass a checkpoint of {SCRIPT}")
    return ckpt


def save_atomic(obj, path: str) -> None:
    tmp = f"{path}.tmp"
    if path.endswith(".json"):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)
    else:
        torch.save(obj, tmp)
    os.replace(tmp, path)  # a kill at any moment leaves the previous file intact


def evaluate(actor: Actor, env_id: str, episodes: int, seed: int, device, video_dir: Optional[str] = None) -> list[float]:
    """Returns of `episodes` episodes of the deterministic actor (no exploration noise)."""
    env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, video_dir, episode_trigger=lambda _: True, name_prefix="eval")
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                action = actor(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])[0].cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(scale_action(action, low, high))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def eval_only(args: Args, device: torch.device) -> None:
    ckpt = load_checkpoint(args.checkpoint)
    cfg = ckpt["args"]
    obs_dim, act_dim, _, _ = env_spaces(cfg["env_id"])
    actor = Actor(obs_dim, act_dim, cfg["hidden_size"]).to(device)
    actor.load_state_dict(ckpt["actor"])
    run_dir = args.run_dir or checkpoint_run_dir(args.checkpoint)
    os.makedirs(run_dir, exist_ok=True)
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    returns = evaluate(actor, cfg["env_id"], args.eval_episodes, cfg["seed"], device, video_dir)
    result = {"script": SCRIPT, "algo": "d4pg", "env_id": cfg["env_id"], "seed": cfg["seed"], "checkpoint": args.checkpoint,
              "global_step": ckpt["global_step"], "eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)),
              "eval_episodes": len(returns), "eval_returns": returns}
    save_atomic(result, os.path.join(run_dir, "eval.json"))
    print(f"eval {cfg['env_id']} step {ckpt['global_step']:,}: {result['eval_mean']:.1f} +- {result['eval_std']:.1f} over {len(returns)} episodes")


def install_stop_handlers() -> dict:
    """SIGINT/SIGTERM set stop["signal"]; the loop saves and leaves at its next safe point.
    After the first signal, SIGINT is back to its default, so a second Ctrl-C kills at once."""
    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signum
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    """Train (or --eval-only); a W&B run is finished on every way out, errors included."""
    ok = False
    try:
        run_training(args)
        ok = True
    finally:
        wandb = sys.modules.get("wandb")
        if args.track and wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish(exit_code=0 if ok else 1)


def run_training(args: Args) -> None:
    t_start = time.time()  # wall_time_s: the whole process, from here to summary.json
    validate(args)
    if args.torch_deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic cuBLAS
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    if args.eval_only:
        return eval_only(args, device)
    if args.track:  # before anything is written
        try:
            import wandb
        except ImportError:
            raise fail("--track needs the wandb package; install it or drop --track")
    ckpt = load_checkpoint(args.resume) if args.resume else None
    if ckpt is not None:
        for key in COMPATIBLE:
            if ckpt["args"][key] != getattr(args, key):
                flag = "--" + key.replace("_", "-")
                raise fail(f"checkpoint {args.resume} has {flag} {ckpt['args'][key]}, not {getattr(args, key)}; resume with the checkpoint's value")
        if args.total_steps < ckpt["global_step"]:
            raise fail(f"checkpoint {args.resume} is at step {ckpt['global_step']}, beyond --total-steps {args.total_steps}; pass --total-steps {ckpt['global_step']} or more")
    obs_dim, act_dim, low, high = env_spaces(args.env_id)

    default_dir = checkpoint_run_dir(args.resume) if ckpt else f"runs/{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = args.run_dir or default_dir
    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    ckpt_path = os.path.join(run_dir, "checkpoints", "latest.pt")
    if args.track:
        wandb.init(project=args.wandb_project_name, config=vars(args), sync_tensorboard=True, dir=run_dir,
                   name=os.path.basename(run_dir), mode=os.environ.get("WANDB_MODE", "online"))
    stop = install_stop_handlers()
    save_atomic({**asdict(args), "run_dir": run_dir, "device": str(device)}, os.path.join(run_dir, "config.json"))

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(args.torch_deterministic)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    rng = np.random.default_rng(args.seed)  # exploration noise, random actions and replay sampling

    envs = make_envs(args.env_id, args.num_envs)
    actor = Actor(obs_dim, act_dim, args.hidden_size).to(device)
    critic = Critic(obs_dim, act_dim, args.hidden_size, args.num_atoms).to(device)
    actor_target = Actor(obs_dim, act_dim, args.hidden_size).to(device)
    critic_target = Critic(obs_dim, act_dim, args.hidden_size, args.num_atoms).to(device)
    actor_target.load_state_dict(actor.state_dict())
    critic_target.load_state_dict(critic.state_dict())
    actor_optim = torch.optim.Adam(actor.parameters(), lr=args.actor_lr)
    critic_optim = torch.optim.Adam(critic.parameters(), lr=args.critic_lr)
    z = torch.linspace(args.v_min, args.v_max, args.num_atoms, device=device)  # the atoms z_i
    buffer = ReplayBuffer(args.buffer_size, obs_dim, act_dim, args.prioritized, args.per_alpha)
    windows = NStepWindows(args.num_envs, args.n_step, args.gamma, obs_dim, act_dim)
    global_step, num_updates, updates_due = 0, 0, 0.0

    if ckpt is not None:
        for net, key in ((actor, "actor"), (critic, "critic"), (actor_target, "actor_target"), (critic_target, "critic_target"),
                         (actor_optim, "actor_optim"), (critic_optim, "critic_optim"), (buffer, "buffer"), (windows, "windows")):
            net.load_state_dict(ckpt[key])
        global_step, num_updates, updates_due = ckpt["global_step"], ckpt["num_updates"], ckpt["updates_due"]
        py_state = ckpt["rng"]["python"]
        random.setstate((py_state[0], tuple(py_state[1]), py_state[2]))
        rng.bit_generator.state = json.loads(ckpt["rng"]["numpy"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        buffer.add(windows.flush(ckpt["last_obs"].numpy()))  # detail 9: the cut episodes end here
    obs, _ = envs.reset(seed=args.seed + global_step)
    obs = obs.astype(np.float32)

    def checkpoint_state() -> dict:
        py_state = random.getstate()
        return {"algo": "d4pg", "script": SCRIPT, "env_id": args.env_id, "args": asdict(args), "run_dir": run_dir,
                "global_step": global_step, "num_updates": num_updates, "updates_due": updates_due,
                "actor": actor.state_dict(), "critic": critic.state_dict(), "actor_target": actor_target.state_dict(),
                "critic_target": critic_target.state_dict(), "actor_optim": actor_optim.state_dict(),
                "critic_optim": critic_optim.state_dict(), "buffer": buffer.state_dict(), "windows": windows.state_dict(),
                "last_obs": torch.from_numpy(obs.copy()),
                "rng": {"python": [py_state[0], list(py_state[1]), py_state[2]], "numpy": json.dumps(rng.bit_generator.state),
                        "torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else []}}

    # purge what a killed process logged after its checkpoint; points at the checkpoint's step stay
    writer = SummaryWriter(run_dir, purge_step=global_step + 1 if ckpt else None)
    if ckpt is None:
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))
    nonfinite = torch.zeros((), dtype=torch.bool, device=device)

    def check_finite() -> None:
        if nonfinite.item():
            raise fail(f"non-finite loss by step {global_step:,}; the last good checkpoint (if any) is {ckpt_path}, lower the learning rates")

    episode_return, episode_length = np.zeros(args.num_envs), np.zeros(args.num_envs, np.int64)
    discounted_return, discount_power = np.zeros(args.num_envs), np.ones(args.num_envs)
    recent_returns, support_warned = deque(maxlen=20), False
    start_step, log_every = global_step, 200
    loop_start = last_print = time.time()  # sps: env steps per second of this loop only
    critic_loss = actor_loss = q_value = None

    while global_step < args.total_steps and stop["signal"] is None:
        if global_step < args.learning_starts:
            actions = rng.uniform(-1.0, 1.0, (args.num_envs, act_dim)).astype(np.float32)
        else:
            with torch.inference_mode():
                actions = actor(torch.from_numpy(obs).to(device)).cpu().numpy()
            actions = np.clip(actions + args.sigma * rng.standard_normal(actions.shape), -1.0, 1.0).astype(np.float32)
        next_obs, rewards, terminated, truncated, infos = envs.step(scale_action(actions, low, high))
        next_obs = next_obs.astype(np.float32)
        buffer.add(windows.add(obs, actions, rewards, terminated, truncated, final_observations(next_obs, infos)))
        obs, prev_step = next_obs, global_step
        global_step += args.num_envs

        episode_return += rewards
        episode_length += 1
        discounted_return += discount_power * rewards
        discount_power *= args.gamma
        for i in np.flatnonzero(terminated | truncated):
            writer.add_scalar("charts/episodic_return", episode_return[i], global_step)
            writer.add_scalar("charts/episodic_length", episode_length[i], global_step)
            recent_returns.append(float(episode_return[i]))
            if not support_warned and not args.v_min <= discounted_return[i] <= args.v_max:
                support_warned = True
                print(f"{SCRIPT}: warning: an episode's discounted return {discounted_return[i]:.1f} lies outside the critic support "
                      f"[{args.v_min:g}, {args.v_max:g}]; set --v-min/--v-max to cover the task's returns", file=sys.stderr)
            episode_return[i], episode_length[i], discounted_return[i], discount_power[i] = 0.0, 0, 0.0, 1.0

        if global_step >= args.learning_starts and buffer.size >= args.batch_size:
            updates_due += args.num_envs * args.updates_per_step
        beta = args.per_beta + (1.0 - args.per_beta) * min(1.0, global_step / args.total_steps)
        while updates_due >= 1:
            updates_due -= 1
            num_updates += 1
            idx, batch, weights = buffer.sample(args.batch_size, beta, rng)
            b = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
            with torch.no_grad():  # the target distribution Phi(R + gamma^m Z'(s', pi'(s')))
                p_next = critic_target(b["next_obs"], actor_target(b["next_obs"])).softmax(-1)
                target = categorical_projection(b["returns"], b["discounts"], p_next, z)
            log_p = F.log_softmax(critic(b["obs"], b["actions"]), -1)
            cross_entropy = -(target * log_p).sum(-1)
            critic_loss = (torch.from_numpy(weights).to(device) * cross_entropy).mean()
            critic_optim.zero_grad(set_to_none=True)
            critic_loss.backward()
            critic_optim.step()

            # deterministic policy gradient through the mean of Z: maximise Q(s, pi(s)) = sum_i p_i z_i
            critic.requires_grad_(False)  # the actor step needs dQ/da only, not critic weight gradients
            q_value = (critic(b["obs"], actor(b["obs"])).softmax(-1) * z).sum(-1).mean()
            actor_loss = -q_value
            actor_optim.zero_grad(set_to_none=True)
            actor_loss.backward()
            actor_optim.step()
            critic.requires_grad_(True)
            with torch.no_grad():
                for net, target_net in ((actor, actor_target), (critic, critic_target)):
                    for p, p_target in zip(net.parameters(), target_net.parameters()):
                        p_target.lerp_(p, args.tau)
            if buffer.tree is not None:  # priority = KL(Phi Y || p) = cross-entropy - entropy(Phi Y)
                kl = cross_entropy.detach() + (target * target.clamp(min=1e-12).log()).sum(-1)
                buffer.update_priorities(idx, kl.cpu().numpy())
            nonfinite |= ~torch.isfinite(critic_loss.detach() + actor_loss.detach())

        if global_step // log_every > prev_step // log_every:
            check_finite()
            sps = (global_step - start_step) / (time.time() - loop_start)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/learning_rate", args.critic_lr, global_step)
            writer.add_scalar("charts/actor_learning_rate", args.actor_lr, global_step)
            if critic_loss is not None:
                writer.add_scalar("losses/critic_loss", critic_loss.item(), global_step)
                writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)
                writer.add_scalar("losses/q_values", q_value.item(), global_step)
                writer.add_scalar("charts/num_updates", num_updates, global_step)
        if stop["signal"] is not None:  # save right away: no evaluation, no periodic checkpoint
            continue
        if args.eval_interval and global_step < args.total_steps and global_step // args.eval_interval > prev_step // args.eval_interval:
            check_finite()
            returns = evaluate(actor, args.env_id, args.eval_episodes, args.seed, device)
            writer.add_scalar("eval/episodic_return", float(np.mean(returns)), global_step)
        if args.checkpoint_interval and global_step // args.checkpoint_interval > prev_step // args.checkpoint_interval:
            check_finite()
            save_atomic(checkpoint_state(), ckpt_path)
        if time.time() - last_print > 5:
            last_print = time.time()
            sps = (global_step - start_step) / (last_print - loop_start)
            recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            eta = int((args.total_steps - global_step) / max(sps, 1e-9))
            print(f"step {global_step:,}/{args.total_steps:,} | {sps:,.0f} SPS | return {recent} | eta {eta // 60}m{eta % 60:02d}s", flush=True)

    loop_time = time.time() - loop_start
    check_finite()
    save_atomic(checkpoint_state(), ckpt_path)
    envs.close()
    if stop["signal"] is not None:  # detail 9: no summary.json for an interrupted run
        writer.close()
        print(f"{signal.Signals(stop['signal']).name} at step {global_step:,}: checkpoint saved to {ckpt_path}; continue with --resume {ckpt_path}")
        return
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    returns = evaluate(actor, args.env_id, args.eval_episodes, args.seed, device, video_dir)
    writer.add_scalar("eval/episodic_return", float(np.mean(returns)), global_step)
    writer.close()
    result = {"script": SCRIPT, "algo": "d4pg", "env_id": args.env_id, "seed": args.seed, "global_step": global_step,
              "num_updates": num_updates, "eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)),
              "eval_episodes": len(returns), "eval_returns": returns, "wall_time_s": time.time() - t_start,
              "sps": (global_step - start_step) / max(loop_time, 1e-9), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    save_atomic(result, os.path.join(run_dir, "summary.json"))
    print(f"done: step {global_step:,} | eval {result['eval_mean']:.1f} +- {result['eval_std']:.1f} | {result['sps']:,.0f} SPS | {run_dir}")


if __name__ == "__main__":
    train(tyro.cli(Args))
