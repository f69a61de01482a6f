"""Phasic Policy Gradient (PPG) for discrete actions and flat observations.

Paper: Karl Cobbe, Jacob Hilton, Oleg Klimov, John Schulman, "Phasic Policy
Gradient", ICML 2021, arXiv:2009.04416. Reference code: openai/phasic-policy-gradient;
peer: CleanRL ppg_procgen.py.

Idea. PPO trains policy and value function together, either in one network (the
value gradient disturbs the policy's features) or in two (the policy never
benefits from value learning). PPG alternates two phases. In the *policy phase*
it runs N_pi ordinary PPO iterations, keeping policy and value training apart.
In the *auxiliary phase* it goes E_aux times over every sample stored during
those N_pi iterations, distilling value knowledge into the policy network through
an auxiliary value head while a behavioural-cloning KL term keeps the policy
where it was. The policy's features thus learn from value targets, and the
value function gets many more epochs of sample reuse than the policy.

Equations (one state s, advantage A_hat from GAE, r = pi(a|s) / pi_old(a|s)):
    policy phase, E_pi epochs:  L_clip = -E[min(r A_hat, clip(r, 1-eps, 1+eps) A_hat)] - c_ent H[pi]
    policy phase, E_V epochs:   L_value = c_vf * 0.5 E[(V(s) - V_targ)^2]
    auxiliary phase, E_aux epochs over all stored samples:
        L_joint = 0.5 E[(V_aux(s) - V_targ)^2] + beta_clone E[KL(pi_old(.|s) || pi(.|s))]
        L_value = 0.5 E[(V(s) - V_targ)^2]        (trained in the same step)
    V_targ = A_hat + V_old, the GAE(lambda) return computed when the rollout was
    collected; pi_old is the policy just before the auxiliary phase, computed once.

Implementation details:
 1. Architectures (--arch), named as in the reference. `dual` (the reference
    default, the paper's PPG): a policy network (trunk + policy head + auxiliary
    value head) and a separate value network. `detach`: one trunk carrying the
    policy, value and auxiliary value heads; the value head reads the trunk's
    features detached, so value training never reaches the trunk, which learns
    value only through the auxiliary head in the auxiliary phase. `shared`: the
    same single trunk without the stop-gradient, so the value loss trains the
    trunk too (with --e-aux 0, the usual shared-network PPO).
 2. Policy phase: max(E_pi, E_V) epochs of minibatches with one optimizer;
    epoch i adds the policy loss if i < E_pi and the value loss if i < E_V.
    With E_pi = E_V (the reference's and our defaults) this is the reference's
    `ppo.learn`; when they differ the reference runs the E_V value epochs first
    with a third optimizer. Advantages are normalised over the whole batch.
 3. Auxiliary phase after every N_pi policy iterations, with pi_old's logits
    computed once for all stored states before the first epoch; minibatches are
    drawn from all stored samples (--aux-num-minibatches).
 4. Separate Adam optimizers for the policy and auxiliary phases, as in the
    reference (eps: deviation g); both, the phase counter and the samples stored
    for the next auxiliary phase are checkpointed, so a resume mid-phase continues it.
 5. Gymnasium semantics: vector envs autoreset in the NEXT_STEP mode; the step
    after a done is masked out of every loss and statistic (`valid`). GAE uses
    V(s_{t+1}) on truncation (under NEXT_STEP, s_{t+1} is the real final
    observation) and 0 on termination.
 6. Orthogonal init (sqrt 2 body, 0.01 policy head, 1 value heads), tanh MLPs,
    optional linear LR annealing of both optimizers to 0 at --anneal-steps (by
    default the first run's --total-steps; a resume keeps that horizon, and a
    --total-steps beyond it is refused rather than training at a rate of 0).
    --norm-reward divides rewards by the running std of the discounted return
    and clips them to +-10, as the reference's RewardNormalizer.
 7. Evaluation: greedy (argmax) policy on a separate env, episode i seeded with
    seed + 10000 + i.
 8. Checkpoints (plain dict, `torch.load(weights_only=True)` on the CPU; tensors
    move to --device as they are restored): network, both optimizers, counters,
    stored samples, reward statistics, and torch's generator, the only one drawn
    from (initialisation, action sampling, minibatch order; CUDA's too when used).
    Resume restores the vector env's numpy state (classic control's
    vector_entry_point envs keep it in arrays), so a resumed run continues the
    same episodes and gives the same metrics as an uninterrupted one; envs that
    fall back to SyncVectorEnv (e.g. Box2D) are reset at resume instead.
    SIGINT/SIGTERM skip any evaluation still due, save a checkpoint and exit 0
    without summary.json (summary.json means "finished"); a second signal kills.

Deviations from the Procgen reference (N_pi 32, E_pi 1, E_V 1, E_aux 6,
beta_clone 1, lr 5e-4, gamma 0.999, lambda 0.95, 64 envs x 256 steps), chosen so
that CartPole-v1 is solved in about 50k steps, all tested on CartPole:
 a. small batches (8 envs x 32 steps) and N_pi 8, so an auxiliary phase comes
    every 2,048 steps instead of every 524k;
 b. E_pi = E_V = 10 and lr 1e-3 annealed: one epoch per batch learns too
    slowly for a 50k-step budget (the RL Zoo PPO preset uses 20 epochs);
 c. gamma 0.98, lambda 0.8, no entropy bonus (RL Zoo's tuned CartPole values);
 d. --no-norm-reward by default: CartPole's reward is a constant 1 and the
    rescaling made one of two test seeds unstable late; use --norm-reward for
    LunarLander-like rewards (without it LunarLander did not learn in 300k);
 e. gradient-norm clipping (0.5, CleanRL; the reference has none), applied to
    the policy side and the value side separately: one joint norm let the
    large value gradient shrink the policy's steps to nothing on LunarLander;
 f. unclipped value loss and MLPs instead of IMPALA CNNs (flat observations);
 g. Adam eps 1e-5 (CleanRL's and baselines' PPO) where the reference keeps
    PyTorch's default 1e-8: the presets were tuned and the zoo's results measured
    with 1e-5; --adam-eps 1e-8 gives the reference's optimizer.
With --e-aux 0 the auxiliary phase is off and the file is plain PPO (separate
policy and value networks with --arch dual): the honest ablation.

Usage: python algos/ppg.py --env-id CartPole-v1 --total-steps 50000 --seed 1
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle OpenMP threads sleep instead of spinning

import importlib.util
import json
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
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """Gymnasium id of an environment with discrete actions and flat observations"""
    seed: int = 1
    """seed of torch and the environments"""
    total_steps: int = 50_000
    """environment steps in total (summed over envs)"""
    num_envs: int = 8
    """parallel environments"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms, for identical runs on CPU"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    exp_name: str = "ppg"
    """experiment name, part of the default run directory"""
    run_dir: str | None = None
    """output directory (default runs/<env>__<exp>__<seed>__<unixtime>)"""
    checkpoint_interval: int = 25_000
    """env steps between checkpoints (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from (its run directory is reused)"""
    eval_episodes: int = 10
    """greedy evaluation episodes (periodic and final)"""
    eval_interval: int = 10_000
    """env steps between evaluations (0: only at the end)"""
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
    # PPO (policy phase)
    num_steps: int = 32
    """steps per env per rollout"""
    learning_rate: float = 1e-3
    """Adam learning rate of the policy phase"""
    adam_eps: float = 1e-5
    """Adam epsilon of both optimizers (the reference: 1e-8; deviation g)"""
    anneal_lr: bool = True
    """anneal both learning rates linearly to 0 at --anneal-steps"""
    anneal_steps: int = 0
    """env steps at which the annealed rates reach 0 (0: the first run's --total-steps, kept on resume)"""
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
    """gradient-norm clip, applied to the policy and value sides separately"""
    norm_reward: bool = False
    """divide rewards by a running std of the discounted return (reference rnorm)"""
    hidden_dim: int = 64
    """width of the two hidden layers"""
    # PPG
    arch: Literal["dual", "detach", "shared"] = "dual"
    """dual: separate value network; detach: one trunk, value head on its detached features; shared: one trunk"""
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
def check_env(env_id: str) -> tuple[int, int]:
    """Observation size and action count, or a one-line refusal."""
    try:
        env = gym.make(env_id)
    except gym.error.Error as e:
        hint = "Atari ids belong to ppo_atari.py" if env_id.startswith("ALE/") else "check the id (e.g. CartPole-v1)"
        raise fail(f"unknown environment {env_id!r} ({e}); {hint}") from None
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) >= 2:
        raise fail(f"{env_id} has image observations {obs_space.shape}; use ppo_atari.py")
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        raise fail(f"{env_id} has observation space {obs_space}; ppg.py needs a flat Box")
    if isinstance(act_space, gym.spaces.Box):
        raise fail(f"{env_id} has continuous actions; use d4pg.py, naf.py or rlpd.py")
    if not isinstance(act_space, gym.spaces.Discrete):
        raise fail(f"{env_id} has action space {act_space}; ppg.py needs Discrete actions")
    return int(obs_space.shape[0]), int(act_space.n)


