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

# Harness calls above the run harness (class `Run`, at the bottom): Run(args, checks), run.device,
# run.stop, run.start/log/episode/sps/check_finite/end_iteration/finish, run.compile/graph_step,
# run.host_buffer/upload, run.resume_checkpoint, Run.fail/rng_state/set_rng_state, eval-only's own.


@dataclass
class Args:
    """PPO's flags (tyro): the common ones first, then the algorithm's; the module
    docstring at the top of ppo_atari.py gives the reasons for their defaults."""

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
        match = re.fullmatch(pattern, env_id)
        if match and match[1] in games:
            return games[match[1]], sticky
    raise Run.fail(not_atari(env_id, games))


def resolve_protocol(protocol: str, env_id: str) -> str:
    """The life and FIRE protocol of detail 3: `auto` follows the id's literature."""
    if protocol != "auto":
        return protocol
    return "baselines" if env_id.endswith("NoFrameskip-v4") else "machado"


def atari_settings(run: dict) -> dict:
    """make_envs' keywords for a run's flags (details 1 and 3)."""
    game, sticky = atari_protocol(run["env_id"])
    baselines = resolve_protocol(run["protocol"], run["env_id"]) == "baselines"
    return dict(
        game=game,
        sticky=sticky,
        max_frames=run["max_episode_frames"],
        frame_stack=run["frame_stack"],
        baselines=baselines,
    )


def make_envs(
    num_envs: int, game: str, sticky: float, max_frames: int, frame_stack: int, baselines: bool
) -> AtariVectorEnv:
    """ale_py's C++ vector env with detail 1's preprocessing; `envs.fire` is FIRE's action index
    under the baselines protocol in a game that has it, else None (detail 3)."""
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


def learning_flags(terminated, truncated, lives, prev_lives, baselines: bool):
    """(terminal, time-limit cut, life lost) of one vector step, numpy bool arrays (detail 3)."""
    # After a game ends `lives` is the new game's: only a drop within a game is a lost life.
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    # baselines: a lost life ends the return too
    terminal = terminated | (life_lost & baselines)
    # a game over at the time limit is terminal, not a cut
    cut = truncated & ~terminated
    return terminal, cut, life_lost


class LifeProtocol:
    """The vector env under detail 3's life and FIRE protocol (the wrapper the Atari files share).

    reset(seed) -> obs. step(actions) -> obs, reward, game ended, terminal, time-limit cut, and
    the real final observations where a game was cut (None when none was; detail 4's bootstrap).
    Between steps, per env: `forced`: the next step must be FIRE (baselines, after a lost life, in
    games with FIRE); step() presses it whatever action it is given. `lives`: the count.
    """

    def __init__(self, envs: AtariVectorEnv, baselines: bool):
        self.vec = envs
        self.baselines = baselines

    def reset(self, seed: int) -> np.ndarray:
        """New games (env i seeded seed + i); none is forced."""
        obs, info = self.vec.reset(seed=seed)
        self.lives = info["lives"]
        self.forced = np.zeros(len(obs), bool)
        return obs

    def step(self, actions: np.ndarray):
        """One agent step of every env -> obs, reward, ended, terminal, cut, final obs."""
        if self.forced.any():
            actions = np.where(self.forced, self.vec.fire, actions)
        obs, reward, term, trunc, info = self.vec.step(actions)
        terminal, cut, lost = learning_flags(term, trunc, info["lives"], self.lives, self.baselines)
        # Autoreset SameStep: an ended game returns the new game's first observation; its real
        # last one is in info["final_obs"]
        final = info["final_obs"] if cut.any() else None
        self.lives = info["lives"]
        self.forced = lost & (self.vec.fire is not None)
        return obs, reward, term | trunc, terminal, cut, final


