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


@dataclass
class Args:
    """NAF's flags (tyro): the common ones first, then the algorithm's; the module
    docstring at the top of naf.py gives the reasons for their defaults."""

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
def make_envs(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """The training vector env, in NEXT_STEP autoreset mode (detail 5)."""
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
        self.act_dim = act_dim
        self.normalize_obs = normalize_obs
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

    def observe(self, obs: np.ndarray) -> None:
        """Add a step's observations [num_envs, obs_dim] to the moments (deviation e)."""
        x = torch.as_tensor(obs, device=self.obs_moments.device).double()  # [n, obs_dim]
        count = torch.full_like(x[0], len(x))
        self.obs_moments += torch.stack([count, x.sum(0), (x * x).sum(0)])  # [3, obs_dim]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The trunk's output h(x) [B, hidden_dim]."""
        if self.normalize_obs:  # deviation e: clip((x - mean) / sqrt(var + 1e-8), -10, 10)
            # the clamp on the count keeps it finite before the first observation
            mean, mean_sq = self.obs_moments[1:] / self.obs_moments[0].clamp(min=1.0)
            std = ((mean_sq - mean.square()).clamp(min=0.0) + 1e-8).sqrt()
            x = ((x - mean) / std).clamp(-10.0, 10.0).float()
        return self.trunk(x)

    def value(self, x: torch.Tensor, sigma: float = 0.0, floor: float = 0.0) -> torch.Tensor:
        """V(x) [B], which is max_u Q(x, u); V alone needs neither the mu nor the L head."""
        if sigma == 0.0:
            return self.v_head(self.features(x)).squeeze(-1)
        # deviation j: E Q(x, mu + eps) = V - sigma^2/2 tr P, eps ~ N(0, sigma^2 I), where
        # tr(L L^T + floor I) = |L|_F^2 + floor |A|
        V, _, L, _ = self(x)
        return V - 0.5 * sigma**2 * (L.square().sum((1, 2)) + floor * self.act_dim)

    def forward(self, x: torch.Tensor):
        """V(x) [B], mu(x) [B, |A|] in [-1, 1], L(x) [B, |A|, |A|] and mu before tanh [B, |A|]."""
        h = self.features(x)
        L = lower_triangular(self.l_head(h), self.tril, self.act_dim)
        pre_tanh = self.mu_head(h)
        return self.v_head(h).squeeze(-1), torch.tanh(pre_tanh), L, pre_tanh


def lower_triangular(entries: torch.Tensor, tril: torch.Tensor, act_dim: int) -> torch.Tensor:
    """L(x) [B, |A|, |A|] from its |A|(|A|+1)/2 entries [B, |A|(|A|+1)/2], filled row by row
    at the indices `tril` [2, |A|(|A|+1)/2]; the diagonal exponentiated, so that P = L L^T is
    positive definite (paper, Section 4)."""
    L = entries.new_zeros(entries.shape[0], act_dim, act_dim)
    L[:, tril[0], tril[1]] = entries
    diagonal = torch.diagonal(L, dim1=1, dim2=2)  # [B, |A|]
    return torch.tril(L, diagonal=-1) + torch.diag_embed(diagonal.exp())


def share_observation_moments(nets: nn.ModuleList, target_nets: nn.ModuleList) -> None:
    """One set of observation statistics for x and x' (deviation e): every network, twin and
    target reads the acting network's moments buffer, which only train() updates."""
    moments = nets[0].obs_moments
    for other in (*nets[1:], *target_nets):
        other.obs_moments = moments


# ---------------------------------------------------------------- NAF math
def advantage(u, mu, L, floor=0.0):
    """A(x, u) = -1/2 (u - mu)^T P (u - mu), P = L L^T (the paper) + floor I (deviation f).

    u, mu [B, |A|]; L [B, |A|, |A|]; returns [B].
    """
    P = L @ L.transpose(1, 2) + floor * torch.eye(L.shape[-1], device=L.device)  # [B, |A|, |A|]
    d = (u - mu).unsqueeze(-1)  # [B, |A|, 1]
    quadratic = d.transpose(1, 2) @ P @ d  # [B, 1, 1] = d^T P d
    return -0.5 * quadratic.squeeze(-1).squeeze(-1)


def q_value(V, mu, L, u, floor=0.0):
    """Q(x, u) = V(x) + A(x, u)."""
    return V + advantage(u, mu, L, floor)


def td_target(r, terminated, V_next, gamma):
    """y = r + gamma (1 - terminated) V'(x'); a truncation bootstraps (detail 4)."""
    return r + gamma * (1.0 - terminated) * V_next


def naf_loss(nets, target_nets, batch, gamma, floor=0.0, penalty=0.0, sigma=0.0):
    """The NAF loss, the TD error mean (y - Q(x, u))^2 of the acting network, and its Q(x, u).

    The paper (Section 4), one network and its target:
        y = r + gamma (1 - terminated) V'(x'),   loss = mean_batch (y - Q(x, u))^2
    `nets` and `target_nets` hold one network each, or two with deviation h; `floor` is deviation
    f (inside Q and V'), `sigma` deviation j (inside V'), `penalty` deviation g.
    """
    obs, actions = batch["obs"], batch["actions"]
    with torch.no_grad():
        V_next = target_nets[0].value(batch["next_obs"], sigma, floor)  # V'(x') [B]
        if len(target_nets) == 2:  # deviation h: TD3's clipped double Q, the smaller V'(x')
            V_next = torch.minimum(V_next, target_nets[1].value(batch["next_obs"], sigma, floor))
        y = td_target(batch["rewards"], batch["terminated"], V_next, gamma)  # [B]

    losses = []  # per network: TD error (+ deviation g's penalty)
    tds = []
    qs = []
    for net in nets:  # the paper's single network; with deviation h each twin is fitted to y
        V, mu, L, pre_tanh = net(obs)
        q = q_value(V, mu, L, actions, floor)  # Q(x, u) [B]
        td = F.mse_loss(q, y)
        loss = td
        if penalty > 0:  # deviation g: pull mu back from tanh's flat tails
            loss = td + penalty * pre_tanh.square().mean()
        losses.append(loss)
        tds.append(td)
        qs.append(q)
    total = losses[0]
    if len(losses) == 2:  # deviation h: one loss, the sum over the twins
        total = total + losses[1]
    return total, tds[0].detach(), qs[0].detach()


def exploration_noise(kind: str, state: np.ndarray, scale: float, rng: np.random.Generator):
    """(noise, new OU state). OU: x <- x - theta x + sigma N(0, 1) (dt = 1)."""
    eps = scale * rng.standard_normal(state.shape)
    if kind == "gaussian":
        return eps, state
    state = state - OU_THETA * state + eps
    return state, state


def noise_scale(args: Args, step: int) -> float:
    """sigma at `step`: linear from noise_scale to final_noise_scale, then held (detail 3)."""
    if args.final_noise_scale is None or args.noise_decay_steps <= 0:
        return args.noise_scale
    fraction = min(1.0, step / args.noise_decay_steps)
    return args.noise_scale + (args.final_noise_scale - args.noise_scale) * fraction


class ReplayBuffer:
    """Preallocated ring buffer of (x, u, r, x', terminated); u in [-1, 1]."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int):
        self.capacity = capacity
        self.ptr = 0
        self.size = 0
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.actions = np.zeros((capacity, act_dim), np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, np.float32)

    def add(self, *transitions) -> None:
        """Store a batch of (obs, actions, rewards, next_obs, terminated), in FIELDS' order."""
        n = len(transitions[0])
        idx = (self.ptr + np.arange(n)) % self.capacity
        for name, value in zip(self.FIELDS, transitions):
            getattr(self, name)[idx] = value
        self.ptr = (self.ptr + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict:
        """A uniform minibatch, as numpy arrays by field."""
        idx = rng.integers(0, self.size, batch_size)
        return {k: getattr(self, k)[idx] for k in self.FIELDS}

    def state_dict(self) -> dict:
        """Copies of the filled part only: torch.save of a view would write the whole array."""
        filled = {k: torch.from_numpy(getattr(self, k)[: self.size].copy()) for k in self.FIELDS}
        return {"ptr": self.ptr, "size": self.size, **filled}

    def load_state_dict(self, state: dict) -> None:
        """Put back what state_dict() saved."""
        self.ptr = int(state["ptr"])
        self.size = int(state["size"])
        for k in self.FIELDS:
            getattr(self, k)[: self.size] = state[k].numpy()


def step_and_store(envs, buffer, obs, actions, autoreset):
    """One vector step that stores only real transitions (detail 5): the step's outputs, the
    last one the mask of envs whose next step is an autoreset."""
    space = envs.single_action_space
    next_obs, rewards, terminated, truncated, _ = envs.step(
        scale_action(actions, space.low, space.high)
    )
    # A reset step's row is no transition.
    real = ~autoreset
    buffer.add(*(a[real] for a in (obs, actions, rewards, next_obs, terminated)))
    return next_obs, rewards, terminated, truncated, terminated | truncated


def update(nets, target_nets, optimizer, batch: dict, args: Args):
    """One gradient step on naf_loss (its norm clipped over all networks, deviation d), then the
    soft target update theta' <- tau theta + (1 - tau) theta'; (loss, TD error, Q(x, u))."""
    loss, td, q = naf_loss(
        nets,
        target_nets,
        batch,
        gamma=args.gamma,
        floor=args.curvature_floor,
        penalty=args.pre_tanh_penalty,
        sigma=args.target_noise,
    )
    optimizer.zero_grad()
    loss.backward()
    if args.max_grad_norm > 0:
        nn.utils.clip_grad_norm_(nets.parameters(), args.max_grad_norm)
    optimizer.step()
    Run.polyak(target_nets, nets, args.tau)
    return loss.detach(), td, q


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    """NAF (Gu et al. 2016, Algorithm 1 without the model-based part) with --num-envs
    synchronous environments."""
    # Algorithm 1, as this loop runs it (every env step):
    #  1. act: u = mu(x) + N (OU or Gaussian), clipped to [-1, 1];
    #     uniform random actions before --learning-starts              -> exploration_noise
    #  2. step the envs, store (x, u, r, x', terminated), never a reset step -> step_and_store
    #  3. --updates-per-step times per env step:
    #     a. sample a minibatch                                           -> ReplayBuffer.sample
    #     b. y = r + gamma (1 - terminated) V'(x'); minimise (y - Q(x, u))^2   -> naf_loss
    #     c. theta' <- tau theta + (1 - tau) theta'                       -> update
    #  4. log episodes and losses; evaluate and checkpoint as their intervals pass (run.*)
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)
    rng = np.random.default_rng(args.seed)  # replay samples, exploration noise, random actions

    # set-up: envs, the network (and its twin), targets, optimizer, replay
    envs = make_envs(args.env_id, args.num_envs)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = envs.single_action_space.shape[0]
    nets = nn.ModuleList(
        NAFNetwork(
            obs_dim,
            act_dim,
            args.hidden_dim,
            head_init_scale=args.head_init_scale,
            normalize_obs=args.normalize_obs,
            layer_norm=args.layer_norm,
        )
        for _ in range(1 + args.twin_q)
    ).to(run.device)
    target_nets = copy.deepcopy(nets)
    net = nets[0]  # the network that acts and is evaluated
    share_observation_moments(nets, target_nets)
    optimizer = torch.optim.Adam(nets.parameters(), lr=args.learning_rate, fused=True)
    learn = run.compile(update)
    buffer = ReplayBuffer(args.buffer_size, obs_dim, act_dim)
    global_step, progress = restore(run, args, nets, target_nets, optimizer, buffer, rng)
    obs, _ = envs.reset(seed=args.seed + global_step)
    autoreset = np.zeros(args.num_envs, bool)  # envs whose next step only resets them
    ep_return = np.zeros(args.num_envs)
    ep_length = np.zeros(args.num_envs, int)

    def state() -> dict:
        """The checkpoint (detail 8), at this moment."""
        return checkpoint_state(nets, target_nets, optimizer, buffer, progress, rng)

    def evaluate_policy(video_dir: Path | None) -> list[float]:
        """The deterministic policy's returns (detail 7)."""
        return evaluate(net, args.env_id, args.eval_episodes, args.seed, run.device, video_dir)

    with run.start(global_step, args.total_steps, state=state, evaluate=evaluate_policy):
        while global_step < args.total_steps and not run.stop:
            # 1. act
            if global_step < args.learning_starts:
                actions = rng.uniform(-1.0, 1.0, (args.num_envs, act_dim)).astype(np.float32)
            else:
                with torch.inference_mode():
                    _, mu, _, _ = net(run.to_device(obs).float())
                sigma = noise_scale(args, global_step)
                noise, progress.ou_state = exploration_noise(
                    args.noise, progress.ou_state, sigma, rng
                )
                actions = np.clip(mu.cpu().numpy() + noise, -1.0, 1.0).astype(np.float32)
            # the env ignores an autoreset step's action: a new episode's noise starts at 0
            progress.ou_state[autoreset] = 0.0

            # 2. step and store
            obs, rewards, _, _, done = step_and_store(envs, buffer, obs, actions, autoreset)
            if args.normalize_obs:
                net.observe(obs)
            ep_return += rewards * ~autoreset  # a reset step belongs to no episode
            ep_length += ~autoreset
            autoreset = done
            previous_step = global_step
            global_step += args.num_envs
            for i in np.flatnonzero(done):
                run.episode(global_step, ep_return[i], ep_length[i])
                ep_return[i] = 0.0
                ep_length[i] = 0

            # 3. learn
            if global_step >= args.learning_starts and buffer.size >= args.batch_size:
                for _ in range(args.updates_per_step * args.num_envs):
                    batch = buffer.sample(args.batch_size, rng)
                    batch = {k: run.to_device(v) for k, v in batch.items()}
                    run.graph_step()
                    loss, td, q = learn(nets, target_nets, optimizer, batch, args)
                    progress.num_updates += 1
                run.check_finite(loss, global_step)
                if Run.every(global_step, previous_step, 100):  # as CleanRL
                    run.log(global_step, {"losses/td_loss": td, "losses/q_values": q.mean()})

            # 4. log
            due = Run.every(global_step, previous_step, 1000)
            if due or global_step >= args.total_steps or run.stop:
                charts = {"charts/SPS": run.sps(global_step)}
                charts["charts/learning_rate"] = args.learning_rate
                run.log(global_step, charts)
            run.end_iteration(global_step)
        envs.close()
        run.finish(global_step, num_updates=progress.num_updates)


# ---------------------------------------------------------------- checks, checkpoints, evaluation
# Checkpoint key prefixes of the acting network and its twin (deviation h).
NET_KEYS = ("", "twin_")
# The Args fields, besides hidden_dim, that NAFNetwork takes.
NET_OPTIONS = ("head_init_scale", "normalize_obs", "layer_norm")


def check_args(args: Args) -> list[tuple[bool, str]]:
    """The file's own argument checks, as (condition, message) rows for Run."""
    positive = "num_envs batch_size hidden_dim updates_per_step learning_rate head_init_scale"
    non_negative = "learning_starts noise_scale final_noise_scale noise_decay_steps max_grad_norm"
    non_negative += " curvature_floor pre_tanh_penalty target_noise"
    rows = [(getattr(args, k) > 0, f"--{k} must be positive") for k in positive.split()]
    # `or 0`: None is allowed
    rows += [((getattr(args, k) or 0) >= 0, f"--{k} must be >= 0") for k in non_negative.split()]
    rows += [
        (args.buffer_size >= args.batch_size, "--buffer-size must be at least --batch-size"),
        (0 < args.tau <= 1, "--tau must be in (0, 1]"),
        (0 <= args.gamma <= 1, "--gamma must be in [0, 1]"),
    ]
    return [(ok, message.replace("_", "-")) for ok, message in rows]


@dataclass
class Progress:
    """What a checkpoint keeps of the loop besides the networks and the replay: the OU noise
    state [num_envs, |A|] and the gradient updates done."""

    ou_state: np.ndarray
    num_updates: int


def checkpoint_state(nets, target_nets, optimizer, buffer, progress: Progress, rng) -> dict:
    """Detail 8's checkpoint: networks, optimizer, replay, OU state and generators."""
    state = {"num_updates": progress.num_updates, "optimizer": optimizer.state_dict()}
    for prefix, net, target_net in zip(NET_KEYS, nets, target_nets):
        state[prefix + "net"] = net.state_dict()
        state[prefix + "target_net"] = target_net.state_dict()
    state["replay_buffer"] = buffer.state_dict()
    state["ou_state"] = torch.from_numpy(progress.ou_state.copy())
    state["rng"] = Run.rng_state(torch=torch.default_generator, numpy=rng)
    return state


def restore(run: Run, args, nets, target_nets, optimizer, buffer, rng) -> tuple[int, Progress]:
    """--resume's checkpoint loaded into the learner: its global step and progress; a fresh
    start without one."""
    same = ("hidden_dim", "num_envs", "buffer_size", "normalize_obs", "twin_q", "layer_norm")
    ckpt = run.resume_checkpoint(same)
    if ckpt is None:
        return 0, Progress(np.zeros((args.num_envs, nets[0].act_dim)), 0)
    for prefix, net, target_net in zip(NET_KEYS, nets, target_nets):
        net.load_state_dict(ckpt[prefix + "net"])
        target_net.load_state_dict(ckpt[prefix + "target_net"])
    optimizer.load_state_dict(ckpt["optimizer"])
    buffer.load_state_dict(ckpt["replay_buffer"])
    Run.set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    progress = Progress(ckpt["ou_state"].numpy().copy(), ckpt["num_updates"])
    return ckpt["global_step"], progress


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """gym.make; unknown ids and spaces naf.py cannot use stop with one line."""
    if env_id not in gym.registry and importlib.util.find_spec("ale_py"):
        # Atari ids, refused below
        gym.register_envs(importlib.import_module("ale_py"))
    try:
        env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
    except Exception as e:  # unknown id, missing module or dependency
        raise Run.fail(f"cannot make environment {env_id!r} ({str(e).splitlines()[0]})")
    obs_space = env.observation_space
    act_space = env.action_space
    problem = None
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
        raise Run.fail(f"{env_id} {problem}")
    return env


def evaluate(net, env_id, episodes, seed, device, video_dir=None) -> list[float]:
    """Deterministic returns, u = mu(x), episode i seeded seed + 10_000 + i (detail 7)."""
    env = make_env(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, str(video_dir), lambda _: True, disable_logger=True)
    low = env.action_space.low
    high = env.action_space.high
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done = False
        total = 0.0
        while not done:
            with torch.inference_mode():
                _, mu, _, _ = net(torch.as_tensor(obs[None], device=device).float())
            action = scale_action(mu[0].cpu().numpy(), low, high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def eval_only(args: Args, run: Run) -> None:
    """--checkpoint evaluated with its own env, network and seed: the run's final evaluation
    again."""
    ckpt = Run.load_checkpoint(args.checkpoint)
    saved = ckpt["args"]
    with make_env(ckpt["env_id"]) as env:  # its spaces size the network
        obs_dim = int(np.prod(env.observation_space.shape))
        act_dim = env.action_space.shape[0]
    options = {k: saved[k] for k in NET_OPTIONS if k in saved}
    net = NAFNetwork(obs_dim, act_dim, saved["hidden_dim"], **options).to(run.device)
    net.load_state_dict(ckpt["net"])
    returns = evaluate(
        net, ckpt["env_id"], args.eval_episodes, saved["seed"], run.device, run.video_dir
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
