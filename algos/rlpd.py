"""RLPD: online reinforcement learning with prior data.

Paper: Philip J. Ball, Laura Smith, Ilya Kostrikov, Sergey Levine, "Efficient Online Reinforcement Learning
with Offline Data", ICML 2023, arXiv:2302.02948; reference code: github.com/ikostrikov/rlpd (JAX).

Idea: plain off-policy SAC, run online, can use a fixed dataset of earlier experience (expert, noisy or
mediocre) with three changes and no offline-RL machinery. (1) Symmetric sampling: every minibatch is half
prior data, half online replay. (2) LayerNorm in the critics bounds the Q-values of actions the data never
shows, so they cannot blow up. (3) A large ensemble at a high update-to-data (UTD) ratio: 10 critics, the
target from the minimum over a random pair of them (as REDQ), 20 critic updates per environment step.

Equations (paper, Algorithm 1; reference sac_learner.py):
    a' ~ pi(.|s'),  Z = a random subset of 2 of the 10 target critics, drawn anew for each update
    y       = r + gamma (1 - terminated) (min_{j in Z} Q'_j(s', a') - alpha log pi(a'|s'))
    L_Q     = mean over critics i and batch of (Q_i(s, a) - y)^2
    L_pi    = mean over batch of (alpha log pi(a~|s) - mean_i Q_i(s, a~)),  a~ ~ pi(.|s) reparameterised
    L_alpha = alpha (H - H_target),  H = -mean log pi(a~|s),  H_target = -|A|/2
    Q'_i   <- tau Q_i + (1 - tau) Q'_i after every critic step

Implementation details:
1. The ensemble is one module with stacked weights [num_qs, in, out]: one batched matrix product
   (torch.baddbmm) per layer evaluates all critics. Each critic is Linear -> LayerNorm -> ReLU, twice,
   then Linear -> 1; LayerNorm normalises each critic's features and has its own gain and bias per
   critic. Weights are Xavier-uniform and biases zero, as the reference's flax layers.
   Against ten separate modules (`python -m benchmark ensemble-speed`): 3.8x the critic updates per
   second at 64 units and 3.4x at 256 on an H100, where launches dominate; on one CPU thread 2.9x at 64
   and 0.8x at 256, since both do the same arithmetic there and batching only saves per-op overhead.
2. The target's random subset (num_min_qs distinct critics out of num_qs, torch.randperm) is drawn per
   critic update; the entropy term is part of the backup; the mask is 1 - terminated, so a time-limit
   truncation keeps the bootstrap. The critic loss averages over critics and batch, as the reference.
3. The actor is a tanh-squashed Gaussian with state-dependent log std clipped to [-20, 2] (reference);
   log pi includes the tanh correction in its stable form. Actor and temperature losses use the ensemble
   mean (not the min) and the temperature starts at 1.0 (learned, Adam like the rest, lr 3e-4).
4. One update round per environment step: `utd_ratio` minibatches are drawn at once; a critic step and a
   target update on each, then one actor step and one temperature step on the last (reference `update`).
   The actor does not change during the critic steps, so the next actions of all of them are drawn in one
   actor pass: the same distribution as drawing them step by step.
5. Symmetric sampling: each minibatch holds round(offline_ratio * batch_size) prior-data rows, the rest
   online replay (the reference interleaves the two halves; the order inside a minibatch is irrelevant).
   `--offline-ratio 0` uses no dataset: plain high-UTD ensemble SAC.
6. Prior data: a Minari dataset (`--dataset-id` through minari.load_dataset, which reads
   MINARI_DATASETS_PATH or ~/.minari/datasets; or `--dataset-path`, a dataset folder). Episodes become
   transitions: observations[t] -> observations[t + 1], with terminations and truncations apart
   (only a termination masks the bootstrap; a truncated episode's last transition keeps its real final
   observation and its bootstrap). Actions are mapped from the env's bounds to [-1, 1] and clipped to
   +-(1 - 1e-5) as the reference. Spaces that differ from --env-id's, NaN or infinite values, or no
   episodes stop the run in one line before training.
7. `--pretrain-steps` (default 0, as the paper): update rounds on prior data alone before the first env
   step, logged under pretrain/* at steps -pretrain_steps..0 (before online step 0, and untouched by a
   resume's purge of later steps), then one evaluation logged as pretrain/eval_return at step 0.
8. Online: uniform random actions for the first `learning_starts` env steps (5,000 in the paper's
   commands; the reference script's own default is 10,000);
   NEXT_STEP autoreset handled explicitly: the step after an episode end only resets that env and never
   becomes a transition. `scale_action` is the one place that maps [-1, 1] to the env's bounds.
9. Each loop iteration first updates on what is stored, then acts: the same sequence of operations as
   act-store-update, with the checkpoint falling between a store and the next update, so that a resumed
   run's first update round is exactly the uninterrupted run's.
10. Checkpoints (plain dict, torch.load(weights_only=True)): actor, critics, target critics, log alpha,
    the three optimizers, the online replay (filled part), the prior data itself (so a resume reads no
    dataset: it may have moved or gone), counters and the torch and numpy generator states. Resume
    refuses another --dataset-id/--dataset-path, --offline-ratio, --pretrain-steps, --hidden-dim,
    --num-qs, --num-envs or --buffer-size; it resets the envs (seeded with seed + global_step),
    dropping the episode in progress. SIGINT/SIGTERM save and exit 0 without summary.json.
11. Evaluation is deterministic (a = tanh(mean)) on a separate env seeded seed + 10_000 + i.

Deviations from the reference code:
a. PyTorch instead of JAX; Gymnasium 1.x with Minari data instead of gym with D4RL.
b. `--num-envs` > 1 runs num_envs update rounds per vector step, keeping the ratio per env step.
c. The reference's options that its RLPD config leaves off (critic dropout, weight decay, ResNet
   critics, p-norm features) are not offered.

Usage: python algos/rlpd.py --env-id Pendulum-v1 --dataset-path DIR --total-steps 20000
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle OpenMP threads sleep instead of spinning

import copy
import importlib.util
import json
import math
import random
import resource
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # reference TanhNormal
ACTION_LIMIT = 1.0 - 1e-5  # prior-data actions are clipped inside tanh's range (reference D4RLDataset)


@dataclass
class Args:
    env_id: str = "Pendulum-v1"
    """Gymnasium id of an environment with Box actions and flat Box observations"""
    seed: int = 1
    """seed of python, numpy, torch and the environments"""
    total_steps: int = 250_000
    """online environment steps to train for (summed over envs)"""
    num_envs: int = 1
    """parallel environments in one synchronous vector env"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms, for identical runs on CPU"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    exp_name: str = "rlpd"
    """experiment name, part of the default run directory"""
    run_dir: str | None = None
    """output directory (default runs/<env>__<exp>__<seed>__<unixtime>)"""
    checkpoint_interval: int = 10_000
    """save a checkpoint every this many env steps (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from (its run directory is reused)"""
    eval_episodes: int = 10
    """deterministic evaluation episodes (periodic and final)"""
    eval_interval: int = 5_000
    """evaluate every this many env steps (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint (its env, network and seed), write eval.json and exit"""
    checkpoint: str | None = None
    """checkpoint to evaluate with --eval-only"""
    capture_video: bool = False
    """record the final (or --eval-only) evaluation episodes as mp4 in <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases (mode from WANDB_MODE)"""
    wandb_project_name: str = "rl-training"
    """Weights & Biases project"""
    # Algorithm-specific
    dataset_id: str | None = None
    """Minari dataset id of the prior data (read from MINARI_DATASETS_PATH, default ~/.minari/datasets)"""
    dataset_path: str | None = None
    """Minari dataset folder of the prior data (the folder holding data/), instead of --dataset-id"""
    offline_ratio: float = 0.5
    """share of every minibatch drawn from the prior data (0: ensemble SAC without a dataset)"""
    pretrain_steps: int = 0
    """update rounds on the prior data alone before the first environment step"""
    utd_ratio: int = 20
    """critic updates per environment step (update-to-data ratio)"""
    num_qs: int = 10
    """critics in the ensemble"""
    num_min_qs: int = 2
    """critics in the random subset whose minimum forms the target"""
    hidden_dim: int = 256
    """units in each of the two hidden layers of the actor and of every critic"""
    batch_size: int = 256
    """minibatch size of each gradient step (prior and online rows together)"""
    buffer_size: int = 1_000_000
    """online replay capacity (transitions)"""
    learning_rate: float = 3e-4
    """Adam learning rate of the actor, the critics and the temperature"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """soft target update rate, Q' <- tau Q + (1 - tau) Q'"""
    init_temperature: float = 1.0
    """initial entropy temperature alpha"""
    target_entropy: float | None = None
    """entropy the temperature steers towards (default -|A|/2)"""
    learning_starts: int = 5_000
    """online env steps of uniform random actions before the online updates start"""


# ---------------------------------------------------------------- environment
def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """gym.make with unknown ids and unsupported spaces turned into one-line errors."""
    if env_id not in gym.registry:
        try:  # Atari ids register only once ale_py is imported
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            pass
    try:
        env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
    except Exception as e:  # unknown id, missing entry-point module, missing dependency
        raise fail(f"cannot make environment {env_id!r} ({str(e).splitlines()[0]}); check the id with gymnasium.pprint_registry()")
    obs_space, act_space, problem = env.observation_space, env.action_space, None
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) > 1:
        problem = f"has image observations {obs_space.shape}; use ppo_atari.py or dqn_atari.py"
    elif isinstance(act_space, gym.spaces.Discrete):
        problem = "has a discrete action space; RLPD needs Box actions, use ppg.py"
    elif not isinstance(act_space, gym.spaces.Box) or not isinstance(obs_space, gym.spaces.Box):
        problem = f"has {type(obs_space).__name__} observations and {type(act_space).__name__} actions; rlpd.py needs flat Box ones"
    elif not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        problem = "has unbounded actions; rlpd.py needs finite action bounds to scale [-1, 1] onto"
    if problem:
        env.close()
        raise fail(f"{env_id} {problem}")
    return env


def make_vector_env(env_id: str, num_envs: int, seed: int) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    make_env(env_id).close()  # validate once, in the main process, before building the copies
    # NEXT_STEP autoreset on purpose (detail 8): step_and_store drops the reset step.
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )
    envs.action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    return envs, obs


def scale_action(u: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The one place that maps the policy's u in [-1, 1] to the env's [low, high] (its inverse reads prior data)."""
    return low + 0.5 * (u + 1.0) * (high - low)


