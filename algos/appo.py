"""APPO: PPO's clipped objective on V-trace targets, synchronous or with actor processes.

Papers: Lasse Espeholt, Hubert Soyer, Remi Munos, Karen Simonyan, Volodymyr Mnih, Tom Ward, Yotam Doron,
Vlad Firoiu, Tim Harley, Iain Dunning, Shane Legg, Koray Kavukcuoglu, "IMPALA: Scalable Distributed Deep-RL
with Importance Weighted Actor-Learner Architectures", ICML 2018, arXiv:1802.01561 (V-trace, Section 4);
John Schulman, Filip Wolski, Prafulla Dhariwal, Alec Radford, Oleg Klimov, "Proximal Policy Optimization
Algorithms", 2017, arXiv:1707.06347 (the clipped surrogate). The pairing is RLlib's APPO; Sample Factory
(Aleksei Petrenko et al. 2020, arXiv:2006.11751) trains the same loss and masks samples by policy lag.

Idea: in an actor-learner system, actors act with a copy of the policy while the learner trains, so every
rollout comes from a slightly stale behaviour policy mu, not from the learner's policy pi: the *policy lag*.
V-trace corrects the value targets and advantages with truncated importance weights pi/mu, and PPO's
clipped surrogate, with its ratio taken against mu, keeps each update close to the policy that acted.
With no lag (mu = pi, the synchronous mode) the weights are 1, V-trace's targets are lambda-returns, and
APPO is PPO whose advantage looks one step into them: r_s + gamma v_{s+1} - V(x_s).

Equations (rollout x_0..x_T of one env; ratio_s = pi(a_s|x_s) / mu(a_s|x_s); r_s the reward):
    rho_s = min(rho_bar, ratio_s),   c_s = lambda min(c_bar, ratio_s)
    delta_s = rho_s (r_s + gamma V(x_{s+1}) - V(x_s))
    v_s = V(x_s) + delta_s + gamma c_s (v_{s+1} - V(x_{s+1})),   v_T = V(x_T)       (Remark 1, backwards)
    A_s = rho_s (r_s + gamma v_{s+1} - V(x_s))                                      (the policy advantage)
    L = -E[min(ratio_s A_s, clip(ratio_s, 1 - eps, 1 + eps) A_s)] + c_v E[(V(x_s) - v_s)^2] / 2 - c_ent E[H(pi)]
An episode end at s cuts the trace: termination sets V(x_{s+1}) = v_{s+1} = 0; a time-limit truncation
sets v_{s+1} = V(x_{s+1}) of the real final observation. lambda = 1 is the paper's V-trace; lambda < 1 is
the variant of its Section 4.1 with Retrace's lambda: on-policy, v_s is then GAE(lambda)'s return.

Implementation details:
1. Synchronous mode (the default, --num-actors 0): the learner's vector env collects num_envs x num_steps
   steps with the current policy, then the learner trains on them. mu = pi when the targets are computed,
   so the policy lag is 0, V-trace gives the bootstrapped lambda-returns, and APPO is PPO with those
   targets. Deterministic on CPU with a seed; resume restores the state of native numpy vector envs
   (CartPole's), so a resumed run continues exactly as an uninterrupted one.
2. --num-actors N: N processes from torch.multiprocessing's *spawn* context (fresh interpreters: no
   forked OpenMP or CUDA state; the same on Linux and macOS). Each owns a vector env and a CPU copy of the
   policy and acts with one torch thread; the learner keeps max(1, threads - N) of torch's threads
   (OMP_NUM_THREADS, else the cores): one more would take an actor's core for no gain on layers this
   small. Weights go through shared memory: one flat tensor plus a seqlock counter (odd while the learner
   writes; an actor that overlapped a write reads again), so the learner never waits on an actor. Each
   actor writes its rollout into its own shared buffer and sends only (actor, policy version) through a
   queue; once the learner has copied the buffer, the actor reads the newest weights and collects the next
   rollout while the learner trains. Messages of a few bytes cannot be half-written by a killed actor.
   SPS (charts/SPS, summary.json's sps) counts env steps over the training loop in both modes: from
   the moment the actors are ready (spawning and importing take seconds, outside it; the first rollout's
   wait is inside) to the last update, before the final evaluation and checkpoint.
3. Policy lag = learner updates since the rollout's weights were published, logged as charts/policy_lag
   (and charts/importance_ratio, the mean pi/mu before the update); a rollout older than --max-policy-lag
   is dropped (charts/dropped_rollouts; its env steps still count).
4. Shutdown: actors ignore SIGINT and SIGTERM (Ctrl-C reaches the whole process group): the learner's
   stop signal checkpoints, then the learner sets a shared stop flag, joins the actors and kills any left
   after 3 s, on every way out. An actor that raises sends its error; a dead actor (killed) is seen by a
   liveness check at each wait of at most 0.5 s; either stops the learner with one line naming the actor.
   An actor whose learner is gone exits, so no process is orphaned. The stop and ready flags are shared
   tensors, not locks or events, which a killed actor could leave held.
5. V-trace runs once per batch, before the epochs (as PPO's GAE), with the learner's current pi and V;
   then update_epochs passes of shuffled minibatches. Advantages are normalised over the batch.
   --target-kl stops the epochs once the approximate KL(mu || pi) of the last minibatch exceeds it.
6. Gymnasium's NEXT_STEP autoreset: the step after an episode end only resets that env. Its row is left
   out of every loss and statistic (`valid`), and its observation, the real final observation of the
   ended episode, gives V(x_{s+1}) for the truncation bootstrap.
7. --no-vtrace: GAE(lambda) advantages with returns A + V on the same data, for the ablation.
8. Networks and optimiser as CleanRL's ppo.py: separate policy and value MLPs (2 x 64, tanh), orthogonal
   init (sqrt 2, 0.01 policy head, 1 value head), Adam (eps 1e-5), learning rate annealed linearly over
   env steps, gradient-norm clip 0.5 (per network, deviation e).
9. Evaluation is greedy (argmax) on a separate env, episode i seeded seed + 10_000 + i. Checkpoints hold
   the networks, optimiser, counters, torch's generator (actions in synchronous mode, minibatches) and,
   in synchronous mode, the env state; actors restart their envs (seeded with the step) on resume.
   SIGINT/SIGTERM skip any evaluation still due, save a checkpoint and exit 0 without summary.json.
10. Cost: with one actor the learner is the bottleneck (its update is about 60% of a synchronous batch's
    CPU time on CartPole), and for layers this small each torch op costs microseconds of Python and
    dispatch whatever its size. So the per-step work is kept to few ops, with the same numbers: fused Adam,
    log_softmax and gather instead of torch.distributions, the entropy differentiated only when
    --ent-coef > 0, minibatches cut from one permutation per epoch, clip_grad_norm_'s math in two foreach
    ops, V-trace with one op per step over all envs, numpy writes into the rollout buffers.

Deviations:
a. The surrogate's ratio is taken against mu, as the issue asks and Sample Factory does; RLlib's APPO
   takes it against a target network refreshed every few updates (times a clipped pi_target/mu).
b. The learner trains on one rollout at a time (num_envs x num_steps from one actor), the synchronous
   batch, so the two modes compare at equal batch settings; IMPALA and RLlib batch several actors.
c. No clamp of the raw ratio to [0.05, 20] before V-trace (Sample Factory): rho_bar and c_bar bound it
   above and the clipped surrogate bounds the step.
d. Defaults for CartPole-v1 in 150k steps: 8 envs x 64 steps, 4 epochs of 4 minibatches, lr 1e-3 annealed,
   and RL Zoo's tuned CartPole PPO values gamma 0.98, lambda 0.8, no entropy bonus (with gamma 0.99 and
   lambda 0.95 the greedy return of seed 1 reached 500 at 75k, then sank to 397 by 150k).
e. The gradient norm is clipped for the policy and the value network apart (CleanRL clips them jointly):
   on LunarLander, without reward scaling, the value gradient dominates a joint norm and shrinks the
   policy's steps; seed 1's greedy return at 300k was -4 with the joint clip, 194 with separate ones.

Usage: python algos/appo.py --env-id CartPole-v1 --total-steps 150000 --num-actors 1 --seed 1
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle OpenMP threads sleep instead of spinning

import importlib.util
import json
import queue
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
import torch.multiprocessing as mp
import torch.nn as nn
import tyro
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.tensorboard import SummaryWriter

MAX_GRAD_NORM = 0.5  # CleanRL ppo.py
LOSS_TAGS = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac")


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """Gymnasium id of an environment with Discrete actions and flat Box observations"""
    seed: int = 1
    """seed of python, numpy, torch and the environments"""
    total_steps: int = 150_000
    """environment steps to train for (summed over envs and actors)"""
    num_envs: int = 8
    """parallel environments in each vector env (the learner's, or each actor's)"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms, for identical runs on CPU (synchronous mode)"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """the learner's device (auto picks cuda when available); actors act on the CPU"""
    exp_name: str = "appo"
    """experiment name, part of the default run directory"""
    run_dir: str | None = None
    """output directory (default runs/<env>__<exp>__<seed>__<unixtime>)"""
    checkpoint_interval: int = 50_000
    """save a checkpoint every this many env steps (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from (its run directory is reused)"""
    eval_episodes: int = 10
    """greedy evaluation episodes (periodic and final)"""
    eval_interval: int = 25_000
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
    num_steps: int = 64
    """steps per env in each rollout (a batch is num_envs x num_steps)"""
    num_actors: int = 0
    """actor processes (0: synchronous mode, the learner collects its own rollouts)"""
    max_policy_lag: int = 10
    """drop rollouts collected with weights more than this many updates old"""
    vtrace: bool = True
    """V-trace targets and advantages; --no-vtrace: GAE(lambda) on the same data (the ablation)"""
    rho_bar: float = 1.0
    """V-trace's truncation of rho_s = min(rho_bar, pi/mu) (must be >= c_bar)"""
    c_bar: float = 1.0
    """V-trace's truncation of c_s = lambda min(c_bar, pi/mu)"""
    gamma: float = 0.98
    """discount factor"""
    lam: float = 0.8
    """lambda of V-trace's c_s (paper Section 4.1), and GAE's lambda with --no-vtrace"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over --total-steps"""
    update_epochs: int = 4
    """passes over each batch"""
    num_minibatches: int = 4
    """minibatches per pass"""
    clip_coef: float = 0.2
    """PPO's clip epsilon of the ratio pi/mu"""
    ent_coef: float = 0.0
    """entropy bonus c_ent"""
    vf_coef: float = 0.5
    """value loss weight c_v"""
    target_kl: float | None = None
    """stop a batch's epochs once the approximate KL(mu || pi) exceeds this (default: never)"""
    hidden_dim: int = 64
    """units in each hidden layer of the policy and value MLPs"""


