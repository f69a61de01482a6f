"""RLPD: online reinforcement learning with prior data.

Paper: Philip J. Ball, Laura Smith, Ilya Kostrikov, Sergey Levine, "Efficient Online Reinforcement
Learning with Offline Data", ICML 2023, arXiv:2302.02948; reference code: github.com/ikostrikov/rlpd
(JAX).

Idea: plain off-policy SAC, run online, can use a fixed dataset of earlier experience (expert, noisy
or mediocre) with three changes and no offline-RL machinery. (1) Symmetric sampling: every minibatch
is half prior data, half online replay. (2) LayerNorm in the critics bounds the Q-values of actions
the data never shows, so they cannot blow up. (3) A large ensemble at a high update-to-data (UTD)
ratio: 10 critics, the target from the minimum over a random pair of them (as REDQ), 20 critic
updates per environment step.

Equations (paper, Algorithm 1; reference sac_learner.py):
    a' ~ pi(.|s'),  Z = a random subset of 2 of the 10 target critics, drawn anew for each update
    y       = r + gamma (1 - terminated) (min_{j in Z} Q'_j(s', a') - alpha log pi(a'|s'))
    L_Q     = mean over critics i and batch of (Q_i(s, a) - y)^2
    L_pi    = mean over batch of (alpha log pi(a~|s) - mean_i Q_i(s, a~)), a~ ~ pi(.|s) (reparam.)
    L_alpha = alpha (H - H_target),  H = -mean log pi(a~|s),  H_target = -|A|/2
    Q'_i   <- tau Q_i + (1 - tau) Q'_i after every critic step

Implementation details:
1. The ensemble is one module (as the reference's vmapped one), each layer one tensor
   [num_qs, in + 1 (+ 2), out]: the weight's rows, the bias, and in the hidden layers each critic's
   own LayerNorm gain and shift, read through named views (EnsembleLayer). One batched matrix
   product (torch.baddbmm) a layer evaluates all critics, one index a layer picks a subset, one
   fused Polyak call (Run.polyak) updates every target. Each
   critic is Linear -> LayerNorm -> ReLU, twice, then Linear -> 1; weights Xavier-uniform, biases
   zero (reference). Faster than ten separate modules (results/rlpd-measurements.md). Checkpoints
   of the older layout (a tensor for each weight, bias, gain and shift) are refused.
2. The target's random subset (num_min_qs distinct critics out of num_qs: the first of a random
   order) is drawn anew for each critic update, a round's all in one call; the entropy term is part
   of the backup; the mask is 1 - terminated, so a time-limit truncation keeps the bootstrap. The
   critic loss averages over critics and batch.
3. The actor is a tanh-squashed Gaussian with state-dependent log std clipped to [-20, 2]
   (reference); log pi includes the tanh correction in its stable form. Actor and temperature
   losses use the ensemble mean (not the min); the temperature starts at 1.0 (learned, Adam like
   the rest, lr 3e-4).
4. One update round per environment step: `utd_ratio` minibatches are drawn at once; a critic step
   and a target update on each, then one actor step and one temperature step on the last
   (reference `update`). The actor does not change during the critic steps, so the next actions of
   all of them are drawn in one actor pass: the same distribution as drawing them step by step.
   Minibatches and observations reach a GPU through pinned memory without blocking; losses stay
   on the device until logged; Adam is fused. `--compile` compiles the critic step and the
   actor/temperature step (CUDA graphs on a GPU); off by default: not yet measured to win there.
5. Symmetric sampling: each minibatch holds round(offline_ratio * batch_size) prior-data rows, the
   rest online replay (the reference interleaves the two halves; the order inside a minibatch is
   irrelevant). `--offline-ratio 0` uses no dataset: plain high-UTD ensemble SAC.
6. Prior data: a Minari dataset (`--dataset-id` through minari.load_dataset, which reads
   MINARI_DATASETS_PATH or ~/.minari/datasets; or `--dataset-path`, a dataset folder). Episodes
   become transitions observations[t] -> observations[t + 1], terminations and truncations apart
   (only a termination masks the bootstrap; a truncated episode's last transition keeps its real
   final observation). Actions are mapped from the env's bounds to [-1, 1] and clipped to
   +-(1 - 1e-5), as the reference. Other spaces than --env-id's, NaN or infinite values, or no
   episodes stop the run in one line before training.
7. `--pretrain-steps` (default 0, as the paper): update rounds on prior data alone before the first
   env step, logged under pretrain/* at steps -pretrain_steps..0 (before online step 0, and
   untouched by a resume's purge of later steps), then one evaluation, pretrain/eval_return at 0.
8. Online: uniform random actions for the first `learning_starts` env steps (5,000 in the paper's
   commands; the reference script's own default is 10,000). NEXT_STEP autoreset handled
   explicitly: the step after an episode end only resets that env and never becomes a transition.
   `scale_action` is the one place that maps [-1, 1] to the env's bounds.
9. Each loop iteration first updates on what is stored, then acts: the same sequence of operations
   as act-store-update, with the checkpoint falling between a store and the next update, so that a
   resumed run's first update round is exactly the uninterrupted run's.
10. The checkpoint holds the online replay and the prior data itself (a resume reads no dataset and
    refuses other data flags, widths or buffer sizes); a resume restarts the envs from
    seed + global_step, dropping the episode in progress.
11. Evaluation is deterministic (a = tanh(mean)) on a separate env seeded seed + 10_000 + i.

Deviations from the reference code:
a. PyTorch instead of JAX; Gymnasium 1.x with Minari data instead of gym with D4RL.
b. `--num-envs` > 1 runs num_envs update rounds per vector step, keeping the ratio per env step.
c. The reference's options that its RLPD config leaves off (critic dropout, weight decay, ResNet
   critics, p-norm features) are not offered.

Usage: python algos/rlpd.py --env-id Pendulum-v1 --dataset-path DIR --total-steps 20000
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter

# The run harness (class Run, at the bottom) is reached above it through Run(...), run.device,
# run.resume_checkpoint, run.compile, run.graph_step, Run.polyak, run.to_device, run.start, run.log,
# run.episode, run.sps, run.end_iteration, run.finish, Run.every and Run.fail, and in the plumbing
# after train() run.check_finite, Run.rng_state, Run.set_rng_state, Run.load_checkpoint,
# run.video_dir and run.write_eval_only.

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # reference TanhNormal
# Prior-data actions stay inside tanh's range (reference D4RLDataset)
ACTION_LIMIT = 1.0 - 1e-5


@dataclass
class Args:
    """RLPD's flags (tyro): the common ones first, then the algorithm's; the module
    docstring at the top of rlpd.py gives the reasons for their defaults."""

    env_id: str = "Pendulum-v1"
    """Gymnasium id (Box actions, flat Box observations)"""
    seed: int = 1
    """seed of python, numpy, torch and the envs"""
    total_steps: int = 250_000
    """online env steps (summed over envs)"""
    num_envs: int = 1
    """parallel environments"""
    torch_deterministic: bool = True
    """deterministic torch kernels"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    compile: bool = False
    """torch.compile the updates (CUDA graphs on a GPU)"""
    exp_name: str = "rlpd"
    """experiment name, part of the default run directory"""
    run_dir: str | None = None
    """output directory (default runs/<env>__<exp>__<seed>__<time>)"""
    checkpoint_interval: int = 10_000
    """env steps between checkpoints (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from"""
    eval_episodes: int = 10
    """deterministic evaluation episodes"""
    eval_interval: int = 5_000
    """env steps between evaluations (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint, into eval.json"""
    checkpoint: str | None = None
    """checkpoint for --eval-only"""
    capture_video: bool = False
    """record the final evaluation in <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """Weights & Biases project"""
    # Algorithm-specific
    dataset_id: str | None = None
    """Minari dataset id of the prior data"""
    dataset_path: str | None = None
    """Minari dataset folder, instead of --dataset-id"""
    offline_ratio: float = 0.5
    """share of prior data in each minibatch (0: none)"""
    pretrain_steps: int = 0
    """update rounds on prior data before the first env step"""
    utd_ratio: int = 20
    """critic updates per env step"""
    num_qs: int = 10
    """critics in the ensemble"""
    num_min_qs: int = 2
    """critics in the target's random subset"""
    hidden_dim: int = 256
    """units per hidden layer"""
    batch_size: int = 256
    """minibatch size, prior and online rows together"""
    buffer_size: int = 1_000_000
    """online replay capacity"""
    learning_rate: float = 3e-4
    """Adam learning rate of every network and alpha"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target update rate"""
    init_temperature: float = 1.0
    """initial entropy temperature alpha"""
    target_entropy: float | None = None
    """target entropy (default -|A|/2)"""
    learning_starts: int = 5_000
    """env steps of uniform random actions before updates"""


