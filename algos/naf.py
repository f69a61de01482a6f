"""NAF: continuous Q-learning with Normalized Advantage Functions.

Paper: Shixiang Gu, Timothy Lillicrap, Ilya Sutskever, Sergey Levine, "Continuous Deep
Q-Learning with Model-based Acceleration", ICML 2016, arXiv:1603.00748 (Section 4; the
model-based acceleration of Section 5 is not part of this file).

Idea: Q-learning needs max_u Q(x, u), which has no closed form for continuous actions u.
NAF restricts the advantage to a concave quadratic in u, centred on a learned action mu(x).
Then the greedy action is mu(x) and max_u Q(x, u) = V(x), both read off one network: the
policy needs no separate actor, and the only loss is the TD error of Q (plus, here, deviation
g's small penalty on mu).

Equations (paper, Section 4):
    Q(x, u) = V(x) + A(x, u)
    A(x, u) = -1/2 (u - mu(x))^T P(x) (u - mu(x)),   P(x) = L(x) L(x)^T
    L(x)    lower-triangular, its entries a linear output of the network, diagonal
            exponentiated, so P is positive definite and A <= 0 with A = 0 only at u = mu
    y       = r + gamma (1 - terminated) V'(x')        (V' from the target network; the
            options h and j change V')
    loss    = mean_batch (y - Q(x, u))^2,   theta' <- tau theta + (1 - tau) theta'

Implementation details:
1. One MLP trunk (two ReLU layers of `hidden_dim`) with three linear heads: V (1 value), mu
   (|A| values through tanh, so mu lies in [-1, 1]^|A|) and the |A|(|A|+1)/2 entries of L.
2. The network acts in [-1, 1]^|A|; `scale_action` is the one place that maps to the
   environment's bounds. Exploration noise is added in [-1, 1] space and clipped there.
3. Exploration (the paper's random process N): Gaussian N(0, sigma^2) per step, or
   Ornstein-Uhlenbeck (as in DDPG, theta = 0.15) whose state restarts at 0 with each episode:
   it is zeroed on the autoreset step (whose action the env ignores), so an episode's first
   action carries exactly one increment. sigma falls linearly from `noise_scale` to
   `final_noise_scale` over `noise_decay_steps` steps, then stays (deviation c). Uniform
   random actions for the first `learning_starts` steps.
4. The target masks the bootstrap with `terminated` only: a time-limit truncation keeps
   gamma V'(x') of the real final observation, which Gymnasium's NEXT_STEP autoreset
   returns at the step the episode ends.
5. NEXT_STEP autoreset, handled explicitly: the vector step after an episode end only resets
   that env (its action is ignored, its reward is 0), so `step_and_store` never stores that
   row. Such steps still count as environment steps.
6. `updates_per_step` gradient steps per environment step (num_envs * updates_per_step per
   vector step), each followed by the soft target update.
7. Evaluation is deterministic (u = mu(x), no noise) on a separate env seeded
   seed + 10_000 + i for episode i.
8. A checkpoint holds the networks, the optimizer, the filled part of the replay buffer, the OU
   state and the torch and numpy generators. A resume reseeds the envs with seed + global_step,
   so the episode in progress at save time is dropped.
9. `--compile` runs `update` (the loss, its backward, the clipped Adam step and the soft target
   update) through torch.compile, as CUDA graphs on a GPU. Off by default: it has not yet been
   measured to win on a GPU.

Deviations from the paper and its public ports, set for Pendulum-v1 in 20k steps. What each
was measured on, with seeds and commands: results/naf-ablations/README.md (its last section
sums up the evidence per deviation); the zoo's presets are in zoo/naf.toml.
a. tau = 0.005 (ports: 1e-3): at 1e-3 the target trails the network by ~1000 updates, slow
   for a 20k-step budget. On HalfCheetah-v5, TD3's pace (0.0025) and 0.01 both ended lower.
b. hidden_dim = 256 without batch normalisation (ports: 128-200, some with it): per-sample
   layers keep acting and evaluation independent of the batch.
c. OU sigma 0.3 (DDPG: 0.2) falling linearly to 0.05 over 15k steps. Gaussian noise 0.1 or 0.2
   instead let Pendulum seeds collapse (P -> 0, mu saturated); a constant OU 0.3 let Q diverge
   on InvertedPendulum-v5, whose replay then held almost only falls.
d. Gradient-norm clipping at 10 (`--max-grad-norm`; not in the paper): early TD errors are
   large and exp on L's diagonal amplifies big steps. On HalfCheetah-v5 it rescales every step,
   and without it the zoo's preset ended lower.
e. Input normalisation, off by default (`--normalize-obs`; on in the locomotion presets):
   clip((x - mean) / sqrt(var + 1e-8), -10, 10) over every observation a step returned (SB3's
   constants; saved). It helped HalfCheetah-v5 and unsettled InvertedPendulum-v5.
f. A curvature floor, off by default (`--curvature-floor`): P = L L^T + floor I. On HalfCheetah
   P_11 = exp(2 l_11) sinks towards 0 and A goes flat along u_1; a floor of 0.01 keeps it curved
   but showed no gain. An ablation, not a setting that won.
g. A penalty on mu before tanh, weight 0.01 (`--pre-tanh-penalty`, 0: the paper; rlkit's
   `policy_pre_activation_weight`): tanh passes almost no gradient back from its flat tails; the
   penalty's pull grows there. Without it mu sat at its bounds on Hopper-v5, which stood still.
h. Twin networks, off by default (`--twin-q`; on in `naf-halfcheetah`): TD3's clipped double Q,
   y uses min(V_1'(x'), V_2'(x')), each network fitted to it, the loss their sum, the first
   acts, one clip over both. Steadier on HalfCheetah-v5 at batch 256, at twice the cost.
i. A LayerNorm before each hidden ReLU, off by default (`--layer-norm`; on in
   `naf-halfcheetah`): per sample, as b asks (Ba et al. 2016; RLPD's critics have it). Ahead
   with the twins on HalfCheetah-v5; alone it did not gain.
j. TD3's target smoothing, off by default (`--target-noise sigma`), in closed form for a
   quadratic Q': E Q'(x', mu' + eps) = V'(x') - sigma^2/2 tr P'(x'). At TD3's 0.2 it ended
   behind on HalfCheetah-v5. An ablation, not a setting that won.

Locomotion (results/naf-ablations/README.md): with the defaults NAF learns to run HalfCheetah-v5
on its back; TD3's start (10k random steps, then small Gaussian noise, the zoo's
`naf-halfcheetah`) lets it run upright, but at 100k steps it ends below RL Zoo's TD3, as on
Hopper-v5. For locomotion, prefer d4pg.py.

Usage: python algos/naf.py --env-id Pendulum-v1 --total-steps 20000 --seed 1
"""