# ---------------------------------------------------------------- prior data
def load_prior_data(args: Args, obs_space: gym.Space, act_space: gym.spaces.Box) -> dict[str, np.ndarray]:
    """The Minari dataset of --dataset-id or --dataset-path as transitions (s_t, u_t, r_t, s_t+1, terminated_t)
    with u in [-1, 1] (detail 6); a missing, mismatched, non-finite or empty dataset stops the run in one line."""
    import minari  # only runs with prior data need it

    name = args.dataset_id or args.dataset_path
    try:
        if args.dataset_id:
            dataset = minari.load_dataset(args.dataset_id)
        else:
            folder = Path(args.dataset_path)
            dataset = minari.MinariDataset(folder / "data" if (folder / "data").is_dir() else folder)
        episodes = list(dataset.iterate_episodes())
    except Exception as e:
        raise fail(f"cannot load dataset {name} ({str(e).splitlines()[0]}); pass a Minari dataset id or folder")
    if dataset.observation_space != obs_space or dataset.action_space != act_space:
        raise fail(f"dataset {name} has observations {dataset.observation_space} and actions {dataset.action_space}, but "
                   f"{args.env_id} has {obs_space} and {act_space}; pass the --env-id it was recorded in")
    if not episodes:
        raise fail(f"dataset {name} has no episodes; record at least one")
    # Truncation only ends an episode: its last transition keeps terminated = 0, so it bootstraps.
    data = {"obs": np.concatenate([ep.observations[:-1] for ep in episodes]),
            "actions": np.concatenate([ep.actions for ep in episodes]),
            "rewards": np.concatenate([ep.rewards for ep in episodes]),
            "next_obs": np.concatenate([ep.observations[1:] for ep in episodes]),
            "terminated": np.concatenate([ep.terminations for ep in episodes])}
    for field, values in data.items():
        if not np.all(np.isfinite(values)):
            raise fail(f"dataset {name} holds NaN or infinite values in its {field}; drop those episodes or record it again")
    low, high = act_space.low, act_space.high
    data["actions"] = np.clip(2.0 * (data["actions"] - low) / (high - low) - 1.0, -ACTION_LIMIT, ACTION_LIMIT)
    return {k: v.astype(np.float32) for k, v in data.items()}