# ---------------------------------------------------------------- environment
def make_envs(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """The training envs; NEXT_STEP autoreset on purpose (detail 8)."""
    # Refuse what rlpd.py cannot run once, in this process, before building the copies
    make_env(env_id).close()
    envs = [lambda: gym.make(env_id) for _ in range(num_envs)]
    return gym.vector.SyncVectorEnv(envs, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def scale_action(actions, low, high):
    """The one place that maps the policy's [-1, 1] to the env's [low, high]."""
    return low + 0.5 * (actions + 1.0) * (high - low)


# ---------------------------------------------------------------- networks
class EnsembleLayer(NamedTuple):
    """One layer of E critics at once, as named views (no copies) of its packed tensor
    [E, in + 1 (+ 2), out], whose rows are the weight, the bias and, in a hidden layer, LayerNorm's
    gain and shift. Gradients reach the packed tensor through the views."""

    weight: torch.Tensor  # [E, in, out]
    bias: torch.Tensor  # [E, 1, out]
    ln_gain: torch.Tensor | None  # [E, 1, out]; None in the output layer
    ln_shift: torch.Tensor | None  # [E, 1, out]; None in the output layer

    @classmethod
    def of(cls, packed: torch.Tensor, in_dim: int) -> EnsembleLayer:
        """The views of `packed` [E, in_dim + 1 (+ 2), out]: in_dim rows, then one row each."""
        weight, bias, *norm = packed.split([in_dim] + [1] * (packed.shape[1] - in_dim), 1)
        if not norm:
            return cls(weight, bias, None, None)
        ln_gain, ln_shift = norm
        return cls(weight, bias, ln_gain, ln_shift)


class EnsembleCritic(nn.Module):
    """num_qs critics Q_i(s, a), each Linear -> LayerNorm -> ReLU twice, then Linear -> 1,
    evaluated together: one batched matrix product a layer (detail 1)."""

    def __init__(self, num_qs: int, in_dim: int, hidden_dim: int):
        """Weights Xavier-uniform and biases 0 (reference); LayerNorm gains 1 and shifts 0."""
        super().__init__()
        self.num_qs = num_qs
        dims = [in_dim, hidden_dim, hidden_dim, 1]
        self.in_dims = dims[:-1]  # each layer's input width
        # One Parameter a layer, [num_qs, in + 1 (+ 2), out]: the checkpoint's critic.layers.0..2
        # (EnsembleLayer names its rows)
        self.layers = nn.ParameterList()
        for index, (fan_in, fan_out) in enumerate(zip(dims, dims[1:])):
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            weight = torch.empty(num_qs, fan_in, fan_out).uniform_(-bound, bound)
            bias = torch.zeros(num_qs, 1, fan_out)
            rows = [weight, bias]
            hidden = index < len(dims) - 2
            if hidden:
                ln_gain = torch.ones(num_qs, 1, fan_out)
                ln_shift = torch.zeros(num_qs, 1, fan_out)
                rows += [ln_gain, ln_shift]
            self.layers.append(nn.Parameter(torch.cat(rows, 1)))

    def unpacked(self, members: torch.Tensor | None = None) -> list[EnsembleLayer]:
        """Every layer's named views: of all critics (E = num_qs), or of `members` only
        (E = len(members): one index a layer, [E, in + 1 (+ 2), out], picks the subset)."""
        layers = []
        for packed, in_dim in zip(self.layers, self.in_dims):
            if members is not None:
                packed = packed[members]
            layers.append(EnsembleLayer.of(packed, in_dim))
        return layers

    def forward(self, obs, actions, members: torch.Tensor | None = None) -> torch.Tensor:
        """Q_i(s, a) [E, B] of every critic (E = num_qs), or of `members` only."""
        layers = self.unpacked(members)
        x = torch.cat([obs, actions], -1)  # [B, in]
        # [E, B, in]: every critic sees the same input (a broadcast view, no copy)
        x = x.expand(layers[0].weight.shape[0], -1, -1)
        for layer in layers:
            # bias [E, 1, out] + x [E, B, in] @ weight [E, in, out] -> [E, B, out]
            x = torch.baddbmm(layer.bias, x, layer.weight)
            # Each critic normalises its own features, with its own gain and shift [E, 1, out]
            if layer.ln_gain is not None:
                x = F.relu(F.layer_norm(x, x.shape[-1:]) * layer.ln_gain + layer.ln_shift)
        return x.squeeze(-1)  # [E, B]


class Actor(nn.Module):
    """Tanh-squashed Gaussian policy over [-1, 1]^|A| (detail 3)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int):
        """Two ReLU layers, then a mean head and a log-std head; Xavier-uniform weights, zero
        biases (reference)."""
        super().__init__()
        h = hidden_dim
        self.trunk = nn.Sequential(nn.Linear(obs_dim, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU())
        self.mean = nn.Linear(h, act_dim)
        self.log_std = nn.Linear(h, act_dim)
        for layer in (self.trunk[0], self.trunk[2], self.mean, self.log_std):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and clipped log std [B, |A|] of the Gaussian before tanh."""
        h = self.trunk(obs)
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs, noise=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised a = tanh(x), x = mean + std * noise, [..., |A|], and log pi(a|s) [...];
        noise ~ N(0, I) is drawn here unless given (the compiled actor step takes it as input)."""
        mean, log_std = self(obs)
        if noise is None:
            noise = torch.randn_like(mean)
        x = mean + log_std.exp() * noise
        return torch.tanh(x), tanh_gaussian_log_prob(x, mean, log_std)


class Agent(nn.Module):
    """Actor, critics, target critics and log alpha: one state_dict."""

    def __init__(self, obs_dim, act_dim, hidden_dim, num_qs, init_temperature: float = 1.0):
        """The target critics start as a copy of the critics; alpha = init_temperature."""
        super().__init__()
        self.actor = Actor(obs_dim, act_dim, hidden_dim)
        self.critic = EnsembleCritic(num_qs, obs_dim + act_dim, hidden_dim)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_temperature)))


# ---------------------------------------------------------------- RLPD math
def tanh_gaussian_log_prob(x, mean, log_std) -> torch.Tensor:
    """log pi(tanh(x)|s) [...] of x [..., |A|]: summed over the action's dims,
    log N(x; mean, std) - log(1 - tanh(x)^2) (SAC, Appendix C)."""
    gaussian = -0.5 * ((x - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    # log(1 - tanh(x)^2) written as 2 (log 2 - x - softplus(-2x)), which stays finite where tanh(x)
    # rounds to +-1 (reference)
    return (gaussian - 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))).sum(-1)


@torch.no_grad()
def soft_q_target(target_critic, batch, next_actions, next_log_prob, members, alpha, gamma):
    """y [B] = r + gamma (1 - terminated) (min_{j in Z} Q'_j(s', a') - alpha log pi(a'|s')), Z the
    target critics `members` (paper, Algorithm 1; detail 2). A constant of the critic loss: no
    gradient flows into the target critics or the actor. A truncation keeps the bootstrap."""
    next_q = target_critic(batch["next_obs"], next_actions, members)  # [|Z|, B]
    min_next_q = next_q.min(0).values  # [B]
    soft_next_value = min_next_q - alpha * next_log_prob  # [B]
    return batch["rewards"] + gamma * (1.0 - batch["terminated"]) * soft_next_value


def gradient_step(optimizer, loss) -> None:
    """Zero the optimizer's gradients, backpropagate `loss`, step."""
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def critic_step(
    agent, optimizer, batch, *, next_actions, next_log_prob, members, alpha, gamma, tau
) -> dict[str, torch.Tensor]:
    """A step on L_Q = mean over critics i and batch of (Q_i(s, a) - y)^2, then the targets'
    Q'_i <- tau Q_i + (1 - tau) Q'_i. Returns L_Q and the mean Q-value, detached."""
    # The target y [B], a constant
    y = soft_q_target(
        agent.target_critic, batch, next_actions, next_log_prob, members, alpha, gamma
    )
    q = agent.critic(batch["obs"], batch["actions"])  # [num_qs, B]
    critic_loss = ((q - y) ** 2).mean()  # y [B] broadcasts over the critics
    gradient_step(optimizer, critic_loss)
    Run.polyak(agent.target_critic, agent.critic, tau)
    return {"critic_loss": critic_loss.detach(), "q_values": q.mean().detach()}


def actor_step(agent, optimizers, *, obs, noise, alpha, target_entropy) -> dict[str, torch.Tensor]:
    """A step on L_pi = mean over batch of (alpha log pi(a~|s) - mean_i Q_i(s, a~)), then one on
    L_alpha = alpha (H - H_target) (detail 3). Returns both losses and the entropy H, detached."""
    actions, log_prob = agent.actor.sample(obs, noise)  # a~ [B, |A|], log pi [B]
    # The ensemble's mean over critics, [num_qs, B] -> [B] (not the min of the target)
    actor_loss = (alpha * log_prob - agent.critic(obs, actions).mean(0)).mean()
    # This loss also reaches the critics: their gradients, stale by now (and under CUDA graphs in
    # memory that later graphs reuse), are cleared first; the next critic step clears them again.
    optimizers["critic"].zero_grad()
    gradient_step(optimizers["actor"], actor_loss)
    entropy = -log_prob.detach().mean()
    alpha_loss = agent.log_alpha.exp() * (entropy - target_entropy)
    gradient_step(optimizers["alpha"], alpha_loss)
    return {
        "actor_loss": actor_loss.detach(),
        "alpha_loss": alpha_loss.detach(),
        "entropy": entropy,
    }


@dataclass(frozen=True)
class UpdateHyper:
    """The hyperparameters of an update round (Args' values, the target entropy resolved)."""

    gamma: float
    tau: float
    num_min_qs: int
    target_entropy: float


@dataclass(frozen=True)
class UpdateSteps:
    """An update round's two gradient steps, eager or compiled (run.compile under --compile), and
    what runs before each compiled step (run.graph_step: lets a CUDA graph reuse the last one's
    memory); eager by default."""

    critic: Callable = critic_step
    actor: Callable = actor_step
    graph_step: Callable[[], None] = lambda: None


def update(
    agent, optimizers, batches, hyper: UpdateHyper, steps: UpdateSteps = UpdateSteps()
) -> dict[str, torch.Tensor]:
    """One update round (paper, Algorithm 1; detail 4) on minibatches [utd, B, ...]: a critic step
    and a target update on each, then one actor and one temperature step on the last. Returns the
    named losses and alpha, 0-dim tensors on the device."""
    utd = len(batches["rewards"])
    alpha = agent.log_alpha.exp().detach()  # a constant of every loss but L_alpha
    # Random draws stay outside the compiled steps. Each critic step's Z, num_min_qs distinct
    # critics: the first of a random order, all steps' in one call.
    order = torch.rand(utd, agent.critic.num_qs, device=alpha.device).argsort(1)  # [utd, num_qs]
    members = order[:, : hyper.num_min_qs]  # [utd, num_min_qs]
    # The actor is fixed during the critic steps: every step's a' ~ pi(.|s') in one pass
    with torch.no_grad():
        # [utd, B, |A|] and [utd, B]
        next_actions, next_log_prob = agent.actor.sample(batches["next_obs"])
    for i in range(utd):
        batch = {name: values[i] for name, values in batches.items()}  # minibatch i: [B, ...]
        steps.graph_step()
        critic_losses = steps.critic(
            agent,
            optimizers["critic"],
            batch,
            next_actions=next_actions[i],
            next_log_prob=next_log_prob[i],
            members=members[i],
            alpha=alpha,
            gamma=hyper.gamma,
            tau=hyper.tau,
        )
        # CUDA graphs reuse a step's outputs in the next: keep copies
        critic_losses = {name: value.clone() for name, value in critic_losses.items()}
    # The actor and the temperature learn on the last minibatch
    steps.graph_step()
    noise = torch.randn_like(batch["actions"])  # [B, |A|]
    actor_losses = steps.actor(
        agent,
        optimizers,
        obs=batch["obs"],
        noise=noise,
        alpha=alpha,
        target_entropy=hyper.target_entropy,
    )
    return {**critic_losses, **actor_losses, "alpha": alpha}


# ---------------------------------------------------------------- data
class ReplayBuffer:
    """Ring buffer of (s, a, r, s', terminated), a in [-1, 1]: online replay or prior data."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int):
        """Zeroed float32 arrays of `capacity` rows, one a field."""
        self.capacity = capacity
        self.ptr = 0  # the row the next transition goes to
        self.size = 0  # rows filled
        shapes = ((obs_dim,), (act_dim,), (), (obs_dim,), ())
        self.data = {
            name: np.zeros((capacity, *shape), np.float32)
            for name, shape in zip(self.FIELDS, shapes)
        }

    @classmethod
    def holding(cls, data: dict) -> ReplayBuffer:
        """A buffer exactly the size of `data` (prior data, or its copy in a checkpoint)."""
        buffer = cls(len(data["rewards"]), data["obs"].shape[1], data["actions"].shape[1])
        buffer.add(**{name: np.asarray(data[name]) for name in cls.FIELDS})
        return buffer

    def add(self, obs, actions, rewards, next_obs, terminated) -> None:
        """Store n transitions (n rows each) after the last ones, over the oldest when full."""
        idx = (self.ptr + np.arange(len(obs))) % self.capacity  # [n]
        new = {
            "obs": obs,
            "actions": actions,
            "rewards": rewards,
            "next_obs": next_obs,
            "terminated": terminated,
        }
        for name, values in new.items():
            self.data[name][idx] = values
        self.ptr = int((self.ptr + len(idx)) % self.capacity)
        self.size = min(self.size + len(idx), self.capacity)

    def sample(self, shape, rng) -> dict:
        """Rows drawn uniformly with replacement: each field's [*shape, ...]."""
        idx = rng.integers(0, self.size, shape)
        return {name: values[idx] for name, values in self.data.items()}


def sample_mixed(offline, online, utd, batch_size, offline_ratio, rng, to_device) -> dict:
    """Symmetric sampling (paper, Section 3.1; detail 5): `utd` minibatches [utd, batch_size, ...]
    on the device (`to_device` uploads an array), each round(offline_ratio * batch_size) rows of
    prior data, then online rows."""
    n_offline = round(offline_ratio * batch_size)
    n_online = batch_size - n_offline
    parts = []
    if n_offline > 0:
        parts.append(offline.sample((utd, n_offline), rng))  # [utd, n_offline, ...]
    if n_online > 0:
        parts.append(online.sample((utd, n_online), rng))  # [utd, n_online, ...]
    # Side by side along the minibatch axis: [utd, batch_size, ...]
    return {name: to_device(np.concatenate([p[name] for p in parts], 1)) for name in parts[0]}


def step_and_store(envs, buffer, obs, actions, autoreset):
    """One vector step; only real transitions are stored (detail 8). Returns the next
    observations, the rewards and the mask of envs whose next step is an autoreset."""
    low, high = envs.single_action_space.low, envs.single_action_space.high
    next_obs, rewards, terminated, truncated, _ = envs.step(scale_action(actions, low, high))
    # The step after an episode's end only reset that env: not a transition
    real = ~autoreset
    buffer.add(obs[real], actions[real], rewards[real], next_obs[real], terminated[real])
    return next_obs, rewards, terminated | truncated


# ---------------------------------------------------------------- training
@dataclass
class Counters:
    """What the loop counts besides global_step; saved in the checkpoint."""

    num_updates: int = 0  # critic updates so far, pretraining's included
    pretrain_done: int = 0  # pretraining rounds done (detail 7)


def train(args: Args) -> None:
    """RLPD (Ball et al. 2023, Algorithm 1): online SAC on prior data and its own replay."""
    # 0. optionally (--pretrain-steps, detail 7): rounds on prior data alone  -> update
    # Then at every env step:
    # 1. learn (from learning_starts on), one update round:                    -> update
    #    a. utd_ratio minibatches, each half prior data, half online replay   -> sample_mixed
    #    b. on each, a critic step towards y from a random pair of target     -> critic_step,
    #       critics, and a Polyak update of the target critics                   soft_q_target
    #    c. on the last, one actor step and one temperature step              -> actor_step
    # 2. act, a ~ pi(.|s) (uniform before learning_starts); store real steps  -> step_and_store
    # 3. log episodes and losses; evaluate and checkpoint as due              -> log_losses, run.*
    # It learns, then acts (CleanRL's SAC acts, stores, then learns: the same sequence), so that the
    # checkpoint falls after a store and a resumed run's first update round is the straight run's.
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)
    # numpy draws the replay samples and the first random actions
    rng = np.random.default_rng(args.seed)
    envs = make_envs(args.env_id, args.num_envs)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = envs.single_action_space.shape[0]
    agent = Agent(obs_dim, act_dim, args.hidden_dim, args.num_qs, args.init_temperature)
    agent = agent.to(run.device)
    adam = partial(torch.optim.Adam, lr=args.learning_rate, fused=True)
    optimizers = {
        "actor": adam(agent.actor.parameters()),
        "alpha": adam([agent.log_alpha]),
        "critic": adam(agent.critic.parameters()),
    }
    buffer = ReplayBuffer(args.buffer_size, obs_dim, act_dim)
    counters = Counters()
    ckpt = run.resume_checkpoint(same=SAME_ON_RESUME)  # None without --resume
    global_step = restore(ckpt, args.resume, agent, optimizers, buffer, rng, counters)
    offline = prior_data(args, ckpt, envs)  # a ReplayBuffer, or None with --offline-ratio 0
    obs, _ = envs.reset(seed=args.seed + global_step)
    if args.target_entropy is None:
        target_entropy = -act_dim / 2
    else:
        target_entropy = args.target_entropy
    hyper = UpdateHyper(
        gamma=args.gamma,
        tau=args.tau,
        num_min_qs=args.num_min_qs,
        target_entropy=target_entropy,
    )
    steps = UpdateSteps(
        critic=run.compile(critic_step),
        actor=run.compile(actor_step),
        graph_step=run.graph_step,
    )
    to_device = partial(run.to_device, dtype=torch.float32)
    # Called by the harness when it saves and evaluates
    state = partial(checkpoint_state, agent, optimizers, buffer, offline, counters, rng)
    evaluate_policy = partial(evaluate, agent.actor, args, to_device)
    about = {
        "target_entropy": target_entropy,
        "offline_transitions": offline.size if offline else 0,
    }

    with run.start(global_step, args.total_steps, state=state, evaluate=evaluate_policy, **about):
        # 0. pretraining (detail 7): the rounds log at steps -pretrain_steps + 1 .. 0
        while counters.pretrain_done < args.pretrain_steps and not run.stop:
            batches = sample_mixed(
                offline,
                buffer,
                utd=args.utd_ratio,
                batch_size=args.batch_size,
                offline_ratio=1.0,
                rng=rng,
                to_device=to_device,
            )
            losses = update(agent, optimizers, batches, hyper, steps)
            counters.pretrain_done += 1
            counters.num_updates += args.utd_ratio
            step = counters.pretrain_done - args.pretrain_steps
            due = counters.pretrain_done % 100 == 0 or step == 0
            log_losses(run, "pretrain", step, losses, due)
            if step == 0:
                run.log(0, {"pretrain/eval_return": np.mean(evaluate_policy())})

        autoreset = np.zeros(args.num_envs, bool)  # envs whose next step only resets them
        ep_return = np.zeros(args.num_envs)
        ep_length = np.zeros(args.num_envs, int)
        while global_step < args.total_steps and not run.stop:
            # 1. learn on what is stored: utd_ratio update rounds' worth per env step
            if global_step >= args.learning_starts and buffer.size > 0:
                for _ in range(args.num_envs):
                    batches = sample_mixed(
                        offline,
                        buffer,
                        utd=args.utd_ratio,
                        batch_size=args.batch_size,
                        offline_ratio=args.offline_ratio,
                        rng=rng,
                        to_device=to_device,
                    )
                    losses = update(agent, optimizers, batches, hyper, steps)
                counters.num_updates += args.utd_ratio * args.num_envs
                due = Run.every(global_step, global_step - args.num_envs, 100)  # as CleanRL
                log_losses(run, "losses", global_step, losses, due)

            # 2. act and store
            if global_step < args.learning_starts:
                actions = rng.uniform(-1.0, 1.0, (args.num_envs, act_dim)).astype(np.float32)
            else:
                with torch.inference_mode():
                    policy_actions, _ = agent.actor.sample(to_device(obs))
                    actions = policy_actions.cpu().numpy()
            next_obs, rewards, dones = step_and_store(envs, buffer, obs, actions, autoreset)
            ep_return += rewards * ~autoreset
            ep_length += ~autoreset
            obs = next_obs
            autoreset = dones
            prev_step = global_step
            global_step += args.num_envs

            # 3. log
            for i in np.flatnonzero(autoreset):
                run.episode(global_step, ep_return[i], ep_length[i])
                ep_return[i] = 0.0
                ep_length[i] = 0
            if (
                Run.every(global_step, prev_step, 1000)
                or global_step >= args.total_steps
                or run.stop
            ):
                run.log(global_step, {"charts/SPS": run.sps(global_step)})
                run.log(global_step, {"charts/learning_rate": args.learning_rate})
            run.end_iteration(global_step)
        envs.close()
        run.finish(global_step, num_updates=counters.num_updates)


# ---------------------------------------------------------------- the file's own plumbing
def check_args(args: Args) -> list[tuple[bool, str]]:
    """The file's own flag checks, (condition, message) rows for Run."""
    data_id = args.dataset_id
    data_path = args.dataset_path
    ratio = args.offline_ratio
    has_data = bool(data_id or data_path)
    rows = [
        (0 <= ratio <= 1, f"--offline-ratio must be in [0, 1], got {ratio}"),
        (not (data_id and data_path), "pass --dataset-id or --dataset-path, not both"),
        (
            has_data or ratio == 0 or args.eval_only,
            "--offline-ratio > 0 needs prior data: pass --dataset-id or --dataset-path, or "
            "--offline-ratio 0 for none",
        ),
        (not has_data or ratio > 0, "--offline-ratio 0 uses no prior data; drop the dataset"),
        (
            args.pretrain_steps == 0 or ratio > 0,
            "--pretrain-steps trains on prior data; it needs --offline-ratio > 0",
        ),
        (args.pretrain_steps >= 0, "--pretrain-steps must be non-negative"),
        (args.learning_starts >= 0, "--learning-starts must be non-negative"),
        (1 <= args.num_min_qs <= args.num_qs, "--num-min-qs must be between 1 and --num-qs"),
        (0 < args.tau <= 1, "--tau must be in (0, 1]"),
        (0 <= args.gamma <= 1, "--gamma must be in [0, 1]"),
    ]
    positive = "num_envs utd_ratio batch_size buffer_size hidden_dim learning_rate init_temperature"
    for k in positive.split():
        rows.append((getattr(args, k) > 0, f"--{k.replace('_', '-')} must be positive"))
    return rows


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """One environment (evaluation, video); one line for what rlpd.py cannot run."""
    if env_id not in gym.registry and importlib.util.find_spec("ale_py"):
        # Atari ids register only once ale_py is imported; then the refusal names the right file
        gym.register_envs(importlib.import_module("ale_py"))
    try:
        env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
    except Exception as e:
        # Unknown id, missing entry-point module, missing dependency
        raise Run.fail(
            f"cannot make environment {env_id!r} ({str(e).splitlines()[0]}); check the id"
        )
    obs_space = env.observation_space
    act_space = env.action_space
    box = gym.spaces.Box
    problem = None
    if isinstance(obs_space, box) and len(obs_space.shape) > 1:
        problem = "has image observations; use ppo_atari.py or dqn_atari.py"
    elif isinstance(act_space, gym.spaces.Discrete):
        problem = "has discrete actions; use ppg.py"
    elif not (isinstance(obs_space, box) and isinstance(act_space, box)):
        problem = "needs flat Box observations and Box actions"
    elif not np.isfinite([act_space.low, act_space.high]).all():
        problem = "has unbounded actions; rlpd.py needs finite bounds"
    if problem:
        env.close()
        raise Run.fail(f"{env_id} {problem}")
    return env


def prior_data(args: Args, ckpt: dict | None, envs) -> ReplayBuffer | None:
    """The prior data as a buffer: the checkpoint's copy on a resume (no dataset is read again),
    else the dataset of --dataset-id or --dataset-path, else None (--offline-ratio 0)."""
    if ckpt is not None:
        return ReplayBuffer.holding(ckpt["offline_data"]) if ckpt["offline_data"] else None
    if not (args.dataset_id or args.dataset_path):
        return None
    data = load_prior_data(args, envs.single_observation_space, envs.single_action_space)
    return ReplayBuffer.holding(data)


def load_prior_data(args: Args, obs_space, act_space) -> dict:
    """The Minari dataset of --dataset-id or --dataset-path as transitions (s, a, r, s',
    terminated), a in [-1, 1] (detail 6); a missing, mismatched, non-finite or empty one stops in
    one line."""
    # minari is imported here: only runs with prior data need it.
    import minari

    name = args.dataset_id or args.dataset_path
    try:
        if args.dataset_id:
            dataset = minari.load_dataset(args.dataset_id)
        else:
            # A dataset folder, or the data/ folder inside it
            folder = Path(args.dataset_path)
            dataset = minari.MinariDataset(
                folder / "data" if (folder / "data").is_dir() else folder
            )
        episodes = list(dataset.iterate_episodes())
    except Exception as e:
        error = str(e).splitlines()[0]
        raise Run.fail(f"cannot load dataset {name} ({error}); pass a Minari dataset id or folder")
    spaces = (dataset.observation_space, dataset.action_space)
    if spaces != (obs_space, act_space):
        raise Run.fail(
            f"dataset {name} has spaces {spaces}, but {args.env_id} has {(obs_space, act_space)}; "
            "pass the --env-id it was recorded in"
        )
    if not episodes:
        raise Run.fail(f"dataset {name} has no episodes; record at least one")
    # A truncation only ends an episode: its last transition keeps terminated = 0 and bootstraps.
    data = {
        "obs": [ep.observations[:-1] for ep in episodes],
        "actions": [ep.actions for ep in episodes],
        "rewards": [ep.rewards for ep in episodes],
        "next_obs": [ep.observations[1:] for ep in episodes],
        "terminated": [ep.terminations for ep in episodes],
    }
    data = {k: np.concatenate(v) for k, v in data.items()}
    for field, values in data.items():
        if not np.isfinite(values).all():
            raise Run.fail(f"dataset {name} holds NaN or infinite values in its {field}; fix it")
    low, high = act_space.low, act_space.high
    actions = 2.0 * (data["actions"] - low) / (high - low) - 1.0
    data["actions"] = np.clip(actions, -ACTION_LIMIT, ACTION_LIMIT)
    return {k: v.astype(np.float32) for k, v in data.items()}


def buffer_state(buffer: ReplayBuffer) -> dict:
    """A buffer's filled rows and pointers, for the checkpoint."""
    # Copies of the filled part: torch.save of a view would write the whole array.
    data = {k: torch.from_numpy(v[: buffer.size].copy()) for k, v in buffer.data.items()}
    return {"ptr": buffer.ptr, "size": buffer.size, **data}


def checkpoint_state(agent, optimizers, buffer, offline, counters: Counters, rng) -> dict:
    """The checkpoint's algorithm part: networks, optimizers, both buffers, counters, generators."""
    return {
        "agent": agent.state_dict(),
        "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
        "replay_buffer": buffer_state(buffer),
        "offline_data": buffer_state(offline) if offline else None,
        "num_updates": counters.num_updates,
        "pretrain_done": counters.pretrain_done,
        "rng": Run.rng_state(torch=torch.default_generator, numpy=rng),
    }


# A resume must keep the data, the widths and the buffer (detail 10); the order of the refusals
SAME_ON_RESUME = (
    "dataset_id",
    "dataset_path",
    "offline_ratio",
    "pretrain_steps",
    "hidden_dim",
    "num_qs",
    "num_envs",
    "buffer_size",
)


def restore(ckpt, path, agent, optimizers, buffer, rng, counters: Counters) -> int:
    """Put --resume's checkpoint (read from `path`) back into the agent, the optimizers, the online
    replay, the generators and the counters; returns its global_step (0 without a checkpoint)."""
    if ckpt is None:
        return 0
    load_agent(agent, ckpt, path)
    for name, optimizer in optimizers.items():
        optimizer.load_state_dict(ckpt["optimizers"][name])
    replay = ckpt["replay_buffer"]
    buffer.ptr = int(replay["ptr"])
    buffer.size = int(replay["size"])
    for name, values in buffer.data.items():
        values[: buffer.size] = replay[name].numpy()
    Run.set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    counters.num_updates = ckpt["num_updates"]
    counters.pretrain_done = ckpt["pretrain_done"]
    return ckpt["global_step"]


def load_agent(agent, ckpt, path) -> None:
    """The checkpoint's weights; one line for the critics' older layout."""
    # The older layout: critic.weights, .biases, .ln_gains and .ln_biases, a tensor each
    if "critic.layers.0" not in ckpt["agent"]:
        raise Run.fail(
            f"checkpoint {path} has the critics' older layout; use the rlpd.py that wrote it"
        )
    agent.load_state_dict(ckpt["agent"])


def log_losses(run, prefix, step, losses, due) -> None:
    """Stop on a non-finite loss (pretraining counts as step 0); log prefix/<name> when due."""
    values = torch.stack(list(losses.values()))  # [len(losses)]: one copy to the host, if logged
    run.check_finite(values, max(step, 0))
    if due:
        run.log(step, {f"{prefix}/{name}": v for name, v in zip(losses, values.tolist())})


def evaluate(actor: Actor, args: Args, to_device, video_dir: Path | None = None) -> list[float]:
    """Deterministic returns, a = tanh(mean), of episodes seeded seed + 10_000 + i (detail 11)."""
    env = make_env(args.env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(
            env, str(video_dir), episode_trigger=lambda _: True, disable_logger=True
        )
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for i in range(args.eval_episodes):
        obs, _ = env.reset(seed=args.seed + 10_000 + i)
        done = False
        total = 0.0
        while not done:
            with torch.inference_mode():
                mean, _ = actor(to_device(obs[None]))
            action = scale_action(torch.tanh(mean[0]).cpu().numpy(), low, high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def eval_only(args: Args, run) -> None:
    """Evaluate --checkpoint with its own env, network and seed: it repeats the final evaluation."""
    ckpt = Run.load_checkpoint(args.checkpoint)
    env = make_env(ckpt["env_id"])
    obs_dim = int(np.prod(env.observation_space.shape))
    act_dim = env.action_space.shape[0]
    env.close()
    agent = Agent(obs_dim, act_dim, ckpt["args"]["hidden_dim"], ckpt["args"]["num_qs"])
    load_agent(agent, ckpt, args.checkpoint)
    run_args = replace(args, env_id=ckpt["env_id"], seed=ckpt["args"]["seed"])
    to_device = partial(run.to_device, dtype=torch.float32)
    returns = evaluate(agent.actor.to(run.device), run_args, to_device, run.video_dir)
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
