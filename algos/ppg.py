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


@dataclass
class Args:
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


def mlp(obs_dim: int, hidden_dim: int) -> nn.Sequential:
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
        """Policy logits, V(s) and V_aux(s)."""
        h = self.pi_body(x)
        if self.arch == "dual":
            h_v = self.v_body(x)
        elif self.arch == "detach":  # the value loss must not shape the policy's features (Sec. 3)
            h_v = h.detach()
        else:
            h_v = h
        return self.pi_head(h), self.v_head(h_v).squeeze(-1), self.aux_head(h).squeeze(-1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.pi_head(self.pi_body(x))


def clip_grads(agent: Agent, max_norm: float) -> None:
    """Clip the policy side (trunk, policy and aux heads) and the value side apart: one joint norm
    would let the large value gradient shrink the policy's step (deviation e)."""
    value_side = [p for n, p in agent.named_parameters() if n.startswith("v_")]
    policy_side = [p for n, p in agent.named_parameters() if not n.startswith("v_")]
    nn.utils.clip_grad_norm_(policy_side, max_norm)
    nn.utils.clip_grad_norm_(value_side, max_norm)


# ------------------------------------------------------------- algorithm math
ENV_ARRAYS = ("rewards", "terminated", "dones", "valid")  # what the envs give, per step


def rollout_storage(num_steps: int, num_envs: int, obs_dim: int, run: Run) -> dict:
    """Preallocated [T, N] tensors of one rollout (`valid` = 0 marks an autoreset step) on the
    device, and `staging`: the env's arrays and next observations in CPU memory, pinned on CUDA, so
    that their copies to the device do not wait (detail 9)."""
    names = ("logprobs", "values", *ENV_ARRAYS)
    shape = (num_steps, num_envs)
    storage = {name: torch.zeros(shape, device=run.device) for name in names}
    storage["obs"] = torch.zeros((*shape, obs_dim), device=run.device)
    storage["actions"] = torch.zeros(shape, dtype=torch.long, device=run.device)
    staging = {name: run.host_buffer(shape) for name in ENV_ARRAYS}
    staging["next_obs"] = run.host_buffer((*shape, obs_dim))
    return storage | {"staging": staging}


def aux_storage(n_rollouts: int, batch_size: int, obs_dim: int, device) -> dict:
    """States, V_targ and valid masks of the rollouts kept for the auxiliary phase (detail 3)."""
    shape = (n_rollouts, batch_size)
    aux = {name: torch.zeros(shape, device=device) for name in ("vtarg", "valid")}
    aux["obs"] = torch.zeros((*shape, obs_dim), device=device)
    return aux


def reset_carry(envs, seed: int, device) -> dict:
    """What crosses rollouts: next_obs, the envs whose next step is an autoreset, and the running
    episodes' ep_return and ep_length."""
    next_obs = torch.as_tensor(envs.reset(seed=seed)[0], dtype=torch.float32, device=device)
    # contiguous, as the staged ones (CartPole's reset gives a transposed array): a compiled
    # acting forward then sees one layout
    next_obs = next_obs.contiguous()
    n = envs.num_envs
    carry = {"next_obs": next_obs, "autoreset": np.zeros(n, dtype=bool), "ep_return": np.zeros(n)}
    carry["ep_length"] = np.zeros(n, dtype=np.int64)
    return carry


def rollout(envs, agent, storage: dict, carry: dict, run: Run) -> list[tuple[int, float, int]]:
    """num_steps vector steps into `storage`, updating `carry` (see reset_carry) in place; the
    autoreset step gets valid = 0 (detail 5). Returns (t, return, length) of each episode ended.
    The actions' copy to the CPU is the only wait for the device (detail 9)."""
    episodes = []
    staging = storage["staging"]
    stage = {name: x.numpy() for name, x in staging.items()}
    for t in range(storage["rewards"].shape[0]):
        real = ~carry["autoreset"]
        storage["obs"][t] = carry["next_obs"]
        with torch.inference_mode():
            logits, value, _ = agent(carry["next_obs"])
            # Categorical's draw and log-probability without its argument checks, which wait for
            # the device
            log_pi = logits.log_softmax(-1)
            actions = torch.multinomial(log_pi.exp(), 1).squeeze(-1)
            storage["logprobs"][t] = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            storage["values"][t], storage["actions"][t] = value, actions
        next_obs, reward, terminated, truncated, _ = envs.step(actions.cpu().numpy())
        done = terminated | truncated
        # staging rows are written after that wait: the previous rollout's copies of them are done
        for name, x in zip(ENV_ARRAYS, (reward, terminated, done, real)):
            stage[name][t] = x
        stage["next_obs"][t] = next_obs
        carry["next_obs"] = run.upload(staging["next_obs"][t], copy=True)
        carry["ep_return"] += np.where(real, reward, 0.0)
        carry["ep_length"] += real
        for i in np.flatnonzero(done & real):
            episodes.append((t, float(carry["ep_return"][i]), int(carry["ep_length"][i])))
        carry["ep_return"][done], carry["ep_length"][done] = 0.0, 0
        carry["autoreset"] = done
    for name in ENV_ARRAYS:
        storage[name].copy_(staging[name], non_blocking=True)
    return episodes


def gae(rewards, values, next_value, terminated, dones, gamma: float, lam: float) -> torch.Tensor:
    """GAE(lambda) advantages, [T, N]. values[t] = V(s_t); next_value = V(s_T). Termination cuts
    the bootstrap; truncation keeps V(s_{t+1}) (the real final observation under NEXT_STEP
    autoreset); any done cuts the lambda-trace."""
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
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


@torch.no_grad()
def make_batch(storage: dict, agent, next_obs, reward_norm: dict, args: Args, gae=gae) -> dict:
    """The flat training batch: GAE advantages normalised over the valid samples, and V_targ,
    bootstrapped from V(next_obs). --norm-reward first scales the rewards as the reference's
    RewardNormalizer (detail 6), updating `reward_norm` (moments, running return) in place.
    `gae`: the GAE function (compiled with --compile)."""
    r, values, dones, valid = (storage[k] for k in ("rewards", "values", "dones", "valid"))
    if args.norm_reward:
        ret, reward_norm["ret"] = discounted_returns(r, dones, reward_norm["ret"], args.gamma)
        reward_norm["moments"] = update_moments(reward_norm["moments"], ret, valid)
        r = (r / (reward_norm["moments"][2] + 1e-8).sqrt().float()).clamp(-10.0, 10.0)
    advantages = gae(
        r, values, agent(next_obs)[1], storage["terminated"], dones, args.gamma, args.gae_lambda
    )
    w, adv = valid.flatten(), advantages.flatten()
    mean = masked_mean(adv, w)
    std = masked_mean((adv - mean) ** 2, w).sqrt()
    return {
        "obs": storage["obs"].flatten(0, 1),
        "actions": storage["actions"].flatten(),
        "logprobs": storage["logprobs"].flatten(),
        "advantages": (adv - mean) / (std + 1e-8),
        "returns": (advantages + values).flatten(),
        "valid": w,
    }


@torch.no_grad()
def explained_variance(y: torch.Tensor, pred: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """1 - Var(y - pred) / Var(y) over the samples where w = 1; NaN when y does not vary."""
    var_y = masked_mean((y - masked_mean(y, w)) ** 2, w)
    resid = y - pred
    explained = 1 - masked_mean((resid - masked_mean(resid, w)) ** 2, w) / var_y
    return torch.where(var_y > 0, explained, torch.nan)


def categorical_kl(logits_old: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(pi_old || pi) per state."""
    logp_old, logp = F.log_softmax(logits_old, -1), F.log_softmax(logits, -1)
    return (logp_old.exp() * (logp_old - logp)).sum(-1)


def ppo_losses(logits, value, actions, logprob_old, adv, v_targ, valid, clip_coef: float):
    """L_clip, the value loss 0.5 (V - V_targ)^2, entropy, approx KL, clip fraction."""
    log_pi = logits.log_softmax(-1)
    log_ratio = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1) - logprob_old
    ratio = log_ratio.exp()
    pg = -torch.min(ratio * adv, ratio.clamp(1 - clip_coef, 1 + clip_coef) * adv)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - log_ratio, valid)
        clipfrac = masked_mean(((ratio - 1).abs() > clip_coef).float(), valid)
    v_loss = 0.5 * masked_mean((value - v_targ) ** 2, valid)
    entropy = masked_mean(-(log_pi.exp() * log_pi).sum(-1), valid)
    return masked_mean(pg, valid), v_loss, entropy, approx_kl, clipfrac


def aux_losses(logits, value, aux_value, logits_old, v_targ, valid):
    """KL(pi_old || pi), 0.5 (V_aux - V_targ)^2 and 0.5 (V - V_targ)^2 (paper Eq. 2-3)."""
    kl = masked_mean(categorical_kl(logits_old, logits), valid)
    aux_v_loss = 0.5 * masked_mean((aux_value - v_targ) ** 2, valid)
    return kl, aux_v_loss, 0.5 * masked_mean((value - v_targ) ** 2, valid)


PPO_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")


def policy_step(agent: Agent, optimizer, args: Args, train_pi: bool, train_v: bool, **mb):
    """One minibatch of the policy phase: the policy loss if train_pi, the value loss if train_v,
    then an Adam step; the minibatch's [L_clip, value loss, entropy, approx KL, clip fraction]."""
    logits, value, _ = agent(mb["obs"])
    pg, v_loss, entropy, approx_kl, clipfrac = ppo_losses(
        logits,
        value,
        actions=mb["actions"],
        logprob_old=mb["logprobs"],
        adv=mb["advantages"],
        v_targ=mb["returns"],
        valid=mb["valid"],
        clip_coef=args.clip_coef,
    )
    loss = 0.0
    if train_pi:
        loss = loss + pg - args.ent_coef * entropy
    if train_v:
        loss = loss + args.vf_coef * v_loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    clip_grads(agent, args.max_grad_norm)
    optimizer.step()
    return torch.stack([pg, v_loss, entropy, approx_kl, clipfrac]).detach()


def policy_phase(agent: Agent, optimizer, batch: dict, args: Args, step=policy_step):
    """One PPO iteration: max(E_pi, E_V) epochs; epoch i trains the policy if i < E_pi and the
    value function if i < E_V (reference ppo.learn). The last minibatch's statistics (with
    E_V > E_pi its policy terms come from a value-only epoch); `step`: policy_step, or compiled."""
    n = batch["obs"].shape[0]
    for epoch in range(max(args.e_pi, args.e_v)):
        for idx in torch.randperm(n, device=batch["obs"].device).split(n // args.num_minibatches):
            mb = {k: x[idx] for k, x in batch.items()}
            # (E_pi != E_V: one compiled graph for each of the at most 3 pairs of flags)
            stats = step(agent, optimizer, args, epoch < args.e_pi, epoch < args.e_v, **mb)
    return stats.clone()  # (CUDA graphs overwrite a compiled step's outputs at its next call)


def aux_step(agent: Agent, optimizer, args: Args, obs, logits_old, v_targ, valid) -> torch.Tensor:
    """One minibatch of the auxiliary phase (paper Alg. 1, lines 12-14); its [KL, aux value loss,
    value loss]."""
    logits, value, aux_value = agent(obs)
    kl, aux_v, v = aux_losses(logits, value, aux_value, logits_old, v_targ, valid)
    optimizer.zero_grad(set_to_none=True)
    (args.beta_clone * kl + aux_v + v).backward()
    clip_grads(agent, args.max_grad_norm)
    optimizer.step()
    return torch.stack([kl, aux_v, v]).detach()


def auxiliary_phase(agent: Agent, optimizer, aux: dict, args: Args, step=aux_step):
    """E_aux epochs over all samples stored in `aux` (paper Alg. 1, lines 10-15); the mean [KL,
    aux value loss, value loss] of its minibatches. `step`: aux_step, or compiled."""
    obs, v_targ, valid = (aux[name].flatten(0, 1) for name in ("obs", "vtarg", "valid"))
    n = obs.shape[0]
    with torch.no_grad():  # pi_old, computed once before the phase
        logits_old = torch.cat([agent.logits(o) for o in obs.split(4096)])
    stats = torch.zeros(3, device=obs.device)
    for _ in range(args.e_aux):
        for idx in torch.randperm(n, device=obs.device).split(n // args.aux_num_minibatches):
            stats += step(
                agent, optimizer, args, obs[idx], logits_old[idx], v_targ[idx], valid[idx]
            )
    return stats / max(1, args.e_aux * args.aux_num_minibatches)


# ---------------------------------------------------------------- training
LOSS_TAGS = [f"losses/{k}" for k in ("explained_variance", *PPO_STATS)]
LOSS_TAGS += [f"losses/aux/{k}" for k in ("kl", "aux_value", "value")]


def adam(agent: Agent, lr: float, eps: float, device) -> torch.optim.Adam:
    """Fused Adam of all parameters (both phases train all of them, detail 4), with a tensor
    learning rate, set in place: compiled steps do not recompile."""
    lr = torch.tensor(lr, device=device)
    return torch.optim.Adam(agent.parameters(), lr=lr, eps=eps, fused=True)


def train(args: Args) -> None:
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)
    obs_dim, num_actions = check_env(args.env_id)
    ckpt = load_resume(args, run)
    horizon = anneal_horizon(args, ckpt)
    device = run.device
    envs = make_envs(args.env_id, args.num_envs)
    agent = Agent(obs_dim, num_actions, args.hidden_dim, args.arch).to(device)
    optimizer = adam(agent, args.learning_rate, args.adam_eps, device)
    aux_optimizer = adam(agent, args.aux_learning_rate, args.adam_eps, device)
    N, batch_size = args.num_envs, args.num_envs * args.num_steps
    storage = rollout_storage(args.num_steps, N, obs_dim, run)
    aux = aux_storage(args.n_pi if args.e_aux else 0, batch_size, obs_dim, device)
    carry = reset_carry(envs, args.seed, device)
    moments = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64, device=device)
    reward_norm = {"moments": moments, "ret": torch.zeros(N, device=device)}
    counters = dict.fromkeys(COUNTERS, 0) | {"schedule_steps": horizon}
    if ckpt:
        restore(ckpt, agent, optimizer, aux_optimizer, envs, carry, aux, reward_norm, counters)
    global_step = counters["iteration"] * batch_size
    total = args.total_steps // batch_size * batch_size  # whole rollouts
    evaluate_policy = partial(evaluate, agent, args.env_id, args.eval_episodes, args.seed, device)
    state = partial(
        checkpoint_state, agent, optimizer, aux_optimizer, envs, carry, aux, reward_norm, counters
    )
    act, gae_fn = run.compile(agent), run.compile(gae)
    policy_fn, aux_fn = run.compile(policy_step), run.compile(aux_step)
    with run.start(global_step, total, state=state, evaluate=evaluate_policy):
        while global_step < total and not run.stop:
            t_iter = time.time()
            # both rates fall linearly to 0 at the horizon (detail 6)
            frac = 1.0 - counters["iteration"] / (horizon // batch_size) if args.anneal_lr else 1.0
            lr, aux_lr = frac * args.learning_rate, frac * args.aux_learning_rate
            optimizer.param_groups[0]["lr"].fill_(lr)
            aux_optimizer.param_groups[0]["lr"].fill_(aux_lr)
            counters["iteration"] += 1

            for t, ep_return, ep_length in rollout(envs, act, storage, carry, run):
                run.episode(global_step + (t + 1) * N, ep_return, ep_length)
            global_step += batch_size
            batch = make_batch(storage, agent, carry["next_obs"], reward_norm, args, gae_fn)
            stats = policy_phase(agent, optimizer, batch, args, policy_fn)
            if args.e_aux:  # keep the rollout's samples for the auxiliary phase
                for name, key in (("obs", "obs"), ("vtarg", "returns"), ("valid", "valid")):
                    aux[name][counters["phase_iteration"]] = batch[key]
                counters["phase_iteration"] += 1
            if args.e_aux and counters["phase_iteration"] == args.n_pi:  # every N_pi (Alg. 1)
                t_aux = time.time()
                stats = torch.cat([stats, auxiliary_phase(agent, aux_optimizer, aux, args, aux_fn)])
                counters["phase_iteration"], counters["aux_phases"] = 0, counters["aux_phases"] + 1
                counters["aux_time_s"] += time.time() - t_aux
            counters["train_time_s"] += time.time() - t_iter

            run.check_finite(stats, global_step)
            v_old, w = storage["values"].flatten(), batch["valid"]  # w: the real steps
            ev = explained_variance(batch["returns"], v_old, w)
            # one read from the device per iteration (no aux phase: zip stops before its tags)
            values = torch.cat([ev[None], stats]).tolist()
            run.log(global_step, dict(zip(LOSS_TAGS, values)))
            charts = {"learning_rate": lr, "aux_learning_rate": aux_lr, "SPS": run.sps(global_step)}
            charts["aux_phase_time_fraction"] = aux_time_fraction(counters)
            run.log(global_step, {f"charts/{k}": v for k, v in charts.items()})
            run.end_iteration(global_step)
        envs.close()
        summary = {"arch": args.arch, "aux_phases": counters["aux_phases"]}
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
EPISODE_ARRAYS = ("autoreset", "ep_return", "ep_length")  # carry's numpy arrays
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
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    box, shape = isinstance(obs_space, gym.spaces.Box), obs_space.shape
    continuous, discrete = (isinstance(act_space, t) for t in (gym.spaces.Box, gym.spaces.Discrete))
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


def aux_time_fraction(counters: dict) -> float:
    """The share of the training time spent in auxiliary phases."""
    return counters["aux_time_s"] / max(counters["train_time_s"], 1e-9)


def checkpoint_state(agent, optimizer, aux_optimizer, envs, carry, aux, reward_norm, counters):
    """Everything a resume needs, as plain CPU tensors and numbers (detail 4)."""
    k = counters["phase_iteration"]
    return {
        **counters,
        "agent": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "aux_optimizer": aux_optimizer.state_dict(),
        **{f"aux_{name}": x[:k].cpu() for name, x in aux.items()},
        "env_state": env_state(envs),
        "next_obs": carry["next_obs"].cpu(),
        **{name: torch.from_numpy(carry[name].copy()) for name in EPISODE_ARRAYS},
        "reward_moments": reward_norm["moments"].cpu(),
        "reward_ret": reward_norm["ret"].cpu(),
        "rng": Run.rng_state(torch=torch.default_generator),
    }


def restore(ckpt, agent, optimizer, aux_optimizer, envs, carry, aux, reward_norm, counters):
    """Load a checkpoint (read on the CPU) into the run's objects, in place; its tensors go to the
    run's device (that of the reward statistics, like every tensor of the run)."""
    device = reward_norm["ret"].device
    agent.load_state_dict(ckpt["agent"])
    for opt, name in ((optimizer, "optimizer"), (aux_optimizer, "aux_optimizer")):
        # the run's learning-rate tensor, not the checkpoint's (on the CPU; a float in older ones),
        # and fused as the run's (older checkpoints' optimizers were not)
        ckpt[name]["param_groups"][0] |= {k: opt.param_groups[0][k] for k in ("lr", "fused")}
        opt.load_state_dict(ckpt[name])  # Adam's moments follow the parameters' device
    for name, x in aux.items():
        x[: ckpt["phase_iteration"]] = ckpt[f"aux_{name}"].to(device)
    if ckpt["env_state"] and env_state(envs):  # the same episodes continue (detail 4)
        set_env_state(envs, ckpt["env_state"])
        carry.update({name: ckpt[name].numpy().copy() for name in EPISODE_ARRAYS})
        carry["next_obs"] = ckpt["next_obs"].to(device)
    else:
        obs, _ = envs.reset(seed=ckpt["args"]["seed"] + ckpt["iteration"])
        carry["next_obs"] = torch.as_tensor(obs, dtype=torch.float32, device=device).contiguous()
    Run.set_rng_state(ckpt["rng"], torch=torch.default_generator)
    # (older checkpoints hold the moments as a list of floats)
    moments = torch.as_tensor(ckpt["reward_moments"], dtype=torch.float64).to(device)
    reward_norm.update(moments=moments, ret=ckpt["reward_ret"].to(device))
    counters.update({name: ckpt[name] for name in COUNTERS})


def evaluate(agent, env_id: str, episodes: int, seed: int, device, video_dir=None) -> list[float]:
    """Greedy (argmax) returns of `episodes` episodes seeded seed + 10000 + i (detail 7)."""
    env = make_env(env_id, video_dir)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, ep_return = False, 0.0
        while not done:
            with torch.inference_mode():
                obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device)
                action = int(agent.logits(obs_t.unsqueeze(0)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            ep_return += float(reward)
            done = terminated or truncated
        returns.append(ep_return)
    env.close()
    return returns


def eval_only(args: Args, run: Run) -> None:
    """Evaluate --checkpoint with its own env, network and seed: its run's final evaluation."""
    ckpt, device = Run.load_checkpoint(args.checkpoint), run.device
    saved = ckpt["args"]
    agent = Agent(*check_env(ckpt["env_id"]), saved["hidden_dim"], saved["arch"]).to(device)
    agent.load_state_dict(ckpt["agent"])
    returns = evaluate(
        agent, ckpt["env_id"], args.eval_episodes, saved["seed"], device, run.video_dir
    )
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
        """Stop at the first failed check (the common flags' first), then seed and pick the
        device; --run-dir must not name a file."""
        Run.check_flags(args, list(checks))
        self.args = args
        self.device = Run.seed_and_pick_device(args)
        self.run_dir = Run.run_dir_for(args, args.checkpoint if args.eval_only else args.resume)
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise Run.fail(f"--run-dir {self.run_dir} is a file; pass a folder's path")
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