# ---------------------------------------------------------------- environment
def check_env(env_id: str) -> tuple[int, int]:
    """Observation size and number of actions, or a one-line refusal naming the file that fits."""
    try:
        env = gym.make(env_id)
    except Exception as e:  # unknown id (Atari ids too: ale_py is not imported), missing module or dependency
        hint = "Atari games have image observations, use ppo_atari.py" if env_id.startswith("ALE/") else "check the id with gymnasium.pprint_registry()"
        raise fail(f"cannot make environment {env_id!r} ({str(e).splitlines()[0]}); {hint}")
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) > 1:
        raise fail(f"{env_id} has image observations {obs_space.shape}; appo.py needs flat ones, use ppo_atari.py")
    if isinstance(act_space, gym.spaces.Box):
        raise fail(f"{env_id} has continuous actions; appo.py needs Discrete ones, use d4pg.py or naf.py")
    if not (isinstance(obs_space, gym.spaces.Box) and isinstance(act_space, gym.spaces.Discrete)):
        raise fail(f"{env_id} has {type(obs_space).__name__} observations and {type(act_space).__name__} actions; "
                   "appo.py needs flat Box observations and Discrete actions")
    return int(obs_space.shape[0]), int(act_space.n)


def make_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """Gymnasium's native vector env where one exists (CartPole), else a sync one; NEXT_STEP autoreset (detail 6)."""
    try:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    except gym.error.Error:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def env_state(envs: gym.vector.VectorEnv) -> dict:
    """The arrays and generators of a native numpy vector env, for an exact resume; {} for a sync one."""
    if isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return {}
    return {name: torch.from_numpy(value.copy()) if isinstance(value, np.ndarray) else value.bit_generator.state
            for name, value in vars(envs.unwrapped).items() if isinstance(value, (np.ndarray, np.random.Generator))}


