"""PPO for Atari: Proximal Policy Optimization with the Nature CNN on pixels.

Paper: J. Schulman, F. Wolski, P. Dhariwal, A. Radford, O. Klimov, "Proximal Policy Optimization
Algorithms", 2017, arXiv:1707.06347. Advantages: J. Schulman et al., "High-Dimensional Continuous
Control Using Generalized Advantage Estimation", 2015, arXiv:1506.02438. Peer implementation:
CleanRL `ppo_atari.py` (Huang et al. 2022, "The 37 Implementation Details of Proximal Policy
Optimization"), whose hyperparameters are the defaults here.

Idea: collect T steps from N environments with the current policy pi_old, estimate advantages with
GAE, then take several epochs of minibatch gradient steps on a clipped surrogate that keeps the new
policy pi_theta close to pi_old, so one batch of data can be reused safely.

Equations (r_t(theta) = pi_theta(a_t|s_t) / pi_old(a_t|s_t)):
    delta_t = r_t + gamma * (1 - term_t) * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lambda * (1 - end_t) * A_{t+1}            (GAE, eq. 11-12)
    L_clip  = E[ min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t) ]        (PPO eq. 7)
    L_V     = 1/2 E[ max((V - R_t)^2, (V_old + clip(V - V_old, -eps, eps) - R_t)^2) ]
    loss    = -L_clip + c1 L_V - c2 H[pi_theta]                          (PPO eq. 9)

Implementation details:
 1. Environments: ale_py's C++ `AtariVectorEnv` (threads), standard preprocessing: up to 30 no-ops
    on reset, frame skip 4 with max-pool, 84x84 grayscale, a stack of `--frame-stack` frames (4;
    1 is the memoryless baseline of recurrent PPO) padded with zero frames after a reset.
    `<Game>NoFrameskip-v4`: no sticky actions (DQN/PPO literature); `ALE/<Game>-v5`: sticky actions
    0.25 (Machado et al. 2018). <Game> is any ROM ale_py ships, named as Gymnasium names it
    (ms_pacman -> MsPacman, tic_tac_toe_3d -> TicTacToe3D). Other ids stop with a hint.
 2. Rewards for learning are sign-clipped; `charts/episodic_return` is the unclipped score of the
    whole game (all lives), comparable with published numbers. `charts/episodic_length` counts agent
    steps (each is 4 frames).
 3. Life and FIRE protocol (`--protocol`; auto = baselines for NoFrameskip-v4, machado for v5):
    - baselines (OpenAI baselines / CleanRL's EpisodicLife + FireReset, with which the published
      NoFrameskip-v4 scores were made): in games with FIRE, FIRE is pressed at reset and, as the
      next agent step, after each lost life; a lost life ends the GAE chain and is terminal for
      learning. Compared with CleanRL's curve in results/breakout-protocol/report.md.
    - machado (Machado et al. 2018): no FIRE and no life signal; only a game over is terminal.
    Neither resets the game at a lost life, so the logged score and evaluation are whole games.
    Deviation: the forced FIRE step is not the policy's choice, so it is left out of the policy
    loss (its value target still trains V); it counts as an agent step (one per life), and in the
    entropy, advantage statistics, approx_kl and clipfrac (recurrent_ppo_atari.py masks it there).
 4. Deviation: time-limit truncation (`--max-episode-frames`, 108,000 frames = 30 min) bootstraps
    from V(final observation); CleanRL's PPO treats it as terminal, a known open problem there.
    Autoreset mode SameStep: the step that ends an episode returns the reset observation and the
    real last one in `info["final_obs"]`, so no transition crosses an episode boundary.
 5. Nature CNN with orthogonal init (gain sqrt 2 body, 0.01 policy head, 1 value head), shared
    trunk, uint8 frames divided by 255 inside the network, on a copy (the caller's tensor is kept).
 6. Adam eps 1e-5, lr 2.5e-4 annealed linearly, lr = 2.5e-4 (1 - step / H), 4 epochs of 4
    minibatches, advantages normalised per minibatch, clipped value loss, global grad-norm 0.5,
    optional early stop of the epochs when the approximate KL exceeds `--target-kl`.
    The horizon H is the run's own (`--schedule-steps`, by default the first run's steps rounded
    down to whole rollouts) and is kept in the checkpoint, so a resume continues the same schedule.
    Running past H is refused rather than guessed (lr 0 would waste the compute, a stretched H
    would make the rate jump up): pass --schedule-steps to re-plan it, or --no-anneal-lr.
 7. Speed: channels_last convolutions, fused Adam, `torch.inference_mode()` for acting,
    preallocated uint8 rollout storage, V(final_obs) computed only for truncated envs; on a GPU the
    action copy is the only wait per step (pinned staging). `--compile` compiles acting, GAE and
    the update step (CUDA graphs on a GPU); off by default: not yet measured to win on a GPU.
 8. Evaluation: the sampled policy, as the literature's PPO scores are measured (a greedy Breakout
    agent may never press FIRE and run to the frame limit), drawn from evaluation's own generator
    (seeded seed + 10_000; game i is seeded seed + 10_000 + i), so evaluating never moves the
    training generators and `--eval-only` repeats the run's own final evaluation (with the env,
    seed, frame limit, frame stack and protocol of the checkpoint). Full games under the same
    protocol; `eval_capped_games` counts games cut by the frame limit. `--capture-video` records
    one extra game (`eval_video_return`) with gymnasium's AtariPreprocessing + RecordVideo (the
    vector env does not render), its frames stacked as the vector env stacks them.
 9. Checkpoints also hold the anneal horizon H and the minibatch-order generator, but not the
    emulators: a resumed run restarts its games (seeded seed + step).

Usage: python ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-steps 10000000
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import random
import re
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
import tyro
from ale_py import Action
from ale_py.env import AtariEnv
from ale_py.roms import get_all_rom_ids
from ale_py.vector_env import AtariVectorEnv
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    env_id: str = "BreakoutNoFrameskip-v4"
    """<Game>NoFrameskip-v4, or ALE/<Game>-v5 (sticky actions)"""
    protocol: Literal["auto", "baselines", "machado"] = "auto"
    """life and FIRE protocol (detail 3); auto: baselines for v4 ids, machado for v5"""
    seed: int = 1
    """seed of torch and the games"""
    total_steps: int = 10_000_000
    """agent steps summed over environments (4 frames each)"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: cuda if available"""
    compile: bool = False
    """torch.compile acting, GAE and the updates (CUDA graphs on a GPU)"""
    exp_name: str = Path(__file__).stem
    """part of the run dir's name"""
    run_dir: str | None = None
    """default: runs/<env>__<exp>__<seed>__<time>"""
    checkpoint_interval: int = 500_000
    """env steps between checkpoints (0: at the end only)"""
    resume: str | None = None
    """checkpoint of a run to continue"""
    eval_episodes: int = 10
    """games per evaluation"""
    eval_interval: int = 0
    """env steps between evaluations (0: at the end only)"""
    eval_only: bool = False
    """only evaluate --checkpoint, as its run's final evaluation"""
    checkpoint: str | None = None
    """checkpoint for --eval-only"""
    capture_video: bool = False
    """record a game of the final evaluation to <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """W&B project"""
    max_episode_frames: int = 108_000
    """emulator frames after which a game is truncated"""
    frame_stack: int = 4
    """frames per observation"""

    # PPO (CleanRL defaults)
    num_envs: int = 8
    """parallel environments N"""
    num_steps: int = 128
    """steps per environment per rollout T"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 at --schedule-steps"""
    schedule_steps: int | None = None
    """step where the annealed lr reaches 0 (default: the first run's last step)"""
    gamma: float = 0.99
    """discount factor gamma"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """epochs K over each rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.1
    """surrogate clipping epsilon"""
    clip_vloss: bool = True
    """clip the value loss around the old values"""
    ent_coef: float = 0.01
    """entropy coefficient c2"""
    vf_coef: float = 0.5
    """value loss coefficient c1"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    target_kl: float | None = None
    """stop the epochs early when the approximate KL exceeds this"""


# ---------------------------------------------------------------- environment
def atari_games() -> dict[str, str]:
    """Game names as Gymnasium's ids spell them -> ale_py's ROM ids, for every ROM it ships."""
    return {rom.title().replace("_", ""): rom for rom in get_all_rom_ids()}


def atari_protocol(env_id: str) -> tuple[str, float]:
    """(ROM id, sticky-action probability) of an env id (detail 1); others stop in one line."""
    games = atari_games()
    for pattern, sticky in ((r"(\w+)NoFrameskip-v4", 0.0), (r"ALE/(\w+)-v5", 0.25)):
        if (match := re.fullmatch(pattern, env_id)) and match[1] in games:
            return games[match[1]], sticky
    raise fail(not_atari(env_id, games))


def resolve_protocol(protocol: str, env_id: str) -> str:
    """The life and FIRE protocol of detail 3: `auto` follows the id's literature."""
    if protocol != "auto":
        return protocol
    return "baselines" if env_id.endswith("NoFrameskip-v4") else "machado"


