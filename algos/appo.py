"""APPO: PPO's clipped objective on V-trace targets, synchronous or with actor processes.

Papers: Lasse Espeholt, Hubert Soyer, Remi Munos, Karen Simonyan, Volodymyr Mnih, Tom Ward,
Yotam Doron, Vlad Firoiu, Tim Harley, Iain Dunning, Shane Legg, Koray Kavukcuoglu, "IMPALA:
Scalable Distributed Deep-RL with Importance Weighted Actor-Learner Architectures", ICML 2018,
arXiv:1802.01561 (V-trace, Section 4); John Schulman, Filip Wolski, Prafulla Dhariwal, Alec
Radford, Oleg Klimov, "Proximal Policy Optimization Algorithms", 2017, arXiv:1707.06347 (the
clipped surrogate). The pairing is RLlib's APPO; Sample Factory (Aleksei Petrenko et al. 2020,
arXiv:2006.11751) trains the same loss and masks samples by policy lag.

Idea: in an actor-learner system, actors act with a copy of the policy while the learner trains,
so every rollout comes from a slightly stale behaviour policy mu, not from the learner's policy
pi: the *policy lag*. V-trace corrects the value targets and advantages with truncated importance
weights pi/mu, and PPO's clipped surrogate, with its ratio taken against mu, keeps each update
close to the policy that acted. With no lag (mu = pi, the synchronous mode) the weights are 1,
V-trace's targets are lambda-returns, and APPO is PPO whose advantage looks one step into them.

Equations (rollout x_0..x_T of one env; ratio_s = pi(a_s|x_s) / mu(a_s|x_s); r_s the reward):
    rho_s = min(rho_bar, ratio_s),   c_s = lambda min(c_bar, ratio_s)
    delta_s = rho_s (r_s + gamma V(x_{s+1}) - V(x_s))
    v_s = V(x_s) + delta_s + gamma c_s (v_{s+1} - V(x_{s+1})),   v_T = V(x_T)   (Remark 1)
    A_s = min(pg_rho_bar, ratio_s) (r_s + gamma v_{s+1} - V(x_s))     (Section 4.2's advantage)
    L = -E[min(ratio_s A_s, clip(ratio_s, 1 - eps, 1 + eps) A_s)]
        + c_v E[(V(x_s) - v_s)^2] / 2 - c_ent E[H(pi)]
An episode end at s cuts the trace: termination sets V(x_{s+1}) = v_{s+1} = 0; a time-limit
truncation sets v_{s+1} = V(x_{s+1}) of the real final observation. lambda = 1 is the paper's
V-trace; lambda < 1 is Section 4.1's variant with Retrace's lambda (on-policy: GAE(lambda)'s
return). The paper truncates the advantage's weight with rho_bar too; IMPALA's reference code
and RLlib keep a separate threshold, here --pg-rho-bar (default 1.0, as theirs).

Implementation details:
1. Synchronous mode (the default, --num-actors 0): the learner's vector env collects num_envs x
   num_steps steps with the current policy, then the learner trains on them: mu = pi, the policy
   lag is 0 and V-trace gives the bootstrapped lambda-returns. Deterministic on CPU with a seed;
   the checkpoint keeps the state of native numpy vector envs (CartPole's), so a resumed run
   continues exactly as an uninterrupted one.
2. --num-actors N: N processes from torch.multiprocessing's *spawn* context (fresh interpreters:
   no forked OpenMP or CUDA state). Each owns a vector env and a CPU copy of the policy and acts
   with one torch thread; the learner keeps max(1, threads - N) threads. Weights go through shared
   memory: one flat tensor plus a seqlock counter (odd while the learner writes; an actor that
   overlapped a write reads again), so the learner never waits on an actor. Each actor writes its
   rollout into its own shared buffer and sends only (actor, policy version) through a queue;
   once the learner has copied the buffer, the actor reads the newest weights and collects the
   next rollout while the learner trains. SPS counts from the moment the actors are ready.
3. Policy lag = learner updates since the rollout's weights were published (charts/policy_lag;
   charts/importance_ratio is the mean pi/mu before the update); a rollout older than
   --max-policy-lag is dropped (charts/dropped_rollouts; its env steps still count).
4. Shutdown: actors ignore SIGINT and SIGTERM (Ctrl-C reaches the whole process group): the
   learner checkpoints, sets a shared stop flag, joins the actors and kills any left after 3 s,
   on every way out. An actor that raises sends its error; a dead actor is seen by a liveness
   check at each wait of at most 0.5 s; either stops the learner with one line naming the actor.
   An actor whose learner is gone exits. The stop and ready flags are shared tensors, not locks
   or events, which a killed actor could leave held.
5. V-trace runs once per batch, before the epochs (as PPO's GAE), with the learner's current pi
   and V; then update_epochs passes of minibatches of num_envs x num_steps / num_minibatches rows:
   the valid rows shuffled, the last minibatch that holds some padded with invalid rows of weight
   0 (fixed shapes for --compile). Advantages are normalised over the valid rows when there are
   two or more (one row has no std); a rollout without a valid row (possible only for tiny
   num_envs x num_steps) trains nothing and counts as dropped. --target-kl stops the epochs once
   the approximate KL(mu || pi) of the last minibatch exceeds it (a wait for the device).
6. Gymnasium's NEXT_STEP autoreset: the step after an episode end only resets that env. Its row
   is left out of every loss and statistic (`valid`), and its observation, the real final
   observation of the ended episode, gives V(x_{s+1}) for the truncation bootstrap.
7. --no-vtrace: GAE(lambda) advantages with returns A + V on the same data, for the ablation.
8. Networks and optimiser as CleanRL's ppo.py: separate policy and value MLPs (2 x 64, tanh),
   orthogonal init (sqrt 2, 0.01 policy head, 1 value head), Adam (eps 1e-5), gradient-norm clip
   --max-grad-norm 0.5 (per network, deviation e). The learning rate anneals linearly to 0 at
   --schedule-steps (default: the first run's --total-steps, kept in the checkpoint); a resume
   that would run past it is refused until --schedule-steps re-plans it or --no-anneal-lr turns
   the anneal off.
9. Evaluation is greedy (argmax) on a separate env, episode i seeded seed + 10_000 + i. Actors
   restart their envs (seeded with the step) on resume.
10. Cost: with one actor the learner is the bottleneck, and for layers this small each torch op
    costs microseconds of Python and dispatch whatever its size. So the per-step work is kept to
    few ops, with the same numbers: fused Adam, log_softmax and gather instead of
    torch.distributions, the entropy differentiated only when --ent-coef > 0, all epochs'
    minibatches gathered at once, clip_grad_norm_ in foreach ops, V-trace with one op per step
    over all envs, numpy writes into the rollout buffers. On a GPU the learner waits for
    the device only for the actions (one copy per step), the weights' publication and the logged
    losses (one read per update): observations go through pinned copies, the learning rate is a
    tensor set in place.
11. --compile compiles the learner's minibatch step (forward, loss, backward and clipping; Dynamo
    leaves the fused Adam step, one kernel, as it is) and the batch preparation with V-trace;
    actors act eagerly on the CPU with one thread. Off by default: not yet measured to win on a GPU.
12. --norm-values (Sample Factory's normalize_returns): the critic learns v_s standardised by the
    running mean and std of every v_s so far (kept with the weights); V-trace reads V in the
    return's units. It keeps the value loss on one scale whatever the task's rewards.

Deviations (d measured in results/appo-defaults, e in results/appo-measurements.md):
a. The surrogate's ratio is taken against mu, as Sample Factory does; RLlib's APPO takes it
   against a target network refreshed every few updates (times a clipped pi_target/mu).
b. The learner trains on one rollout at a time (num_envs x num_steps from one actor), so the two
   modes compare at equal batch settings; IMPALA and RLlib batch several actors.
c. No clamp of the raw ratio to [0.05, 20] before V-trace (Sample Factory): rho_bar and c_bar
   bound it above and the clipped surrogate bounds the step.
d. Defaults: RL Zoo's PPO LunarLander values (16 envs x 128 steps, 32 minibatches, gamma 0.999,
   lambda 0.98, entropy 0.01, lr 5e-4 here annealed) with detail 12; one set for CartPole,
   LunarLander, Acrobot and MountainCar; CartPole's gamma 0.98, lambda 0.8 failed LunarLander.
e. The gradient norm is clipped for the policy and the value network apart (CleanRL clips them
   jointly): on LunarLander, without reward scaling, the value gradient dominates a joint norm
   and shrinks the policy's steps.

Usage: python algos/appo.py --env-id CartPole-v1 --total-steps 150000 --num-actors 1 --seed 1
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import queue
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import tyro
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.tensorboard import SummaryWriter

# The run harness (class Run, at the bottom) as used above it: Run(args, checks), run.device,
# run.stop, run.compile, run.to_device, run.resume_checkpoint, run.start, run.episode, run.log,
# run.sps, run.check_finite, run.end_iteration, run.finish, run.video_dir, run.write_eval_only;
# Run.fail, Run.rng_state, Run.set_rng_state, Run.load_checkpoint.


@dataclass
class Args:
    """APPO's flags (tyro): the common ones first, then the algorithm's; the module
    docstring at the top of appo.py gives the reasons for their defaults."""

    env_id: str = "CartPole-v1"
    """Gymnasium id (Discrete actions, flat observations)"""
    seed: int = 1
    """random seed"""
    total_steps: int = 150_000
    """environment steps (all envs and actors)"""
    num_envs: int = 16
    """environments per vector env (the learner's or each actor's)"""
    torch_deterministic: bool = True
    """deterministic torch kernels"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """the learner's device; actors act on the CPU"""
    compile: bool = False
    """torch.compile the learner's updates (CUDA graphs on a GPU)"""
    exp_name: str = "appo"
    """experiment name (in the default run directory)"""
    run_dir: str | None = None
    """output directory"""
    checkpoint_interval: int = 50_000
    """env steps between checkpoints (0: at the end)"""
    resume: str | None = None
    """checkpoint to continue from"""
    eval_episodes: int = 10
    """greedy evaluation episodes"""
    eval_interval: int = 25_000
    """env steps between evaluations (0: at the end)"""
    eval_only: bool = False
    """evaluate --checkpoint and exit"""
    checkpoint: str | None = None
    """checkpoint for --eval-only"""
    capture_video: bool = False
    """record the final evaluation"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """Weights & Biases project"""
    # Algorithm-specific
    num_steps: int = 128
    """steps per env in a rollout"""
    num_actors: int = 0
    """actor processes (0: synchronous mode)"""
    max_policy_lag: int = 10
    """drop rollouts more updates old than this"""
    vtrace: bool = True
    """V-trace; --no-vtrace: GAE(lambda) (the ablation)"""
    rho_bar: float = 1.0
    """truncation of pi/mu in the targets"""
    c_bar: float = 1.0
    """truncation of pi/mu in the traces"""
    pg_rho_bar: float = 1.0
    """truncation of pi/mu in the advantages"""
    gamma: float = 0.999
    """discount factor"""
    lam: float = 0.98
    """lambda of the traces (and of GAE)"""
    learning_rate: float = 5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate to 0 at --schedule-steps"""
    schedule_steps: int | None = None
    """default: the first run's --total-steps"""
    update_epochs: int = 4
    """passes over each batch"""
    num_minibatches: int = 32
    """minibatches per pass"""
    clip_coef: float = 0.2
    """PPO's clip epsilon of pi/mu"""
    ent_coef: float = 0.01
    """entropy bonus c_ent"""
    vf_coef: float = 0.5
    """value loss weight c_v"""
    max_grad_norm: float = 0.5
    """gradient-norm clip, of the policy and of the value network apart (deviation e)"""
    norm_values: bool = True
    """the critic learns v_s standardised by their running mean and std (detail 12)"""
    target_kl: float | None = None
    """stop the epochs past this approximate KL"""
    hidden_dim: int = 64
    """hidden layer width"""