# ---------------------------------------------------------------- networks
class EnsembleCritic(nn.Module):
    """num_qs critics Q_i(s, a), each Linear -> LayerNorm -> ReLU twice, then Linear -> 1, as stacked
    weights [num_qs, in, out]: one batched matrix product per layer for all of them (detail 1)."""

    def __init__(self, num_qs: int, in_dim: int, hidden_dim: int):
        super().__init__()
        self.num_qs, dims = num_qs, [in_dim, hidden_dim, hidden_dim, 1]
        bounds = [math.sqrt(6.0 / (i + o)) for i, o in zip(dims, dims[1:])]  # Xavier uniform, as the reference
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(num_qs, i, o).uniform_(-b, b)) for i, o, b in zip(dims, dims[1:], bounds))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(num_qs, 1, o)) for o in dims[1:])
        self.ln_gains = nn.ParameterList(nn.Parameter(torch.ones(num_qs, 1, hidden_dim)) for _ in range(2))
        self.ln_biases = nn.ParameterList(nn.Parameter(torch.zeros(num_qs, 1, hidden_dim)) for _ in range(2))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """Q_i(s, a) [num_qs, B] of every critic, or [len(members), B] of the critics `members` only."""
        pick = slice(None) if members is None else members
        x = torch.cat([obs, actions], -1)
        x = x.expand(self.num_qs if members is None else len(members), *x.shape)
        for layer, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b[pick], x, w[pick])
            if layer < 2:  # each critic normalises its own features, then applies its own gain and bias
                x = F.relu(F.layer_norm(x, x.shape[-1:]) * self.ln_gains[layer][pick] + self.ln_biases[layer][pick])
        return x.squeeze(-1)