def atari_settings(run: dict) -> dict:
    """make_envs' keywords for a run's flags (details 1 and 3)."""
    game, sticky = atari_protocol(run["env_id"])
    baselines = resolve_protocol(run["protocol"], run["env_id"]) == "baselines"
    frames, stack = run["max_episode_frames"], run["frame_stack"]
    return dict(game=game, sticky=sticky, max_frames=frames, frame_stack=stack, baselines=baselines)


def make_envs(
    num_envs: int, game: str, sticky: float, max_frames: int, frame_stack: int, baselines: bool
) -> AtariVectorEnv:
    # Raw rewards (clipped for learning only, to keep the score) and no life-loss episodes (lives
    # are read from info["lives"]), so a game over can be told apart from a lost life.
    envs = AtariVectorEnv(
        game,
        num_envs,
        repeat_action_probability=sticky,
        max_num_frames_per_episode=max_frames,
        stack_num=frame_stack,
        reward_clipping=False,
        episodic_life=False,
        life_loss_info=False,
        autoreset_mode="SameStep",
        use_fire_reset=baselines,
    )
    action_set = list(envs.ale.get_action_set())
    has_fire = baselines and Action.FIRE in action_set
    envs.fire = action_set.index(Action.FIRE) if has_fire else None  # pressed after a lost life
    return envs