# ---------------------------------------------------------------- environment
def check_env(env_id: str) -> tuple[int, int]:
    """Observation size and number of actions, or a one-line refusal."""
    try:
        env = gym.make(env_id)
    except Exception as e:
        # unknown id (ale_py is not imported), missing dependency
        hint = "check the id with gymnasium.pprint_registry()"
        if env_id.startswith("ALE/"):
            hint = "Atari games have image observations, use ppo_atari.py"
        raise Run.fail(f"cannot make environment {env_id!r} ({str(e).splitlines()[0]}); {hint}")
    obs_space = env.observation_space
    act_space = env.action_space
    env.close()
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) > 1:
        raise Run.fail(f"{env_id} has image observations; use ppo_atari.py")
    if isinstance(act_space, gym.spaces.Box):
        raise Run.fail(f"{env_id} has continuous actions; use d4pg.py or naf.py")
    if not isinstance(obs_space, gym.spaces.Box) or not isinstance(act_space, gym.spaces.Discrete):
        spaces = f"{type(obs_space).__name__} observations, {type(act_space).__name__} actions"
        raise Run.fail(f"{env_id} has {spaces}; {SCRIPT} needs flat Box and Discrete ones")
    return int(obs_space.shape[0]), int(act_space.n)


def make_env(env_id: str, video_dir: Path | None = None) -> gym.Env:
    """One env for evaluation, recording every episode into video_dir if given."""
    env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(
            env, str(video_dir), episode_trigger=lambda _: True, disable_logger=True
        )
    return env


