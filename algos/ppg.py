"""Phasic Policy Gradient (PPG) for discrete actions and flat observations.

Paper: Karl Cobbe, Jacob Hilton, Oleg Klimov, John Schulman, "Phasic Policy Gradient", ICML 2021,
arXiv:2009.04416. Reference code: openai/phasic-policy-gradient; peer: CleanRL ppg_procgen.py.

Idea. PPO trains policy and value function together, either in one network (the value gradient
disturbs the policy's features) or in two (the policy never benefits from value learning). PPG
alternates two phases. In the *policy phase* it runs N_pi ordinary PPO iterations, keeping policy
and value training apart. In the *auxiliary phase* it goes E_aux times over every sample stored
during those N_pi iterations, distilling value knowledge into the policy network through an
auxiliary value head while a behavioural-cloning KL term keeps the policy where it was. The
policy's features thus learn from value targets, and the value function gets many more epochs of
sample reuse than the policy.

Equations (one state s, advantage A_hat from GAE, r = pi(a|s) / pi_old(a|s)):
    policy phase, E_pi epochs:  L_clip = -E[min(r A_hat, clip(r, 1-eps, 1+eps) A_hat)] - c_ent H[pi]
    policy phase, E_V epochs:   L_value = c_vf * 0.5 E[(V(s) - V_targ)^2]
    auxiliary phase, E_aux epochs over all stored samples:
        L_joint = 0.5 E[(V_aux(s) - V_targ)^2] + beta_clone E[KL(pi_old(.|s) || pi(.|s))]
        L_value = 0.5 E[(V(s) - V_targ)^2]        (trained in the same step)
    V_targ = A_hat + V_old, the GAE(lambda) return computed when the rollout was collected;
    pi_old is the policy just before the auxiliary phase, computed once.

Implementation details:
 1. Architectures (--arch), named as in the reference. `dual` (the reference default, the paper's
    PPG): a policy network (trunk + policy head + auxiliary value head) and a separate value
    network. `detach`: one trunk carrying the policy, value and auxiliary value heads; the value
    head reads the trunk's features detached, so value training never reaches the trunk, which
    learns value only through the auxiliary head in the auxiliary phase. `shared`: the same single
    trunk without the stop-gradient, so the value loss trains the trunk too (with --e-aux 0, the
    usual shared-network PPO).
 2. Policy phase: max(E_pi, E_V) epochs of minibatches with one optimizer; epoch i adds the policy
    loss if i < E_pi and the value loss if i < E_V. With E_pi = E_V (the reference's and our
    defaults) this is the reference's `ppo.learn`; when they differ the reference runs the E_V
    value epochs first with a third optimizer. Advantages are normalised over the whole batch.
 3. Auxiliary phase after every N_pi policy iterations, with pi_old's logits computed once for all
    stored states before the first epoch; minibatches are drawn from all stored samples
    (--aux-num-minibatches).
 4. Separate Adam optimizers for the policy and auxiliary phases, as in the reference (eps:
    deviation g). A checkpoint holds both, the samples stored so far in the phase, the reward
    statistics and the vector env's state: a resume continues the phase and the same episodes.
 5. Gymnasium semantics: vector envs autoreset in the NEXT_STEP mode; the step after a done is
    masked out of every loss and statistic (`valid`). GAE uses V(s_{t+1}) on truncation (under
    NEXT_STEP, s_{t+1} is the real final observation) and 0 on termination.
 6. Orthogonal init (sqrt 2 body, 0.01 policy head, 1 value heads), tanh MLPs, optional linear LR
    annealing of both optimizers to 0 at --schedule-steps (by default the first run's
    --total-steps; a resume keeps that horizon, and a --total-steps beyond it is refused rather
    than training at a rate of 0). --norm-reward divides rewards by the running std of the
    discounted return and clips them to +-10, as the reference's RewardNormalizer.
 7. Evaluation: greedy (argmax) policy on a separate env, episode i seeded with seed + 10000 + i.
 8. Torch's generator is the only one drawn from (initialisation, actions, minibatch order), so
    it is the only one a checkpoint saves; python's and numpy's global generators go unused.
 9. On a GPU the only wait for the device per env step is the actions' copy to the CPU: the envs'
    arrays and observations go through pinned staging buffers, Adam is fused with tensor learning
    rates set in place, and the losses stay on the device until the iteration logs them (one
    read). Categorical's draw is written out: its argument checks would wait for the device.
    --compile compiles the acting forward, GAE and both phases' minibatch steps (CUDA graphs on a
    GPU; Dynamo leaves the fused Adam step, one kernel, as it is). Off by default: not yet
    measured to win on a GPU.

Deviations from the Procgen reference (N_pi 32, E_pi 1, E_V 1, E_aux 6, beta_clone 1, lr 5e-4,
gamma 0.999, lambda 0.95, 64 envs x 256 steps), chosen so that CartPole-v1 is solved in 50k steps
(zoo/ppg.toml; what was measured, and how, is in results/ppg-measurements.md):
 a. small batches (8 envs x 32 steps) and N_pi 8, so an auxiliary phase comes every 2,048 steps
    instead of every 524k;
 b. E_pi = E_V = 10 and lr 1e-3 annealed: one epoch per batch learns too slowly for a 50k-step
    budget (the RL Zoo PPO preset uses 20 epochs);
 c. gamma 0.98, lambda 0.8, no entropy bonus (RL Zoo's tuned CartPole values);
 d. --no-norm-reward by default: CartPole's reward is a constant 1 and the rescaling made training
    less stable there; LunarLander-like rewards need --norm-reward (the zoo's presets use it);
 e. gradient-norm clipping (0.5, CleanRL; the reference has none), of the policy side and the
    value side apart: one joint norm let the large value gradient stall the policy on LunarLander;
 f. unclipped value loss and MLPs instead of IMPALA CNNs (flat observations);
 g. Adam eps 1e-5 (CleanRL's and baselines' PPO) where the reference keeps PyTorch's 1e-8: the
    presets were tuned with it; --adam-eps 1e-8 gives the reference's optimizer.
With --e-aux 0 the auxiliary phase is off and the file is plain PPO (separate policy and value
networks with --arch dual): the honest ablation (the zoo's ppg-lunarlander-noaux).

Usage: python algos/ppg.py --env-id CartPole-v1 --total-steps 50000 --seed 1
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter

# The run harness, at the end of the file, is reached through one name: Run(args, checks) checks the
# flags, seeds and picks run.device; run.compile, run.host_buffer, run.upload for speed; run.start,
# run.episode, run.log, run.check_finite, run.end_iteration, run.finish for the run's outputs.


@dataclass
class Args:
    """PPG's flags (tyro): the common ones first, then the algorithm's; the module
    docstring at the top of ppg.py gives the reasons for their defaults."""

    env_id: str = "CartPole-v1"
    """Gymnasium id: discrete actions, flat observations"""
    seed: int = 1
    """seed of torch and the environments"""
    total_steps: int = 50_000
    """environment steps in total (summed over envs)"""
    num_envs: int = 8
    """parallel environments"""
    torch_deterministic: bool = True
    """deterministic torch kernels"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    compile: bool = False
    """torch.compile the updates, GAE and the acting forward (CUDA graphs on a GPU)"""
    exp_name: str = "ppg"
    """experiment name, part of the default run directory"""
    run_dir: str | None = None
    """output directory (default runs/<env>__<exp>__<seed>__<unixtime>)"""
    checkpoint_interval: int = 25_000
    """env steps between checkpoints (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from"""
    eval_episodes: int = 10
    """greedy evaluation episodes"""
    eval_interval: int = 10_000
    """env steps between evaluations (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint and write eval.json"""
    checkpoint: str | None = None
    """checkpoint to evaluate with --eval-only"""
    capture_video: bool = False
    """record the final evaluation's episodes in <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """Weights & Biases project"""
    # PPO (policy phase)
    num_steps: int = 32
    """steps per env per rollout"""
    learning_rate: float = 1e-3
    """Adam learning rate of the policy phase"""
    adam_eps: float = 1e-5
    """Adam epsilon of both optimizers (the reference's: 1e-8)"""
    anneal_lr: bool = True
    """anneal both learning rates linearly to 0 at --schedule-steps"""
    schedule_steps: int | None = None
    """step at which the rates reach 0 (default: the first run's --total-steps)"""
    gamma: float = 0.98
    """discount"""
    gae_lambda: float = 0.8
    """GAE lambda"""
    num_minibatches: int = 4
    """minibatches per policy-phase epoch"""
    clip_coef: float = 0.2
    """PPO ratio clip epsilon"""
    ent_coef: float = 0.0
    """entropy bonus c_ent"""
    vf_coef: float = 0.5
    """value loss weight in the policy phase"""
    max_grad_norm: float = 0.5
    """gradient-norm clip of the policy side and of the value side"""
    norm_reward: bool = False
    """divide rewards by a running std of the discounted return"""
    hidden_dim: int = 64
    """width of the two hidden layers"""
    # PPG
    arch: Literal["dual", "detach", "shared"] = "dual"
    """value network: its own (dual), on the policy trunk detached (detach) or not (shared)"""
    n_pi: int = 8
    """N_pi: policy iterations per phase"""
    e_pi: int = 10
    """E_pi: policy epochs per iteration"""
    e_v: int = 10
    """E_V: value epochs per iteration"""
    e_aux: int = 6
    """E_aux: auxiliary epochs per phase (0: no auxiliary phase, i.e. PPO)"""
    beta_clone: float = 1.0
    """weight of KL(pi_old || pi) in the auxiliary phase"""
    aux_learning_rate: float = 1e-3
    """Adam learning rate of the auxiliary phase"""
    aux_num_minibatches: int = 8
    """minibatches per auxiliary epoch (over all N_pi rollouts)"""


# ---------------------------------------------------------------- environment
def make_env(env_id: str, video_dir: Path | None = None) -> gym.Env:
    """One environment (evaluation, video); its video records every episode."""
    env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(
            env,
            str(video_dir),
            episode_trigger=lambda _: True,
            name_prefix="eval",
            disable_logger=True,
        )
    return env


def make_envs(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """Gymnasium's native vector env where one exists (classic control), else a sync one; both
    autoreset in the NEXT_STEP mode (detail 5)."""
    try:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    except gym.error.Error:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


# ------------------------------------------------------------------- networks
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with gain `std` and a constant bias (detail 6)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(obs_dim: int, hidden_dim: int) -> nn.Sequential:
    """The trunk: two tanh layers of `hidden_dim` units."""
    return nn.Sequential(
        layer_init(nn.Linear(obs_dim, hidden_dim)),
        nn.Tanh(),
        layer_init(nn.Linear(hidden_dim, hidden_dim)),
        nn.Tanh(),
    )


class Agent(nn.Module):
    """Policy trunk with policy and auxiliary value heads; the value head sits on its own trunk
    (`dual`), on the policy trunk's detached features (`detach`) or on the trunk (`shared`)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden_dim: int, arch: str):
        super().__init__()
        self.arch = arch
        self.pi_body = mlp(obs_dim, hidden_dim)
        self.pi_head = layer_init(nn.Linear(hidden_dim, num_actions), std=0.01)
        self.aux_head = layer_init(nn.Linear(hidden_dim, 1), std=1.0)
        self.v_body = mlp(obs_dim, hidden_dim) if arch == "dual" else None
        self.v_head = layer_init(nn.Linear(hidden_dim, 1), std=1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Policy logits [n, A], V(s) [n] and V_aux(s) [n] of observations x [n, obs_dim]."""
        h = self.pi_body(x)
        if self.arch == "dual":
            h_v = self.v_body(x)
        elif self.arch == "detach":  # the value loss must not shape the policy's features (Sec. 3)
            h_v = h.detach()
        else:
            h_v = h
        # the value heads' [n, 1] -> [n]
        return self.pi_head(h), self.v_head(h_v).squeeze(-1), self.aux_head(h).squeeze(-1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The policy's logits [n, A] alone (pi_old, evaluation): the value trunk is not run."""
        return self.pi_head(self.pi_body(x))


def clip_grads(agent: Agent, max_norm: float) -> None:
    """Clip the policy side (trunk, policy and aux heads) and the value side apart: one joint norm
    would let the large value gradient shrink the policy's step (deviation e)."""
    value_side = [p for n, p in agent.named_parameters() if n.startswith("v_")]
    policy_side = [p for n, p in agent.named_parameters() if not n.startswith("v_")]
    nn.utils.clip_grad_norm_(policy_side, max_norm)
    nn.utils.clip_grad_norm_(value_side, max_norm)


@dataclass
class Learner:
    """The network and its two Adam optimizers, one per phase (detail 4); their names are the
    checkpoint's keys."""

    agent: Agent
    optimizer: torch.optim.Adam  # the policy phase's
    aux_optimizer: torch.optim.Adam  # the auxiliary phase's

    def set_learning_rates(self, learning_rate: float, aux_learning_rate: float) -> None:
        """Both rates, written into their tensors in place: compiled steps do not recompile."""
        self.optimizer.param_groups[0]["lr"].fill_(learning_rate)
        self.aux_optimizer.param_groups[0]["lr"].fill_(aux_learning_rate)


def adam(agent: Agent, lr: float, eps: float, device) -> torch.optim.Adam:
    """Fused Adam of all parameters (both phases train all of them, detail 4), with a tensor
    learning rate, set in place: compiled steps do not recompile."""
    lr = torch.tensor(lr, device=device)
    return torch.optim.Adam(agent.parameters(), lr=lr, eps=eps, fused=True)


# ----------------------------------------------------------- collecting rollouts
ENV_ARRAYS = ("rewards", "terminated", "dones", "valid")  # what the envs give, per step


@dataclass
class Carry:
    """What crosses rollouts: the next observation (on the device), the envs whose next step is
    an autoreset, and the running episodes' return and length."""

    next_obs: torch.Tensor  # [N, obs_dim]
    autoreset: np.ndarray  # [N] bool
    ep_return: np.ndarray  # [N]
    ep_length: np.ndarray  # [N] int64


def reset_carry(envs, seed: int, device) -> Carry:
    """The carry of freshly reset envs (seeded with `seed`)."""
    obs, _ = envs.reset(seed=seed)
    next_obs = torch.as_tensor(obs, dtype=torch.float32, device=device)
    # contiguous, as the staged ones (CartPole's reset gives a transposed array): a compiled
    # acting forward then sees one layout
    next_obs = next_obs.contiguous()
    n = envs.num_envs
    return Carry(
        next_obs=next_obs,
        autoreset=np.zeros(n, dtype=bool),
        ep_return=np.zeros(n),
        ep_length=np.zeros(n, dtype=np.int64),
    )


def rollout_storage(num_steps: int, num_envs: int, obs_dim: int, run: Run) -> dict:
    """Preallocated [T, N] tensors of one rollout on the device (`valid` = 0 marks an autoreset
    step), and `staging`: the envs' arrays and next observations in host memory (pinned on a GPU),
    so that their copies to the device do not wait (detail 9)."""
    shape = (num_steps, num_envs)
    storage = {}
    for name in ("logprobs", "values", *ENV_ARRAYS):
        storage[name] = torch.zeros(shape, device=run.device)
    storage["obs"] = torch.zeros((*shape, obs_dim), device=run.device)
    storage["actions"] = torch.zeros(shape, dtype=torch.long, device=run.device)
    staging = {name: run.host_buffer(shape) for name in ENV_ARRAYS}
    staging["next_obs"] = run.host_buffer((*shape, obs_dim))
    storage["staging"] = staging
    return storage


def rollout(envs, agent, storage: dict, carry: Carry, run: Run) -> list[tuple[int, float, int]]:
    """num_steps vector steps of the current policy into `storage`, updating `carry` in place; the
    autoreset step gets valid = 0 (detail 5). Returns (t, return, length) of each episode ended.
    The actions' copy to the CPU is the only wait for the device (detail 9)."""
    episodes = []
    staging = storage["staging"]
    host = {name: x.numpy() for name, x in staging.items()}  # numpy views of the staging rows
    for t in range(storage["rewards"].shape[0]):
        real = ~carry.autoreset  # [N]: false where this step only resets the env
        storage["obs"][t] = carry.next_obs
        with torch.inference_mode():
            logits, value, _ = agent(carry.next_obs)  # [N, A], [N]
            # Categorical's draw and log-probability without its argument checks, which wait for
            # the device
            log_pi = logits.log_softmax(-1)  # [N, A]
            actions = torch.multinomial(log_pi.exp(), 1).squeeze(-1)  # [N, 1] -> [N]
            # log pi(a_t | s_t): [N, A] gathered at [N, 1] -> [N]
            storage["logprobs"][t] = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            storage["values"][t] = value
            storage["actions"][t] = actions
        next_obs, reward, terminated, truncated, _ = envs.step(actions.cpu().numpy())
        done = terminated | truncated
        # staging rows are written after that wait: the previous rollout's copies of them are done
        host["rewards"][t] = reward
        host["terminated"][t] = terminated
        host["dones"][t] = done
        host["valid"][t] = real
        host["next_obs"][t] = next_obs
        carry.next_obs = run.upload(staging["next_obs"][t], copy=True)
        carry.ep_return += np.where(real, reward, 0.0)
        carry.ep_length += real
        for i in np.flatnonzero(done & real):
            episodes.append((t, float(carry.ep_return[i]), int(carry.ep_length[i])))
        carry.ep_return[done] = 0.0
        carry.ep_length[done] = 0
        carry.autoreset = done
    for name in ENV_ARRAYS:
        storage[name].copy_(staging[name], non_blocking=True)
    return episodes


# ------------------------------------------------------ advantages and V_targ
def gae(rewards, values, next_value, terminated, dones, gamma: float, lam: float) -> torch.Tensor:
    """GAE(lambda) advantages, [T, N]. values[t] = V(s_t); next_value = V(s_T), [N]. Termination
    cuts the bootstrap; truncation keeps V(s_{t+1}) (the real final observation under NEXT_STEP
    autoreset); any done cuts the lambda-trace."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        v_next = next_value if t == T - 1 else values[t + 1]  # [N]
        # delta_t = r_t + gamma V(s_{t+1}) - V(s_t), with no bootstrap past a termination
        delta = rewards[t] + gamma * v_next * (1.0 - terminated[t]) - values[t]
        # A_t = delta_t + gamma lambda A_{t+1}, the sum cut where an episode ended
        last = delta + gamma * lam * (1.0 - dones[t]) * last
        advantages[t] = last
    return advantages


@dataclass
class RewardStats:
    """--norm-reward's state (detail 6): the moments [count, mean, var] (float64) of the discounted
    returns seen so far, and each env's running discounted return [N]."""

    moments: torch.Tensor
    ret: torch.Tensor


def discounted_returns(rewards, dones, ret, gamma: float):
    """Running discounted reward sums per env, [T, N]; `ret` [N] carries over rollouts."""
    out = torch.zeros_like(rewards)
    for t in range(rewards.shape[0]):
        ret = rewards[t] + gamma * ret
        out[t] = ret
        ret = ret * (1.0 - dones[t])
    return out, ret


def update_moments(moments: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[count, mean, var] of all x seen so far where w = 1 (parallel variance formula), as tensors
    on x's device: nothing waits for it."""
    count, mean, var = moments
    n = w.sum()
    m = (x * w).sum() / n.clamp(min=1.0)
    v = ((x - m) ** 2 * w).sum() / n.clamp(min=1.0)
    total = count + n
    delta = m - mean
    new_var = (var * count + v * n + delta**2 * count * n / total) / total
    return torch.stack([total, mean + delta * n / total, new_var])


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of x over the samples where mask = 1: the valid steps (detail 5)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


@torch.no_grad()
def make_batch(
    storage: dict, agent, next_obs, reward_stats: RewardStats | None, args: Args, gae=gae
) -> dict:
    """The flat training batch of T x N samples: GAE advantages normalised over the valid samples,
    and V_targ = A_hat + V_old, bootstrapped from V(next_obs). --norm-reward first scales the
    rewards as the reference's RewardNormalizer (detail 6), updating `reward_stats` in place.
    `gae`: the GAE function (compiled with --compile)."""
    rewards = storage["rewards"]  # [T, N], as every array here
    values = storage["values"]
    dones = storage["dones"]
    valid = storage["valid"]
    if args.norm_reward:
        ret, reward_stats.ret = discounted_returns(rewards, dones, reward_stats.ret, args.gamma)
        reward_stats.moments = update_moments(reward_stats.moments, ret, valid)
        return_std = (reward_stats.moments[2] + 1e-8).sqrt().float()
        rewards = (rewards / return_std).clamp(-10.0, 10.0)
    next_value = agent(next_obs)[1]  # V(s_T), [N]
    advantages = gae(
        rewards,
        values,
        next_value,
        storage["terminated"],
        dones,
        gamma=args.gamma,
        lam=args.gae_lambda,
    )
    # [T, N] -> [T * N], step-major
    w = valid.flatten()
    adv = advantages.flatten()
    mean = masked_mean(adv, w)
    std = masked_mean((adv - mean) ** 2, w).sqrt()
    return {
        "obs": storage["obs"].flatten(0, 1),  # [T, N, obs_dim] -> [T * N, obs_dim]
        "actions": storage["actions"].flatten(),
        "logprobs": storage["logprobs"].flatten(),
        "advantages": (adv - mean) / (std + 1e-8),
        "returns": (advantages + values).flatten(),  # V_targ
        "valid": w,
    }


@torch.no_grad()
def explained_variance(y: torch.Tensor, pred: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """1 - Var(y - pred) / Var(y) over the samples where w = 1; NaN when y does not vary."""
    var_y = masked_mean((y - masked_mean(y, w)) ** 2, w)
    resid = y - pred
    explained = 1 - masked_mean((resid - masked_mean(resid, w)) ** 2, w) / var_y
    return torch.where(var_y > 0, explained, torch.nan)


# ------------------------------------------------------------------ policy phase
def ppo_losses(
    logits, value, *, actions, logprob_old, advantages, v_targ, valid, clip_coef: float
) -> dict[str, torch.Tensor]:
    """The policy phase's losses on a minibatch of M samples (logits [M, A], the rest [M]), as
    0-dim tensors: L_clip, the value loss 0.5 (V - V_targ)^2, the entropy H[pi], and two
    diagnostics, the approximate KL to pi_old and the fraction of clipped ratios. Each is a mean
    over the valid samples: an autoreset step is not a transition (detail 5)."""
    log_pi = logits.log_softmax(-1)  # [M, A]
    # log r = log pi(a|s) - log pi_old(a|s): [M, A] gathered at [M, 1] -> [M]
    log_ratio = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1) - logprob_old
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    surrogate = -torch.min(ratio * advantages, clipped * advantages)  # [M]
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - log_ratio, valid)
        clipfrac = masked_mean(((ratio - 1).abs() > clip_coef).float(), valid)
    value_loss = 0.5 * masked_mean((value - v_targ) ** 2, valid)
    entropy = masked_mean(-(log_pi.exp() * log_pi).sum(-1), valid)  # sum over A: [M, A] -> [M]
    return {
        "policy_loss": masked_mean(surrogate, valid),
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


def policy_step(
    agent: Agent, optimizer, args: Args, train_pi: bool, train_v: bool, **minibatch
) -> dict[str, torch.Tensor]:
    """One minibatch of the policy phase: L_clip - c_ent H if train_pi, c_vf L_value if train_v,
    then an Adam step; the minibatch's losses (ppo_losses' names)."""
    logits, value, _ = agent(minibatch["obs"])
    losses = ppo_losses(
        logits,
        value,
        actions=minibatch["actions"],
        logprob_old=minibatch["logprobs"],
        advantages=minibatch["advantages"],
        v_targ=minibatch["returns"],
        valid=minibatch["valid"],
        clip_coef=args.clip_coef,
    )
    loss = 0.0
    if train_pi:  # an E_pi epoch
        loss = loss + losses["policy_loss"] - args.ent_coef * losses["entropy"]
    if train_v:  # an E_V epoch
        loss = loss + args.vf_coef * losses["value_loss"]
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    clip_grads(agent, args.max_grad_norm)
    optimizer.step()
    return {name: value.detach() for name, value in losses.items()}


def policy_phase(
    agent: Agent, optimizer, batch: dict, args: Args, step=policy_step
) -> dict[str, torch.Tensor]:
    """One PPO iteration's updates (Alg. 1's policy and value epochs): max(E_pi, E_V) epochs, where
    epoch i trains the policy if i < E_pi and the value function if i < E_V (reference ppo.learn,
    detail 2). Returns the last minibatch's losses (with E_V > E_pi its policy terms come from a
    value-only epoch); `step`: policy_step, or compiled."""
    n = batch["obs"].shape[0]
    minibatch_size = n // args.num_minibatches
    for epoch in range(max(args.e_pi, args.e_v)):
        # a random permutation of the n samples, cut into num_minibatches index vectors [M]
        for idx in torch.randperm(n, device=batch["obs"].device).split(minibatch_size):
            minibatch = {name: x[idx] for name, x in batch.items()}  # [n, ...] -> [M, ...]
            train_pi = epoch < args.e_pi
            train_v = epoch < args.e_v
            # (E_pi != E_V: one compiled graph for each of the at most 3 pairs of flags)
            losses = step(agent, optimizer, args, train_pi, train_v, **minibatch)
    # (CUDA graphs overwrite a compiled step's outputs at its next call)
    return {name: value.clone() for name, value in losses.items()}


def learning_rates(iteration: int, horizon_iterations: int, args: Args) -> dict[str, float]:
    """Both phases' Adam rates for policy iteration `iteration` (0, 1, ...): with --anneal-lr they
    fall linearly from the flags' values to 0 at iteration `horizon_iterations` (detail 6)."""
    fraction = 1.0
    if args.anneal_lr:
        fraction = 1.0 - iteration / horizon_iterations
    return {
        "learning_rate": fraction * args.learning_rate,
        "aux_learning_rate": fraction * args.aux_learning_rate,
    }


# -------------------------------------------------------------- auxiliary phase
@dataclass
class AuxBuffer:
    """The buffer B of Algorithm 1: the states, V_targ and valid masks of the phase's rollouts,
    [N_pi, T * N, ...] (detail 3); row k holds the phase's rollout k."""

    obs: torch.Tensor  # [N_pi, T * N, obs_dim]
    vtarg: torch.Tensor  # [N_pi, T * N]
    valid: torch.Tensor  # [N_pi, T * N]

    @staticmethod
    def empty(n_rollouts: int, batch_size: int, obs_dim: int, device) -> AuxBuffer:
        """Room for `n_rollouts` rollouts of `batch_size` samples (none without a phase)."""
        return AuxBuffer(
            obs=torch.zeros((n_rollouts, batch_size, obs_dim), device=device),
            vtarg=torch.zeros((n_rollouts, batch_size), device=device),
            valid=torch.zeros((n_rollouts, batch_size), device=device),
        )

    def store(self, k: int, batch: dict) -> None:
        """Add every (s_t, V_targ) of a batch to B as rollout k (the policy phase's last step)."""
        self.obs[k] = batch["obs"]
        self.vtarg[k] = batch["returns"]
        self.valid[k] = batch["valid"]


def categorical_kl(logits_old: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(pi_old || pi) per state: logits [M, A] -> [M]."""
    logp_old = F.log_softmax(logits_old, -1)
    logp = F.log_softmax(logits, -1)
    return (logp_old.exp() * (logp_old - logp)).sum(-1)


def aux_losses(logits, value, aux_value, logits_old, v_targ, valid) -> dict[str, torch.Tensor]:
    """The auxiliary phase's terms (paper Eq. 2-3), 0-dim means over the valid samples: the
    behavioural-cloning KL(pi_old || pi), the auxiliary value loss 0.5 (V_aux - V_targ)^2 and the
    value loss 0.5 (V - V_targ)^2. L_joint = aux_value + beta_clone kl."""
    return {
        "kl": masked_mean(categorical_kl(logits_old, logits), valid),
        "aux_value": 0.5 * masked_mean((aux_value - v_targ) ** 2, valid),
        "value": 0.5 * masked_mean((value - v_targ) ** 2, valid),
    }


def aux_step(
    agent: Agent, optimizer, args: Args, obs, logits_old, v_targ, valid
) -> dict[str, torch.Tensor]:
    """One minibatch of an auxiliary epoch (Alg. 1): L_joint and L_value in one Adam step; the
    minibatch's losses (aux_losses' names)."""
    logits, value, aux_value = agent(obs)
    losses = aux_losses(logits, value, aux_value, logits_old, v_targ, valid)
    optimizer.zero_grad(set_to_none=True)
    # L_joint = L_aux + beta_clone KL, and L_value; their sum, one step
    loss = args.beta_clone * losses["kl"] + losses["aux_value"] + losses["value"]
    loss.backward()
    clip_grads(agent, args.max_grad_norm)
    optimizer.step()
    return {name: value.detach() for name, value in losses.items()}


def auxiliary_phase(
    agent: Agent, optimizer, aux_buffer: AuxBuffer, args: Args, step=aux_step
) -> dict[str, torch.Tensor]:
    """Alg. 1's auxiliary phase: pi_old computed once, then E_aux epochs over every sample in B;
    the mean of each loss over its minibatches. `step`: aux_step, or compiled."""
    # [N_pi, T * N, ...] -> [n, ...], n = N_pi * T * N: all the phase's samples
    obs = aux_buffer.obs.flatten(0, 1)
    v_targ = aux_buffer.vtarg.flatten(0, 1)
    valid = aux_buffer.valid.flatten(0, 1)
    n = obs.shape[0]
    # pi_old(.|s) of every state in B, computed once before the first epoch: [n, A]
    with torch.no_grad():
        logits_old = torch.cat([agent.logits(chunk) for chunk in obs.split(4096)])
    sums = {name: torch.zeros((), device=obs.device) for name in ("kl", "aux_value", "value")}
    for _ in range(args.e_aux):
        # a random permutation of the n samples, cut into aux_num_minibatches index vectors
        for idx in torch.randperm(n, device=obs.device).split(n // args.aux_num_minibatches):
            losses = step(
                agent, optimizer, args, obs[idx], logits_old[idx], v_targ[idx], valid[idx]
            )
            for name, value in losses.items():
                sums[name] += value
    minibatches = max(1, args.e_aux * args.aux_num_minibatches)
    return {name: total / minibatches for name, total in sums.items()}


# ---------------------------------------------------------------- training
@dataclass
class Counters:
    """The run's counters, saved in every checkpoint under these names (detail 4)."""

    iteration: int = 0  # policy iterations done
    phase_iteration: int = 0  # rollouts in B: the policy iterations done in this phase
    aux_phases: int = 0  # auxiliary phases done
    train_time_s: float = 0  # seconds in policy iterations and auxiliary phases ...
    aux_time_s: float = 0  # ... and in auxiliary phases alone
    schedule_steps: int = 0  # the step at which the annealed rates reach 0 (anneal_horizon)


def train(args: Args) -> None:
    """PPG (Cobbe et al. 2021, Algorithm 1) on --num-envs synchronous envs: policy phases of
    N_pi PPO iterations, each followed by an auxiliary phase; with --e-aux 0, PPO."""
    # Algorithm 1, as this loop runs it:
    # for each phase:
    #   the policy phase, N_pi iterations (a resume may start mid-phase):
    #     1. roll out the current policy: T steps of N envs          -> rollout
    #     2. GAE advantages, V_targ = A_hat + V_old                  -> make_batch (gae)
    #     3. E_pi epochs of L_clip - c_ent H, E_V epochs of L_value  -> policy_phase (policy_step,
    #                                                                   ppo_losses)
    #     4. add every (s_t, V_targ) to the buffer B                 -> AuxBuffer.store
    #     5. log; evaluate and checkpoint as their intervals pass    -> log_iteration, run.*
    #   the auxiliary phase (none with --e-aux 0):
    #     6. pi_old(.|s_t) of every state in B, computed once        -> auxiliary_phase
    #     7. E_aux epochs of L_joint = L_aux + beta_clone KL, and L_value on all of B
    #                                                                -> aux_step (aux_losses)
    #     8. log the phase's last iteration (step 5 waits for it)    -> log_iteration, run.*
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)
    obs_dim, num_actions = check_env(args.env_id)
    ckpt = load_resume(args, run)
    horizon = anneal_horizon(args, ckpt)
    device = run.device

    # set-up: envs, network and optimizers, rollout storage, the buffer B, counters
    envs = make_envs(args.env_id, args.num_envs)
    agent = Agent(obs_dim, num_actions, args.hidden_dim, args.arch).to(device)
    learner = Learner(
        agent=agent,
        optimizer=adam(agent, args.learning_rate, args.adam_eps, device),
        aux_optimizer=adam(agent, args.aux_learning_rate, args.adam_eps, device),
    )
    N = args.num_envs
    batch_size = args.num_envs * args.num_steps
    storage = rollout_storage(args.num_steps, N, obs_dim, run)
    n_stored = args.n_pi if args.e_aux else 0  # B holds N_pi rollouts, or none without the phase
    aux_buffer = AuxBuffer.empty(n_stored, batch_size, obs_dim, device)
    carry = reset_carry(envs, args.seed, device)
    reward_stats = RewardStats(
        moments=torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64, device=device),
        ret=torch.zeros(N, device=device),
    )
    counters = Counters(schedule_steps=horizon)
    if ckpt:
        restore(ckpt, learner, envs, carry, aux_buffer, reward_stats, counters)
    global_step = counters.iteration * batch_size
    total = args.total_steps // batch_size * batch_size  # whole rollouts
    evaluate_policy = partial(evaluate, agent, args.env_id, args.eval_episodes, args.seed, device)
    state = partial(checkpoint_state, learner, envs, carry, aux_buffer, reward_stats, counters)
    act = run.compile(agent)
    gae_fn = run.compile(gae)
    policy_fn = run.compile(policy_step)
    aux_fn = run.compile(aux_step)

    with run.start(global_step, total, state=state, evaluate=evaluate_policy):
        while global_step < total and not run.stop:  # one phase
            # ---- the policy phase: N_pi PPO iterations. counters.phase_iteration counts the
            # rollouts in B (none without an auxiliary phase: PPO has no phase to resume)
            for phase_iteration in range(counters.phase_iteration, args.n_pi):
                with timed(counters, "train_time_s"):
                    rates = learning_rates(counters.iteration, horizon // batch_size, args)
                    learner.set_learning_rates(**rates)
                    counters.iteration += 1
                    # 1. collect
                    for t, ep_return, ep_length in rollout(envs, act, storage, carry, run):
                        run.episode(global_step + (t + 1) * N, ep_return, ep_length)
                    global_step += batch_size
                    # 2. advantages and targets
                    batch = make_batch(storage, agent, carry.next_obs, reward_stats, args, gae_fn)
                    # 3. learn: E_pi policy epochs, E_V value epochs
                    losses = policy_phase(agent, learner.optimizer, batch, args, policy_fn)
                    # 4. keep the rollout's samples for the auxiliary phase
                    if args.e_aux:
                        aux_buffer.store(phase_iteration, batch)
                        counters.phase_iteration = phase_iteration + 1
                if counters.phase_iteration == args.n_pi:
                    break  # B is full: this iteration is logged after the auxiliary phase
                # 5. log
                log_iteration(run, global_step, losses, batch, storage, rates, counters)
                run.end_iteration(global_step)
                if global_step >= total or run.stop:
                    break

            # ---- the auxiliary phase, once B holds N_pi rollouts
            if args.e_aux and counters.phase_iteration == args.n_pi:
                with timed(counters, "train_time_s", "aux_time_s"):
                    # 6.-7. pi_old once, then E_aux epochs of L_joint and L_value
                    aux = auxiliary_phase(agent, learner.aux_optimizer, aux_buffer, args, aux_fn)
                    counters.phase_iteration = 0
                    counters.aux_phases += 1
                # 8. log the phase's last policy iteration with the auxiliary phase's losses
                losses |= {f"aux/{name}": value for name, value in aux.items()}
                log_iteration(run, global_step, losses, batch, storage, rates, counters)
                run.end_iteration(global_step)
        envs.close()
        summary = {"arch": args.arch, "aux_phases": counters.aux_phases}
        summary["aux_phase_time_fraction"] = aux_time_fraction(counters)
        run.finish(global_step, **summary)


# ------------------------------------------------------------ the file's own plumbing
SIZES = (
    "num_envs",
    "num_steps",
    "num_minibatches",
    "aux_num_minibatches",
    "n_pi",
    "e_pi",
    "hidden_dim",
)
EPISODE_ARRAYS = ("autoreset", "ep_return", "ep_length")  # Carry's numpy arrays
COUNTERS = ("iteration", "phase_iteration", "aux_phases", "train_time_s", "aux_time_s")


def check_args(args: Args) -> list[tuple[bool, str]]:
    """(condition, one-line refusal) rows of the flags that cannot work; the sizes first, alone
    when one fails: the later rows divide by them."""
    sizes = {name: getattr(args, name) for name in SIZES}
    size_rows = [
        (v >= 1, f"--{k.replace('_', '-')} must be at least 1, got {v}") for k, v in sizes.items()
    ]
    if not all(ok for ok, _ in size_rows):
        return size_rows
    batch_size = args.num_envs * args.num_steps
    aux_size = args.n_pi * batch_size
    return size_rows + [
        (min(args.e_v, args.e_aux) >= 0, "--e-v and --e-aux must not be negative"),
        (
            args.schedule_steps is None or args.schedule_steps > 0,
            "--schedule-steps must be positive",
        ),
        (
            args.e_v > 0 or args.e_aux > 0,
            "--e-v 0 with --e-aux 0 never trains the value function; raise one",
        ),
        (
            min(args.learning_rate, args.aux_learning_rate, args.adam_eps) > 0,
            "--learning-rate, --aux-learning-rate and --adam-eps must be positive",
        ),
        (
            batch_size % args.num_minibatches == 0,
            f"--num-minibatches {args.num_minibatches} does not divide "
            f"num-envs x num-steps = {batch_size}; pick a divisor",
        ),
        (
            not args.e_aux or aux_size % args.aux_num_minibatches == 0,
            f"--aux-num-minibatches {args.aux_num_minibatches} does not divide "
            f"n-pi x num-envs x num-steps = {aux_size}; pick a divisor",
        ),
        (
            args.resume or args.eval_only or args.total_steps >= batch_size,
            f"--total-steps {args.total_steps} is below one rollout "
            f"(num-envs x num-steps = {batch_size}); raise it",
        ),
    ]


def check_env(env_id: str) -> tuple[int, int]:
    """Observation size and action count, or a one-line refusal that names the file that fits."""
    try:
        env = make_env(env_id)
    except gym.error.Error as e:
        hint = "check the id (e.g. CartPole-v1)"
        if env_id.startswith("ALE/"):
            hint = "Atari ids belong to ppo_atari.py"
        raise Run.fail(f"unknown environment {env_id!r} ({e}); {hint}") from None
    obs_space = env.observation_space
    act_space = env.action_space
    env.close()
    box = isinstance(obs_space, gym.spaces.Box)
    shape = obs_space.shape
    continuous = isinstance(act_space, gym.spaces.Box)
    discrete = isinstance(act_space, gym.spaces.Discrete)
    for ok, problem in [
        (not box or len(shape) < 2, f"image observations {shape}; use ppo_atari.py"),
        (box and len(shape) == 1, f"observation space {obs_space}; ppg.py needs a flat Box"),
        (not continuous, "continuous actions; use d4pg.py, naf.py or rlpd.py"),
        (discrete, f"action space {act_space}; ppg.py needs Discrete actions"),
    ]:
        if not ok:
            raise Run.fail(f"{env_id} has {problem}")
    return int(shape[0]), int(act_space.n)


def load_resume(args: Args, run: Run) -> dict | None:
    """--resume's checkpoint (None without one), refused when what it stores has another shape."""
    ckpt = run.resume_checkpoint(same=("arch", "hidden_dim", "num_envs", "num_steps", "n_pi"))
    if ckpt is None:
        return None
    e_aux = ckpt["args"]["e_aux"]
    if bool(e_aux) != bool(args.e_aux):  # the stored samples exist only with an auxiliary phase
        raise Run.fail(
            f"checkpoint {args.resume} was made with --e-aux {e_aux} (the auxiliary phase cannot "
            f"be switched on or off at resume); pass --e-aux {e_aux}"
        )
    return ckpt


def anneal_horizon(args: Args, ckpt: dict | None) -> int:
    """The step at which the annealed rates reach 0 (detail 6): --schedule-steps if given, else
    the checkpoint's horizon on resume, else this run's --total-steps."""
    if args.schedule_steps is not None:
        horizon = args.schedule_steps
    elif ckpt is not None:
        # checkpoints written before the flag's rename name it anneal_steps
        horizon = ckpt.get("schedule_steps", ckpt.get("anneal_steps"))
    else:
        horizon = args.total_steps
    if args.anneal_lr and args.total_steps > horizon:  # refused rather than trained at a rate of 0
        raise Run.fail(
            f"--total-steps {args.total_steps} runs past the learning-rate schedule, which reaches "
            f"0 at step {horizon}; pass --schedule-steps {args.total_steps} to stretch it, "
            "or --no-anneal-lr"
        )
    return horizon


def log_iteration(
    run: Run,
    global_step: int,
    losses: dict,
    batch: dict,
    storage: dict,
    rates: dict,
    counters: Counters,
) -> None:
    """One iteration's losses/* and charts/* scalars, after the non-finite check of its losses;
    the device is read once, for all of them."""
    stacked = torch.stack(list(losses.values()))
    run.check_finite(stacked, global_step)
    # how much of V_targ's variance the rollout's V(s_t) explained (NaN when V_targ is constant,
    # so it is not checked): [T, N] -> [T * N], as the batch
    ev = explained_variance(batch["returns"], storage["values"].flatten(), batch["valid"])
    values = torch.cat([ev[None], stacked]).tolist()  # one read from the device per iteration
    names = ["explained_variance", *losses]
    run.log(global_step, {f"losses/{name}": value for name, value in zip(names, values)})
    charts = {**rates, "SPS": run.sps(global_step)}
    charts["aux_phase_time_fraction"] = aux_time_fraction(counters)
    run.log(global_step, {f"charts/{name}": value for name, value in charts.items()})


@contextmanager
def timed(counters: Counters, *names: str):
    """Add the wall time of a `with` block to each named counter (seconds, for the chart of the
    auxiliary phase's share of the training time)."""
    start = time.time()
    yield
    elapsed = time.time() - start
    for name in names:
        setattr(counters, name, getattr(counters, name) + elapsed)


def aux_time_fraction(counters: Counters) -> float:
    """The share of the training time spent in auxiliary phases."""
    return counters.aux_time_s / max(counters.train_time_s, 1e-9)


def checkpoint_state(
    learner: Learner,
    envs,
    carry: Carry,
    aux_buffer: AuxBuffer,
    reward_stats: RewardStats,
    counters: Counters,
) -> dict:
    """Everything a resume needs, as plain CPU tensors and numbers (detail 4)."""
    k = counters.phase_iteration  # the rollouts in B
    return {
        **asdict(counters),
        "agent": learner.agent.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "aux_optimizer": learner.aux_optimizer.state_dict(),
        "aux_vtarg": aux_buffer.vtarg[:k].cpu(),
        "aux_valid": aux_buffer.valid[:k].cpu(),
        "aux_obs": aux_buffer.obs[:k].cpu(),
        "env_state": env_state(envs),
        "next_obs": carry.next_obs.cpu(),
        **{name: torch.from_numpy(getattr(carry, name).copy()) for name in EPISODE_ARRAYS},
        "reward_moments": reward_stats.moments.cpu(),
        "reward_ret": reward_stats.ret.cpu(),
        "rng": Run.rng_state(torch=torch.default_generator),
    }


def restore(
    ckpt: dict,
    learner: Learner,
    envs,
    carry: Carry,
    aux_buffer: AuxBuffer,
    reward_stats: RewardStats,
    counters: Counters,
) -> None:
    """Load a checkpoint (read on the CPU) into the run's objects, in place; its tensors go to the
    run's device (that of the reward statistics, like every tensor of the run)."""
    device = reward_stats.ret.device
    learner.agent.load_state_dict(ckpt["agent"])
    for name in ("optimizer", "aux_optimizer"):
        optimizer = getattr(learner, name)
        # the run's learning-rate tensor, not the checkpoint's (on the CPU; a float in older ones),
        # and fused as the run's (older checkpoints' optimizers were not)
        group = optimizer.param_groups[0]
        ckpt[name]["param_groups"][0] |= {key: group[key] for key in ("lr", "fused")}
        optimizer.load_state_dict(ckpt[name])  # Adam's moments follow the parameters' device
    k = ckpt["phase_iteration"]  # the rollouts in B
    aux_buffer.vtarg[:k] = ckpt["aux_vtarg"].to(device)
    aux_buffer.valid[:k] = ckpt["aux_valid"].to(device)
    aux_buffer.obs[:k] = ckpt["aux_obs"].to(device)
    if ckpt["env_state"] and env_state(envs):  # the same episodes continue (detail 4)
        set_env_state(envs, ckpt["env_state"])
        for name in EPISODE_ARRAYS:
            setattr(carry, name, ckpt[name].numpy().copy())
        carry.next_obs = ckpt["next_obs"].to(device)
    else:
        obs, _ = envs.reset(seed=ckpt["args"]["seed"] + ckpt["iteration"])
        carry.next_obs = torch.as_tensor(obs, dtype=torch.float32, device=device).contiguous()
    Run.set_rng_state(ckpt["rng"], torch=torch.default_generator)
    # (older checkpoints hold the moments as a list of floats)
    reward_stats.moments = torch.as_tensor(ckpt["reward_moments"], dtype=torch.float64).to(device)
    reward_stats.ret = ckpt["reward_ret"].to(device)
    for name in COUNTERS:
        setattr(counters, name, ckpt[name])


def env_state(envs: gym.vector.VectorEnv) -> dict:
    """The numpy state (arrays, generators) of a native vector env; {} for a sync one (e.g. Box2D),
    which a resume resets instead."""
    if isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return {}
    state = {}
    for name, value in vars(envs.unwrapped).items():
        if isinstance(value, np.ndarray):
            state[name] = torch.from_numpy(value.copy())
        elif isinstance(value, np.random.Generator):
            state[name] = "rng:" + json.dumps(value.bit_generator.state)
    return state


def set_env_state(envs: gym.vector.VectorEnv, state: dict) -> None:
    """Put what env_state() saved back into a native vector env: the same episodes continue."""
    for name, value in state.items():
        if isinstance(value, str):
            rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = json.loads(value[4:])
            value = rng
        else:
            value = value.numpy().copy()
        setattr(envs.unwrapped, name, value)


def evaluate(agent, env_id: str, episodes: int, seed: int, device, video_dir=None) -> list[float]:
    """Greedy (argmax) returns of `episodes` episodes seeded seed + 10000 + i (detail 7)."""
    env = make_env(env_id, video_dir)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done = False
        ep_return = 0.0
        while not done:
            with torch.inference_mode():
                obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device)
                action = int(agent.logits(obs_t.unsqueeze(0)).argmax())  # [1, obs_dim] -> [1, A]
            obs, reward, terminated, truncated, _ = env.step(action)
            ep_return += float(reward)
            done = terminated or truncated
        returns.append(ep_return)
    env.close()
    return returns


def eval_only(args: Args, run: Run) -> None:
    """Evaluate --checkpoint with its own env, network and seed: its run's final evaluation."""
    ckpt = Run.load_checkpoint(args.checkpoint)
    saved = ckpt["args"]
    obs_dim, num_actions = check_env(ckpt["env_id"])
    agent = Agent(obs_dim, num_actions, saved["hidden_dim"], saved["arch"]).to(run.device)
    agent.load_state_dict(ckpt["agent"])
    env_id = ckpt["env_id"]
    returns = evaluate(agent, env_id, args.eval_episodes, saved["seed"], run.device, run.video_dir)
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