def make_env(atari: dict, video_dir: Path) -> gym.Env:
    """One game recorded to mp4 (the vector env cannot render), preprocessed as make_envs does."""
    env = AtariEnv(
        atari["game"],
        frameskip=1,
        repeat_action_probability=atari["sticky"],
        max_num_frames_per_episode=atari["max_frames"],
        render_mode="rgb_array",
    )
    # AtariPreprocessing's defaults are the vector env's: 30 no-ops, skip 4, 84x84 grayscale
    env = gym.wrappers.AtariPreprocessing(env)
    return gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True)


# ---------------------------------------------------------------- network
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature CNN trunk (Mnih et al. 2015) shared by the policy and value heads."""

    def __init__(self, num_actions: int, frame_stack: int = 4):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(frame_stack, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 frames (B, frame_stack, 84, 84) -> policy logits (B, A), values (B,)."""
        # copy=True: scaling in place then touches only our copy, never the caller's tensor
        x = obs.to(torch.float32, memory_format=torch.channels_last, copy=True).mul_(1.0 / 255.0)
        hidden = self.network(x)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


# ---------------------------------------------------------------- PPO math
def learning_flags(terminated, truncated, lives, prev_lives, baselines: bool):
    """(terminal, truncation, life lost) for learning from one vector step (numpy bool arrays)."""
    # A lost life is terminal under baselines only (the game goes on); a game over at the time limit
    # is terminal. After a game ends `lives` is the new game's: compared only where none ended.
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    return terminated | (life_lost & baselines), truncated & ~terminated, life_lost