from __future__ import annotations

import copy
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

# Ornstein-Uhlenbeck mean reversion (paper / DDPG, Lillicrap et al. 2015).
OU_THETA = 0.15
# Checkpoint key prefixes of the acting network and its twin (deviation h).
NET_KEYS = ("", "twin_")
# The Args fields, besides hidden_dim, that NAFNetwork takes.
NET_OPTIONS = ("head_init_scale", "normalize_obs", "layer_norm")


@dataclass
class Args:
    env_id: str = "Pendulum-v1"
    """Gymnasium id (Box actions, flat Box observations)"""
    seed: int = 1
    """random seed"""
    total_steps: int = 20_000
    """environment steps, all envs together"""
    num_envs: int = 1
    """parallel environments"""
    torch_deterministic: bool = True
    """deterministic torch kernels"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    compile: bool = False
    """torch.compile the updates (CUDA graphs on a GPU)"""
    exp_name: str = "naf"
    """part of the default run directory"""
    run_dir: str | None = None
    """output folder (default: a new one under runs/)"""
    checkpoint_interval: int = 10_000
    """env steps between checkpoints (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from"""
    eval_episodes: int = 10
    """deterministic evaluation episodes"""
    eval_interval: int = 5_000
    """env steps between evaluations (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint and write eval.json"""
    checkpoint: str | None = None
    """checkpoint for --eval-only"""
    capture_video: bool = False
    """record videos of the final evaluation"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """Weights & Biases project"""
    # Algorithm-specific
    buffer_size: int = 1_000_000
    """replay buffer capacity"""
    batch_size: int = 128
    """minibatch size"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    tau: float = 0.005
    """soft target update rate (deviation a)"""
    gamma: float = 0.99
    """discount factor"""
    hidden_dim: int = 256
    """units in each of the two hidden layers"""
    learning_starts: int = 1_000
    """env steps of random actions before learning"""
    noise: Literal["gaussian", "ou"] = "ou"
    """exploration noise process"""
    noise_scale: float = 0.3
    """noise sigma at the start (detail 3)"""
    updates_per_step: int = 1
    """gradient steps per environment step"""
    final_noise_scale: float | None = 0.05
    """noise sigma from --noise-decay-steps on (None: constant)"""
    noise_decay_steps: int = 15_000
    """env steps of the linear noise decay"""
    head_init_scale: float = 1.0
    """factor on the heads' initial weights"""
    max_grad_norm: float = 10.0
    """gradient norm clip (0: off; deviation d)"""
    curvature_floor: float = 0.0
    """P = L L^T + floor I (deviation f)"""
    pre_tanh_penalty: float = 0.01
    """weight of the penalty on mu before tanh (deviation g)"""
    twin_q: bool = False
    """two networks, y from the smaller V' (deviation h)"""
    normalize_obs: bool = False
    """standardise observations by running moments (deviation e)"""
    layer_norm: bool = False
    """a LayerNorm before each hidden ReLU (deviation i)"""
    target_noise: float = 0.0
    """sigma of TD3's target smoothing (deviation j)"""


# ---------------------------------------------------------------- environment
def make_envs(env_id, num_envs):
    make_env(env_id).close()  # validated once, with one-line errors
    # NEXT_STEP autoreset on purpose (detail 5): step_and_store drops the reset step.
    mode = gym.vector.AutoresetMode.NEXT_STEP
    return gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs, autoreset_mode=mode)


def scale_action(u, low, high):
    """The one place that maps the network's u in [-1, 1] to the env's [low, high] (detail 2)."""
    return low + 0.5 * (u + 1.0) * (high - low)


# ---------------------------------------------------------------- network
class NAFNetwork(nn.Module):
    """Trunk with heads V(x), mu(x) and the entries of L(x) (detail 1)."""

    def __init__(
        self, obs_dim, act_dim, hidden_dim, head_init_scale=1, normalize_obs=False, layer_norm=False
    ):
        super().__init__()
        self.act_dim, self.normalize_obs = act_dim, normalize_obs
        # Without LayerNorm (deviation i) the keys stay trunk.0 and trunk.2.
        layers = []
        for n_in in (obs_dim, hidden_dim):
            norm = [nn.LayerNorm(hidden_dim)] if layer_norm else []
            layers += [nn.Linear(n_in, hidden_dim), *norm, nn.ReLU()]
        self.trunk = nn.Sequential(*layers)
        self.v_head = nn.Linear(hidden_dim, 1)
        self.mu_head = nn.Linear(hidden_dim, act_dim)
        self.l_head = nn.Linear(hidden_dim, act_dim * (act_dim + 1) // 2)
        for head in (self.v_head, self.mu_head, self.l_head):
            for p in head.parameters():
                p.data.mul_(head_init_scale)
        self.register_buffer("tril", torch.tril_indices(act_dim, act_dim), persistent=False)
        # Deviation e: count, sum x and sum x^2 of every observation seen, in float64 so that
        # var = E[x^2] - E[x]^2 stays accurate; saved only with the flag.
        moments = torch.zeros(3, obs_dim, dtype=torch.float64)
        self.register_buffer("obs_moments", moments, persistent=normalize_obs)

    def observe(self, obs):
        x = to_device(obs, self.obs_moments.device).double()
        self.obs_moments += torch.stack([torch.full_like(x[0], len(x)), x.sum(0), (x * x).sum(0)])

    def features(self, x):
        # With deviation e the trunk reads clip((x - mean) / sqrt(var + 1e-8), -10, 10); the
        # clamp on the count keeps it finite before the first observation.
        if self.normalize_obs:
            mean, mean_sq = self.obs_moments[1:] / self.obs_moments[0].clamp(min=1.0)
            std = ((mean_sq - mean.square()).clamp(min=0.0) + 1e-8).sqrt()
            x = ((x - mean) / std).clamp(-10.0, 10.0).float()
        return self.trunk(x)

    def value(self, x, sigma=0.0, floor=0.0):
        # V(x); with deviation j's sigma > 0, E Q(x, mu + eps) = V - sigma^2/2 tr P, where
        # tr(L L^T + floor I) = |L|_F^2 + floor |A|. V alone needs neither the mu nor the L head.
        if sigma == 0.0:
            return self.v_head(self.features(x)).squeeze(-1)
        V, _, L, _ = self(x)
        return V - 0.5 * sigma**2 * (L.square().sum((1, 2)) + floor * self.act_dim)

    def forward(self, x):
        # V(x) [B], mu(x) [B, |A|] in [-1, 1], L(x) [B, |A|, |A|] and mu before tanh [B, |A|].
        h = self.features(x)
        L = h.new_zeros(x.shape[0], self.act_dim, self.act_dim)
        L[:, self.tril[0], self.tril[1]] = self.l_head(h)
        # exp on the diagonal makes P = L L^T positive definite (paper, Section 4).
        L = torch.tril(L, diagonal=-1) + torch.diag_embed(torch.diagonal(L, dim1=1, dim2=2).exp())
        pre_tanh = self.mu_head(h)
        return self.v_head(h).squeeze(-1), torch.tanh(pre_tanh), L, pre_tanh


# ---------------------------------------------------------------- NAF math
def advantage(u, mu, L, floor=0.0):
    """A(x, u) = -1/2 (u - mu)^T P (u - mu), P = L L^T + floor I (0: the paper; deviation f)."""
    P = L @ L.transpose(1, 2) + floor * torch.eye(L.shape[-1], device=L.device)
    d = (u - mu).unsqueeze(-1)
    return -0.5 * (d.transpose(1, 2) @ P @ d).squeeze(-1).squeeze(-1)


def q_value(V, mu, L, u, floor=0.0):
    """Q(x, u) = V(x) + A(x, u)."""
    return V + advantage(u, mu, L, floor)


def td_target(r, terminated, V_next, gamma):
    """y = r + gamma (1 - terminated) V'(x'); a truncation bootstraps (detail 4)."""
    return r + gamma * (1.0 - terminated) * V_next


# Returns (loss, TD, Q(x, u)): TD = mean (y - Q(x, u))^2 and Q of the first network. The loss
# sums TD + penalty * mean((mu before tanh)^2) (deviation g) over the networks, and y takes the
# smallest V'(x') of the target networks (deviation h), smoothed by sigma (deviation j).
def naf_loss(nets, target_nets, batch, gamma, floor=0.0, penalty=0.0, sigma=0.0):
    with torch.no_grad():
        V_next = torch.stack([t.value(batch["next_obs"], sigma, floor) for t in target_nets])
        y = td_target(batch["rewards"], batch["terminated"], V_next.amin(0), gamma)
    outputs = [net(batch["obs"]) for net in nets]
    qs = [q_value(V, mu, L, batch["actions"], floor) for V, mu, L, _ in outputs]
    tds = [F.mse_loss(q, y) for q in qs]
    penalties = [penalty * pre_tanh.square().mean() for *_, pre_tanh in outputs]
    return sum(td + p for td, p in zip(tds, penalties)), tds[0].detach(), qs[0].detach()


@torch.no_grad()
def soft_update(target, source, tau):
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def exploration_noise(kind, state, scale, rng):
    """(noise, new OU state). OU: x <- x - theta x + sigma N(0, 1) (dt = 1)."""
    eps = scale * rng.standard_normal(state.shape)
    if kind == "gaussian":
        return eps, state
    state = state - OU_THETA * state + eps
    return state, state


def noise_scale(args, step):
    """sigma at `step`: linear from noise_scale to final_noise_scale, then held (detail 3)."""
    if args.final_noise_scale is None or args.noise_decay_steps <= 0:
        return args.noise_scale
    fraction = min(1.0, step / args.noise_decay_steps)
    return args.noise_scale + (args.final_noise_scale - args.noise_scale) * fraction


class ReplayBuffer:
    """Preallocated ring buffer of (x, u, r, x', terminated); u in [-1, 1]."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity, obs_dim, act_dim):
        self.capacity, self.ptr, self.size = capacity, 0, 0
        self.obs, self.next_obs = np.zeros((2, capacity, obs_dim), np.float32)
        self.actions = np.zeros((capacity, act_dim), np.float32)
        self.rewards, self.terminated = np.zeros((2, capacity), np.float32)

    def add(self, *transitions):
        # Batches of (obs, actions, rewards, next_obs, terminated), in FIELDS' order.
        n = len(transitions[0])
        idx = (self.ptr + np.arange(n)) % self.capacity
        for name, value in zip(self.FIELDS, transitions):
            getattr(self, name)[idx] = value
        self.ptr, self.size = (self.ptr + n) % self.capacity, min(self.size + n, self.capacity)

    def sample(self, batch_size, rng, device):
        idx = rng.integers(0, self.size, batch_size)
        return {k: to_device(getattr(self, k)[idx], device) for k in self.FIELDS}

    def state_dict(self):
        # Copies of the filled part only: torch.save of a view would write the whole array.
        filled = {k: torch.from_numpy(getattr(self, k)[: self.size].copy()) for k in self.FIELDS}
        return {"ptr": self.ptr, "size": self.size, **filled}

    def load_state_dict(self, state):
        self.ptr, self.size = int(state["ptr"]), int(state["size"])
        for k in self.FIELDS:
            getattr(self, k)[: self.size] = state[k].numpy()


# One vector step that stores only real transitions (detail 5); it returns the step's outputs,
# the last one the mask of envs whose next step is an autoreset.
def step_and_store(envs, buffer, obs, actions, autoreset):
    space = envs.single_action_space
    next_obs, rewards, terminated, truncated, _ = envs.step(
        scale_action(actions, space.low, space.high)
    )
    # A reset step's row is no transition.
    real = ~autoreset
    buffer.add(*(a[real] for a in (obs, actions, rewards, next_obs, terminated)))
    return next_obs, rewards, terminated, truncated, terminated | truncated


# One gradient step (its norm clipped over all networks), then the soft target update.
def update(nets, target_nets, optimizer, batch, args):
    terms = dict(floor=args.curvature_floor, penalty=args.pre_tanh_penalty, sigma=args.target_noise)
    loss, td, q = naf_loss(nets, target_nets, batch, gamma=args.gamma, **terms)
    optimizer.zero_grad()
    loss.backward()
    if args.max_grad_norm > 0:
        nn.utils.clip_grad_norm_(nets.parameters(), args.max_grad_norm)
    optimizer.step()
    soft_update(target_nets, nets, args.tau)
    return loss.detach(), td, q


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    check_args(args)
    if args.eval_only:
        return eval_only(args)
    device = seed_and_pick_device(args)
    # rng draws the replay samples, the exploration noise and the random actions.
    rng = np.random.default_rng(args.seed)
    envs = make_envs(args.env_id, args.num_envs)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = envs.single_action_space.shape[0]
    options = {k: getattr(args, k) for k in NET_OPTIONS}
    nets = nn.ModuleList(
        NAFNetwork(obs_dim, act_dim, args.hidden_dim, **options) for _ in range(1 + args.twin_q)
    ).to(device)
    # nets[0] acts and is evaluated.
    target_nets, net = copy.deepcopy(nets), nets[0]
    # One set of statistics for x and x' (deviation e).
    for other in (*nets[1:], *target_nets):
        other.obs_moments = net.obs_moments
    optimizer = torch.optim.Adam(nets.parameters(), lr=args.learning_rate, fused=True)
    learn = compiled(update, args, device)
    buffer = ReplayBuffer(args.buffer_size, obs_dim, act_dim)
    global_step, ou_state, num_updates = restore(args, nets, target_nets, optimizer, buffer, rng)
    obs, _ = envs.reset(seed=args.seed + global_step)
    autoreset = np.zeros(args.num_envs, bool)
    ep_return, ep_length = np.zeros(args.num_envs), np.zeros(args.num_envs, int)
    evaluate_policy = partial(evaluate, net, args.env_id, args.eval_episodes, args.seed, device)

    def state():
        return checkpoint_state(nets, target_nets, optimizer, buffer, ou_state, num_updates, rng)

    stop, run_dir = stop_signal(), run_dir_for(args, args.resume)
    with RunLogger(args, run_dir, global_step, args.total_steps, args.resume is not None) as log:
        while global_step < args.total_steps and not stop:
            if global_step < args.learning_starts:
                actions = rng.uniform(-1.0, 1.0, (args.num_envs, act_dim)).astype(np.float32)
            else:
                with torch.inference_mode():
                    mu = net(to_device(obs, device).float())[1]
                sigma = noise_scale(args, global_step)
                noise, ou_state = exploration_noise(args.noise, ou_state, sigma, rng)
                actions = np.clip(mu.cpu().numpy() + noise, -1.0, 1.0).astype(np.float32)
            # The env ignores an autoreset step's action: a new episode's noise starts at 0.
            ou_state[autoreset] = 0.0
            obs, rewards, _, _, done = step_and_store(envs, buffer, obs, actions, autoreset)
            if args.normalize_obs:
                net.observe(obs)
            # A reset step belongs to no episode.
            ep_return += rewards * ~autoreset
            ep_length += ~autoreset
            autoreset, prev_step, global_step = done, global_step, global_step + args.num_envs
            for i in np.flatnonzero(done):
                log.episode(global_step, ep_return[i], ep_length[i])
                ep_return[i], ep_length[i] = 0.0, 0
            if global_step >= args.learning_starts and buffer.size >= args.batch_size:
                for _ in range(args.updates_per_step * args.num_envs):
                    batch = buffer.sample(args.batch_size, rng, device)
                    if args.compile:  # CUDA graphs: the last update's outputs are read by now
                        torch.compiler.cudagraph_mark_step_begin()
                    loss, td, q = learn(nets, target_nets, optimizer, batch, args)
                    num_updates += 1
                log.check_finite(loss, global_step)
                if every(global_step, prev_step, 100):  # as CleanRL
                    log.scalars(global_step, {"losses/td_loss": td, "losses/q_values": q.mean()})
            if every(global_step, prev_step, 1000) or global_step >= args.total_steps or stop:
                sps = {"charts/SPS": log.sps(global_step)}
                log.scalars(global_step, {**sps, "charts/learning_rate": args.learning_rate})
            log.end_iteration(global_step, stop, evaluate_policy, state)
        envs.close()
        log.finish(global_step, stop, evaluate_policy, state, num_updates=num_updates)


# ---------------------------------------------------------------- checks, checkpoints, evaluation
def check_args(args: Args) -> None:
    positive = "num_envs batch_size hidden_dim updates_per_step learning_rate head_init_scale"
    non_negative = "learning_starts noise_scale final_noise_scale noise_decay_steps max_grad_norm"
    # `or 0`: None is allowed.
    non_negative += " curvature_floor pre_tanh_penalty target_noise"
    rows = [(getattr(args, k) > 0, f"--{k} must be positive") for k in positive.split()]
    rows += [((getattr(args, k) or 0) >= 0, f"--{k} must be >= 0") for k in non_negative.split()]
    rows += [
        (args.buffer_size >= args.batch_size, "--buffer-size must be at least --batch-size"),
        (0 < args.tau <= 1, "--tau must be in (0, 1]"),
        (0 <= args.gamma <= 1, "--gamma must be in [0, 1]"),
    ]
    check_flags(args, [(ok, message.replace("_", "-")) for ok, message in rows])


def checkpoint_state(nets, target_nets, optimizer, buffer, ou_state, num_updates, rng):
    state = {"num_updates": num_updates, "optimizer": optimizer.state_dict()}
    for prefix, net, target_net in zip(NET_KEYS, nets, target_nets):
        state |= {prefix + "net": net.state_dict(), prefix + "target_net": target_net.state_dict()}
    state |= {"replay_buffer": buffer.state_dict(), "ou_state": torch.from_numpy(ou_state.copy())}
    return state | {"rng": rng_state(torch=torch.default_generator, numpy=rng)}


# --resume's checkpoint loaded into the learner; returns (global_step, OU state, updates).
def restore(args, nets, target_nets, optimizer, buffer, rng):
    if not args.resume:
        return 0, np.zeros((args.num_envs, nets[0].act_dim)), 0
    same = ("hidden_dim", "num_envs", "buffer_size", "normalize_obs", "twin_q", "layer_norm")
    ckpt = resume_checkpoint(args, same)
    for prefix, net, target_net in zip(NET_KEYS, nets, target_nets):
        net.load_state_dict(ckpt[prefix + "net"])
        target_net.load_state_dict(ckpt[prefix + "target_net"])
    optimizer.load_state_dict(ckpt["optimizer"])
    buffer.load_state_dict(ckpt["replay_buffer"])
    set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    return ckpt["global_step"], ckpt["ou_state"].numpy().copy(), ckpt["num_updates"]


# Through pinned memory on a GPU, so that the copy does not block the host; the caching host
# allocator keeps the pinned block until the copy is done.
def to_device(array, device):
    x = torch.from_numpy(array)
    return (x.pin_memory() if torch.device(device).type == "cuda" else x).to(
        device, non_blocking=True
    )


# gym.make; unknown ids and spaces naf.py cannot use stop with one line.
def make_env(env_id, render_mode=None):
    if env_id not in gym.registry and importlib.util.find_spec("ale_py"):
        # Atari ids, refused below.
        gym.register_envs(importlib.import_module("ale_py"))
    try:
        env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
    # Unknown id, missing module or dependency.
    except Exception as e:
        raise fail(f"cannot make environment {env_id!r} ({str(e).splitlines()[0]})")
    obs_space, act_space, problem = env.observation_space, env.action_space, None
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) > 1:
        problem = "has image observations; use ppo_atari.py or dqn_atari.py"
    elif isinstance(act_space, gym.spaces.Discrete):
        problem = "has discrete actions; use ppg.py"
    elif not (isinstance(act_space, gym.spaces.Box) and isinstance(obs_space, gym.spaces.Box)):
        problem = "has non-Box spaces; naf.py needs Box ones"
    elif not np.isfinite([act_space.low, act_space.high]).all():
        problem = "has unbounded actions; naf.py needs finite action bounds"
    if problem:
        env.close()
        raise fail(f"{env_id} {problem}")
    return env


# Deterministic returns, u = mu(x), episode i seeded seed + 10_000 + i (detail 7).
def evaluate(net, env_id, episodes, seed, device, video_dir=None):
    env = make_env(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, str(video_dir), lambda _: True, disable_logger=True)
    low, high, returns = env.action_space.low, env.action_space.high, []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                mu = net(to_device(obs[None], device).float())[1]
            obs, reward, terminated, truncated, _ = env.step(
                scale_action(mu[0].cpu().numpy(), low, high)
            )
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


# --checkpoint evaluated with its own env, network and seed: the run's final evaluation again.
def eval_only(args: Args) -> None:
    ckpt, device = load_checkpoint(args.checkpoint), seed_and_pick_device(args)
    saved = ckpt["args"]
    # Its spaces size the network.
    with make_env(ckpt["env_id"]) as env:
        obs_dim, act_dim = int(np.prod(env.observation_space.shape)), env.action_space.shape[0]
    options = {k: saved[k] for k in NET_OPTIONS if k in saved}
    net = NAFNetwork(obs_dim, act_dim, saved["hidden_dim"], **options).to(device)
    net.load_state_dict(ckpt["net"])
    video_dir = run_dir_for(args, args.checkpoint) / "videos" if args.capture_video else None
    returns = evaluate(net, ckpt["env_id"], args.eval_episodes, saved["seed"], device, video_dir)
    write_eval_only(args, ckpt, returns)


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