def set_env_state(envs: gym.vector.VectorEnv, state: dict) -> None:
    for name, value in state.items():
        if isinstance(value, dict):  # a generator's state
            rng = np.random.default_rng()
            rng.bit_generator.state = value
            setattr(envs.unwrapped, name, rng)
        else:
            setattr(envs.unwrapped, name, value.numpy().copy())


# ---------------------------------------------------------------- networks
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(obs_dim: int, hidden: int, out: int, out_std: float) -> nn.Sequential:
    return nn.Sequential(layer_init(nn.Linear(obs_dim, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, hidden)), nn.Tanh(),
                         layer_init(nn.Linear(hidden, out), std=out_std))


class Agent(nn.Module):
    """Separate policy and value MLPs (detail 8)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int):
        super().__init__()
        self.actor, self.critic = mlp(obs_dim, hidden, n_actions, 0.01), mlp(obs_dim, hidden, 1, 1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy logits and V(x)."""
        return self.actor(x), self.critic(x).squeeze(-1)


# ---------------------------------------------------------------- APPO math
def vtrace(log_rho, rewards, values, next_values, terminated, dones, gamma: float, lam: float = 1.0,
           rho_bar: float = 1.0, c_bar: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets v_s and policy advantages A_s, [T, N] (paper Remark 1 and Section 4.2).
    log_rho = log pi(a_s|x_s) - log mu(a_s|x_s); values[s] = V(x_s); next_values[s] = V(x_{s+1}), at an
    episode end the value of the real final observation. Termination zeroes V(x_{s+1}) and v_{s+1};
    any episode end cuts the trace."""
    ratio = log_rho.exp()
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
    discount = gamma * (1.0 - terminated)
    delta, trace = rho * (rewards + discount * next_values - values), gamma * c * (1.0 - dones)
    correction = torch.zeros(len(rewards) + 1, *values.shape[1:], dtype=values.dtype, device=values.device)
    for s in reversed(range(len(rewards))):  # correction[s] = v_s - V(x_s): all envs at once, one loop over T
        correction[s] = torch.addcmul(delta[s], trace[s], correction[s + 1])
    v_s = values + correction[:-1]
    # v_{s+1}: the next target inside an episode, V(x_{s+1}) after an episode end or the rollout's last step.
    v_next = torch.where(dones.bool(), next_values, torch.cat([v_s[1:], next_values[-1:]]))
    return v_s, rho * (rewards + discount * v_next - values)


def gae(rewards, values, next_values, terminated, dones, gamma: float, lam: float) -> torch.Tensor:
    """GAE(lambda) advantages on the same inputs as vtrace (--no-vtrace)."""
    delta, trace = rewards + gamma * (1.0 - terminated) * next_values - values, gamma * lam * (1.0 - dones)
    advantages = torch.zeros(len(rewards) + 1, *values.shape[1:], dtype=values.dtype, device=values.device)
    for s in reversed(range(len(rewards))):
        advantages[s] = torch.addcmul(delta[s], trace[s], advantages[s + 1])
    return advantages[:-1]


def appo_loss(logits, value, actions, logp_mu, advantages, v_s, clip_coef: float, ent_coef: float, vf_coef: float):
    """PPO's clipped surrogate with the ratio pi/mu against the behaviour policy, the value loss to v_s and
    the entropy bonus. Returns the loss and [policy loss, value loss, entropy, approx KL, clip fraction].
    log_softmax and gather, not torch.distributions: the same numbers in fewer ops (the learner is the bottleneck)."""
    log_pi = logits.log_softmax(-1)  # non-finite logits reach log.check_finite, one line
    log_ratio = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1) - logp_mu
    ratio = log_ratio.exp()
    policy_loss = -torch.min(ratio * advantages, ratio.clamp(1 - clip_coef, 1 + clip_coef) * advantages).mean()
    value_loss = 0.5 * (value - v_s).pow(2).mean()
    with torch.set_grad_enabled(torch.is_grad_enabled() and ent_coef > 0):  # logged always, differentiated if used
        entropy = -(log_pi.exp() * log_pi).sum(-1).mean()
    with torch.no_grad():  # KL(mu || pi) estimate k3 (Schulman's blog), as CleanRL
        approx_kl, clipfrac = ((ratio - 1) - log_ratio).mean(), ((ratio - 1).abs() > clip_coef).float().mean()
    stats = torch.stack([policy_loss, value_loss, entropy, approx_kl, clipfrac]).detach()
    return policy_loss + vf_coef * value_loss - ent_coef * entropy, stats


def prepare_batch(agent: Agent, rollout: dict, args: Args) -> tuple[dict, torch.Tensor]:
    """Targets and advantages with the learner's current pi and V (detail 5), then the valid rows flat
    (detail 6). Returns the batch and the mean importance ratio pi/mu."""
    with torch.no_grad():
        logits, values = agent(rollout["obs"])  # T + 1 rows: the last is the bootstrap observation x_T
        log_rho = logits[:-1].log_softmax(-1).gather(-1, rollout["actions"].unsqueeze(-1)).squeeze(-1) - rollout["logprobs"]
        inputs = (rollout["rewards"], values[:-1], values[1:], rollout["terminated"], rollout["dones"], args.gamma)
        if args.vtrace:
            v_s, advantages = vtrace(log_rho, *inputs, args.lam, args.rho_bar, args.c_bar)
        else:
            advantages = gae(*inputs, args.lam)
            v_s = advantages + values[:-1]
    valid = rollout["valid"]
    advantages = advantages[valid]
    batch = {"obs": rollout["obs"][:-1][valid], "actions": rollout["actions"][valid], "logp_mu": rollout["logprobs"][valid],
             "advantages": (advantages - advantages.mean()) / (advantages.std() + 1e-8), "v_s": v_s[valid]}
    return batch, log_rho[valid].exp().mean()


def update(agent: Agent, optimizer, batch: dict, args: Args) -> torch.Tensor:
    """update_epochs passes of shuffled minibatches; returns the last minibatch's statistics. Each epoch permutes
    the batch once and cuts it into views: the minibatches randperm(n).tensor_split picks, with fewer ops."""
    n, keys = len(batch["actions"]), ("obs", "actions", "logp_mu", "advantages", "v_s")
    nets = [list(net.parameters()) for net in (agent.actor, agent.critic)]  # listed once: parameters() walks the modules
    for _ in range(args.update_epochs):
        perm = torch.randperm(n, device=batch["actions"].device)
        for obs, actions, logp_mu, advantages, v_s in zip(*(batch[k][perm].tensor_split(min(args.num_minibatches, n)) for k in keys)):
            loss, stats = appo_loss(*agent(obs), actions, logp_mu, advantages, v_s, args.clip_coef, args.ent_coef, args.vf_coef)
            optimizer.zero_grad()
            loss.backward()
            for params in nets:  # each network apart (deviation e): clip_grad_norm_'s math, fewer ops
                grads = [p.grad for p in params]
                torch._foreach_mul_(grads, (MAX_GRAD_NORM / (torch.stack(torch._foreach_norm(grads)).norm() + 1e-6)).clamp(max=1.0))
            optimizer.step()
        if args.target_kl is not None and stats[3] > args.target_kl:
            break
    return stats


# ---------------------------------------------------------------- rollouts
def new_rollout(num_steps: int, num_envs: int, obs_dim: int) -> dict[str, torch.Tensor]:
    """Preallocated rollout storage; obs has num_steps + 1 rows, the last being x_T."""
    T, N = num_steps, num_envs
    return {"obs": torch.zeros(T + 1, N, obs_dim), "actions": torch.zeros(T, N, dtype=torch.long),
            "logprobs": torch.zeros(T, N), "rewards": torch.zeros(T, N), "terminated": torch.zeros(T, N),
            "dones": torch.zeros(T, N), "valid": torch.zeros(T, N, dtype=torch.bool)}


class Collector:
    """A vector env with its episodes in progress; `collect` fills a rollout with a policy's actions."""

    def __init__(self, env_id: str, num_envs: int, seed: int):
        self.envs = make_vector_env(env_id, num_envs)
        self.next_obs, _ = self.envs.reset(seed=seed)
        self.autoreset = np.zeros(num_envs, dtype=bool)  # NEXT_STEP: the coming step only resets these

    @torch.inference_mode()
    def collect(self, policy: nn.Module, rollout: dict, device: torch.device) -> None:
        # Numpy writes into views of the (CPU) buffers, and Categorical's draw by hand: on tensors this small
        # each torch op costs microseconds, as much as a CartPole step.
        buf = {k: v.numpy() for k, v in rollout.items()}
        for t in range(len(buf["actions"])):
            buf["obs"][t], buf["valid"][t] = self.next_obs, ~self.autoreset
            log_pi = policy(rollout["obs"][t].to(device)).log_softmax(-1)  # published weights are finite
            action = torch.multinomial(log_pi.exp(), 1)  # Categorical(logits).sample()'s draw
            buf["actions"][t], buf["logprobs"][t] = action.squeeze(-1).cpu(), log_pi.gather(-1, action).squeeze(-1).cpu()
            self.next_obs, reward, terminated, truncated, _ = self.envs.step(buf["actions"][t])
            self.autoreset = terminated | truncated
            buf["rewards"][t], buf["terminated"][t], buf["dones"][t] = reward, terminated, self.autoreset
        buf["obs"][-1] = self.next_obs  # x_T, the real final observation if the last step ended an episode


def finished_episodes(rollout: dict, ep_return: torch.Tensor, ep_length: torch.Tensor) -> list[tuple[float, int]]:
    """(return, length) of the episodes that ended in the rollout; ep_return and ep_length [N] carry the
    episodes in progress and are updated in place. Autoreset rows (not valid) add nothing."""
    ended, ep_return, ep_length = [], ep_return.numpy(), ep_length.numpy()  # numpy views, cheaper per op
    rewards, valid, dones = (rollout[k].numpy() for k in ("rewards", "valid", "dones"))
    for t in range(len(rewards)):
        ep_return += rewards[t] * valid[t]
        ep_length += valid[t]
        for i in np.flatnonzero(dones[t]):
            ended.append((float(ep_return[i]), int(ep_length[i])))
            ep_return[i], ep_length[i] = 0.0, 0
    return ended


class LocalSource:
    """Synchronous mode (detail 1): the learner collects with its own policy, so every rollout has lag 0."""

    def __init__(self, args: Args, agent: Agent, obs_dim: int, device: torch.device, seed: int):
        self.collector, self.agent, self.device = Collector(args.env_id, args.num_envs, seed), agent, device
        self.rollout = new_rollout(args.num_steps, args.num_envs, obs_dim)
        self.ep_return, self.ep_length = torch.zeros(args.num_envs, dtype=torch.float64), torch.zeros(args.num_envs, dtype=torch.long)

    def __enter__(self) -> "LocalSource":
        return self

    def __exit__(self, *exc) -> None:
        self.collector.envs.close()

    def next(self, version: int) -> tuple[dict, int, list]:
        self.collector.collect(self.agent.actor, self.rollout, self.device)
        return self.rollout, version, finished_episodes(self.rollout, self.ep_return, self.ep_length)

    def publish(self, agent: Agent, version: int) -> None:
        pass  # collect() acts with the learner's own agent

    def state(self) -> dict:
        c = self.collector
        return {"env": env_state(c.envs), "next_obs": torch.from_numpy(c.next_obs), "autoreset": torch.from_numpy(c.autoreset),
                "ep_return": self.ep_return, "ep_length": self.ep_length}

    def load_state(self, state: dict) -> None:
        """Continue the checkpoint's episodes where the env state can be restored (native vector envs)."""
        if state.get("env") and env_state(self.collector.envs):
            set_env_state(self.collector.envs, state["env"])
            self.collector.next_obs, self.collector.autoreset = state["next_obs"].numpy(), state["autoreset"].numpy()
            self.ep_return, self.ep_length = state["ep_return"], state["ep_length"]


# ---------------------------------------------------------------- actor processes
def publish_weights(weights: torch.Tensor, seq: torch.Tensor, agent: Agent, version: int) -> None:
    """Learner side of the seqlock (detail 2): seq[0] is odd while the weights change; seq[1] is their version."""
    seq[0] += 1
    weights.copy_(parameters_to_vector(agent.parameters()).detach())
    seq[1] = version
    seq[0] += 1


def read_weights(weights: torch.Tensor, seq: torch.Tensor, agent: Agent) -> int | None:
    """Actor side: copy the published weights into `agent` and return their version, or None when the
    learner wrote meanwhile (the caller reads again)."""
    before = int(seq[0])
    flat, version = weights.clone(), int(seq[1])
    if before % 2 or int(seq[0]) != before:
        return None
    vector_to_parameters(flat, agent.parameters())
    return version


def actor_main(actor_id: int, args: Args, start_step: int, shared: dict, rollout: dict, messages, copied) -> None:
    """One actor process (details 2-4): wait until the learner has copied its buffer, read the newest
    weights, collect a rollout into the buffer, send (actor, version, None); an error goes as its text."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # the learner decides: it checkpoints, then stops the actors
    torch.set_num_threads(1)
    learner, free = os.getppid(), False
    try:
        seed = args.seed + 1000 * (actor_id + 1) + start_step  # distinct envs and actions per actor and resume
        torch.manual_seed(seed)
        collector = Collector(args.env_id, args.num_envs, seed)
        agent = Agent(rollout["obs"].shape[-1], int(collector.envs.single_action_space.n), args.hidden_dim)
        shared["ready"][actor_id] = True
        while not shared["stop"][0] and os.getppid() == learner:  # a new parent: the learner is gone
            if not free:
                try:
                    free = copied.get(timeout=0.5)
                except queue.Empty:
                    continue
            version = read_weights(shared["weights"], shared["seq"], agent)
            if version is None:
                continue
            collector.collect(agent.actor, rollout, torch.device("cpu"))
            messages.put((actor_id, version, None))
            free = False
    except Exception as e:
        messages.put((actor_id, -1, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]))
        shared["ready"][actor_id] = True
        while not shared["stop"][0] and os.getppid() == learner:  # stay alive until the learner has read it
            time.sleep(0.1)
    messages.close()
    messages.join_thread()  # the last message is in the pipe
    os._exit(0)  # skips the interpreter's teardown of torch (seconds on a busy machine): nothing is left to save


class Actors:
    """--num-actors processes (details 2-4). A context manager: entering starts them and waits until each has
    its env (start-up stays out of the training loop's SPS); leaving stops them on every way out."""

    def __init__(self, args: Args, agent: Agent, obs_dim: int, version: int, start_step: int, stop: StopSignal):
        ctx, self.stop = mp.get_context("spawn"), stop
        self.shared = {"weights": parameters_to_vector(agent.parameters()).detach().cpu().share_memory_(),
                       "seq": torch.tensor([0, version]).share_memory_(), "stop": torch.zeros(1, dtype=torch.bool).share_memory_(),
                       "ready": torch.zeros(args.num_actors, dtype=torch.bool).share_memory_()}
        self.buffers = [{k: v.share_memory_() for k, v in new_rollout(args.num_steps, args.num_envs, obs_dim).items()}
                        for _ in range(args.num_actors)]
        self.messages, self.copied = ctx.Queue(), [ctx.Queue() for _ in range(args.num_actors)]
        self.procs = [ctx.Process(target=actor_main, name=f"appo-actor-{i}", daemon=True,
                                  args=(i, args, start_step, self.shared, self.buffers[i], self.messages, self.copied[i]))
                      for i in range(args.num_actors)]
        self.ep_return = torch.zeros(args.num_actors, args.num_envs, dtype=torch.float64)
        self.ep_length = torch.zeros(args.num_actors, args.num_envs, dtype=torch.long)

    def __enter__(self) -> "Actors":
        try:
            for proc, copied in zip(self.procs, self.copied):
                proc.start()
                copied.put(True)
            while not self.shared["ready"].all() and not self.stop:
                self.check_alive()
                time.sleep(0.05)
        except BaseException:  # `with` calls __exit__ only after __enter__ returned
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
                code = proc.exitcode
                reason = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                raise fail(f"actor {i} (pid {proc.pid}) died ({reason}); the last checkpoint is kept")

    def next(self, version: int) -> tuple[dict, int, list] | None:
        """The next rollout (a copy of an actor's buffer), its policy version and finished episodes; None once
        the stop signal came."""
        while not self.stop:
            self.check_alive()
            try:
                actor, rollout_version, error = self.messages.get(timeout=0.5)
            except queue.Empty:
                continue
            if error:
                raise fail(f"actor {actor} failed: {error}")
            rollout = {k: v.clone() for k, v in self.buffers[actor].items()}
            self.copied[actor].put(True)  # the actor may now collect its next rollout
            return rollout, rollout_version, finished_episodes(rollout, self.ep_return[actor], self.ep_length[actor])
        return None

    def publish(self, agent: Agent, version: int) -> None:
        publish_weights(self.shared["weights"], self.shared["seq"], agent, version)

    def state(self) -> dict:
        return {}  # actors restart their envs on resume (detail 9)


# ---------------------------------------------------------------- training
def checkpoint_state(agent: Agent, optimizer, version: int, dropped: int, source) -> dict:
    return {"agent": agent.state_dict(), "optimizer": optimizer.state_dict(), "version": version, "dropped": dropped,
            "source": source.state(), "rng": rng_state(torch=torch.default_generator)}


def train(args: Args) -> None:
    batch_size = args.num_envs * args.num_steps
    check_args(args, [
        (min(args.num_envs, args.num_steps, args.update_epochs, args.hidden_dim) >= 1,
         "--num-envs, --num-steps, --update-epochs and --hidden-dim must be at least 1"),
        (1 <= args.num_minibatches <= batch_size, f"--num-minibatches must be between 1 and num-envs x num-steps = {batch_size}"),
        (args.num_actors >= 0, "--num-actors must be >= 0 (0: synchronous mode)"),
        (args.max_policy_lag >= 0, "--max-policy-lag must be >= 0"),
        (0 < args.c_bar <= args.rho_bar, "--rho-bar and --c-bar must satisfy 0 < c-bar <= rho-bar (paper, Section 4.1)"),
        (0 <= args.gamma <= 1 and 0 <= args.lam <= 1, "--gamma and --lam must be in [0, 1]"),
        (args.learning_rate > 0 and args.clip_coef > 0, "--learning-rate and --clip-coef must be positive"),
        (min(args.ent_coef, args.vf_coef) >= 0, "--ent-coef and --vf-coef must be >= 0"),
        (args.target_kl is None or args.target_kl > 0, "--target-kl must be positive (or left out)"),
        (args.eval_only or args.resume or args.total_steps >= batch_size,
         f"--total-steps {args.total_steps} is below one rollout (num-envs x num-steps = {batch_size}); raise it"),
    ])
    if args.eval_only:
        return eval_only(args)
    device = pick_device(args.device)
    seed_everything(args.seed, args.torch_deterministic)
    obs_dim, n_actions = check_env(args.env_id)
    ckpt = resume_checkpoint(args, same=("hidden_dim", "num_envs")) if args.resume else None
    agent = Agent(obs_dim, n_actions, args.hidden_dim).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # one kernel, not a loop of ops
    global_step, version, dropped, lags = 0, 0, 0, []
    if ckpt:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        global_step, version, dropped = ckpt["global_step"], ckpt["version"], ckpt["dropped"]
        set_rng_state(ckpt["rng"], torch=torch.default_generator)
    stop = StopSignal()
    if args.num_actors:  # each actor acts on a core of its own with one thread: the learner's threads leave them room
        torch.set_num_threads(max(1, torch.get_num_threads() - args.num_actors))
        source = Actors(args, agent, obs_dim, version, global_step, stop)
    else:
        source = LocalSource(args, agent, obs_dim, device, args.seed + global_step)
        if ckpt:
            source.load_state(ckpt["source"])
    with source, RunLogger(args, run_dir_for(args, args.resume), global_step, resumed=ckpt is not None) as log:
        while global_step + batch_size <= args.total_steps and not stop:
            got = source.next(version)
            if got is None:  # a signal while waiting for the actors
                break
            rollout, rollout_version, episodes = got
            prev_step, global_step = global_step, global_step + batch_size
            for episodic_return, length in episodes:
                log.episode(global_step, episodic_return, length)
            lags.append(version - rollout_version)
            if lags[-1] <= args.max_policy_lag:
                lr = args.learning_rate * (1.0 - prev_step / args.total_steps if args.anneal_lr else 1.0)
                optimizer.param_groups[0]["lr"] = lr
                batch, ratio = prepare_batch(agent, {k: v.to(device) for k, v in rollout.items()}, args)
                stats = update(agent, optimizer, batch, args)
                log.check_finite(stats, global_step)  # before publishing: actors never get non-finite weights
                version += 1
                source.publish(agent, version)
                log.scalars(global_step, {**dict(zip(LOSS_TAGS, stats.tolist())), "charts/learning_rate": lr, "charts/importance_ratio": ratio})
            else:
                dropped += 1
            log.scalars(global_step, {"charts/policy_lag": lags[-1], "charts/dropped_rollouts": dropped, "charts/SPS": log.sps(global_step)})
            if stop or global_step + batch_size > args.total_steps:  # a signal saves at once; the end evaluates below
                continue
            if every(global_step, prev_step, args.eval_interval):
                log.scalars(global_step, {"eval/episodic_return": np.mean(evaluate(agent, args.env_id, args.eval_episodes, args.seed, device))})
            if every(global_step, prev_step, args.checkpoint_interval):
                save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizer, version, dropped, source))
            log.progress(global_step, args.total_steps)
        save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizer, version, dropped, source))
        if stop:
            return log.interrupted(global_step)
        returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed, device, log.run_dir / "videos" if args.capture_video else None)
        log.scalars(global_step, {"eval/episodic_return": np.mean(returns)})
        log.summary(global_step, returns, num_actors=args.num_actors, updates=version, dropped_rollouts=dropped,
                    policy_lag_mean=float(np.mean(lags)) if lags else 0.0)


# ---------------------------------------------------------------- evaluation
def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, device, video_dir: Path | None = None) -> list[float]:
    """Greedy (argmax) returns (detail 9)."""
    env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True, disable_logger=True)
    returns = []
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
    """Evaluate --checkpoint with its own env, network and seed: it repeats the run's final evaluation."""
    ckpt, device = load_checkpoint(args.checkpoint), pick_device(args.device)
    agent = Agent(*check_env(ckpt["env_id"]), ckpt["args"]["hidden_dim"]).to(device)
    agent.load_state_dict(ckpt["agent"])
    run_dir = run_dir_for(args, args.checkpoint)
    video_dir = run_dir / "videos" if args.capture_video else None
    write_eval_only(run_dir, args, ckpt, evaluate(agent, ckpt["env_id"], args.eval_episodes, ckpt["args"]["seed"], device, video_dir))


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