class Actor(nn.Module):
    """Tanh-squashed Gaussian policy over [-1, 1]^|A| (detail 3)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, hidden_dim), nn.ReLU())
        self.mean, self.log_std = nn.Linear(hidden_dim, act_dim), nn.Linear(hidden_dim, act_dim)
        for layer in (self.trunk[0], self.trunk[2], self.mean, self.log_std):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and clipped log std of the Gaussian before tanh."""
        h = self.trunk(obs)
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action u = tanh(x), x ~ N(mean, std), and log pi(u|s)."""
        mean, log_std = self(obs)
        x = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(x), tanh_gaussian_log_prob(x, mean, log_std)


class Agent(nn.Module):
    """Actor, critic ensemble, target ensemble and log alpha: one state_dict for checkpoints."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int, num_qs: int, init_temperature: float = 1.0):
        super().__init__()
        self.actor = Actor(obs_dim, act_dim, hidden_dim)
        self.critic = EnsembleCritic(num_qs, obs_dim + act_dim, hidden_dim)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_temperature)))


# ---------------------------------------------------------------- RLPD math
def tanh_gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(x)) = sum over dims of log N(x; mean, std) - log(1 - tanh(x)^2), the last term written
    as 2 (log 2 - x - softplus(-2x)), which stays finite where tanh(x) rounds to +-1."""
    gaussian = -0.5 * ((x - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    return (gaussian - 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))).sum(-1)


def soft_q_target(target_critic: EnsembleCritic, batch: dict[str, torch.Tensor], next_u: torch.Tensor,
                  next_log_prob: torch.Tensor, alpha: torch.Tensor, gamma: float, num_min_qs: int) -> torch.Tensor:
    """y = r + gamma (1 - terminated) (min_{j in Z} Q'_j(s', a') - alpha log pi(a'|s')), Z a fresh random
    subset of num_min_qs distinct target critics (detail 2)."""
    members = torch.randperm(target_critic.num_qs, device=next_u.device)[:num_min_qs]
    next_q = target_critic(batch["next_obs"], next_u, members).min(0).values
    return batch["rewards"] + gamma * (1.0 - batch["terminated"]) * (next_q - alpha * next_log_prob)


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    for tp, sp in zip(target.parameters(), source.parameters()):
        tp.lerp_(sp, tau)


def gradient_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def update(agent: Agent, optimizers: dict, batches: dict[str, torch.Tensor], gamma: float, tau: float,
           num_min_qs: int, target_entropy: float) -> dict[str, torch.Tensor]:
    """One update round (detail 4) on minibatches [utd, batch, ...]: a critic step and a target update on
    each, then one actor and one temperature step on the last. Returns the losses (detached) for logging."""
    alpha = agent.log_alpha.exp().detach()
    with torch.no_grad():  # the actor is fixed during the critic steps: all next actions in one pass
        next_u, next_log_prob = agent.actor.sample(batches["next_obs"])
    for i in range(len(next_u)):
        batch = {k: v[i] for k, v in batches.items()}
        with torch.no_grad():
            y = soft_q_target(agent.target_critic, batch, next_u[i], next_log_prob[i], alpha, gamma, num_min_qs)
        q = agent.critic(batch["obs"], batch["actions"])
        critic_loss = ((q - y) ** 2).mean()
        gradient_step(optimizers["critic"], critic_loss)
        soft_update(agent.target_critic, agent.critic, tau)
    u, log_prob = agent.actor.sample(batch["obs"])
    actor_loss = (alpha * log_prob - agent.critic(batch["obs"], u).mean(0)).mean()  # the ensemble mean (detail 3)
    gradient_step(optimizers["actor"], actor_loss)  # its critic gradients are cleared by the next critic step
    entropy = -log_prob.detach().mean()
    alpha_loss = agent.log_alpha.exp() * (entropy - target_entropy)
    gradient_step(optimizers["alpha"], alpha_loss)
    losses = {"critic_loss": critic_loss, "q_values": q.mean(), "actor_loss": actor_loss, "alpha": alpha,
              "alpha_loss": alpha_loss, "entropy": entropy}
    return {k: v.detach() for k, v in losses.items()}


class ReplayBuffer:
    """Preallocated ring buffer of (s, u, r, s', terminated), u in [-1, 1]; online replay or prior data."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int):
        self.capacity, self.ptr, self.size = capacity, 0, 0
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.actions = np.zeros((capacity, act_dim), np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.terminated = np.zeros(capacity, np.float32)

    @classmethod
    def holding(cls, data: dict) -> ReplayBuffer:
        """A buffer exactly the size of `data` (the prior data, or its copy in a checkpoint), filled with it."""
        buffer = cls(len(data["rewards"]), data["obs"].shape[1], data["actions"].shape[1])
        buffer.add(*(np.asarray(data[name]) for name in cls.FIELDS))
        return buffer

    def add(self, obs, actions, rewards, next_obs, terminated) -> None:
        idx = (self.ptr + np.arange(len(rewards))) % self.capacity
        for name, value in zip(self.FIELDS, (obs, actions, rewards, next_obs, terminated)):
            getattr(self, name)[idx] = value
        self.ptr = int((self.ptr + len(rewards)) % self.capacity)
        self.size = min(self.size + len(rewards), self.capacity)

    def sample(self, shape: tuple[int, ...], rng: np.random.Generator) -> dict[str, np.ndarray]:
        idx = rng.integers(0, self.size, shape)
        return {name: getattr(self, name)[idx] for name in self.FIELDS}

    def state_dict(self) -> dict:
        # Copies of the filled part only: torch.save of a view would write the whole array.
        data = {name: torch.from_numpy(getattr(self, name)[: self.size].copy()) for name in self.FIELDS}
        return {"ptr": self.ptr, "size": self.size, **data}

    def load_state_dict(self, state: dict) -> None:
        self.ptr, self.size = int(state["ptr"]), int(state["size"])
        for name in self.FIELDS:
            getattr(self, name)[: self.size] = state[name].numpy()


def sample_mixed(offline: ReplayBuffer | None, online: ReplayBuffer, utd: int, batch_size: int, offline_ratio: float,
                 rng: np.random.Generator, device: torch.device) -> dict[str, torch.Tensor]:
    """Symmetric sampling (paper, Section 3.1; detail 5): `utd` minibatches [utd, batch_size, ...], each
    round(offline_ratio * batch_size) rows of prior data, then online rows; one transfer to the device."""
    n_offline = round(offline_ratio * batch_size)
    sources = ((offline, n_offline), (online, batch_size - n_offline))
    parts = [buffer.sample((utd, n), rng) for buffer, n in sources if n > 0]
    return {k: torch.as_tensor(np.concatenate([p[k] for p in parts], axis=1), device=device) for k in ReplayBuffer.FIELDS}


def step_and_store(envs, rb: ReplayBuffer, obs, u, autoreset, low, high):
    """One vector step; store only real transitions (detail 8). Returns the step's outputs and the mask
    of envs whose next step is an autoreset."""
    next_obs, rewards, terminated, truncated, infos = envs.step(scale_action(u, low, high))
    real = ~autoreset
    rb.add(obs[real], u[real], rewards[real], next_obs[real], terminated[real])
    return next_obs, rewards, terminated, truncated, terminated | truncated


def checkpoint_state(agent: Agent, optimizers: dict, rb: ReplayBuffer, offline: ReplayBuffer | None,
                     num_updates: int, pretrain_done: int, rng) -> dict:
    return {"agent": agent.state_dict(), "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
            "replay_buffer": rb.state_dict(), "offline_data": offline.state_dict() if offline else None,
            "num_updates": num_updates, "pretrain_done": pretrain_done,
            "rng": rng_state(torch=torch.default_generator, numpy=rng)}


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    has_data = bool(args.dataset_id or args.dataset_path)
    check_args(args, [
        (args.num_envs >= 1, "--num-envs must be at least 1"),
        (0.0 <= args.offline_ratio <= 1.0, f"--offline-ratio must be in [0, 1], got {args.offline_ratio}"),
        (not (args.dataset_id and args.dataset_path), "pass one of --dataset-id and --dataset-path, not both"),
        (has_data or args.offline_ratio == 0 or args.eval_only, "--offline-ratio > 0 needs prior data: pass --dataset-id ID or "
         "--dataset-path DIR (a Minari dataset), or --offline-ratio 0 for ensemble SAC without a dataset"),
        (not has_data or args.offline_ratio > 0, "--offline-ratio 0 uses no prior data; drop the dataset or raise the ratio"),
        (args.pretrain_steps >= 0, "--pretrain-steps must be non-negative"),
        (args.pretrain_steps == 0 or args.offline_ratio > 0, "--pretrain-steps trains on prior data; it needs --offline-ratio > 0"),
        (args.utd_ratio >= 1, "--utd-ratio must be at least 1"),
        (args.num_qs >= 1 and 1 <= args.num_min_qs <= args.num_qs, "--num-min-qs must be between 1 and --num-qs"),
        (args.batch_size >= 1, "--batch-size must be at least 1"),
        (args.buffer_size >= 1, "--buffer-size must be at least 1"),
        (args.hidden_dim >= 1, "--hidden-dim must be at least 1"),
        (args.learning_rate > 0, "--learning-rate must be positive"),
        (0 < args.tau <= 1, "--tau must be in (0, 1]"),
        (0 <= args.gamma <= 1, "--gamma must be in [0, 1]"),
        (args.init_temperature > 0, "--init-temperature must be positive"),
        (args.learning_starts >= 0, "--learning-starts must be non-negative"),
    ])
    if args.eval_only:
        return eval_only(args)
    device = pick_device(args.device)
    seed_everything(args.seed, args.torch_deterministic)
    rng = np.random.default_rng(args.seed)  # replay sampling and the first random actions
    same = ("hidden_dim", "num_qs", "num_envs", "buffer_size", "offline_ratio", "dataset_id", "dataset_path", "pretrain_steps")
    ckpt = resume_checkpoint(args, same=same) if args.resume else None
    global_step = ckpt["global_step"] if ckpt else 0
    envs, obs = make_vector_env(args.env_id, args.num_envs, args.seed + global_step)
    obs_dim, act_dim = int(np.prod(envs.single_observation_space.shape)), envs.single_action_space.shape[0]
    low, high = envs.single_action_space.low, envs.single_action_space.high
    agent = Agent(obs_dim, act_dim, args.hidden_dim, args.num_qs, args.init_temperature).to(device)
    optimizers = {"actor": torch.optim.Adam(agent.actor.parameters(), lr=args.learning_rate),
                  "critic": torch.optim.Adam(agent.critic.parameters(), lr=args.learning_rate),
                  "alpha": torch.optim.Adam([agent.log_alpha], lr=args.learning_rate)}
    target_entropy = -act_dim / 2 if args.target_entropy is None else args.target_entropy
    rb, offline, num_updates, pretrain_done = ReplayBuffer(args.buffer_size, obs_dim, act_dim), None, 0, 0
    if ckpt:  # the prior data comes from the checkpoint: no dataset is read again (detail 10)
        agent.load_state_dict(ckpt["agent"])
        for name, optimizer in optimizers.items():
            optimizer.load_state_dict(ckpt["optimizers"][name])
        rb.load_state_dict(ckpt["replay_buffer"])
        offline = ReplayBuffer.holding(ckpt["offline_data"]) if ckpt["offline_data"] else None
        num_updates, pretrain_done = ckpt["num_updates"], ckpt["pretrain_done"]
        set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    elif has_data:
        offline = ReplayBuffer.holding(load_prior_data(args, envs.single_observation_space, envs.single_action_space))
    hyper = (args.gamma, args.tau, args.num_min_qs, target_entropy)
    stop = StopSignal()
    with RunLogger(args, run_dir_for(args, args.resume), global_step, resumed=ckpt is not None,
                   target_entropy=target_entropy, offline_transitions=offline.size if offline else 0) as log:
        while pretrain_done < args.pretrain_steps and not stop:  # detail 7
            losses = update(agent, optimizers, sample_mixed(offline, rb, args.utd_ratio, args.batch_size, 1.0, rng, device), *hyper)
            pretrain_done, num_updates = pretrain_done + 1, num_updates + args.utd_ratio
            log.check_finite(torch.stack(list(losses.values())), 0)
            if pretrain_done % 100 == 0 or pretrain_done == args.pretrain_steps:
                log.scalars(pretrain_done - args.pretrain_steps, {f"pretrain/{k}": v for k, v in losses.items()})
            if pretrain_done == args.pretrain_steps:
                log.scalars(0, {"pretrain/eval_return": np.mean(evaluate(agent.actor, args.env_id, args.eval_episodes, args.seed, device))})
        autoreset = np.zeros(args.num_envs, bool)
        ep_return, ep_length = np.zeros(args.num_envs), np.zeros(args.num_envs, int)
        while global_step < args.total_steps and not stop:
            if global_step >= args.learning_starts and rb.size > 0:  # update on what is stored, then act (detail 9)
                for _ in range(args.num_envs):
                    batches = sample_mixed(offline, rb, args.utd_ratio, args.batch_size, args.offline_ratio, rng, device)
                    losses = update(agent, optimizers, batches, *hyper)
                num_updates += args.utd_ratio * args.num_envs
                log.check_finite(torch.stack(list(losses.values())), global_step)
                if every(global_step, global_step - args.num_envs, 100):  # as CleanRL
                    log.scalars(global_step, {f"losses/{k}": v for k, v in losses.items()})
            if global_step < args.learning_starts:
                u = rng.uniform(-1.0, 1.0, (args.num_envs, act_dim)).astype(np.float32)
            else:
                with torch.inference_mode():
                    u = agent.actor.sample(torch.as_tensor(obs, dtype=torch.float32, device=device))[0].cpu().numpy()
            obs, rewards, terminated, truncated, next_autoreset = step_and_store(envs, rb, obs, u, autoreset, low, high)
            ep_return += rewards * ~autoreset
            ep_length += ~autoreset
            autoreset = next_autoreset
            prev_step, global_step = global_step, global_step + args.num_envs
            for i in np.flatnonzero(autoreset):
                log.episode(global_step, ep_return[i], ep_length[i])
                ep_return[i], ep_length[i] = 0.0, 0

            if every(global_step, prev_step, 1000) or global_step >= args.total_steps or stop:
                log.scalars(global_step, {"charts/SPS": log.sps(global_step), "charts/learning_rate": args.learning_rate})
            if stop:  # save right away: no evaluation, no periodic checkpoint
                break
            if every(global_step, prev_step, args.eval_interval) and global_step < args.total_steps:
                log.scalars(global_step, {"eval/episodic_return": np.mean(evaluate(agent.actor, args.env_id, args.eval_episodes, args.seed, device))})
            if every(global_step, prev_step, args.checkpoint_interval):
                save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizers, rb, offline, num_updates, pretrain_done, rng))
            log.progress(global_step, args.total_steps)
        envs.close()
        if stop:
            save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizers, rb, offline, num_updates, pretrain_done, rng))
            return log.interrupted(global_step)
        returns = evaluate(agent.actor, args.env_id, args.eval_episodes, args.seed, device, log.run_dir / "videos" if args.capture_video else None)
        log.scalars(global_step, {"eval/episodic_return": np.mean(returns)})
        save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizers, rb, offline, num_updates, pretrain_done, rng))
        log.summary(global_step, returns, num_updates=num_updates)


