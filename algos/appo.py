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
   0.5 (per network, deviation e). The learning rate anneals linearly to 0 at --schedule-steps
   (default: the first run's --total-steps, kept in the checkpoint); a resume that would run past
   it is refused until --schedule-steps re-plans it or --no-anneal-lr turns the anneal off.
9. Evaluation is greedy (argmax) on a separate env, episode i seeded seed + 10_000 + i. Actors
   restart their envs (seeded with the step) on resume.
10. Cost: with one actor the learner is the bottleneck, and for layers this small each torch op
    costs microseconds of Python and dispatch whatever its size. So the per-step work is kept to
    few ops, with the same numbers: fused Adam, log_softmax and gather instead of
    torch.distributions, the entropy differentiated only when --ent-coef > 0, all epochs'
    minibatches gathered at once, clip_grad_norm_'s math in two foreach ops, V-trace with one op
    per step over all envs, numpy writes into the rollout buffers. On a GPU the learner waits for
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
import os
import queue
import random
import signal
import time
from collections import deque
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

# CleanRL ppo.py
MAX_GRAD_NORM = 0.5
# what an update logs, read from the device at once
TAGS = [f"losses/{k}" for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")]
TAGS += ["charts/importance_ratio"]


@dataclass
class Args:
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
        raise fail(f"cannot make environment {env_id!r} ({str(e).splitlines()[0]}); {hint}")
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) > 1:
        raise fail(f"{env_id} has image observations; use ppo_atari.py")
    if isinstance(act_space, gym.spaces.Box):
        raise fail(f"{env_id} has continuous actions; use d4pg.py or naf.py")
    if not isinstance(obs_space, gym.spaces.Box) or not isinstance(act_space, gym.spaces.Discrete):
        spaces = f"{type(obs_space).__name__} observations, {type(act_space).__name__} actions"
        raise fail(f"{env_id} has {spaces}; {SCRIPT} needs flat Box and Discrete ones")
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
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(obs_dim: int, hidden_dim: int, out: int, out_std: float) -> nn.Sequential:
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
        super().__init__()
        self.actor = mlp(obs_dim, hidden_dim, num_actions, 0.01)
        self.critic = mlp(obs_dim, hidden_dim, 1, 1.0)
        # (count, mean, var) of the value targets v_s so far; (0, 0, 1) leaves V as it is
        self.register_buffer("moments", torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy logits and the critic's output, V(x) standardised by `moments`."""
        return self.actor(x), self.critic(x).squeeze(-1)

    def scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.moments[1].float(), (self.moments[2] + 1e-8).sqrt().float()


# ---------------------------------------------------------------- APPO math
def vtrace(
    log_rho,
    rewards,
    values,
    next_values,
    terminated,
    dones,
    gamma: float,
    lam=1.0,
    rho_bar=1.0,
    c_bar=1.0,
    pg_rho_bar=1.0,
):
    """V-trace targets v_s and policy advantages A_s, [T, N] (paper Remark 1 and Section 4.2).
    log_rho = log pi(a_s|x_s) - log mu(a_s|x_s); values[s] = V(x_s); next_values[s] = V(x_{s+1}),
    at an episode end the value of the real final observation."""
    ratio = log_rho.exp()
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
    discount = gamma * (1.0 - terminated)
    delta, trace = rho * (rewards + discount * next_values - values), gamma * c * (1.0 - dones)
    correction = values.new_zeros(len(values) + 1, *values.shape[1:])
    # correction[s] = v_s - V(x_s), backwards: one op per step for all envs
    for s in reversed(range(len(rewards))):
        correction[s] = torch.addcmul(delta[s], trace[s], correction[s + 1])
    v_s = values + correction[:-1]
    # v_{s+1}: the next target inside an episode; V(x_{s+1}) after its end or at the last step
    v_next = torch.where(dones.bool(), next_values, torch.cat([v_s[1:], next_values[-1:]]))
    return v_s, ratio.clamp(max=pg_rho_bar) * (rewards + discount * v_next - values)


def gae(rewards, values, next_values, terminated, dones, gamma: float, lam: float) -> torch.Tensor:
    """GAE(lambda) advantages on the same inputs as vtrace (--no-vtrace)."""
    delta = rewards + gamma * (1.0 - terminated) * next_values - values
    trace = gamma * lam * (1.0 - dones)
    advantages = values.new_zeros(len(values) + 1, *values.shape[1:])
    for s in reversed(range(len(rewards))):
        advantages[s] = torch.addcmul(delta[s], trace[s], advantages[s + 1])
    return advantages[:-1]


def appo_loss(logits, value, actions, logp_mu, advantages, v_s, w, clip_coef, ent_coef, vf_coef):
    # PPO's clipped surrogate with the ratio pi/mu, the value loss to v_s and the entropy bonus, as
    # means with the rows' weights w (summing to 1). Returns the loss and [policy loss, value loss,
    # entropy, approx KL, clip fraction].
    # log_softmax and gather, not torch.distributions: the same numbers in fewer ops
    log_pi = logits.log_softmax(-1)
    log_ratio = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1) - logp_mu
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
    stats = torch.stack([policy_loss, value_loss, entropy, approx_kl, clipfrac]).detach()
    return policy_loss + vf_coef * value_loss - ent_coef * entropy, stats


def merge_moments(moments, x, w) -> torch.Tensor:
    # (count, mean, var) of the rows of x where w = 1 merged into `moments` (Chan et al.)
    n, mean = w.sum(), (x * w).sum() / w.sum()
    count, m, v = moments
    total, delta = count + n, mean - m
    var = (v * count + ((x - mean) ** 2 * w).sum() + delta**2 * count * n / total) / total
    return torch.stack([total, m + delta * n / total, var])


def prepare_batch(agent: Agent, rollout: dict, args: Args) -> tuple[dict, torch.Tensor]:
    # targets and advantages with the learner's current pi and V (detail 5), the T x N rows flat
    # with their `valid` mask (detail 6); the batch and the mean importance ratio pi/mu
    with torch.no_grad():
        # T + 1 rows: the last is x_T
        logits, values = agent(rollout["obs"])
        mean, std = agent.scale()
        values = values * std + mean
        log_pi = logits[:-1].log_softmax(-1).gather(-1, rollout["actions"].unsqueeze(-1))
        log_rho = log_pi.squeeze(-1) - rollout["logprobs"]
        steps = dict(rewards=rollout["rewards"], values=values[:-1], next_values=values[1:])
        steps |= dict(terminated=rollout["terminated"], dones=rollout["dones"], gamma=args.gamma)
        if args.vtrace:
            bars = dict(rho_bar=args.rho_bar, c_bar=args.c_bar, pg_rho_bar=args.pg_rho_bar)
            v_s, advantages = vtrace(log_rho, **steps, lam=args.lam, **bars)
        else:
            advantages = gae(**steps, lam=args.lam)
            v_s = advantages + values[:-1]
        valid = rollout["valid"].float()
        if args.norm_values:
            # the critic's targets, standardised by the moments of every v_s so far (detail 12)
            agent.moments.copy_(merge_moments(agent.moments, v_s.double(), valid.double()))
            mean, std = agent.scale()
            v_s = (v_s - mean) / std
        # normalised over the valid rows if there are two or more (one row has no std)
        n = valid.sum()
        mean = (advantages * valid).sum() / n
        std = ((advantages - mean).pow(2) * valid).sum().div(n - 1).sqrt()
        advantages = torch.where(n > 1, (advantages - mean) / (std + 1e-8), advantages)
    batch = dict(obs=rollout["obs"][:-1], actions=rollout["actions"], logp_mu=rollout["logprobs"])
    batch |= dict(advantages=advantages, v_s=v_s, valid=valid)
    return {k: x.flatten(0, 1) for k, x in batch.items()}, (log_rho.exp() * valid).sum() / n


def learn_step(agent: Agent, optimizer, args: Args, obs, actions, logp_mu, advantages, v_s, valid):
    # one minibatch: the loss (a mean over its valid rows), each network's gradient norm clipped
    # apart (deviation e) and an Adam step; its statistics (detail 11)
    logits, value = agent(obs)
    coefs = dict(clip_coef=args.clip_coef, ent_coef=args.ent_coef, vf_coef=args.vf_coef)
    w = valid / valid.sum()
    loss, stats = appo_loss(logits, value, actions, logp_mu, advantages, v_s, w, **coefs)
    optimizer.zero_grad()
    loss.backward()
    for net in (agent.actor, agent.critic):
        # clip_grad_norm_'s math in two foreach ops
        grads = [p.grad for p in net.parameters()]
        norm = torch.stack(torch._foreach_norm(grads)).norm()
        torch._foreach_mul_(grads, (MAX_GRAD_NORM / (norm + 1e-6)).clamp(max=1.0))
    optimizer.step()
    return stats


def update(step, batch: dict, n: int, args: Args) -> torch.Tensor:
    # update_epochs passes of `step` over the batch's n valid rows, shuffled and cut into
    # minibatches of len(batch) / num_minibatches rows (detail 5); the last one's statistics
    valid = batch["valid"]
    mb = len(valid) // args.num_minibatches
    # the valid rows first, in random order (the last minibatch of them padded with invalid ones:
    # fixed shapes); every epoch's gathered before a compiled step runs, which with CUDA graphs
    # overwrites the compiled prepare_batch's outputs
    perm = (torch.rand(args.update_epochs, len(valid), device=valid.device) - valid).argsort()
    minibatches = {k: x[perm].unflatten(1, (-1, mb)) for k, x in batch.items()}
    for epoch in range(args.update_epochs):
        for i in range(-(-n // mb)):
            stats = step(**{k: x[epoch, i] for k, x in minibatches.items()})
        if args.target_kl is not None and stats[3] > args.target_kl:
            break
    return stats


# ---------------------------------------------------------------- rollouts
def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    # on CUDA a pinned copy, sent without waiting; the caching host allocator keeps it until the
    # transfer is done, so x may be refilled at once
    return x.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else x


def new_rollout(num_steps: int, num_envs: int, obs_dim: int) -> dict[str, torch.Tensor]:
    """Preallocated rollout storage; obs has num_steps + 1 rows, the last being x_T."""
    T, N = num_steps, num_envs
    rollout = {k: torch.zeros(T, N) for k in ("logprobs", "rewards", "terminated", "dones")}
    rollout["obs"], rollout["actions"] = torch.zeros(T + 1, N, obs_dim), torch.zeros(T, N).long()
    return rollout | {"valid": torch.zeros(T, N, dtype=torch.bool)}


class Collector:
    """A vector env and its episodes in progress; `collect` fills a rollout."""

    def __init__(self, env_id: str, num_envs: int, seed: int):
        self.envs = make_envs(env_id, num_envs)
        self.next_obs, _ = self.envs.reset(seed=seed)
        # NEXT_STEP: the coming step only resets
        self.autoreset = np.zeros(num_envs, dtype=bool)

    @torch.inference_mode()
    def collect(self, policy: nn.Module, rollout: dict, device: torch.device) -> None:
        # numpy writes into the (CPU) buffers and Categorical's draw by hand: on tensors this small
        # each torch op costs microseconds, as much as a CartPole step
        buf = {k: v.numpy() for k, v in rollout.items()}
        for t in range(len(buf["actions"])):
            buf["obs"][t], buf["valid"][t] = self.next_obs, ~self.autoreset
            log_pi = policy(to_device(rollout["obs"][t], device)).log_softmax(-1)
            actions = torch.multinomial(log_pi.exp(), 1)
            # one copy to the CPU, the step's only wait for the device
            sample = torch.cat([log_pi.gather(-1, actions), actions], 1).cpu()
            buf["logprobs"][t], buf["actions"][t] = sample.T.numpy()
            self.next_obs, reward, terminated, truncated, _ = self.envs.step(buf["actions"][t])
            self.autoreset = terminated | truncated
            buf["rewards"][t], buf["terminated"][t] = reward, terminated
            buf["dones"][t] = self.autoreset
        # x_T, the real final observation if an episode just ended
        buf["obs"][-1] = self.next_obs


def finished_episodes(rollout: dict, ep_return, ep_length) -> list[tuple[float, int]]:
    """(return, length) of the episodes that ended; ep_return and ep_length [N] carry those in
    progress, updated in place. Autoreset rows (not valid) add nothing."""
    ended, ep_return, ep_length = [], ep_return.numpy(), ep_length.numpy()
    rewards, valid, dones = (rollout[k].numpy() for k in ("rewards", "valid", "dones"))
    for t in range(len(rewards)):
        ep_return += rewards[t] * valid[t]
        ep_length += valid[t]
        for i in np.flatnonzero(dones[t]):
            ended.append((float(ep_return[i]), int(ep_length[i])))
            ep_return[i], ep_length[i] = 0.0, 0
    return ended


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    check_args(args)
    if args.eval_only:
        return eval_only(args)
    device = seed_and_pick_device(args)
    obs_dim, num_actions = check_env(args.env_id)
    agent = Agent(obs_dim, num_actions, args.hidden_dim).to(device)
    # fused: one kernel per step; a tensor lr: the anneal sets it in place, compiled steps keep it
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=torch.tensor(args.learning_rate, device=device), eps=1e-5, fused=True
    )
    start = restore(args, agent, optimizer)
    step = compiled(partial(learn_step, agent, optimizer, args), args, device)
    prepare = compiled(prepare_batch, args, device)
    global_step, version, dropped = start["global_step"], start["version"], start["dropped"]
    batch_size, horizon, lags = args.num_envs * args.num_steps, start["schedule_steps"], []
    stop = stop_signal()
    if args.num_actors:
        source = Actors(args, agent, obs_dim, start, stop)
    else:
        source = LocalSource(args, agent, obs_dim, device, start)

    def evaluate_policy(video_dir: Path | None = None) -> list[float]:
        return evaluate(agent, args.env_id, args.eval_episodes, args.seed, device, video_dir)

    def state() -> dict:
        return checkpoint_state(agent, optimizer, version, dropped, horizon, source)

    run_dir, resumed = run_dir_for(args, args.resume), args.resume is not None
    with source, RunLogger(args, run_dir, global_step, start["end_step"], resumed) as log:
        while global_step < start["end_step"] and not stop:
            got = source.next(version)
            if got is None:
                # a signal while waiting for the actors
                break
            rollout, rollout_version, episodes = got
            lr = args.learning_rate * (1.0 - global_step / horizon if args.anneal_lr else 1.0)
            global_step += batch_size
            for ep_return, ep_length in episodes:
                log.episode(global_step, ep_return, ep_length)
            lags.append(version - rollout_version)
            if lags[-1] <= args.max_policy_lag and (n := int(rollout["valid"].sum())):
                optimizer.param_groups[0]["lr"].fill_(lr)
                rollout = {k: to_device(v, device) for k, v in rollout.items()}
                batch, ratio = prepare(agent, rollout, args)
                # CUDA graphs overwrite a compiled function's outputs at the next compiled call
                ratio = ratio.clone()
                stats = update(step, batch, n, args)
                # before publishing: actors get finite weights
                log.check_finite(stats, global_step)
                version += 1
                source.publish(agent, version)
                # one read per update: the next action, or the weights' publication, waits for the
                # update anyway
                values = dict(zip(TAGS, torch.cat([stats, ratio[None]]).tolist()))
                log.scalars(global_step, values | {"charts/learning_rate": lr})
            else:
                # too old, or no valid row (detail 5)
                dropped += 1
            charts = {"charts/policy_lag": lags[-1], "charts/dropped_rollouts": dropped}
            log.scalars(global_step, charts | {"charts/SPS": log.sps(global_step)})
            log.end_iteration(global_step, stop, evaluate_policy, state)
        lag_mean = float(np.mean(lags)) if lags else 0.0
        extra = dict(num_actors=args.num_actors, updates=version, dropped_rollouts=dropped)
        log.finish(global_step, stop, evaluate_policy, state, **extra, policy_lag_mean=lag_mean)


# ---------------------------------------------------------------- rollout sources
class LocalSource(Collector):
    """Synchronous mode (detail 1): the learner collects with its own policy, so every lag is 0."""

    def __init__(self, args: Args, agent: Agent, obs_dim: int, device, start: dict):
        super().__init__(args.env_id, args.num_envs, args.seed + start["global_step"])
        self.agent, self.device = agent, device
        self.rollout = new_rollout(args.num_steps, args.num_envs, obs_dim)
        self.ep_return = torch.zeros(args.num_envs, dtype=torch.float64)
        self.ep_length = torch.zeros(args.num_envs, dtype=torch.long)
        # continue the checkpoint's episodes where the env state can be restored (native envs)
        saved = start["source"]
        if saved.get("env") and env_state(self.envs):
            set_env_state(self.envs, saved["env"])
            self.next_obs, self.autoreset = saved["next_obs"].numpy(), saved["autoreset"].numpy()
            self.ep_return, self.ep_length = saved["ep_return"], saved["ep_length"]

    def __enter__(self) -> LocalSource:
        return self

    def __exit__(self, *exc) -> None:
        self.envs.close()

    def next(self, version: int) -> tuple[dict, int, list]:
        self.collect(self.agent.actor, self.rollout, self.device)
        episodes = finished_episodes(self.rollout, self.ep_return, self.ep_length)
        return self.rollout, version, episodes

    def publish(self, agent: Agent, version: int) -> None:
        # collect() acts with the learner's own agent
        pass

    def state(self) -> dict:
        obs, autoreset = torch.from_numpy(self.next_obs), torch.from_numpy(self.autoreset)
        episodes = {"ep_return": self.ep_return, "ep_length": self.ep_length}
        return {"env": env_state(self.envs), "next_obs": obs, "autoreset": autoreset, **episodes}


def env_state(envs: gym.vector.VectorEnv) -> dict:
    # the arrays and generators of a native numpy vector env, for an exact resume; {} for others
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
    for name, value in state.items():
        if isinstance(value, dict):
            # a generator's state
            rng = np.random.default_rng()
            rng.bit_generator.state = value
            setattr(envs.unwrapped, name, rng)
        else:
            setattr(envs.unwrapped, name, value.numpy().copy())


def publish_weights(weights: torch.Tensor, seq: torch.Tensor, agent: Agent, version: int) -> None:
    # the learner's side of the seqlock (detail 2): seq = [writes, version]; writes is odd while
    # the weights change
    seq[0] += 1
    weights.copy_(parameters_to_vector(agent.parameters()).detach())
    seq[1] = version
    seq[0] += 1


def read_weights(weights: torch.Tensor, seq: torch.Tensor, agent: Agent) -> int | None:
    """Actor side: the published weights into `agent`; their version, or None if torn."""
    before = int(seq[0])
    flat, version = weights.clone(), int(seq[1])
    if before % 2 or int(seq[0]) != before:
        return None
    vector_to_parameters(flat, agent.parameters())
    return version


def actor_main(actor_id: int, args: Args, start_step: int, shared: dict, rollout, messages, copied):
    # one actor process (details 2-4): wait until the learner has copied its buffer, read the
    # newest weights, collect a rollout into the buffer, send (actor, version, None); or an error
    for sig in (signal.SIGINT, signal.SIGTERM):
        # the learner decides: it checkpoints, then stops us
        signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(1)
    learner, free = os.getppid(), False
    try:
        # distinct per actor and resume
        seed = args.seed + 1000 * (actor_id + 1) + start_step
        torch.manual_seed(seed)
        collector = Collector(args.env_id, args.num_envs, seed)
        num_actions = int(collector.envs.single_action_space.n)
        agent = Agent(rollout["obs"].shape[-1], num_actions, args.hidden_dim)
        shared["ready"][actor_id] = True
        # a new parent: the learner is gone
        while not shared["stop"][0] and os.getppid() == learner:
            if not free:
                try:
                    free = copied.get(timeout=0.5)
                except queue.Empty:
                    continue
            version = read_weights(shared["weights"], shared["seq"], agent)
            if version is not None:
                collector.collect(agent.actor, rollout, torch.device("cpu"))
                messages.put((actor_id, version, None))
                free = False
    except Exception as e:
        error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]
        messages.put((actor_id, -1, error))
        shared["ready"][actor_id] = True
        # stay alive until the learner has read it
        while not shared["stop"][0] and os.getppid() == learner:
            time.sleep(0.1)
    messages.close()
    # the last message is in the pipe
    messages.join_thread()
    # skip the interpreter's teardown of torch (seconds on a busy machine): nothing is left to save
    os._exit(0)


class Actors:
    """--num-actors processes (details 2-4). Entering starts them and waits until each has its env
    (start-up stays out of the training loop's SPS); leaving stops them on every way out."""

    def __init__(self, args: Args, agent: Agent, obs_dim: int, start: dict, stop):
        # each actor acts on a core of its own with one thread: the learner leaves them room
        torch.set_num_threads(max(1, torch.get_num_threads() - args.num_actors))
        ctx, self.stop, n = mp.get_context("spawn"), stop, args.num_actors
        weights = parameters_to_vector(agent.parameters()).detach().cpu()
        flags = {"stop": torch.zeros(1).bool(), "ready": torch.zeros(n).bool()}
        self.shared = {"weights": weights, "seq": torch.tensor([0, start["version"]]), **flags}
        self.buffers = [new_rollout(args.num_steps, args.num_envs, obs_dim) for _ in range(n)]
        for tensor in [*self.shared.values(), *(v for b in self.buffers for v in b.values())]:
            tensor.share_memory_()
        self.messages, self.copied = ctx.Queue(), [ctx.Queue() for _ in range(n)]
        self.procs = []
        for i in range(n):
            queues = (self.messages, self.copied[i])
            run = (i, args, start["global_step"], self.shared, self.buffers[i], *queues)
            self.procs.append(ctx.Process(target=actor_main, args=run, daemon=True))
        self.ep_return = torch.zeros(n, args.num_envs, dtype=torch.float64)
        self.ep_length = torch.zeros(n, args.num_envs, dtype=torch.long)

    def __enter__(self) -> Actors:
        try:
            for proc, copied in zip(self.procs, self.copied):
                proc.start()
                copied.put(True)
            while not self.shared["ready"].all() and not self.stop:
                self.check_alive()
                time.sleep(0.05)
        except BaseException:
            # `with` calls __exit__ only after __enter__ returned
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.shared["stop"][0] = True
        started = [proc for proc in self.procs if proc.pid is not None]
        for proc in started:
            proc.join(timeout=3)
        for proc in started:
            if proc.is_alive():
                proc.kill()
                proc.join()

    def check_alive(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                reason = f"exit code {proc.exitcode}"
                if proc.exitcode < 0:
                    reason = f"killed by {signal.Signals(-proc.exitcode).name}"
                raise fail(f"actor {i} (pid {proc.pid}) died ({reason}); last checkpoint kept")

    def next(self, version: int) -> tuple[dict, int, list] | None:
        """A copy of the next rollout, its policy version and episodes; None after a signal."""
        while not self.stop:
            self.check_alive()
            try:
                actor, rollout_version, error = self.messages.get(timeout=0.5)
            except queue.Empty:
                continue
            if error:
                raise fail(f"actor {actor} failed: {error}")
            rollout = {k: v.clone() for k, v in self.buffers[actor].items()}
            # the actor may now collect its next rollout
            self.copied[actor].put(True)
            episodes = finished_episodes(rollout, self.ep_return[actor], self.ep_length[actor])
            return rollout, rollout_version, episodes
        return None

    def publish(self, agent: Agent, version: int) -> None:
        publish_weights(self.shared["weights"], self.shared["seq"], agent, version)

    def state(self) -> dict:
        # actors restart their envs on resume (detail 9)
        return {}


# ---------------------------------------------------------------- plumbing
def check_args(args: Args) -> None:
    batch, mb = args.num_envs * args.num_steps, args.num_minibatches
    sizes = min(args.num_envs, args.num_steps, args.update_epochs, args.hidden_dim)
    rows = [
        (sizes >= 1, "--num-envs, --num-steps, --update-epochs and --hidden-dim must be >= 1"),
        (mb > 0 and batch % mb == 0, f"--num-minibatches must divide the rollout's {batch} steps"),
        (args.num_actors >= 0, "--num-actors must be >= 0 (0: synchronous mode)"),
        (args.max_policy_lag >= 0, "--max-policy-lag must be >= 0"),
        (0 < args.c_bar <= args.rho_bar, "need 0 < c-bar <= rho-bar (paper, Section 4.1)"),
        (args.pg_rho_bar > 0, "--pg-rho-bar must be positive"),
        (0 <= args.gamma <= 1 and 0 <= args.lam <= 1, "--gamma and --lam must be in [0, 1]"),
        (min(args.learning_rate, args.clip_coef) > 0, "--learning-rate and --clip-coef: > 0"),
        (min(args.ent_coef, args.vf_coef) >= 0, "--ent-coef and --vf-coef must be >= 0"),
        (args.target_kl is None or args.target_kl > 0, "--target-kl must be positive"),
        (args.schedule_steps is None or args.schedule_steps > 0, "--schedule-steps must be > 0"),
        (
            args.eval_only or args.resume or args.total_steps >= batch,
            f"--total-steps is below one rollout ({batch} steps)",
        ),
    ]
    check_flags(args, rows)


def checkpoint_state(agent: Agent, optimizer, version, dropped, horizon, source) -> dict:
    counters = {"version": version, "dropped": dropped, "schedule_steps": horizon}
    state = {"agent": agent.state_dict(), "optimizer": optimizer.state_dict(), **counters}
    return state | {"source": source.state(), "rng": rng_state(torch=torch.default_generator)}


def restore(args: Args, agent: Agent, optimizer) -> dict:
    # the run's counters, lr horizon, end step and rollout source's state: --resume's or fresh
    start = {"global_step": 0, "version": 0, "dropped": 0, "source": {}}
    start["schedule_steps"] = args.total_steps
    if args.resume is not None:
        start = resume_checkpoint(args, same=("hidden_dim", "num_envs", "norm_values"))
        agent.load_state_dict(start["agent"])
        # the run's lr tensor on its device, not the checkpoint's (read on the CPU; older: a float)
        start["optimizer"]["param_groups"][0]["lr"] = optimizer.param_groups[0]["lr"]
        optimizer.load_state_dict(start["optimizer"])
        set_rng_state(start["rng"], torch=torch.default_generator)
        # a checkpoint from before --schedule-steps annealed to its own --total-steps
        start.setdefault("schedule_steps", start["args"]["total_steps"])
    if args.schedule_steps is not None:
        start["schedule_steps"] = args.schedule_steps
    step, batch = start["global_step"], args.num_envs * args.num_steps
    # the loop ends after the last whole rollout within --total-steps
    start["end_step"] = end = step + (args.total_steps - step) // batch * batch
    if args.anneal_lr and end > start["schedule_steps"]:
        raise fail(
            f"--total-steps {args.total_steps} runs past the learning-rate anneal, which ends at "
            f"step {start['schedule_steps']}; pass --schedule-steps {end} or --no-anneal-lr"
        )
    return start


def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, device, video_dir=None):
    # greedy (argmax) returns (detail 9)
    env, returns = make_env(env_id, video_dir), []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                logits = agent.actor(torch.as_tensor(obs, dtype=torch.float32, device=device))
            obs, reward, terminated, truncated, _ = env.step(int(logits.argmax()))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def eval_only(args: Args) -> None:
    # --checkpoint's own env, network and seed: it repeats the run's final evaluation
    ckpt, device = load_checkpoint(args.checkpoint), seed_and_pick_device(args)
    agent = Agent(*check_env(ckpt["env_id"]), ckpt["args"]["hidden_dim"]).to(device)
    # older checkpoints have no moments, which acting does not use
    agent.load_state_dict({"moments": agent.moments} | ckpt["agent"])
    video_dir = run_dir_for(args, args.checkpoint) / "videos" if args.capture_video else None
    seed = ckpt["args"]["seed"]
    result = evaluate(agent, ckpt["env_id"], args.eval_episodes, seed, device, video_dir)
    write_eval_only(args, ckpt, result)


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