def make_envs(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """Gymnasium's native vector env where one exists (CartPole), else a sync one (detail 6)."""
    try:
        return gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point")
    except gym.error.Error:
        return gym.make_vec(env_id, num_envs, vectorization_mode="sync")


# ---------------------------------------------------------------- networks
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights of gain `std` and constant biases, as CleanRL's ppo.py (detail 8)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(obs_dim: int, hidden_dim: int, out: int, out_std: float) -> nn.Sequential:
    """Two tanh hidden layers; the output layer's gain `out_std` (0.01 policy, 1 value)."""
    return nn.Sequential(
        layer_init(nn.Linear(obs_dim, hidden_dim)),
        nn.Tanh(),
        layer_init(nn.Linear(hidden_dim, hidden_dim)),
        nn.Tanh(),
        layer_init(nn.Linear(hidden_dim, out), std=out_std),
    )


class Agent(nn.Module):
    """Separate policy and value MLPs (detail 8)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden_dim: int):
        """The policy pi(a|x) as logits, the value V(x), and the running moments of v_s."""
        super().__init__()
        self.actor = mlp(obs_dim, hidden_dim, num_actions, 0.01)
        self.critic = mlp(obs_dim, hidden_dim, 1, 1.0)
        # (count, mean, var) of the value targets v_s so far; (0, 0, 1) leaves V as it is
        self.register_buffer("moments", torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy logits [..., A] and the critic's output [...], V(x) standardised by `moments`."""
        return self.actor(x), self.critic(x).squeeze(-1)

    def scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std of the value targets so far: V(x) = mean + std * critic(x) (detail 12)."""
        return self.moments[1].float(), (self.moments[2] + 1e-8).sqrt().float()


# ---------------------------------------------------------------- APPO math
def vtrace(
    log_rho: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    *,
    gamma: float,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets v_s and policy advantages A_s, [T, N] (paper Remark 1 and Section 4.2).
    log_rho = log pi(a_s|x_s) - log mu(a_s|x_s); values[s] = V(x_s); next_values[s] = V(x_{s+1}),
    at an episode end the value of the real final observation. Every input is [T, N]."""
    ratio = log_rho.exp()  # pi/mu
    rho = ratio.clamp(max=rho_bar)
    c = lam * ratio.clamp(max=c_bar)  # lam < 1: Section 4.1's variant
    # a termination cuts the bootstrap (V(x_{s+1}) = 0), any episode end cuts the trace
    discount = gamma * (1.0 - terminated)
    delta = rho * (rewards + discount * next_values - values)
    trace = gamma * c * (1.0 - dones)
    # v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} - V(x_{s+1})), backwards: one op per step for
    # all envs; correction[T] = 0 (v_T = V(x_T))
    correction = values.new_zeros(len(values) + 1, *values.shape[1:])  # [T + 1, N]
    for s in reversed(range(len(rewards))):
        correction[s] = torch.addcmul(delta[s], trace[s], correction[s + 1])
    v_s = values + correction[:-1]
    # v_{s+1}: the next target inside an episode; V(x_{s+1}) after its end or at the last step
    v_after = torch.cat([v_s[1:], next_values[-1:]])  # [T, N]
    v_next = torch.where(dones.bool(), next_values, v_after)
    # A_s: the paper weights it with rho_s; IMPALA's code and RLlib truncate at their own
    # pg_rho_bar (default 1, rho_bar's default too)
    pg_rho = ratio.clamp(max=pg_rho_bar)
    return v_s, pg_rho * (rewards + discount * v_next - values)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """GAE(lambda) advantages [T, N] on the same inputs as vtrace (--no-vtrace, detail 7)."""
    delta = rewards + gamma * (1.0 - terminated) * next_values - values
    trace = gamma * lam * (1.0 - dones)
    advantages = values.new_zeros(len(values) + 1, *values.shape[1:])  # [T + 1, N]
    for s in reversed(range(len(rewards))):
        advantages[s] = torch.addcmul(delta[s], trace[s], advantages[s + 1])
    return advantages[:-1]


def appo_loss(
    logits: torch.Tensor,
    value: torch.Tensor,
    actions: torch.Tensor,
    logp_mu: torch.Tensor,
    advantages: torch.Tensor,
    v_s: torch.Tensor,
    w: torch.Tensor,
    *,
    clip_coef: float,
    ent_coef: float,
    vf_coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (Schulman et al. 2017, eq. 7) with the ratio pi/mu (deviation a),
    the value loss to v_s and the entropy bonus (eq. 9), as means with the rows' weights w [B]
    (summing to 1); the loss and its named statistics (0-dim tensors)."""
    # log_softmax and gather, not torch.distributions: the same numbers in fewer ops
    log_pi = logits.log_softmax(-1)  # [B, A]
    log_pi_a = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [B, 1] -> [B]
    log_ratio = log_pi_a - logp_mu
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    policy_loss = -torch.min(ratio * advantages, clipped * advantages) @ w
    value_loss = 0.5 * (value - v_s).pow(2) @ w
    # logged always, differentiated only when it is used
    with torch.set_grad_enabled(torch.is_grad_enabled() and ent_coef > 0):
        entropy = -(log_pi.exp() * log_pi).sum(-1) @ w
    with torch.no_grad():
        # KL(mu || pi) estimate k3 (Schulman's blog), as CleanRL
        approx_kl = ((ratio - 1) - log_ratio) @ w
        clipfrac = ((ratio - 1).abs() > clip_coef).float() @ w
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
    stats = {
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy.detach(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }
    return loss, stats


def merge_moments(moments: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(count, mean, var) of the rows of x where w = 1 merged into `moments` (Chan et al.'s
    parallel update), for --norm-values (detail 12)."""
    n = w.sum()
    mean = (x * w).sum() / n
    count, m, v = moments
    total = count + n
    delta = mean - m
    var = (v * count + ((x - mean) ** 2 * w).sum() + delta**2 * count * n / total) / total
    return torch.stack([total, m + delta * n / total, var])


def prepare_batch(agent: Agent, rollout: dict, args: Args) -> tuple[dict, torch.Tensor]:
    """Targets v_s and advantages with the learner's current pi and V (detail 5), the T x N rows
    flattened with their `valid` mask (detail 6); the batch and the mean importance ratio pi/mu."""
    with torch.no_grad():
        # T + 1 rows of observations: the last is x_T
        logits, values = agent(rollout["obs"])  # [T + 1, N, A], [T + 1, N]
        v_mean, v_std = agent.scale()
        values = values * v_std + v_mean  # V in the return's units
        log_pi = logits[:-1].log_softmax(-1)  # [T, N, A]
        log_pi_a = log_pi.gather(-1, rollout["actions"].unsqueeze(-1)).squeeze(-1)  # [T, N]
        log_rho = log_pi_a - rollout["logprobs"]
        # the rollout's steps, [T, N] each: V(x_s) and V(x_{s+1}) from the T + 1 values
        steps = dict(
            rewards=rollout["rewards"],
            values=values[:-1],
            next_values=values[1:],
            terminated=rollout["terminated"],
            dones=rollout["dones"],
        )
        if args.vtrace:
            v_s, advantages = vtrace(
                log_rho,
                **steps,
                gamma=args.gamma,
                lam=args.lam,
                rho_bar=args.rho_bar,
                c_bar=args.c_bar,
                pg_rho_bar=args.pg_rho_bar,
            )
        else:  # detail 7: GAE(lambda), the ablation
            advantages = gae(**steps, gamma=args.gamma, lam=args.lam)
            v_s = advantages + values[:-1]
        valid = rollout["valid"].float()  # [T, N]
        if args.norm_values:
            # the critic's targets, standardised by the moments of every v_s so far (detail 12)
            agent.moments.copy_(merge_moments(agent.moments, v_s.double(), valid.double()))
            v_mean, v_std = agent.scale()
            v_s = (v_s - v_mean) / v_std
        # normalised over the valid rows if there are two or more (one row has no std)
        n = valid.sum()
        adv_mean = (advantages * valid).sum() / n
        adv_std = ((advantages - adv_mean).pow(2) * valid).sum().div(n - 1).sqrt()
        normalised = (advantages - adv_mean) / (adv_std + 1e-8)
        advantages = torch.where(n > 1, normalised, advantages)
    batch = {
        "obs": rollout["obs"][:-1],
        "actions": rollout["actions"],
        "logp_mu": rollout["logprobs"],
        "advantages": advantages,
        "v_s": v_s,
        "valid": valid,
    }
    importance_ratio = (log_rho.exp() * valid).sum() / n
    # [T, N, ...] -> [T * N, ...]
    return {k: x.flatten(0, 1) for k, x in batch.items()}, importance_ratio


def learn_step(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    args: Args,
    *,
    obs: torch.Tensor,
    actions: torch.Tensor,
    logp_mu: torch.Tensor,
    advantages: torch.Tensor,
    v_s: torch.Tensor,
    valid: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """One minibatch: the loss (a mean over its valid rows), each network's gradient norm clipped
    and an Adam step (detail 11 compiles it); the loss's named statistics."""
    logits, value = agent(obs)
    w = valid / valid.sum()  # padding rows weigh 0
    loss, stats = appo_loss(
        logits,
        value,
        actions,
        logp_mu,
        advantages,
        v_s,
        w,
        clip_coef=args.clip_coef,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
    )
    optimizer.zero_grad()
    loss.backward()
    # deviation e: the policy's and the value network's norms clipped apart (CleanRL: jointly)
    for net in (agent.actor, agent.critic):
        nn.utils.clip_grad_norm_(net.parameters(), args.max_grad_norm, foreach=True)
    optimizer.step()
    return stats


def valid_rows_first(valid: torch.Tensor, epochs: int) -> torch.Tensor:
    """`epochs` random orders of the rows [epochs, B], each with the valid ones (valid [B], 1 or 0)
    first: a uniform key in [0, 1) per row minus `valid` puts the valid rows' keys in [-1, 0)."""
    keys = torch.rand(epochs, len(valid), device=valid.device) - valid  # [E, B]
    return keys.argsort()


def update(learn: Callable, batch: dict, n: int, args: Args) -> dict[str, torch.Tensor]:
    """update_epochs passes of `learn` (learn_step) over the batch's n valid rows, shuffled and cut
    into minibatches of len(batch) / num_minibatches rows (detail 5); the last one's statistics."""
    valid = batch["valid"]  # [B]
    size = len(valid) // args.num_minibatches
    # the last minibatch that holds valid rows is padded with invalid ones: fixed shapes
    order = valid_rows_first(valid, args.update_epochs)  # [E, B]
    # every epoch's gathered before a compiled step runs, which with CUDA graphs overwrites the
    # compiled prepare_batch's outputs; [B, ...] -> [E, B, ...] -> [E, B / size, size, ...]
    minibatches = {k: x[order].unflatten(1, (-1, size)) for k, x in batch.items()}
    for epoch in range(args.update_epochs):
        for i in range(math.ceil(n / size)):  # the minibatches that hold valid rows
            # [size, ...] each
            stats = learn(**{k: x[epoch, i] for k, x in minibatches.items()})
        if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
            break
    return stats


# ---------------------------------------------------------------- rollouts
def new_rollout(num_steps: int, num_envs: int, obs_dim: int) -> dict[str, torch.Tensor]:
    """Preallocated rollout storage [T, N]; obs has num_steps + 1 rows, the last being x_T."""
    T = num_steps
    N = num_envs
    rollout = {k: torch.zeros(T, N) for k in ("logprobs", "rewards", "terminated", "dones")}
    rollout["obs"] = torch.zeros(T + 1, N, obs_dim)
    rollout["actions"] = torch.zeros(T, N).long()
    rollout["valid"] = torch.zeros(T, N, dtype=torch.bool)
    return rollout


class Collector:
    """A vector env and its episodes in progress; `collect` fills a rollout."""

    def __init__(self, env_id: str, num_envs: int, seed: int):
        """Make the vector env and reset it with `seed`."""
        self.envs = make_envs(env_id, num_envs)
        self.next_obs, _ = self.envs.reset(seed=seed)
        # NEXT_STEP: the coming step only resets
        self.autoreset = np.zeros(num_envs, dtype=bool)

    @torch.inference_mode()
    def collect(
        self, policy: nn.Module, rollout: dict, to_device: Callable = torch.as_tensor
    ) -> None:
        """num_steps steps of every env with `policy` into `rollout` (CPU); `to_device` takes an
        observation to the policy's device (run.to_device; an actor's CPU: as it is)."""
        # numpy writes into the (CPU) buffers and Categorical's draw by hand: on tensors this small
        # each torch op costs microseconds, as much as a CartPole step
        buf = {k: v.numpy() for k, v in rollout.items()}
        for t in range(len(buf["actions"])):
            buf["obs"][t] = self.next_obs
            buf["valid"][t] = ~self.autoreset
            log_pi = policy(to_device(rollout["obs"][t])).log_softmax(-1)  # [N, A]
            actions = torch.multinomial(log_pi.exp(), 1)  # [N, 1]
            # one copy to the CPU, the step's only wait for the device: two [N, 1] -> [N, 2]
            sample = torch.cat([log_pi.gather(-1, actions), actions], 1).cpu()
            buf["logprobs"][t] = sample[:, 0].numpy()  # log mu(a|x)
            buf["actions"][t] = sample[:, 1].numpy()
            self.next_obs, reward, terminated, truncated, _ = self.envs.step(buf["actions"][t])
            self.autoreset = terminated | truncated
            buf["rewards"][t] = reward
            buf["terminated"][t] = terminated
            buf["dones"][t] = self.autoreset
        # x_T, the real final observation if an episode just ended
        buf["obs"][-1] = self.next_obs


def finished_episodes(
    rollout: dict, ep_return: torch.Tensor, ep_length: torch.Tensor
) -> list[tuple[float, int]]:
    """(return, length) of the episodes that ended; ep_return and ep_length [N] carry those in
    progress, updated in place. Autoreset rows (not valid) add nothing."""
    ended = []
    returns = ep_return.numpy()  # views: updated in place
    lengths = ep_length.numpy()
    rewards = rollout["rewards"].numpy()
    valid = rollout["valid"].numpy()
    dones = rollout["dones"].numpy()
    for t in range(len(rewards)):
        returns += rewards[t] * valid[t]
        lengths += valid[t]
        for i in np.flatnonzero(dones[t]):
            ended.append((float(returns[i]), int(lengths[i])))
            returns[i] = 0.0
            lengths[i] = 0
    return ended


# ---------------------------------------------------------------- rollout sources
# Where rollouts come from and where the new weights go. train() calls source.next() for the next
# rollout and source.publish() after each update:
#   synchronous (LocalSource, below): next() collects with the learner's own agent; publish() has
#     nothing to do;
#   --num-actors N (Actors, after train()): actor processes -> a rollout in each one's shared buffer
#     -> next() copies one buffer for the learner -> the learner trains -> publish() writes the
#     weights into shared memory (a seqlock) -> each actor reads the newest before its next rollout.
class LocalSource(Collector):
    """Synchronous mode (detail 1): the learner collects with its own policy, so every lag is 0."""

    def __init__(
        self, args: Args, agent: Agent, obs_dim: int, to_device: Callable, step: int, saved: dict
    ):
        """The learner's vector env (seeded with the start `step`), continuing a checkpoint's
        episodes where the env's state can be restored (`saved`, native envs)."""
        super().__init__(args.env_id, args.num_envs, args.seed + step)
        self.agent = agent
        self.to_device = to_device
        self.rollout = new_rollout(args.num_steps, args.num_envs, obs_dim)
        self.ep_return = torch.zeros(args.num_envs, dtype=torch.float64)
        self.ep_length = torch.zeros(args.num_envs, dtype=torch.long)
        if saved.get("env") and env_state(self.envs):
            set_env_state(self.envs, saved["env"])
            self.next_obs = saved["next_obs"].numpy()
            self.autoreset = saved["autoreset"].numpy()
            self.ep_return = saved["ep_return"]
            self.ep_length = saved["ep_length"]

    def __enter__(self) -> LocalSource:
        """Nothing to start."""
        return self

    def __exit__(self, *exc) -> None:
        """Close the vector env."""
        self.envs.close()

    def next(self, version: int) -> tuple[dict, int, list]:
        """A rollout collected now with the current policy (its version: `version`), and the
        episodes that ended in it."""
        self.collect(self.agent.actor, self.rollout, self.to_device)
        episodes = finished_episodes(self.rollout, self.ep_return, self.ep_length)
        return self.rollout, version, episodes

    def publish(self, agent: Agent, version: int) -> None:
        """Nothing: collect() acts with the learner's own agent."""

    def state(self) -> dict:
        """The vector env's state and the episodes in progress, for an exact resume (detail 1)."""
        return {
            "env": env_state(self.envs),
            "next_obs": torch.from_numpy(self.next_obs),
            "autoreset": torch.from_numpy(self.autoreset),
            "ep_return": self.ep_return,
            "ep_length": self.ep_length,
        }


# ---------------------------------------------------------------- training
@dataclass
class Progress:
    """The loop's counters: what a resume continues from (all but end_step are checkpointed)."""

    global_step: int
    """environment steps so far (all envs and actors)"""
    version: int
    """learner updates so far: the version of the weights the actors act with"""
    dropped: int
    """rollouts dropped: too old, or without a valid row"""
    schedule_steps: int
    """the step at which the learning rate's anneal reaches 0"""
    end_step: int
    """the loop ends after the last whole rollout within --total-steps"""


def train(args: Args) -> None:
    """APPO: PPO's clipped update on V-trace targets, the rollouts from the learner's own env or
    from actor processes."""
    # One iteration, IMPALA's learner (Espeholt et al. 2018, Section 3) with PPO's update:
    # 1. the next rollout, num_steps x num_envs steps acted by mu  -> source.next (LocalSource:
    #                                                                Collector.collect; or Actors)
    # 2. drop it if mu is more than --max-policy-lag updates old   (below)
    # 3. V-trace's targets v_s and advantages A_s, current pi, V   -> prepare_batch, vtrace
    # 4. update_epochs passes of minibatches of the clipped loss   -> update, learn_step, appo_loss
    # 5. publish the new weights (version + 1) for the actors      -> source.publish
    # 6. log the episodes, losses and policy lag                   -> run.episode, run.log
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)
    obs_dim, num_actions = check_env(args.env_id)
    agent = Agent(obs_dim, num_actions, args.hidden_dim).to(run.device)
    # fused: one kernel per step; a tensor lr: the anneal sets it in place, compiled steps keep it
    optimizer = torch.optim.Adam(
        agent.parameters(),
        lr=torch.tensor(args.learning_rate, device=run.device),
        eps=1e-5,
        fused=True,
    )
    progress, saved_source = restore(run, args, agent, optimizer)
    learn = run.compile(partial(learn_step, agent, optimizer, args))
    prepare = run.compile(prepare_batch)
    batch_size = args.num_envs * args.num_steps
    lags = []  # the policy lag of every rollout of this session
    if args.num_actors:
        source = Actors(args, agent, obs_dim, progress.global_step, progress.version, run.stop)
    else:
        source = LocalSource(
            args, agent, obs_dim, run.to_device, progress.global_step, saved_source
        )
    # evaluate_policy(video_dir), as the harness calls it
    evaluate_policy = partial(
        evaluate, agent, args.env_id, args.eval_episodes, args.seed, run.device
    )
    state = partial(checkpoint_state, agent, optimizer, progress, source)
    with (
        source,
        run.start(progress.global_step, progress.end_step, state=state, evaluate=evaluate_policy),
    ):
        while progress.global_step < progress.end_step and not run.stop:
            # 1. the next rollout
            got = source.next(progress.version)
            if got is None:
                # a signal while waiting for the actors
                break
            rollout, rollout_version, episodes = got
            lr = args.learning_rate
            if args.anneal_lr:
                # linearly to 0 at schedule_steps (detail 8)
                lr = args.learning_rate * (1.0 - progress.global_step / progress.schedule_steps)
            progress.global_step += batch_size
            for ep_return, ep_length in episodes:
                run.episode(progress.global_step, ep_return, ep_length)

            # 2. the policy lag: learner updates since the weights that acted (detail 3)
            lag = progress.version - rollout_version
            lags.append(lag)
            n = int(rollout["valid"].sum())  # real transitions, not autoreset rows (detail 6)
            if lag <= args.max_policy_lag and n > 0:
                optimizer.param_groups[0]["lr"].fill_(lr)
                # the rollout's [T, N, ...] tensors on the learner's device
                rollout = {k: run.to_device(x) for k, x in rollout.items()}
                # 3. targets and advantages, once per batch (detail 5)
                batch, importance_ratio = prepare(agent, rollout, args)
                # CUDA graphs overwrite a compiled function's outputs at the next compiled call
                importance_ratio = importance_ratio.clone()
                # 4. the epochs of minibatch steps; the last one's losses
                losses = update(learn, batch, n, args)
                # before publishing: actors get finite weights
                run.check_finite(torch.stack(list(losses.values())), progress.global_step)
                # 5. the new weights
                progress.version += 1
                source.publish(agent, progress.version)
                # 6. one read per update: the next action, or the weights' publication, waits for
                # the update anyway
                logged = {f"losses/{name}": value for name, value in losses.items()}
                logged["charts/importance_ratio"] = importance_ratio
                numbers = torch.stack(list(logged.values())).tolist()
                scalars = dict(zip(logged, numbers)) | {"charts/learning_rate": lr}
                run.log(progress.global_step, scalars)
            else:
                # too old, or no valid row (detail 5)
                progress.dropped += 1
            charts = {"charts/policy_lag": lag, "charts/dropped_rollouts": progress.dropped}
            run.log(progress.global_step, charts | {"charts/SPS": run.sps(progress.global_step)})
            run.end_iteration(progress.global_step)
        lag_mean = float(np.mean(lags)) if lags else 0.0
        run.finish(
            progress.global_step,
            num_actors=args.num_actors,
            updates=progress.version,
            dropped_rollouts=progress.dropped,
            policy_lag_mean=lag_mean,
        )


# ---------------------------------------------------------------- actor processes (--num-actors)
def publish_weights(weights: torch.Tensor, seq: torch.Tensor, agent: Agent, version: int) -> None:
    """The learner's side of the seqlock (detail 2): seq = [writes, version]; writes is odd while
    the weights change."""
    seq[0] += 1
    weights.copy_(parameters_to_vector(agent.parameters()).detach())
    seq[1] = version
    seq[0] += 1


def read_weights(weights: torch.Tensor, seq: torch.Tensor, agent: Agent) -> int | None:
    """Actor side: the published weights into `agent`; their version, or None if torn."""
    before = int(seq[0])
    flat = weights.clone()
    version = int(seq[1])
    if before % 2 or int(seq[0]) != before:
        return None
    vector_to_parameters(flat, agent.parameters())
    return version


@dataclass
class Shared:
    """What the learner and its actors share in memory (details 2 and 4): tensors, not locks or
    events, which a killed actor could leave held."""

    weights: torch.Tensor
    """every parameter of the agent, flat: the newest published weights"""
    seq: torch.Tensor
    """[writes, version]: the seqlock's counter (odd during a write) and the weights' version"""
    stop: torch.Tensor
    """[1] bool: the learner is stopping"""
    ready: torch.Tensor
    """[num_actors] bool: each actor has made its env (or has failed)"""


def actor_main(
    actor_id: int,
    args: Args,
    start_step: int,
    shared: Shared,
    rollout: dict,
    messages: mp.Queue,
    copied: mp.Queue,
) -> None:
    """One actor process (details 2-4): wait until the learner has copied its buffer, read the
    newest weights, collect a rollout into the buffer, send (actor, version, None); or an error."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        # the learner decides: it checkpoints, then stops us
        signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(1)
    learner = os.getppid()
    free = False  # the learner has copied our buffer
    try:
        # distinct per actor and resume
        seed = args.seed + 1000 * (actor_id + 1) + start_step
        torch.manual_seed(seed)
        collector = Collector(args.env_id, args.num_envs, seed)
        num_actions = int(collector.envs.single_action_space.n)
        agent = Agent(rollout["obs"].shape[-1], num_actions, args.hidden_dim)
        shared.ready[actor_id] = True
        # a new parent: the learner is gone
        while not shared.stop[0] and os.getppid() == learner:
            if not free:
                try:
                    free = copied.get(timeout=0.5)
                except queue.Empty:
                    continue
            version = read_weights(shared.weights, shared.seq, agent)
            if version is not None:
                # on the CPU: the observations as they are
                collector.collect(agent.actor, rollout)
                messages.put((actor_id, version, None))
                free = False
    except Exception as e:
        error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]
        messages.put((actor_id, -1, error))
        shared.ready[actor_id] = True
        # stay alive until the learner has read it
        while not shared.stop[0] and os.getppid() == learner:
            time.sleep(0.1)
    messages.close()
    # the last message is in the pipe
    messages.join_thread()
    # skip the interpreter's teardown of torch (seconds on a busy machine): nothing is left to save
    os._exit(0)


class Actors:
    """--num-actors processes (details 2-4). Entering starts them and waits until each has its env
    (start-up stays out of the training loop's SPS); leaving stops them on every way out."""

    def __init__(
        self, args: Args, agent: Agent, obs_dim: int, start_step: int, version: int, stop: list
    ):
        """Shared weights (of `version`) and one rollout buffer per actor; the processes, not yet
        started. `stop` is the run's signal list."""
        # each actor acts on a core of its own with one thread: the learner leaves them room
        torch.set_num_threads(max(1, torch.get_num_threads() - args.num_actors))
        ctx = mp.get_context("spawn")
        n = args.num_actors
        self.stop = stop
        self.shared = Shared(
            weights=parameters_to_vector(agent.parameters()).detach().cpu(),
            seq=torch.tensor([0, version]),
            stop=torch.zeros(1).bool(),
            ready=torch.zeros(n).bool(),
        )
        self.buffers = [new_rollout(args.num_steps, args.num_envs, obs_dim) for _ in range(n)]
        for tensor in [*vars(self.shared).values(), *(x for b in self.buffers for x in b.values())]:
            tensor.share_memory_()
        self.messages = ctx.Queue()
        self.copied = [ctx.Queue() for _ in range(n)]
        self.procs = []
        for i in range(n):
            actor = dict(actor_id=i, args=args, start_step=start_step, shared=self.shared)
            actor |= dict(rollout=self.buffers[i], messages=self.messages, copied=self.copied[i])
            self.procs.append(ctx.Process(target=actor_main, kwargs=actor, daemon=True))
        # [num_actors, num_envs]: the episodes in progress of each actor's envs
        self.ep_return = torch.zeros(n, args.num_envs, dtype=torch.float64)
        self.ep_length = torch.zeros(n, args.num_envs, dtype=torch.long)

    def __enter__(self) -> Actors:
        """Start the actors and wait until each is ready (or a signal came)."""
        try:
            for proc, copied in zip(self.procs, self.copied):
                proc.start()
                copied.put(True)
            while not self.shared.ready.all() and not self.stop:
                self.check_alive()
                time.sleep(0.05)
        except BaseException:
            # `with` calls __exit__ only after __enter__ returned
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        """Set the stop flag, join the actors, kill any left after 3 s (detail 4)."""
        self.shared.stop[0] = True
        started = [proc for proc in self.procs if proc.pid is not None]
        for proc in started:
            proc.join(timeout=3)
        for proc in started:
            if proc.is_alive():
                proc.kill()
                proc.join()

    def check_alive(self) -> None:
        """Stop the learner in one line if an actor has died."""
        for i, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                reason = f"exit code {proc.exitcode}"
                if proc.exitcode < 0:
                    reason = f"killed by {signal.Signals(-proc.exitcode).name}"
                raise Run.fail(f"actor {i} (pid {proc.pid}) died ({reason}); last checkpoint kept")

    def next(self, version: int) -> tuple[dict, int, list] | None:
        """A copy of the next rollout, its policy version and episodes; None after a signal."""
        while not self.stop:
            self.check_alive()
            try:
                actor, rollout_version, error = self.messages.get(timeout=0.5)
            except queue.Empty:
                continue
            if error:
                raise Run.fail(f"actor {actor} failed: {error}")
            rollout = {k: x.clone() for k, x in self.buffers[actor].items()}
            # the actor may now collect its next rollout
            self.copied[actor].put(True)
            episodes = finished_episodes(rollout, self.ep_return[actor], self.ep_length[actor])
            return rollout, rollout_version, episodes
        return None

    def publish(self, agent: Agent, version: int) -> None:
        """The learner's new weights into shared memory, for the actors' next rollouts."""
        publish_weights(self.shared.weights, self.shared.seq, agent, version)

    def state(self) -> dict:
        """Nothing: actors restart their envs on resume (detail 9)."""
        return {}


# ---------------------------------------------------------------- plumbing
def check_args(args: Args) -> list[tuple[bool, str]]:
    """This file's (condition, message) rows for Run's flag checks."""
    batch = args.num_envs * args.num_steps
    mb = args.num_minibatches
    sizes = min(args.num_envs, args.num_steps, args.update_epochs, args.hidden_dim)
    return [
        (sizes >= 1, "--num-envs, --num-steps, --update-epochs and --hidden-dim must be >= 1"),
        (mb > 0 and batch % mb == 0, f"--num-minibatches must divide the rollout's {batch} steps"),
        (args.num_actors >= 0, "--num-actors must be >= 0 (0: synchronous mode)"),
        (args.max_policy_lag >= 0, "--max-policy-lag must be >= 0"),
        (0 < args.c_bar <= args.rho_bar, "need 0 < c-bar <= rho-bar (paper, Section 4.1)"),
        (args.pg_rho_bar > 0, "--pg-rho-bar must be positive"),
        (0 <= args.gamma <= 1 and 0 <= args.lam <= 1, "--gamma and --lam must be in [0, 1]"),
        (min(args.learning_rate, args.clip_coef) > 0, "--learning-rate and --clip-coef: > 0"),
        (min(args.ent_coef, args.vf_coef) >= 0, "--ent-coef and --vf-coef must be >= 0"),
        (args.max_grad_norm > 0, "--max-grad-norm must be positive"),
        (args.target_kl is None or args.target_kl > 0, "--target-kl must be positive"),
        (args.schedule_steps is None or args.schedule_steps > 0, "--schedule-steps must be > 0"),
        (
            args.eval_only or args.resume or args.total_steps >= batch,
            f"--total-steps is below one rollout ({batch} steps)",
        ),
    ]


def checkpoint_state(
    agent: Agent, optimizer: torch.optim.Optimizer, progress: Progress, source
) -> dict:
    """The checkpoint's dict (the harness adds the step, args and ids): weights, optimiser,
    counters, the rollout source's state and torch's generator."""
    return {
        "agent": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "version": progress.version,
        "dropped": progress.dropped,
        "schedule_steps": progress.schedule_steps,
        "source": source.state(),
        "rng": Run.rng_state(torch=torch.default_generator),
    }


def restore(
    run: Run, args: Args, agent: Agent, optimizer: torch.optim.Optimizer
) -> tuple[Progress, dict]:
    """The run's counters and the rollout source's saved state: --resume's (the weights, optimiser
    and generator restored in place) or a fresh start's; refuses a run past the lr anneal."""
    progress = Progress(
        global_step=0, version=0, dropped=0, schedule_steps=args.total_steps, end_step=0
    )
    saved_source = {}
    ckpt = run.resume_checkpoint(same=("hidden_dim", "num_envs", "norm_values"))
    if ckpt is not None:
        agent.load_state_dict(ckpt["agent"])
        # the run's lr tensor on its device, not the checkpoint's (read on the CPU; older: a float)
        ckpt["optimizer"]["param_groups"][0]["lr"] = optimizer.param_groups[0]["lr"]
        optimizer.load_state_dict(ckpt["optimizer"])
        Run.set_rng_state(ckpt["rng"], torch=torch.default_generator)
        progress.global_step = ckpt["global_step"]
        progress.version = ckpt["version"]
        progress.dropped = ckpt["dropped"]
        # a checkpoint from before --schedule-steps annealed to its own --total-steps
        progress.schedule_steps = ckpt.get("schedule_steps", ckpt["args"]["total_steps"])
        saved_source = ckpt["source"]
    if args.schedule_steps is not None:
        progress.schedule_steps = args.schedule_steps
    step = progress.global_step
    batch = args.num_envs * args.num_steps
    # the loop ends after the last whole rollout within --total-steps
    progress.end_step = step + (args.total_steps - step) // batch * batch
    if args.anneal_lr and progress.end_step > progress.schedule_steps:
        raise Run.fail(
            f"--total-steps {args.total_steps} runs past the learning-rate anneal, which ends at "
            f"step {progress.schedule_steps}; pass --schedule-steps {progress.end_step} or "
            "--no-anneal-lr"
        )
    return progress, saved_source


def evaluate(
    agent: Agent,
    env_id: str,
    episodes: int,
    seed: int,
    device: torch.device,
    video_dir: Path | None = None,
) -> list[float]:
    """Greedy (argmax) returns of `episodes` episodes, episode i seeded seed + 10_000 + i
    (detail 9)."""
    env = make_env(env_id, video_dir)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done = False
        total = 0.0
        while not done:
            with torch.inference_mode():
                logits = agent.actor(torch.as_tensor(obs, dtype=torch.float32, device=device))
            obs, reward, terminated, truncated, _ = env.step(int(logits.argmax()))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def eval_only(args: Args, run: Run) -> None:
    """--eval-only: --checkpoint's own env, network and seed repeat the run's final evaluation."""
    ckpt = Run.load_checkpoint(args.checkpoint)
    agent = Agent(*check_env(ckpt["env_id"]), ckpt["args"]["hidden_dim"]).to(run.device)
    # older checkpoints have no moments, which acting does not use
    agent.load_state_dict({"moments": agent.moments} | ckpt["agent"])
    seed = ckpt["args"]["seed"]
    result = evaluate(agent, ckpt["env_id"], args.eval_episodes, seed, run.device, run.video_dir)
    run.write_eval_only(ckpt, result)


def env_state(envs: gym.vector.VectorEnv) -> dict:
    """The arrays and generators of a native numpy vector env, for an exact resume; {} for
    others (detail 1)."""
    if isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return {}
    state = {}
    for name, value in vars(envs.unwrapped).items():
        if isinstance(value, np.ndarray):
            state[name] = torch.from_numpy(value.copy())
        elif isinstance(value, np.random.Generator):
            state[name] = value.bit_generator.state
    return state


def set_env_state(envs: gym.vector.VectorEnv, state: dict) -> None:
    """Put back what env_state() saved."""
    for name, value in state.items():
        if isinstance(value, dict):
            # a generator's state
            rng = np.random.default_rng()
            rng.bit_generator.state = value
            setattr(envs.unwrapped, name, rng)
        else:
            setattr(envs.unwrapped, name, value.numpy().copy())


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