# ---------------------------------------------------------------- evaluation
def evaluate(actor: Actor, env_id: str, episodes: int, seed: int, device, video_dir: Path | None = None) -> list[float]:
    """Deterministic returns, u = tanh(mean) (detail 11)."""
    env = make_env(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True, disable_logger=True)
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                mean, _ = actor(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0))
            obs, r, terminated, truncated, _ = env.step(scale_action(torch.tanh(mean[0]).cpu().numpy(), low, high))
            total += float(r)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def eval_only(args: Args) -> None:
    """Evaluate --checkpoint with its own env, network and seed: it repeats the run's final evaluation."""
    ckpt, device = load_checkpoint(args.checkpoint), pick_device(args.device)
    env = make_env(ckpt["env_id"])
    agent = Agent(int(np.prod(env.observation_space.shape)), env.action_space.shape[0], ckpt["args"]["hidden_dim"], ckpt["args"]["num_qs"])
    env.close()
    agent.load_state_dict(ckpt["agent"])
    run_dir = run_dir_for(args, args.checkpoint)
    video_dir = run_dir / "videos" if args.capture_video else None
    write_eval_only(run_dir, args, ckpt, evaluate(agent.actor.to(device), ckpt["env_id"], args.eval_episodes, ckpt["args"]["seed"], device, video_dir))


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