@torch.inference_mode()
def step_targets(agent, terminated, truncated, info: dict, prev_lives, baselines: bool, device):
    """learning_flags, and V(real final obs) where truncated (else 0), of one vector step."""
    # Autoreset SameStep: an ended env returns the new game's observation, so the bootstrap value
    # comes from info["final_obs"]; it is computed only for the (rare) cut envs.
    terminal, cut, lost = learning_flags(
        terminated, truncated, info["lives"], prev_lives, baselines
    )
    trunc_value = torch.zeros(len(cut), device=device)
    if cut.any():
        idx = np.flatnonzero(cut)
        final_obs = torch.from_numpy(info["final_obs"][idx]).to(device)
        trunc_value[torch.from_numpy(idx).to(device)] = agent(final_obs)[1]
    return terminal, cut, lost, trunc_value


def gae(rewards, values, next_value, terminals, truncations, truncation_values, gamma, gae_lambda):
    """Advantages A_t and returns R_t = A_t + V(s_t), all (T, N); next_value V(s_T) is (N,)."""
    # terminals: 1 where V(s_{t+1}) is 0 for learning (game over, lost life). truncations: 1 where
    # the time limit cut the episode; V(s_{t+1}) is then truncation_values (V of the real final
    # observation), not values[t + 1] (a new game's). Either ends the GAE chain.
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(truncations.bool(), truncation_values, next_values)
    deltas = rewards + gamma * (1.0 - terminals) * next_values - values
    carry = 1.0 - torch.maximum(terminals, truncations)
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):  # one vector op per step, over N envs
        last = deltas[t] + gamma * gae_lambda * carry[t] * last
        advantages[t] = last
    return advantages, advantages + values


def ppo_losses(
    logprob, old_logprob, advantages, value, old_value, returns, clip_coef, clip_vloss, acted=None
):
    """-L_clip, L_V, approximate KL and clip fraction (eq. 7 and 9)."""
    # the policy loss averages over the steps the policy chose: `acted` is 0 at detail 3's FIRE
    log_ratio = logprob - old_logprob
    ratio = log_ratio.exp()
    acted = torch.ones_like(ratio) if acted is None else acted
    clipped_ratio = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    pg_losses = torch.max(-advantages * ratio, -advantages * clipped_ratio)
    pg_loss = (pg_losses * acted).sum() / acted.sum().clamp(min=1)
    v_loss = (value - returns) ** 2
    if clip_vloss:
        v_clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        v_loss = torch.max(v_loss, (v_clipped - returns) ** 2)
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # k3 estimator (Schulman, "Approximating KL")
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return pg_loss, 0.5 * v_loss.mean(), approx_kl, clipfrac