# ---------------------------------------------------------------- network
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std` and constant biases (detail 5)."""
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
        hidden = self.network(x)  # [B, 512]
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


# ---------------------------------------------------------------- PPO math
def learning_rate(args: Args, global_step: int, horizon: int) -> float:
    """Detail 6: lr = lr_0 (1 - step / H), annealed linearly to 0 at the horizon H."""
    if not args.anneal_lr:
        return args.learning_rate
    return args.learning_rate * (1.0 - global_step / horizon)


@torch.inference_mode()
def bootstrap_values(agent: Agent, final_obs, cut, device) -> torch.Tensor:
    """V(real final observation) where the time limit cut the episode, else 0 (detail 4); (N,)."""
    # one forward pass, over the (rare) cut envs only
    values = torch.zeros(len(cut), device=device)
    if cut.any():
        idx = np.flatnonzero(cut)
        final = torch.from_numpy(final_obs[idx]).to(device)  # [cut envs, frame_stack, 84, 84]
        values[torch.from_numpy(idx).to(device)] = agent(final)[1]
    return values


def gae(rewards, values, next_value, terminals, truncations, truncation_values, gamma, gae_lambda):
    """GAE (Schulman et al. 2015, eq. 11-12): advantages A_t and returns R_t = A_t + V(s_t).

    All (T, N) but next_value, V(s_T) after the rollout's last step, (N,). terminals: 1 where
    V(s_{t+1}) is 0 for learning (game over, lost life); truncations: 1 where the time limit cut
    the episode. Either ends the chain of A_{t+1}.
    """
    # V(s_{t+1}): the next row, and V(s_T) after the last one  [T, N]
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    # deviation (detail 4): where the time limit cut the episode, s_{t+1} is the real final
    # observation (truncation_values), not values[t + 1], which is the new game's
    next_values = torch.where(truncations.bool(), truncation_values, next_values)
    # delta_t = r_t + gamma (1 - term_t) V(s_{t+1}) - V(s_t)  [T, N]
    deltas = rewards + gamma * (1.0 - terminals) * next_values - values
    # A_t = delta_t + gamma lambda (1 - end_t) A_{t+1}, backwards; one vector op per step over N
    carry = 1.0 - torch.maximum(terminals, truncations)
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)  # A_{t+1}  [N]
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * carry[t] * last
        advantages[t] = last
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, acted: torch.Tensor) -> torch.Tensor:
    """Mean over the steps the policy chose (acted 1.0; forced FIRE 0.0, detail 3).

    The forced-FIRE rule of this file: only the policy loss averages over the policy's own steps;
    the value loss, entropy, advantage normalisation, approx_kl and clipfrac keep every step
    (recurrent_ppo_atari.py masks those too)."""
    return (x * acted).sum() / acted.sum().clamp(min=1)


def ppo_losses(
    logprob, old_logprob, advantages, value, old_value, returns, clip_coef, clip_vloss, acted=None
) -> dict[str, torch.Tensor]:
    """-L_clip and L_V (eq. 7 and 9), and the approximate KL and clip fraction; 0-dim tensors."""
    # r_t(theta) = pi_theta(a_t|s_t) / pi_old(a_t|s_t)  [B]
    log_ratio = logprob - old_logprob
    ratio = log_ratio.exp()
    clipped_ratio = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    # -L_clip = E[-min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)]  (eq. 7)
    pg_losses = torch.max(-advantages * ratio, -advantages * clipped_ratio)
    policy_loss = pg_losses.mean()
    if acted is not None:  # deviation (detail 3): a forced FIRE is not the policy's choice
        policy_loss = masked_mean(pg_losses, acted)
    # L_V = E[(V(s_t) - R_t)^2]
    v_loss = (value - returns) ** 2
    if clip_vloss:  # detail 6 (baselines, CleanRL): V moves at most eps from V_old, as r_t does
        v_clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        v_loss = torch.max(v_loss, (v_clipped - returns) ** 2)
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # k3 estimator (Schulman, "Approximating KL")
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return {
        "policy_loss": policy_loss,
        "value_loss": 0.5 * v_loss.mean(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """1 - Var[R - V] / Var[R]: how much of the returns' variance V explains; NaN if R is flat."""
    var_returns = returns.var()
    return torch.where(var_returns > 0, 1 - (returns - values).var() / var_returns, torch.nan)


def mean_over_steps(history: list[dict[str, torch.Tensor]], key: str) -> torch.Tensor:
    """The mean of `key` over every minibatch step of an update."""
    # summed as a column of the (steps, stats) table, the order the logged value has always been
    # summed in: a contiguous mean of the same numbers adds them in another order (last-bit changes)
    table = torch.stack([torch.stack(list(step.values())) for step in history])  # [steps, stats]
    return table[:, list(history[0]).index(key)].mean()


class Rollout:
    """Storage of one rollout (T steps of N envs), and the acting state carried to the next."""

    def __init__(self, run: Run, T: int, N: int, frame_stack: int):
        device = run.device
        self.obs = torch.zeros((T, N, frame_stack, 84, 84), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((T, N), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((T, N), device=device)  # log pi_old(a_t|s_t)
        self.values = torch.zeros((T, N), device=device)  # V(s_t)
        self.trunc_values = torch.zeros((T, N), device=device)  # bootstrap_values, detail 4
        # Rewards and flags are born in numpy on the host: written through numpy views of one host
        # tensor (pinned on a GPU), which batch() moves to the device in one copy.
        self.host = run.host_buffer((4, T, N))
        self.rewards = self.host[0].numpy()  # sign-clipped (Mnih et al. 2015)
        self.terminals = self.host[1].numpy()  # 1: V(s_{t+1}) is 0 for learning
        self.truncations = self.host[2].numpy()  # 1: the time limit cut the episode
        self.acted = self.host[3].numpy()  # 0: detail 3's forced FIRE, not the policy's choice
        # Host buffers of what goes to the device at every step. Each copy from them is done before
        # they are written again: the action's copy back to the host waits for it.
        self.obs_staging = run.host_buffer((N, frame_stack, 84, 84), torch.uint8)
        self.forced_staging = run.host_buffer((N,), torch.bool)

    def restart(self, next_obs: torch.Tensor) -> None:
        """Fresh games (a new or a resumed run): their first observations, no episode under way."""
        self.next_obs = next_obs
        self.ep_return = np.zeros(len(next_obs))  # unclipped score of the game so far (detail 2)
        self.ep_length = np.zeros(len(next_obs), dtype=np.int64)

    @torch.inference_mode()
    def batch(self, act, gae_fn, gamma: float, gae_lambda: float, run: Run) -> dict:
        """GAE over the rollout, and the rollout flattened to T N rows for update()."""
        # the four host rows, [T, N] each
        rewards, terminals, truncations, acted = run.upload(self.host)
        next_value = act(self.next_obs)[1]  # V(s_T)  [N]
        advantages, returns = gae_fn(
            rewards=rewards,
            values=self.values,
            next_value=next_value,
            terminals=terminals,
            truncations=truncations,
            truncation_values=self.trunc_values,
            gamma=gamma,
            gae_lambda=gae_lambda,
        )
        batch = dict(obs=self.obs, actions=self.actions, logprobs=self.logprobs, values=self.values)
        # cloned: CUDA graphs would overwrite a compiled gae's outputs at its next call
        batch |= dict(advantages=advantages.clone(), returns=returns.clone(), acted=acted)
        return {k: v.flatten(0, 1) for k, v in batch.items()}  # [T, N, ...] -> [T N, ...]


@torch.inference_mode()
def collect(act, agent: Agent, envs: LifeProtocol, ro: Rollout, run: Run, global_step: int) -> int:
    """Fill `ro` with T steps of every env under pi_old (`act`: the agent, or compiled); returns
    the new global step."""
    for t in range(len(ro.obs)):
        ro.obs[t] = ro.next_obs
        ro.acted[t] = ~envs.forced  # 0 where detail 3 forces FIRE at this step
        forced = run.upload(ro.forced_staging.copy_(torch.from_numpy(envs.forced)))
        logits, ro.values[t] = act(ro.next_obs)
        dist = Categorical(logits=logits, validate_args=False)  # NaNs: caught after the update
        # a_t ~ pi_old(.|s_t); detail 3: FIRE after a lost life, not the policy's choice
        action = torch.where(forced, envs.vec.fire or 0, dist.sample())
        ro.actions[t] = action
        ro.logprobs[t] = dist.log_prob(action)
        obs, reward, ended, terminal, cut, final_obs = envs.step(action.cpu().numpy())
        global_step += len(reward)
        ro.trunc_values[t] = bootstrap_values(agent, final_obs, cut, run.device)  # detail 4
        ro.rewards[t] = np.sign(reward)  # clipped (Mnih et al. 2015)
        ro.terminals[t] = terminal
        ro.truncations[t] = cut
        ro.next_obs = run.upload(ro.obs_staging.copy_(torch.from_numpy(obs)))
        # the score of whole games, unclipped (detail 2)
        ro.ep_return = ro.ep_return + reward
        ro.ep_length = ro.ep_length + 1
        for i in np.flatnonzero(ended):
            run.episode(global_step, ro.ep_return[i], ro.ep_length[i])
            ro.ep_return[i] = 0.0
            ro.ep_length[i] = 0
    return global_step


def ppo_step(agent: Agent, optimizer, mb: dict, args: Args) -> dict[str, torch.Tensor]:
    """One gradient step on the PPO loss (eq. 9) of minibatch `mb`; its stats, 0-dim tensors."""
    logits, value = agent(mb["obs"])  # [B, A], [B]
    dist = Categorical(logits=logits, validate_args=False)  # NaNs: caught after the update
    logprob = dist.log_prob(mb["actions"])  # log pi_theta(a_t|s_t)  [B]
    entropy = dist.entropy().mean()  # H[pi_theta], over every step (detail 3)
    advantages = mb["advantages"]
    if args.norm_adv:  # detail 6: per minibatch, over every step (detail 3)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    losses = ppo_losses(
        logprob=logprob,
        old_logprob=mb["logprobs"],
        advantages=advantages,
        value=value,
        old_value=mb["values"],
        returns=mb["returns"],
        clip_coef=args.clip_coef,
        clip_vloss=args.clip_vloss,
        acted=mb["acted"],
    )
    # loss = -L_clip - c2 H[pi_theta] + c1 L_V  (eq. 9, as a loss to minimise)
    loss = losses["policy_loss"] - args.ent_coef * entropy + args.vf_coef * losses["value_loss"]
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    stats = {
        "loss": loss,
        "value_loss": losses["value_loss"],
        "policy_loss": losses["policy_loss"],
        "entropy": entropy,
        "approx_kl": losses["approx_kl"],
        "clipfrac": losses["clipfrac"],
    }
    return {k: v.detach() for k, v in stats.items()}


def update(ppo_step, batch: dict, generator: torch.Generator, args: Args, run: Run) -> dict:
    """K epochs of `ppo_step` (bound to the agent and optimizer, maybe compiled) on minibatches.

    Returns 0-dim tensors: the last minibatch's losses, the mean clip fraction over all of them,
    and the explained variance of the rollout's values."""
    batch_size = len(batch["actions"])
    minibatch_size = batch_size // args.num_minibatches
    history = []  # each minibatch step's stats
    for epoch in range(args.update_epochs):
        # a new order every epoch, drawn from the minibatch generator (kept in the checkpoint)
        order = torch.randperm(batch_size, generator=generator).to(batch["actions"].device)
        for rows in order.split(minibatch_size):
            minibatch = {k: v[rows] for k, v in batch.items()}  # [B / M, ...] each
            run.graph_step()
            stats = ppo_step(minibatch)
            # copied: a compiled step's CUDA graph overwrites its outputs at its next call
            history.append({k: v.clone() for k, v in stats.items()})
        # early stop on the last step's KL (reading it waits for the device)
        if args.target_kl is not None and history[-1]["approx_kl"] > args.target_kl:
            break
    logged = dict(history[-1])
    logged["clipfrac"] = mean_over_steps(history, "clipfrac")
    logged["explained_variance"] = explained_variance(batch["values"], batch["returns"])
    return logged


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    """PPO, Actor-Critic Style (Schulman et al. 2017, Algorithm 1) on Atari frames."""
    # for iteration = 1, 2, ...:
    #   anneal the learning rate (detail 6)                          -> learning_rate
    #   run pi_old in N environments for T steps                     -> collect
    #     FIRE forced after a lost life; the learning flags          -> LifeProtocol.step
    #     V(real last frame) where the time limit cut a game         -> bootstrap_values
    #   compute advantage estimates A_1 .. A_T (GAE)                 -> Rollout.batch, gae
    #   optimise the surrogate L for K epochs of M minibatches       -> update, ppo_step
    #     -L_clip and L_V (eq. 7 and 9)                              -> ppo_losses
    #   theta_old <- theta: the next rollout acts with the new agent
    #   log the losses; evaluate and checkpoint as due               -> run.log, run.end_iteration
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)

    # set up
    atari = atari_settings(asdict(args))
    T = args.num_steps
    N = args.num_envs
    total = args.total_steps // (T * N) * T * N  # whole rollouts
    envs = LifeProtocol(make_envs(N, **atari), atari["baselines"])
    agent = Agent(int(envs.vec.single_action_space.n), args.frame_stack)
    agent = agent.to(run.device, memory_format=torch.channels_last)
    lr = torch.tensor(args.learning_rate, device=run.device)  # set_learning_rate fills it
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, fused=True)
    generator = torch.Generator().manual_seed(args.seed)  # minibatch order
    global_step, iteration, horizon = restore(args, run, agent, optimizer, generator, total)
    # with --compile these run compiled (CUDA graphs on a GPU), else they are the plain functions
    act = run.compile(agent)
    gae_fn = run.compile(gae)
    step_fn = run.compile(partial(ppo_step, agent, optimizer, args=args))
    ro = Rollout(run, T, N, args.frame_stack)
    obs = envs.reset(seed=args.seed + global_step)  # fresh games after a resume too (detail 9)
    ro.restart(run.upload(ro.obs_staging.copy_(torch.from_numpy(obs))))

    def checkpoint() -> dict:
        """The checkpoint's state, read when the harness saves (at the loop's current iteration)."""
        return checkpoint_state(agent, optimizer, iteration, horizon, generator)

    def evaluate_policy(video_dir: Path | None) -> tuple[list[float], dict]:
        """Full games of the sampled policy, from evaluation's own seed (detail 8)."""
        eval_seed = args.seed + 10_000
        return evaluate(
            agent, atari, args.eval_episodes, eval_seed, run.device, run.stop, video_dir
        )

    protocol = resolve_protocol(args.protocol, args.env_id)
    about = dict(game=atari["game"], repeat_action_probability=atari["sticky"], protocol=protocol)
    with run.start(global_step, total, state=checkpoint, evaluate=evaluate_policy, **about):
        while global_step < total and not run.stop:
            iteration += 1
            rate = learning_rate(args, global_step, horizon)
            set_learning_rate(optimizer, lr, rate)

            # collect
            global_step = collect(act, agent, envs, ro, run, global_step)
            batch = ro.batch(act, gae_fn, args.gamma, args.gae_lambda, run)

            # learn
            stats = update(step_fn, batch, generator, args, run)

            # log
            run.check_finite(stats["loss"], global_step)
            logged = as_floats({k: v for k, v in stats.items() if k != "loss"})
            scalars = {"losses/" + k: v for k, v in logged.items()}
            scalars["charts/learning_rate"] = rate
            scalars["charts/SPS"] = run.sps(global_step)
            run.log(global_step, scalars)
            run.end_iteration(global_step)
        envs.vec.close()
        run.finish(global_step, **about)


# ---------------------------------------------------------------- the file's own plumbing
POSITIVE = ("num-envs", "num-steps", "num-minibatches", "update-epochs", "learning-rate")
POSITIVE += ("clip-coef", "max-grad-norm", "max-episode-frames", "frame-stack")


def check_args(args: Args) -> list[tuple[bool, str]]:
    """This file's (condition, message) rows for Run: each false one stops the run."""
    flags = {k.replace("_", "-"): v for k, v in asdict(args).items()}
    batch_size = args.num_envs * args.num_steps
    rows = [(flags[k] > 0, f"--{k} must be positive, got {flags[k]}") for k in POSITIVE]
    for k in ("gamma", "gae-lambda"):
        rows.append((0 <= flags[k] <= 1, f"--{k} must be in [0, 1], got {flags[k]}"))
    divides = batch_size % max(args.num_minibatches, 1) == 0
    rows.append((divides, f"a rollout ({batch_size} steps) is not divisible by --num-minibatches"))
    enough = args.eval_only or args.total_steps >= batch_size
    rows.append((enough, f"--total-steps is less than one rollout ({batch_size} steps); raise it"))
    return rows


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


def set_learning_rate(optimizer, lr: torch.Tensor, rate: float) -> None:
    """Fill `rate` into the 0-dim tensor `lr` and make it the optimizer's rate (again, after a
    resume loaded the checkpoint's): a compiled update reads the new value, no recompile."""
    optimizer.param_groups[0]["lr"] = lr.fill_(rate)


def as_floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-dim tensors as Python floats, read in one stack: one wait for a GPU, not one per value."""
    return dict(zip(values, torch.stack(list(values.values())).tolist()))


def checkpoint_state(agent, optimizer, iteration: int, horizon: int, generator) -> dict:
    """The file's part of a checkpoint: weights, optimizer, counters, lr horizon, generators."""
    rng = Run.rng_state(torch=torch.default_generator, minibatch=generator)
    return {
        "iteration": iteration,
        "schedule_steps": horizon,
        "agent": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": rng,
    }


def restore(args: Args, run: Run, agent, optimizer, generator, total: int) -> tuple[int, int, int]:
    """(global_step, iteration, anneal horizon H of detail 6), from --resume's checkpoint if any."""
    ckpt = run.resume_checkpoint(same=("num_envs", "num_steps", "frame_stack", "protocol"))
    if args.schedule_steps is not None:
        horizon = args.schedule_steps
        source = "set by --schedule-steps"
    elif ckpt is not None:
        horizon = ckpt["schedule_steps"]
        source = "the schedule of the checkpoint"
    else:
        horizon = total
        source = "this run's steps"
    if args.anneal_lr and horizon < total:
        raise Run.fail(
            f"--total-steps {args.total_steps} runs past the lr anneal's end at step {horizon} "
            f"({source}); pass --schedule-steps {total} (or more), or --no-anneal-lr"
        )
    if ckpt is None:
        return 0, 0, horizon
    agent.load_state_dict(ckpt["agent"])
    optimizer.load_state_dict(ckpt["optimizer"])
    Run.set_rng_state(ckpt["rng"], torch=torch.default_generator, minibatch=generator)
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
    envs = LifeProtocol(make_envs(episodes, **atari), atari["baselines"])
    obs = envs.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    scores = np.zeros(episodes)
    finished = np.zeros(episodes, bool)
    capped = np.zeros(episodes, bool)
    while not finished.all() and not stop:
        actions = sample_actions(agent, obs, device, generator)
        obs, reward, ended, _, cut, _ = envs.step(actions)  # FIRE after a lost life (detail 3)
        scores += reward * ~finished  # games that ended keep running; ignore them
        capped |= cut & ~finished
        finished |= ended
    envs.vec.close()
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
    generator = torch.Generator().manual_seed(seed)
    score = 0.0
    done = False
    forced = False  # FIRE is due after a lost life (detail 3)
    while not done:
        stack = np.concatenate(
            [stack[:, 1:], frame[None, None]], axis=1
        )  # [1, frame_stack, 84, 84]
        action = int(sample_actions(agent, stack, device, generator)[0])
        lives = info["lives"]
        frame, reward, term, trunc, info = env.step(fire if forced else action)
        score += float(reward)
        done = term or trunc
        forced = fire is not None and info["lives"] < lives and not done
    env.close()
    return score


def eval_only(args: Args, run: Run) -> None:
    """Repeat the final evaluation of --checkpoint's run: its env, seed, frame limit and stack."""
    ckpt = Run.load_checkpoint(args.checkpoint)
    flags = {"frame_stack": 4, "protocol": "auto", **ckpt["args"]}  # older checkpoints lack these
    agent = Agent(ckpt["agent"]["actor.weight"].shape[0], flags["frame_stack"])
    agent.load_state_dict(ckpt["agent"])
    agent = agent.to(run.device, memory_format=torch.channels_last)
    seed = flags["seed"] + 10_000  # the run's final evaluation (detail 8)
    atari = atari_settings(flags)
    result = evaluate(agent, atari, args.eval_episodes, seed, run.device, video_dir=run.video_dir)
    run.write_eval_only(ckpt, result)


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