def make_envs(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """Gymnasium's native vector env where one exists (classic control), else sync; NEXT_STEP autoreset (detail 5)."""
    try:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    except gym.error.Error:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def env_state(envs: gym.vector.VectorEnv) -> dict:
    """The numpy state (arrays, generators) of a native vector env; {} for a sync one (detail 8)."""
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
    for name, value in state.items():
        if isinstance(value, str):
            rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = json.loads(value[4:])
            value = rng
        else:
            value = value.numpy().copy()
        setattr(envs.unwrapped, name, value)


# ------------------------------------------------------------------- networks
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(obs_dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(layer_init(nn.Linear(obs_dim, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, hidden)), nn.Tanh())


class Agent(nn.Module):
    """Policy trunk with policy and auxiliary value heads; the value head sits on its own trunk
    (`dual`), on the policy trunk's detached features (`detach`) or on the policy trunk (`shared`)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int, arch: str):
        super().__init__()
        self.arch = arch
        self.pi_body = mlp(obs_dim, hidden)
        self.pi_head = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.aux_head = layer_init(nn.Linear(hidden, 1), std=1.0)
        self.v_body = mlp(obs_dim, hidden) if arch == "dual" else None
        self.v_head = layer_init(nn.Linear(hidden, 1), std=1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Policy logits, V(s) and V_aux(s)."""
        h = self.pi_body(x)
        # `detach`: the value loss must not shape the policy's features (paper Sec. 3); `shared` lets it.
        h_v = self.v_body(x) if self.v_body is not None else h.detach() if self.arch == "detach" else h
        return self.pi_head(h), self.v_head(h_v).squeeze(-1), self.aux_head(h).squeeze(-1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.pi_head(self.pi_body(x))


def clip_grads(agent: Agent, max_norm: float) -> None:
    """Clip the policy side (trunk, policy and aux heads) and the value side apart: one
    joint norm would let the large value gradient shrink the policy's step."""
    value_side = [p for n, p in agent.named_parameters() if n.startswith("v_")]
    policy_side = [p for n, p in agent.named_parameters() if not n.startswith("v_")]
    nn.utils.clip_grad_norm_(policy_side, max_norm)
    nn.utils.clip_grad_norm_(value_side, max_norm)


# ------------------------------------------------------------- algorithm math
def rollout(envs, agent: Agent, buf: dict, carry: dict) -> list[tuple[int, float, int]]:
    """num_steps vector steps into the preallocated `buf`. `carry` holds what crosses rollouts
    (next observation, envs whose next step is an autoreset, running episode return and length)
    and is updated in place. The autoreset step gets valid = 0 (detail 5).
    Returns (step index, return, length) of each episode that ended."""
    device, episodes = buf["rewards"].device, []
    for t in range(buf["rewards"].shape[0]):
        buf["obs"][t] = carry["obs"]
        buf["valid"][t] = torch.as_tensor(~carry["autoreset"], dtype=torch.float32, device=device)
        with torch.inference_mode():
            logits, value, _ = agent(carry["obs"])
            dist = Categorical(logits=logits)
            action = dist.sample()
            buf["logprobs"][t], buf["values"][t], buf["actions"][t] = dist.log_prob(action), value, action
        next_obs, reward, terminated, truncated, _ = envs.step(action.cpu().numpy())
        done, real = terminated | truncated, ~carry["autoreset"]
        for name, x in (("rewards", reward), ("terminated", terminated), ("dones", done)):
            buf[name][t] = torch.as_tensor(x, dtype=torch.float32, device=device)
        carry["obs"] = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
        carry["ep_return"] += np.where(real, reward, 0.0)
        carry["ep_length"] += real
        episodes += [(t, float(carry["ep_return"][i]), int(carry["ep_length"][i])) for i in np.flatnonzero(done & real)]
        carry["ep_return"][done], carry["ep_length"][done] = 0.0, 0
        carry["autoreset"] = done
    return episodes


def gae(rewards, values, next_value, terminated, dones, gamma: float, lam: float) -> torch.Tensor:
    """GAE(lambda) advantages, [T, N]. values[t] = V(s_t); next_value = V(s_T).
    Termination cuts the bootstrap; truncation keeps V(s_{t+1}) (the real final
    observation under NEXT_STEP autoreset); any done cuts the lambda-trace."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        v_next = next_value if t == T - 1 else values[t + 1]
        delta = rewards[t] + gamma * v_next * (1.0 - terminated[t]) - values[t]
        last = delta + gamma * lam * (1.0 - dones[t]) * last
        advantages[t] = last
    return advantages


def discounted_returns(rewards, dones, ret, gamma: float):
    """Running discounted reward sums per env, [T, N]; `ret` carries over rollouts."""
    out = torch.zeros_like(rewards)
    for t in range(rewards.shape[0]):
        ret = rewards[t] + gamma * ret
        out[t] = ret
        ret = ret * (1.0 - dones[t])
    return out, ret


def update_moments(moments: list, x: torch.Tensor) -> list:
    """[count, mean, var] of all x seen so far (parallel variance formula)."""
    count, mean, var = moments
    n, m, v = x.numel(), x.mean().item(), x.var(unbiased=False).item()
    total = count + n
    delta = m - mean
    return [total, mean + delta * n / total, (var * count + v * n + delta**2 * count * n / total) / total]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def make_batch(buf: dict, next_value, reward_norm: dict, args: Args) -> tuple[dict, dict]:
    """The flat training batch: GAE advantages normalised over the valid samples, and V_targ.
    With --norm-reward the rewards are first scaled as the reference's RewardNormalizer (detail 6).
    Returns the batch and the updated reward statistics. Call it under torch.no_grad()."""
    r = buf["rewards"]
    if args.norm_reward:
        ret, carry_ret = discounted_returns(r, buf["dones"], reward_norm["ret"], args.gamma)
        reward_norm = {"moments": update_moments(reward_norm["moments"], ret[buf["valid"].bool()]), "ret": carry_ret}
        r = (r / np.sqrt(reward_norm["moments"][2] + 1e-8)).clamp(-10.0, 10.0)
    advantages = gae(r, buf["values"], next_value, buf["terminated"], buf["dones"], args.gamma, args.gae_lambda)
    w, adv = buf["valid"].flatten(), advantages.flatten()
    mean = masked_mean(adv, w)
    std = masked_mean((adv - mean) ** 2, w).sqrt()
    return {"obs": buf["obs"].flatten(0, 1), "actions": buf["actions"].flatten(), "logprobs": buf["logprobs"].flatten(),
            "advantages": (adv - mean) / (std + 1e-8), "returns": (advantages + buf["values"]).flatten(), "valid": w}, reward_norm


@torch.no_grad()
def explained_variance(y: torch.Tensor, pred: torch.Tensor, w: torch.Tensor) -> float:
    var_y = masked_mean((y - masked_mean(y, w)) ** 2, w)
    resid = y - pred
    return float(1 - masked_mean((resid - masked_mean(resid, w)) ** 2, w) / var_y) if var_y > 0 else float("nan")


def categorical_kl(logits_old: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(pi_old || pi) per state."""
    logp_old, logp = F.log_softmax(logits_old, -1), F.log_softmax(logits, -1)
    return (logp_old.exp() * (logp_old - logp)).sum(-1)


def ppo_losses(logits, value, actions, logprob_old, adv, v_targ, valid, clip_coef: float):
    """L_clip, the value loss 0.5 (V - V_targ)^2, entropy, approx KL, clip fraction."""
    dist = Categorical(logits=logits)
    log_ratio = dist.log_prob(actions) - logprob_old
    ratio = log_ratio.exp()
    pg = -torch.min(ratio * adv, ratio.clamp(1 - clip_coef, 1 + clip_coef) * adv)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - log_ratio, valid)
        clipfrac = masked_mean(((ratio - 1).abs() > clip_coef).float(), valid)
    return (masked_mean(pg, valid), 0.5 * masked_mean((value - v_targ) ** 2, valid),
            masked_mean(dist.entropy(), valid), approx_kl, clipfrac)


def aux_losses(logits, value, aux_value, logits_old, v_targ, valid):
    """KL(pi_old || pi), 0.5 (V_aux - V_targ)^2 and 0.5 (V - V_targ)^2 (paper Eq. 2-3)."""
    return (masked_mean(categorical_kl(logits_old, logits), valid),
            0.5 * masked_mean((aux_value - v_targ) ** 2, valid),
            0.5 * masked_mean((value - v_targ) ** 2, valid))


def policy_phase(agent: Agent, optimizer, batch: dict, args: Args) -> dict:
    """One PPO iteration: max(E_pi, E_V) epochs; epoch i trains the policy if
    i < E_pi and the value function if i < E_V (reference ppo.learn)."""
    n = batch["obs"].shape[0]
    mb_size = n // args.num_minibatches
    for epoch in range(max(args.e_pi, args.e_v)):
        for mb in torch.randperm(n, device=batch["obs"].device).split(mb_size):
            logits, value, _ = agent(batch["obs"][mb])
            pg, v_loss, entropy, approx_kl, clipfrac = ppo_losses(
                logits, value, batch["actions"][mb], batch["logprobs"][mb], batch["advantages"][mb],
                batch["returns"][mb], batch["valid"][mb], args.clip_coef)
            loss = 0.0
            if epoch < args.e_pi:
                loss = loss + pg - args.ent_coef * entropy
            if epoch < args.e_v:
                loss = loss + args.vf_coef * v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            clip_grads(agent, args.max_grad_norm)
            optimizer.step()
        # Stats of the last minibatch; with E_V > E_pi its policy terms come from a value-only epoch.
        stats = torch.stack([pg, v_loss, entropy, approx_kl, clipfrac]).detach()
    return dict(zip(["policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac"], stats.tolist()))


def auxiliary_phase(agent: Agent, optimizer, obs, v_targ, valid, args: Args) -> dict:
    """E_aux epochs over all stored samples of the phase (paper Alg. 1, lines 10-15)."""
    n = obs.shape[0]
    with torch.no_grad():  # pi_old, computed once before the phase
        logits_old = torch.cat([agent.logits(o) for o in obs.split(4096)])
    mb_size = n // args.aux_num_minibatches
    stats = torch.zeros(3, device=obs.device)
    for _ in range(args.e_aux):
        for mb in torch.randperm(n, device=obs.device).split(mb_size):
            logits, value, aux_value = agent(obs[mb])
            kl, aux_v, v = aux_losses(logits, value, aux_value, logits_old[mb], v_targ[mb], valid[mb])
            optimizer.zero_grad(set_to_none=True)
            (args.beta_clone * kl + aux_v + v).backward()
            clip_grads(agent, args.max_grad_norm)
            optimizer.step()
            stats += torch.stack([kl, aux_v, v]).detach()
    stats /= max(1, args.e_aux * args.aux_num_minibatches)
    return dict(zip(["kl", "aux_value", "value"], stats.tolist()))


# ------------------------------------------------------------- checkpoints
def checkpoint_state(agent, optimizer, aux_optimizer, envs, carry: dict, aux: dict, reward_norm: dict, counters: dict) -> dict:
    """Everything a resume needs, as plain CPU tensors and numbers (detail 8)."""
    k = counters["phase_iteration"]
    return {**counters, "agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
            "aux_optimizer": aux_optimizer.state_dict(), **{f"aux_{name}": x[:k].cpu() for name, x in aux.items()},
            "env_state": env_state(envs), "next_obs": carry["obs"].cpu(),
            **{name: torch.from_numpy(carry[name].copy()) for name in ("autoreset", "ep_return", "ep_length")},
            "reward_moments": reward_norm["moments"], "reward_ret": reward_norm["ret"].cpu(),
            "rng": rng_state(torch=torch.default_generator)}


def restore(ckpt: dict, agent, optimizer, aux_optimizer, envs, carry: dict, aux: dict, device) -> tuple[dict, dict]:
    """Load a checkpoint (on the CPU) into the run's objects, moving tensors to `device`;
    returns the reward statistics and the counters."""
    agent.load_state_dict(ckpt["agent"])
    optimizer.load_state_dict(ckpt["optimizer"])  # Adam's moments follow the parameters' device
    aux_optimizer.load_state_dict(ckpt["aux_optimizer"])
    for name, x in aux.items():
        x[: ckpt["phase_iteration"]] = ckpt[f"aux_{name}"].to(device)
    if ckpt["env_state"] and env_state(envs):  # the same episodes continue (detail 8)
        set_env_state(envs, ckpt["env_state"])
        carry.update({name: ckpt[name].numpy().copy() for name in ("autoreset", "ep_return", "ep_length")})
        carry["obs"] = ckpt["next_obs"].to(device)
    else:
        obs, _ = envs.reset(seed=ckpt["args"]["seed"] + ckpt["iteration"])
        carry["obs"] = torch.as_tensor(obs, dtype=torch.float32, device=device)
    set_rng_state(ckpt["rng"], torch=torch.default_generator)
    counters = {name: ckpt[name] for name in ("iteration", "phase_iteration", "aux_phases", "train_time_s", "aux_time_s")}
    return {"moments": ckpt["reward_moments"], "ret": ckpt["reward_ret"].to(device)}, counters


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    batch_size = args.num_envs * args.num_steps
    positive = ("num_envs", "num_steps", "num_minibatches", "aux_num_minibatches", "n_pi", "e_pi", "hidden_dim")
    check_args(args, [(getattr(args, n) >= 1, f"--{n.replace('_', '-')} must be at least 1, got {getattr(args, n)}") for n in positive] + [
        (min(args.e_v, args.e_aux, args.anneal_steps) >= 0, "--e-v, --e-aux and --anneal-steps must not be negative"),
        (args.e_v > 0 or args.e_aux > 0, "--e-v 0 with --e-aux 0 never trains the value function; raise one of them"),
        (min(args.learning_rate, args.aux_learning_rate, args.adam_eps) > 0,
         "--learning-rate, --aux-learning-rate and --adam-eps must be positive"),
        (batch_size % args.num_minibatches == 0,
         f"--num-minibatches {args.num_minibatches} does not divide num-envs x num-steps = {batch_size}; pick a divisor"),
        (not args.e_aux or args.n_pi * batch_size % args.aux_num_minibatches == 0, f"--aux-num-minibatches "
         f"{args.aux_num_minibatches} does not divide n-pi x num-envs x num-steps = {args.n_pi * batch_size}; pick a divisor"),
        (args.resume or args.eval_only or args.total_steps >= batch_size,
         f"--total-steps {args.total_steps} is below one rollout (num-envs x num-steps = {batch_size}); raise it"),
    ])
    if args.eval_only:
        return eval_only(args)
    device = pick_device(args.device)
    obs_dim, n_actions = check_env(args.env_id)
    ckpt = resume_checkpoint(args, same=("arch", "hidden_dim", "num_envs", "num_steps", "n_pi")) if args.resume else None
    if ckpt and bool(ckpt["args"]["e_aux"]) != bool(args.e_aux):  # the stored samples exist only with an aux phase
        raise fail(f"checkpoint {args.resume} was made with --e-aux {ckpt['args']['e_aux']}, not {args.e_aux} (the auxiliary phase "
                   f"cannot be switched on or off at resume); pass --e-aux {ckpt['args']['e_aux']}")
    anneal_steps = args.anneal_steps or (ckpt["anneal_steps"] if ckpt else args.total_steps)
    if args.anneal_lr and args.total_steps > anneal_steps:
        raise fail(f"--total-steps {args.total_steps} runs past the learning-rate schedule, which reaches 0 at step {anneal_steps}; "
                   f"pass --anneal-steps {args.total_steps} to stretch it, or --no-anneal-lr")
    seed_everything(args.seed, args.torch_deterministic)
    envs = make_envs(args.env_id, args.num_envs)
    agent = Agent(obs_dim, n_actions, args.hidden_dim, args.arch).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    aux_optimizer = torch.optim.Adam(agent.parameters(), lr=args.aux_learning_rate, eps=args.adam_eps)
    T, N = args.num_steps, args.num_envs
    buf = {name: torch.zeros((T, N), device=device) for name in ("logprobs", "rewards", "values", "terminated", "dones", "valid")}
    buf.update(obs=torch.zeros((T, N, obs_dim), device=device), actions=torch.zeros((T, N), dtype=torch.long, device=device))
    # Samples kept for the auxiliary phase: states, V_targ and the valid mask of N_pi rollouts.
    n_store = args.n_pi if args.e_aux else 0
    aux = {"obs": torch.zeros((n_store, batch_size, obs_dim), device=device),
           "vtarg": torch.zeros((n_store, batch_size), device=device), "valid": torch.zeros((n_store, batch_size), device=device)}
    carry = {"obs": torch.as_tensor(envs.reset(seed=args.seed)[0], dtype=torch.float32, device=device),
             "autoreset": np.zeros(N, dtype=bool), "ep_return": np.zeros(N), "ep_length": np.zeros(N, dtype=np.int64)}
    reward_norm = {"moments": [0, 0.0, 1.0], "ret": torch.zeros(N, device=device)}
    counters = {"iteration": 0, "phase_iteration": 0, "aux_phases": 0, "train_time_s": 0.0, "aux_time_s": 0.0,
                "anneal_steps": anneal_steps}
    if ckpt:
        reward_norm, restored = restore(ckpt, agent, optimizer, aux_optimizer, envs, carry, aux, device)
        counters.update(restored)
    global_step, num_iterations = counters["iteration"] * batch_size, args.total_steps // batch_size
    stop = StopSignal()
    with RunLogger(args, run_dir_for(args, args.resume), global_step, resumed=ckpt is not None) as log:
        while counters["iteration"] < num_iterations:
            counters["iteration"] += 1
            t_iter = time.time()
            frac = 1.0 - (counters["iteration"] - 1) / (anneal_steps // batch_size) if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
            aux_optimizer.param_groups[0]["lr"] = frac * args.aux_learning_rate

            for t, ep_return, ep_length in rollout(envs, agent, buf, carry):
                log.episode(global_step + (t + 1) * N, ep_return, ep_length)
            global_step += batch_size
            with torch.no_grad():
                batch, reward_norm = make_batch(buf, agent(carry["obs"])[1], reward_norm, args)
            stats, aux_stats = policy_phase(agent, optimizer, batch, args), {}
            if args.e_aux:
                k = counters["phase_iteration"]
                aux["obs"][k], aux["vtarg"][k], aux["valid"][k] = batch["obs"], batch["returns"], batch["valid"]
                counters["phase_iteration"] += 1
            if args.e_aux and counters["phase_iteration"] == args.n_pi:
                t_aux = time.time()
                aux_stats = auxiliary_phase(agent, aux_optimizer, aux["obs"].flatten(0, 1), aux["vtarg"].flatten(),
                                            aux["valid"].flatten(), args)
                counters["phase_iteration"], counters["aux_phases"] = 0, counters["aux_phases"] + 1
                counters["aux_time_s"] += time.time() - t_aux
            counters["train_time_s"] += time.time() - t_iter

            log.check_finite(torch.tensor([*stats.values(), *aux_stats.values()]), global_step)
            explained_var = explained_variance(batch["returns"], buf["values"].flatten(), batch["valid"])
            log.scalars(global_step, {"charts/learning_rate": optimizer.param_groups[0]["lr"],
                                      "charts/aux_learning_rate": aux_optimizer.param_groups[0]["lr"],
                                      **{f"losses/{k}": v for k, v in stats.items()}, "losses/explained_variance": explained_var,
                                      **{f"losses/aux/{k}": v for k, v in aux_stats.items()},
                                      "charts/aux_phase_time_fraction": counters["aux_time_s"] / max(counters["train_time_s"], 1e-9),
                                      "charts/SPS": log.sps(global_step)})
            leaving = bool(stop) or counters["iteration"] == num_iterations  # a signal skips the evaluations still due
            if not leaving and every(global_step, global_step - batch_size, args.eval_interval):
                returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed, device)
                log.scalars(global_step, {"eval/episodic_return": np.mean(returns)})
            if leaving or every(global_step, global_step - batch_size, args.checkpoint_interval):
                state = checkpoint_state(agent, optimizer, aux_optimizer, envs, carry, aux, reward_norm, counters)
                save_checkpoint(log.checkpoint, args, global_step, state)
            if leaving:
                break
            log.progress(global_step, args.total_steps)
        envs.close()
        if stop:
            return log.interrupted(global_step)
        returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed, device, log.run_dir / "videos" if args.capture_video else None)
        log.scalars(global_step, {"eval/episodic_return": np.mean(returns)})
        log.summary(global_step, returns, arch=args.arch, aux_phases=counters["aux_phases"],
                    aux_phase_time_fraction=counters["aux_time_s"] / max(counters["train_time_s"], 1e-9))


# ---------------------------------------------------------------- evaluation
def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, device, video_dir: Path | None = None) -> list[float]:
    """Greedy (argmax) returns of `episodes` episodes seeded seed + 10000 + i (detail 7)."""
    env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True, name_prefix="eval", disable_logger=True)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                logits = agent.logits(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0))
            obs, reward, terminated, truncated, _ = env.step(int(logits.argmax()))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def eval_only(args: Args) -> None:
    """Evaluate --checkpoint with its own env, network and seed: it repeats the run's final evaluation."""
    ckpt, device = load_checkpoint(args.checkpoint), pick_device(args.device)
    saved = ckpt["args"]
    agent = Agent(*check_env(ckpt["env_id"]), saved["hidden_dim"], saved["arch"]).to(device)
    agent.load_state_dict(ckpt["agent"])
    run_dir = run_dir_for(args, args.checkpoint)
    video_dir = run_dir / "videos" if args.capture_video else None
    write_eval_only(run_dir, args, ckpt, evaluate(agent, ckpt["env_id"], args.eval_episodes, saved["seed"], device, video_dir))


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