class Rollout:
    """Storage of T steps of N envs and the acting state carried from one rollout to the next."""

    def __init__(self, envs, T: int, N: int, frame_stack: int, device, seed: int):
        self.obs = torch.zeros((T, N, frame_stack, 84, 84), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((T, N), dtype=torch.long, device=device)
        self.logprobs, self.values, self.trunc_values = torch.zeros((3, T, N), device=device)
        # Host memory, pinned on a GPU: the copies to the device need not wait. Each is done before
        # its buffer is written again (the next action copy, or reading the losses, waits for it).
        cuda = device.type == "cuda"
        self.host = torch.zeros((4, T, N), pin_memory=cuda)
        self.rewards, self.terminals, self.truncations, self.acted = self.host.numpy()
        self.staging = torch.empty((N, frame_stack, 84, 84), dtype=torch.uint8, pin_memory=cuda)
        self.forced = torch.zeros(N, dtype=torch.bool, pin_memory=cuda)  # FIRE is due (detail 3)
        next_obs, info = envs.reset(seed=seed)
        self.next_obs, self.lives = self.upload(next_obs), info["lives"]
        self.ep_return, self.ep_length = np.zeros(N), np.zeros(N, dtype=np.int64)

    def upload(self, obs):
        return self.staging.copy_(torch.from_numpy(obs)).to(self.obs.device, non_blocking=True)

    @torch.inference_mode()
    def collect(self, act, agent: Agent, envs, global_step: int, log, baselines: bool) -> int:
        """T steps of every env, acting by `act` (agent, or compiled); the new global step."""
        device = self.obs.device
        for t in range(len(self.obs)):
            self.obs[t], forced = self.next_obs, self.forced.to(device, non_blocking=True)
            logits, self.values[t] = act(self.next_obs)
            dist = Categorical(logits=logits, validate_args=False)  # NaNs: caught after the update
            # detail 3: FIRE after a lost life, not the policy's choice
            action = torch.where(forced, envs.fire or 0, dist.sample())
            self.actions[t], self.logprobs[t] = action, dist.log_prob(action)
            self.acted[t] = ~self.forced.numpy()
            next_obs, reward, term, trunc, info = envs.step(action.cpu().numpy())
            global_step += len(reward)
            flags = step_targets(agent, term, trunc, info, self.lives, baselines, device)
            self.terminals[t], self.truncations[t], lost, self.trunc_values[t] = flags
            self.lives = info["lives"]
            self.forced[:] = torch.from_numpy(lost & (envs.fire is not None))
            self.rewards[t] = np.sign(reward)  # clipped (Mnih et al. 2015)
            self.next_obs = self.upload(next_obs)
            self.ep_return, self.ep_length = self.ep_return + reward, self.ep_length + 1
            for i in np.flatnonzero(term | trunc):
                log.episode(global_step, self.ep_return[i], self.ep_length[i])
                self.ep_return[i], self.ep_length[i] = 0.0, 0
        return global_step

    @torch.inference_mode()
    def batch(self, act, gae, gamma: float, gae_lambda: float) -> dict:
        """GAE over the rollout, and the rollout flattened to T N rows for update()."""
        rewards, terminals, cuts, acted = self.host.to(self.obs.device, non_blocking=True)
        next_value = act(self.next_obs)[1]
        advantages, returns = gae(
            rewards, self.values, next_value, terminals, cuts, self.trunc_values, gamma, gae_lambda
        )
        batch = dict(obs=self.obs, actions=self.actions, logprobs=self.logprobs, values=self.values)
        # cloned: CUDA graphs would overwrite a compiled gae's outputs at its next call
        batch |= dict(advantages=advantages.clone(), returns=returns.clone(), acted=acted)
        return {k: v.flatten(0, 1) for k, v in batch.items()}


def ppo_step(agent: Agent, optimizer, mb: dict, args: Args) -> torch.Tensor:
    """One gradient step on the PPO loss (eq. 9) of minibatch `mb`; its losses, stacked."""
    logits, value = agent(mb["obs"])
    dist = Categorical(logits=logits, validate_args=False)  # NaNs: caught after the update
    logprob, entropy = dist.log_prob(mb["actions"]), dist.entropy().mean()
    A, old, R = mb["advantages"], mb["logprobs"], mb["returns"]
    A = (A - A.mean()) / (A.std() + 1e-8) if args.norm_adv else A
    pg_loss, v_loss, approx_kl, clipfrac = ppo_losses(
        logprob, old, A, value, mb["values"], R, args.clip_coef, args.clip_vloss, mb["acted"]
    )
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return torch.stack([loss, v_loss, pg_loss, entropy, approx_kl, clipfrac]).detach()


LOGGED = ("value_loss", "policy_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")


def update(step, batch: dict, generator: torch.Generator, args: Args) -> torch.Tensor:
    """K epochs of `step` (ppo_step, or compiled) on minibatches: the total loss, then LOGGED."""
    # minibatch order drawn from `generator`; logged: the last minibatch's losses, the epochs' mean
    # clip fraction and the explained variance of the rollout's values
    batch_size, stats = len(batch["actions"]), []
    for epoch in range(args.update_epochs):
        order = torch.randperm(batch_size, generator=generator).to(batch["actions"].device)
        for rows in order.split(batch_size // args.num_minibatches):
            # compiled: its outputs are kept (copied), so a new CUDA graph step (not in eager mode:
            # its first call imports Inductor, seconds)
            if args.compile:
                torch.compiler.cudagraph_mark_step_begin()
            stats.append(step({k: v[rows] for k, v in batch.items()}).clone())
        # (waits for the device)
        if args.target_kl is not None and stats[-1][4] > args.target_kl:
            break
    stats = torch.stack(stats)
    R, var_R = batch["returns"], batch["returns"].var()
    explained = torch.where(var_R > 0, 1 - (R - batch["values"]).var() / var_R, torch.nan)
    return torch.cat([stats[-1, :5], stats[:, 5].mean().view(1), explained.view(1)])


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    check_args(args)
    if args.eval_only:
        return eval_only(args)
    atari = atari_settings(asdict(args))
    device = seed_and_pick_device(args)
    T, N = args.num_steps, args.num_envs
    total = args.total_steps // (T * N) * T * N  # whole rollouts
    envs = make_envs(N, **atari)
    agent = Agent(int(envs.single_action_space.n), args.frame_stack)
    agent = agent.to(device, memory_format=torch.channels_last)
    # a tensor: no recompile as it anneals
    lr = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, fused=True)
    generator = torch.Generator().manual_seed(args.seed)  # minibatch order
    global_step, iteration, horizon = restore(args, agent, optimizer, generator, total)
    act, gae_fn = compiled(agent, args, device), compiled(gae, args, device)
    step = compiled(partial(ppo_step, agent, optimizer, args=args), args, device)
    # fresh games after a resume
    ro = Rollout(envs, T, N, args.frame_stack, device, seed=args.seed + global_step)
    stop = stop_signal()
    eval_seed = args.seed + 10_000  # detail 8
    evaluate_policy = partial(evaluate, agent, atari, args.eval_episodes, eval_seed, device, stop)

    def state() -> dict:
        return checkpoint_state(agent, optimizer, iteration, horizon, generator)

    protocol = resolve_protocol(args.protocol, args.env_id)
    about = dict(game=atari["game"], repeat_action_probability=atari["sticky"], protocol=protocol)
    run_dir, resumed = run_dir_for(args, args.resume), args.resume is not None
    with RunLogger(
        args, run_dir, global_step, total, resumed, resolved_device=str(device), **about
    ) as log:
        while global_step < total and not stop:
            iteration += 1
            # detail 6: lr = lr_0 (1 - step / H)
            rate = args.learning_rate * (1.0 - global_step / horizon if args.anneal_lr else 1.0)
            # (after a resume the group holds the checkpoint's lr)
            optimizer.param_groups[0]["lr"] = lr.fill_(rate)
            global_step = ro.collect(act, agent, envs, global_step, log, atari["baselines"])
            batch = ro.batch(act, gae_fn, args.gamma, args.gae_lambda)
            stats = update(step, batch, generator, args)
            log.check_finite(stats[0], global_step)
            losses = {"losses/" + k: v for k, v in zip(LOGGED, stats[1:].tolist())}
            losses |= {"charts/learning_rate": rate, "charts/SPS": log.sps(global_step)}
            log.scalars(global_step, losses)
            log.end_iteration(global_step, stop, evaluate_policy, state)
        envs.close()
        log.finish(global_step, stop, evaluate_policy, state, **about)


# ---------------------------------------------------------------- the file's own plumbing
POSITIVE = ("num-envs", "num-steps", "num-minibatches", "update-epochs", "learning-rate")
POSITIVE += ("clip-coef", "max-grad-norm", "max-episode-frames", "frame-stack")


def check_args(args: Args) -> None:
    flags = {k.replace("_", "-"): v for k, v in asdict(args).items()}
    batch_size = args.num_envs * args.num_steps
    rows = [(flags[k] > 0, f"--{k} must be positive, got {flags[k]}") for k in POSITIVE]
    for k in ("gamma", "gae-lambda"):
        rows.append((0 <= flags[k] <= 1, f"--{k} must be in [0, 1], got {flags[k]}"))
    divides = batch_size % max(args.num_minibatches, 1) == 0
    rows.append((divides, f"a rollout ({batch_size} steps) is not divisible by --num-minibatches"))
    enough = args.eval_only or args.total_steps >= batch_size
    rows.append((enough, f"--total-steps is less than one rollout ({batch_size} steps); raise it"))
    check_flags(args, rows)


def not_atari(env_id: str, games: dict[str, str]) -> str:
    """Why `env_id` is not an Atari id this file plays, and what to pass instead."""
    match = re.fullmatch(r"(ALE/)?(\w+?)(-ram)?(NoFrameskip|Deterministic)?-v\d+", env_id)
    ale, game, ram, skip = match.groups() if match else (None, None, None, None)
    if game in games:
        what = "RAM observations are" if ram else "this variant is"
        return f"{env_id}: {what} not supported; use {game}NoFrameskip-v4 or ALE/{game}-v5"
    if ale or skip:
        close = difflib.get_close_matches(game, games, n=1)
        hint = f"did you mean {env_id.replace(game, close[0])}?" if close else "see ale_py.roms"
        return f"unknown Atari game {game!r}: ale_py has no such ROM; {hint}"
    try:
        env = gym.make(env_id)
    except Exception:
        return f"unknown environment id {env_id!r}; use e.g. BreakoutNoFrameskip-v4"
    env.close()
    if isinstance(env.action_space, gym.spaces.Box):
        return f"{env_id} has continuous actions; use d4pg.py, naf.py or rlpd.py"
    if len(env.observation_space.shape or ()) == 1:
        return f"{env_id} has vector observations; use ppg.py"
    return f"{env_id} is not an Atari game; use <Game>NoFrameskip-v4 or ALE/<Game>-v5"


def checkpoint_state(agent, optimizer, iteration: int, horizon: int, generator) -> dict:
    rng = rng_state(torch=torch.default_generator, minibatch=generator)
    model = {"agent": agent.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng}
    return {"iteration": iteration, "schedule_steps": horizon, **model}


def restore(args: Args, agent, optimizer, generator, total: int) -> tuple[int, int, int]:
    """(global_step, iteration, anneal horizon H of detail 6), from --resume's checkpoint if any."""
    ckpt = None
    if args.resume:
        ckpt = resume_checkpoint(args, same=("num_envs", "num_steps", "frame_stack", "protocol"))
    if args.schedule_steps is not None:
        horizon, source = args.schedule_steps, "set by --schedule-steps"
    elif ckpt is not None:
        horizon, source = ckpt["schedule_steps"], "the schedule of the checkpoint"
    else:
        horizon, source = total, "this run's steps"
    if args.anneal_lr and horizon < total:
        raise fail(
            f"--total-steps {args.total_steps} runs past the lr anneal's end at step {horizon} "
            f"({source}); pass --schedule-steps {total} (or more), or --no-anneal-lr"
        )
    if ckpt is None:
        return 0, 0, horizon
    agent.load_state_dict(ckpt["agent"])
    optimizer.load_state_dict(ckpt["optimizer"])
    set_rng_state(ckpt["rng"], torch=torch.default_generator, minibatch=generator)
    return ckpt["global_step"], ckpt["iteration"], horizon


def sample_actions(agent: Agent, obs: np.ndarray, device, generator: torch.Generator) -> np.ndarray:
    """a ~ pi(.|s) (detail 8), drawn on the CPU from evaluation's own generator."""
    with torch.inference_mode():
        logits, _ = agent(torch.as_tensor(obs, device=device))
    probs = logits.float().softmax(-1).cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(1).numpy()


def evaluate(agent: Agent, atari: dict, episodes: int, seed: int, device, stop=(), video_dir=None):
    """Unclipped scores of full games of the sampled policy (detail 8), and how many were capped."""
    # game i is seeded seed + i; a signal (`stop`) cuts the evaluation short
    envs = make_envs(episodes, **atari)
    obs, info = envs.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    scores, (finished, capped, forced) = np.zeros(episodes), np.zeros((3, episodes), bool)
    while not finished.all() and not stop:
        actions = sample_actions(agent, obs, device, generator)
        if forced.any():  # detail 3 (baselines: FIRE after a lost life; never under machado)
            actions[forced] = envs.fire
        lives = info["lives"]
        obs, reward, term, trunc, info = envs.step(actions)
        forced = (info["lives"] < lives) & ~(term | trunc) & (envs.fire is not None)
        scores += reward * ~finished  # games that ended keep running; ignore them
        capped |= trunc & ~term & ~finished
        finished |= term | trunc
    envs.close()
    extra = {"eval_capped_games": int(capped.sum())}
    if video_dir is not None and not stop:
        extra["eval_video_return"] = record_video(agent, atari, video_dir, seed + 10_000, device)
    return scores.tolist(), extra


def record_video(agent: Agent, atari: dict, video_dir: Path, seed: int, device) -> float:
    """One game of the sampled policy, to mp4; its score."""
    # frames stacked as the vector env stacks them: zero padding, the first real one after FIRE
    env = make_env(atari, video_dir)
    frame, info = env.reset(seed=seed)
    meanings = env.unwrapped.get_action_meanings()
    fire = meanings.index("FIRE") if atari["baselines"] and "FIRE" in meanings else None
    if fire is not None:  # as use_fire_reset in the vector env
        frame, _, _, _, info = env.step(fire)
    stack = np.zeros((1, atari["frame_stack"], 84, 84), dtype=np.uint8)
    generator, score, done, forced = torch.Generator().manual_seed(seed), 0.0, False, False
    while not done:
        stack = np.concatenate([stack[:, 1:], frame[None, None]], axis=1)
        action, lives = int(sample_actions(agent, stack, device, generator)[0]), info["lives"]
        frame, reward, term, trunc, info = env.step(fire if forced else action)
        score, done = score + float(reward), term or trunc
        forced = fire is not None and info["lives"] < lives and not done
    env.close()
    return score


def eval_only(args: Args) -> None:
    """Repeat the final evaluation of --checkpoint's run: its env, seed, frame limit and stack."""
    ckpt, device = load_checkpoint(args.checkpoint), seed_and_pick_device(args)
    run = {"frame_stack": 4, "protocol": "auto", **ckpt["args"]}  # older checkpoints lack these
    agent = Agent(ckpt["agent"]["actor.weight"].shape[0], run["frame_stack"])
    agent.load_state_dict(ckpt["agent"])
    agent = agent.to(device, memory_format=torch.channels_last)
    video_dir = run_dir_for(args, args.checkpoint) / "videos" if args.capture_video else None
    seed = run["seed"] + 10_000  # the run's final evaluation (detail 8)
    result = evaluate(
        agent, atari_settings(run), args.eval_episodes, seed, device, video_dir=video_dir
    )
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
