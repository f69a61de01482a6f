"""Recurrent PPO for Atari: PPO with an LSTM policy on pixels, one frame per observation.

Papers: J. Schulman, F. Wolski, P. Dhariwal, A. Radford, O. Klimov, "Proximal Policy Optimization
Algorithms", 2017, arXiv:1707.06347 (advantages: GAE, arXiv:1506.02438). Memory: S. Hochreiter,
J. Schmidhuber, "Long Short-Term Memory", Neural Computation 1997; M. Hausknecht, P. Stone, "Deep
Recurrent Q-Learning for Partially Observable MDPs", 2015, arXiv:1507.06527 (one frame per step,
the LSTM integrates the history). Replaying sequences from the state stored while acting: S.
Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement Learning" (R2D2),
ICLR 2019. Peers: CleanRL `ppo_atari_lstm.py`, sb3-contrib `RecurrentPPO`, Sample Factory
(Petrenko et al. 2020, arXiv:2006.11751).

Idea: a single frame does not show where the ball is going. The policy keeps an LSTM state h_t
that summarises the episode so far and acts from it: pi(a_t | h_t), V(h_t). PPO's ratio needs the
same h_t at training time as while acting, so training replays each stored sequence through the
network, in order, from the state the actor had when it played that sequence's first step.

Equations (ppo_atari.py's, with the observation s_t replaced by the memory h_t):
    h_t     = LSTM(CNN(o_t), (1 - start_t) h_{t-1})     start_t = 1 at an episode's first observation
    delta_t = r_t + gamma (1 - term_t) V(h_{t+1}) - V(h_t)
    A_t     = delta_t + gamma lambda (1 - end_t) A_{t+1}                     (GAE, eq. 11-12)
    L_clip  = E[ min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t) ],  rho_t = pi(a_t|h_t) / pi_old(a_t|h_t)
    loss    = -L_clip + c1 L_V - c2 H[pi]                                    (PPO eq. 9, L_V clipped)

Implementation details:
 1. Environments: ale_py's C++ `AtariVectorEnv`: up to 30 no-ops on reset, frame skip 4 with
    max-pool, 84x84 grayscale, and a stack of `--frame-stack` frames, 1 by default (the
    memory does the stacking; 4 is RL Zoo's recurrent setting). `<Game>NoFrameskip-v4` ids
    play without sticky actions, `ALE/<Game>-v5` ids with 0.25 (Machado et al. 2018); games are
    ale_py's ROM list. Autoreset SameStep: the real last observation is in info["final_obs"].
 2. Rewards for learning are sign-clipped; `charts/episodic_return` is the unclipped score of the
    whole game (all lives); `charts/episodic_length` counts agent steps (4 frames each).
 3. Life and FIRE protocol (`--protocol`; auto = baselines for NoFrameskip-v4, machado for v5),
    as ppo_atari.py:
    - baselines (OpenAI baselines / CleanRL's EpisodicLife + FireReset, with which the published
      NoFrameskip-v4 scores were made): in games with FIRE, FIRE is pressed at reset and, as the
      next agent step, after each lost life; a lost life ends the GAE chain and is terminal for
      learning. That forced step is not the policy's choice, so it is left out of the policy
      loss (`acted` = 0; its value target still trains V); it is recorded as the action taken
      (its log-probability too, so the replay of detail 7 still matches) and counts as an
      agent step (one per life).
    - machado (Machado et al. 2018): no FIRE and no life signal; only a game over is terminal.
    Neither resets the game at a lost life, so the logged score and evaluation are whole games
    played under the same protocol. Time-limit truncation (`--max-episode-frames`) bootstraps
    from V(final observation), computed with one more LSTM step from the episode's own state
    (the state after its last step, before the reset).
 4. Network: Nature CNN (orthogonal, gain sqrt 2) -> 512 ReLU -> LSTM(512 -> H) -> policy head
    (gain 0.01) and value head (gain 1); LSTM weights orthogonal (gain 1), biases 0, as CleanRL.
    H = `--lstm-hidden-size` 128, as CleanRL's nn.LSTM(512, 128) and RL Zoo. H = 512 costs on
    the CPU: a minibatch of 2 sequences makes each recurrent step a (2 x 512) @ (512 x 2048)
    product that streams 4 MB of weights, and an update took 1.8x the CPU time of H = 128.
 5. Episode starts: start_t = 1 where o_t opens a learning episode: a new game (after a game
    over or a time-limit cut) or, under baselines only, the first frame after a lost life
    (under machado the memory runs through the whole game). Acting and training both zero
    (h, c) there, from the same stored flags, so memory never crosses an episode boundary.
 6. Sequences: the state (h, c) entering every `--seq-len` L-th step is stored while acting;
    training replays chunks of L steps of one env from their stored state (truncated BPTT, as
    sb3-contrib and Sample Factory). L = `--num-steps` (the default) gives CleanRL's
    whole-rollout sequences. A minibatch is a set of chunks: the N T / L chunks of a rollout are
    split into `--num-minibatches` (CleanRL: whole envs, N divisible by the minibatches). The
    stored states come from the acting weights (R2D2's "stored state"): in later epochs a chunk
    starts from a slightly stale state, the price of cutting sequences; the steps inside a chunk
    are recomputed with the current weights.
 7. Training pass: the CNN runs once over every frame of a minibatch; nn.LSTM then runs once per
    span of steps in which none of the minibatch's sequences starts an episode (one call per
    span: cuDNN's fused kernel on GPU), zeroing the starting sequences' state at each span's
    first step. Acting is the same forward with L = 1 over all envs (no loop over envs).
    Replaying a rollout with the acting weights gives the log-probabilities and values recorded
    while acting (tested), which is what makes the PPO ratio correct.
 8. PPO as ppo_atari.py (CleanRL defaults): Adam eps 1e-5 (fused), 4 epochs, advantages
    normalised per minibatch, clipped value loss, grad-norm 0.5, optional `--target-kl` early
    stop, channels_last convolutions; lr = 2.5e-4 (1 - step / S), with S = `--schedule-steps`,
    by default the first run's steps, kept in the checkpoint: a resume continues the same
    schedule, and extending an annealed run past S is refused (pass --schedule-steps to re-plan
    it, or --no-anneal-lr) rather than training at lr 0 or making the rate jump up.
 9. Evaluation as ppo_atari.py: the sampled policy (as the literature's PPO scores), full games
    on separate envs seeded seed + 10_000 + i, actions drawn on the CPU from evaluation's own
    generator (evaluating never moves the training generators). The hidden state is carried
    across steps and zeroed where training zeroes it (detail 5); FIRE is forced after a lost life
    as in training (detail 3). `eval/capped_games` (`eval_capped_games` in summary.json and
    eval.json) counts games cut by the frame limit. `--eval-only` takes env, network, seed, frame
    limit, frame stack and protocol (auto for checkpoints older than --protocol) from the
    checkpoint, so it repeats the run's final evaluation. `--capture-video` records one more
    game (seed + 20_000) with gymnasium's AtariPreprocessing, frames stacked as the vector env
    stacks them (zero padding), under the same protocol.
10. Checkpoints: network, optimizer, iteration, the anneal horizon S and exactly the generators
    drawn from: torch's default one (initialisation, actions; CUDA's on a GPU) and the minibatch
    order's. Not the emulators: a resumed run restarts its games (seeded seed + step), and the
    acting hidden states restart at zero with them (a fresh game is an episode start), so they
    need no saving; the episodes in progress are lost. SIGINT/SIGTERM skip any evaluation still
    due, save at the end of the iteration and exit 0 without summary.json (a second one kills).
    --resume and --eval-only write into --run-dir, else the folder above checkpoints/.

Usage: python recurrent_ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-steps 10000000
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle OpenMP threads sleep instead of spinning

import difflib
import importlib.util
import json
import random
import re
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
    """`<Game>NoFrameskip-v4` (no sticky actions) or `ALE/<Game>-v5` (sticky actions 0.25)"""
    protocol: Literal["auto", "baselines", "machado"] = "auto"
    """FIRE after a lost life and lives terminal for learning (baselines) or neither (machado); auto: baselines for v4 ids (detail 3)"""
    seed: int = 1
    """seed of python, numpy, torch and the environments (--eval-only: the checkpoint's)"""
    total_steps: int = 10_000_000
    """agent steps summed over environments (each is 4 frames); a resume keeps the run's lr schedule (--schedule-steps)"""
    num_envs: int = 8
    """parallel environments N"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms, for identical runs on CPU"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    exp_name: str = Path(__file__).stem
    """experiment name, part of the default run directory"""
    run_dir: str | None = None
    """output directory (default runs/<env>__<exp>__<seed>__<unixtime>)"""
    checkpoint_interval: int = 500_000
    """save checkpoints/latest.pt every this many env steps (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from (outputs go to --run-dir, else the checkpoint's run dir)"""
    eval_episodes: int = 10
    """sampled-policy evaluation games at each evaluation"""
    eval_interval: int = 0
    """evaluate every this many env steps (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint (its env, network, seed, frame limit and protocol), write eval.json and exit"""
    checkpoint: str | None = None
    """checkpoint to evaluate with --eval-only"""
    capture_video: bool = False
    """record one game of the final (or --eval-only) evaluation to <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases (mode from WANDB_MODE)"""
    wandb_project_name: str = "rl-training"
    """Weights & Biases project"""
    max_episode_frames: int = 108_000
    """emulator frames after which a game is truncated (bootstrapped; --eval-only: the checkpoint's)"""
    frame_stack: int = 1
    """frames per observation (1: the LSTM does the stacking; 4: RL Zoo's recurrent setting); fixed on resume"""
    # Recurrent PPO (CleanRL defaults)
    lstm_hidden_size: int = 128
    """LSTM units H (CleanRL and RL Zoo: 128)"""
    seq_len: int = 128
    """steps per training sequence L (divides --num-steps; = --num-steps: whole rollouts)"""
    num_steps: int = 128
    """steps per environment per rollout T"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 at --schedule-steps"""
    schedule_steps: int | None = None
    """step at which the annealed lr reaches 0 (default: the steps of this run, or on resume the checkpoint's)"""
    gamma: float = 0.99
    """discount factor gamma"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    num_minibatches: int = 4
    """minibatches per epoch (each a set of whole sequences)"""
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
    """Game names as Gymnasium ids spell them -> ale_py ROM ids, for every ROM ale_py ships."""
    return {rom.title().replace("_", ""): rom for rom in get_all_rom_ids()}  # ale_py.registration.rom_id_to_name


def atari_protocol(env_id: str) -> tuple[str, float]:
    """(ROM id, sticky-action probability) of an env id (detail 1); anything else stops in one line."""
    games = atari_games()
    for pattern, sticky in ((r"(\w+)NoFrameskip-v4", 0.0), (r"ALE/(\w+)-v5", 0.25)):
        match = re.fullmatch(pattern, env_id)
        if match and match.group(1) in games:
            return games[match.group(1)], sticky
        if match:
            close = difflib.get_close_matches(match.group(1), games, n=1)
            hint = f"did you mean {env_id.replace(match.group(1), close[0])}?" if close else "see ale_py.roms.get_all_rom_ids()"
            raise fail(f"unknown Atari game {match.group(1)!r} in {env_id!r}: ale_py has no such ROM; {hint}")
    match = re.fullmatch(r"(?:ALE/)?(\w+?)(-ram)?(?:NoFrameskip|Deterministic)?-v\d+", env_id)
    if match and match.group(1) in games:
        what = "RAM observations are not supported (this file learns from pixels)" if match.group(2) else "this variant's frame-skip protocol is not supported"
        raise fail(f"{env_id}: {what}; use {match.group(1)}NoFrameskip-v4 or ALE/{match.group(1)}-v5")
    try:
        env = gym.make(env_id)
    except Exception:
        raise fail(f"unknown environment id {env_id!r}; use an Atari id such as BreakoutNoFrameskip-v4 or ALE/Breakout-v5")
    act, obs = env.action_space, env.observation_space
    env.close()
    if isinstance(act, gym.spaces.Box):
        raise fail(f"{env_id} is not an Atari game (continuous actions); use d4pg.py, naf.py or rlpd.py")
    if isinstance(act, gym.spaces.Discrete) and len(obs.shape) == 1:
        raise fail(f"{env_id} is not an Atari game (discrete actions, vector observations); use ppg.py")
    raise fail(f"{env_id} is not an Atari game; use BreakoutNoFrameskip-v4 or ALE/<Game>-v5")


def resolve_protocol(protocol: str, env_id: str) -> str:
    """The life and FIRE protocol of detail 3: `auto` follows the id's literature."""
    return protocol if protocol != "auto" else "baselines" if env_id.endswith("NoFrameskip-v4") else "machado"


def make_envs(num_envs: int, game: str, sticky: float, max_frames: int, frame_stack: int, baselines: bool) -> AtariVectorEnv:
    # Raw rewards (clipped here, to keep the score) and no life-loss episodes (read from
    # info["lives"]), so a game over can be told apart from a life loss.
    envs = AtariVectorEnv(
        game, num_envs, repeat_action_probability=sticky, max_num_frames_per_episode=max_frames, stack_num=frame_stack,
        reward_clipping=False, episodic_life=False, life_loss_info=False, autoreset_mode="SameStep", use_fire_reset=baselines,
    )
    action_set = list(envs.ale.get_action_set())
    envs.fire = action_set.index(Action.FIRE) if baselines and Action.FIRE in action_set else None  # pressed after a lost life
    return envs


# ---------------------------------------------------------------- network
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature CNN (Mnih et al. 2015) -> LSTM -> policy and value heads (detail 4)."""

    def __init__(self, num_actions: int, frame_stack: int, hidden_size: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(frame_stack, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.lstm = nn.LSTM(512, hidden_size)
        for name, param in self.lstm.named_parameters():
            nn.init.orthogonal_(param, 1.0) if "weight" in name else nn.init.zeros_(param)
        self.actor = layer_init(nn.Linear(hidden_size, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(hidden_size, 1), std=1.0)

    def initial_state(self, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(torch.zeros(1, batch, self.lstm.hidden_size, device=device) for _ in range(2))

    def forward(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], starts: torch.Tensor):
        """uint8 frames (L, B, C, 84, 84), the state (h, c) entering step 0 (each (1, B, H)) and the
        episode-start flags (L, B) -> logits (L, B, A), values (L, B), the state after step L - 1."""
        L, B = starts.shape
        x = obs.flatten(0, 1).to(torch.float32, memory_format=torch.channels_last) / 255.0
        features = self.network(x).view(L, B, -1)
        # One nn.LSTM call per span without an episode start inside (detail 7), not one per step.
        bounds = [0, *(torch.nonzero(starts[1:].any(1)).flatten() + 1).tolist(), L]
        (h, c), outputs = state, []
        for t0, t1 in zip(bounds[:-1], bounds[1:]):
            keep = (1.0 - starts[t0]).view(1, B, 1)  # zero the memory of the sequences that start here
            out, (h, c) = self.lstm(features[t0:t1], (h * keep, c * keep))
            outputs.append(out)
        out = torch.cat(outputs)
        return self.actor(out), self.critic(out).squeeze(-1), (h, c)


# ---------------------------------------------------------------- PPO math
def learning_flags(terminated, truncated, lives, prev_lives, baselines: bool):
    """(terminal, truncation, life lost) for learning from one vector step (numpy bool arrays). Under the
    baselines protocol a life loss is terminal for learning only (the game goes on). After a game ends,
    `lives` is that of the freshly reset game, so it is compared only where no episode ended. A game over
    at the time limit is terminal."""
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    return terminated | (life_lost & baselines), truncated & ~terminated, life_lost


def bootstrap_values(agent: Agent, final_obs, cut, state, device) -> torch.Tensor:
    """V(real final observation) where the time limit cut the episode, else 0 (detail 3): one more
    LSTM step from the episode's own state, before the reset zeroes it."""
    values = torch.zeros(len(cut), device=device)
    if cut.any():
        idx, final = torch.from_numpy(np.flatnonzero(cut)).to(device), torch.from_numpy(final_obs[cut]).to(device)
        values[idx] = agent(final[None], (state[0][:, idx], state[1][:, idx]), torch.zeros(1, len(idx), device=device))[1][0]
    return values


def gae(rewards, values, next_value, terminals, truncations, truncation_values, gamma: float, gae_lambda: float):
    """Generalized advantage estimates and returns R_t = A_t + V(s_t), all (T, N) float tensors.
    terminals: 1 where s_{t+1} has value 0 for learning (game over or life loss). truncations: 1 where the
    time limit cut the episode; V(s_{t+1}) is then truncation_values (V of the real final observation), not
    values[t + 1] (a freshly reset game). Either ends the GAE chain: A_{t+1} belongs to another episode.
    next_value: V of the observation after the last step, shape (N,)."""
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


def ppo_losses(new_logprob, old_logprob, advantages, new_value, old_value, returns, clip_coef: float, clip_vloss: bool, acted=None):
    """Clipped surrogate policy loss (-L_clip) averaged over the steps the policy chose (`acted`, 1.0 or 0.0:
    detail 3's forced FIRE is 0), value loss L_V, approx KL, clip fraction."""
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    acted = torch.ones_like(ratio) if acted is None else acted
    pg_loss = (torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)) * acted).sum() / acted.sum().clamp(min=1)
    if clip_vloss:
        v_clipped = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((new_value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # k3 estimator (Schulman's blog "Approximating KL")
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return pg_loss, v_loss, approx_kl, clipfrac


class Rollout:
    """Preallocated storage of one rollout (T steps of N envs) and the acting state carried from
    one rollout to the next."""

    def __init__(self, T: int, N: int, seq_len: int, frame_stack: int, hidden_size: int, device):
        self.obs = torch.zeros((T, N, frame_stack, 84, 84), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((T, N), dtype=torch.long, device=device)
        self.logprobs, self.values, self.trunc_values = (torch.zeros((T, N), device=device) for _ in range(3))
        # rewards and flags are born in numpy: kept on the host, moved once per rollout
        self.rewards, self.terminals, self.truncations, self.starts, self.acted = (np.zeros((T, N), np.float32) for _ in range(5))
        # (h, c) entering the first step of each chunk of seq_len steps: where its replay starts (detail 6)
        self.h0, self.c0 = (torch.zeros((T // seq_len, N, hidden_size), device=device) for _ in range(2))

    def restart(self, obs_np: np.ndarray, lives: np.ndarray, agent: Agent) -> None:
        """Fresh games (a new or resumed run): every env's next step starts an episode from a zero state."""
        self.next_obs = torch.from_numpy(obs_np).to(self.obs.device)
        self.next_start, self.forced = np.ones(len(lives), np.float32), np.zeros(len(lives), bool)
        self.state = agent.initial_state(len(lives), self.obs.device)
        self.lives, self.score, self.length = lives, np.zeros(len(lives)), np.zeros(len(lives), np.int64)

    def sequences(self, x: torch.Tensor) -> torch.Tensor:
        """(T, N, ...) -> (L, K, ...), K = N T / L: sequence k = j N + n is env n's chunk j (as h0, c0)."""
        (T, N), L = x.shape[:2], self.obs.shape[0] // self.h0.shape[0]
        return x.reshape(T // L, L, N, *x.shape[2:]).transpose(0, 1).reshape(L, -1, *x.shape[2:])


@torch.inference_mode()
def collect(agent: Agent, envs, ro: Rollout, global_step: int, log, baselines: bool) -> int:
    """Fill `ro` with one rollout of every env, acting one step at a time; returns the new step count."""
    (T, N), device, seq_len = ro.rewards.shape, ro.obs.device, ro.obs.shape[0] // ro.h0.shape[0]
    for t in range(T):
        if t % seq_len == 0:
            ro.h0[t // seq_len], ro.c0[t // seq_len] = ro.state[0][0], ro.state[1][0]
        ro.obs[t], ro.starts[t] = ro.next_obs, ro.next_start
        logits, value, ro.state = agent(ro.next_obs[None], ro.state, torch.from_numpy(ro.next_start).to(device)[None])
        dist = Categorical(logits=logits[0], validate_args=False)  # NaN weights are caught after the update
        action = dist.sample()
        if ro.forced.any():  # detail 3: FIRE after a lost life, not the policy's choice
            action[torch.from_numpy(ro.forced).to(device)] = envs.fire
        ro.actions[t], ro.logprobs[t], ro.values[t], ro.acted[t] = action, dist.log_prob(action), value[0], ~ro.forced
        obs_np, reward, term, trunc, info = envs.step(action.cpu().numpy())
        global_step += N
        terminal, cut, lost = learning_flags(term, trunc, info["lives"], ro.lives, baselines)
        ro.forced = lost & (envs.fire is not None)
        ro.trunc_values[t] = bootstrap_values(agent, info.get("final_obs"), cut, ro.state, device)
        ro.rewards[t], ro.terminals[t], ro.truncations[t] = np.sign(reward), terminal, cut  # clipped (Mnih 2015)
        ro.next_start = (terminal | cut).astype(np.float32)  # detail 5
        ro.next_obs, ro.lives = torch.from_numpy(obs_np).to(device), info["lives"]
        ro.score, ro.length = ro.score + reward, ro.length + 1
        for i in np.flatnonzero(term | trunc):
            log.episode(global_step, ro.score[i], ro.length[i])
            ro.score[i], ro.length[i] = 0.0, 0
    return global_step


def update(agent: Agent, optimizer, ro: Rollout, advantages, returns, args: Args, gen: torch.Generator):
    """`--update-epochs` epochs of clipped-PPO steps on minibatches of whole sequences (details 6-7).
    Returns the last minibatch's losses, the epochs' mean clip fraction, the explained variance and the total loss."""
    device = ro.obs.device
    obs, actions, old_logprobs, old_values, b_adv, b_returns, starts, acted = (ro.sequences(x) for x in (
        ro.obs, ro.actions, ro.logprobs, ro.values, advantages, returns, *(torch.from_numpy(f).to(device) for f in (ro.starts, ro.acted))))
    h0, c0 = ro.h0.flatten(0, 1), ro.c0.flatten(0, 1)
    num_seqs, clipfracs = h0.shape[0], []
    for epoch in range(args.update_epochs):
        for mb in torch.randperm(num_seqs, generator=gen).to(device).split(num_seqs // args.num_minibatches):
            logits, new_value, _ = agent(obs[:, mb], (h0[mb][None], c0[mb][None]), starts[:, mb])
            dist = Categorical(logits=logits, validate_args=False)
            new_logprob, entropy = dist.log_prob(actions[:, mb]), dist.entropy().mean()
            mb_adv = b_adv[:, mb]
            if args.norm_adv:
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            pg_loss, v_loss, approx_kl, clipfrac = ppo_losses(new_logprob, old_logprobs[:, mb], mb_adv, new_value, old_values[:, mb],
                                                              b_returns[:, mb], args.clip_coef, args.clip_vloss, acted[:, mb])
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            clipfracs.append(clipfrac)
        if args.target_kl is not None and approx_kl.item() > args.target_kl:
            break
    var_y = b_returns.var()
    return {"loss": loss.detach(), "losses/value_loss": v_loss.detach(), "losses/policy_loss": pg_loss.detach(),
            "losses/entropy": entropy.detach(), "losses/approx_kl": approx_kl, "losses/clipfrac": torch.stack(clipfracs).mean(),
            "losses/explained_variance": (1 - (b_returns - old_values).var() / var_y).item() if var_y > 0 else float("nan")}


def checkpoint_state(agent: Agent, optimizer, iteration: int, horizon: int, gen: torch.Generator) -> dict:
    """Everything a resume needs (detail 10); the acting hidden states restart with the games."""
    return {"agent": agent.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration,
            "schedule_steps": horizon, "rng": rng_state(torch=torch.default_generator, minibatch=gen)}


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    T, N, L, M = args.num_steps, args.num_envs, args.seq_len, args.num_minibatches
    positive = {"num-envs": N, "num-steps": T, "seq-len": L, "num-minibatches": M, "update-epochs": args.update_epochs,
                "frame-stack": args.frame_stack, "lstm-hidden-size": args.lstm_hidden_size, "learning-rate": args.learning_rate,
                "clip-coef": args.clip_coef, "max-grad-norm": args.max_grad_norm, "max-episode-frames": args.max_episode_frames}
    check_args(args, [(value > 0, f"--{name} must be positive, got {value}") for name, value in positive.items()])
    check_args(args, [
        (T % L == 0, f"--seq-len {L} does not divide --num-steps {T}; pick a divisor of {T}"),
        (N * T // L % M == 0, f"{N * T // L} sequences per rollout (num_envs * num_steps / seq_len) do not split into "
                              f"--num-minibatches {M}; choose a divisor of {N * T // L}"),
        *[(0 <= value <= 1, f"--{name} must be in [0, 1], got {value}") for name, value in {"gamma": args.gamma, "gae-lambda": args.gae_lambda}.items()],
        (args.eval_only or args.total_steps >= N * T, f"--total-steps {args.total_steps} is less than one rollout "
                                                     f"(num_envs * num_steps = {N * T}); raise it"),
    ])
    if args.eval_only:
        return eval_only(args)
    game, sticky = atari_protocol(args.env_id)
    device = pick_device(args.device)
    seed_everything(args.seed, args.torch_deterministic)
    ckpt = resume_checkpoint(args, same=("num_envs", "num_steps", "seq_len", "frame_stack", "lstm_hidden_size", "protocol")) if args.resume else None
    num_iterations = args.total_steps // (N * T)
    horizon = args.schedule_steps if args.schedule_steps is not None else ckpt["schedule_steps"] if ckpt else num_iterations * N * T
    if args.anneal_lr and horizon < num_iterations * N * T:  # detail 8
        raise fail(f"--total-steps {args.total_steps} runs past the learning-rate anneal, which reaches 0 at step {horizon} "
                   f"({'set by --schedule-steps' if args.schedule_steps is not None else 'the schedule of the checkpoint'}); "
                   f"pass --schedule-steps {num_iterations * N * T} (or more) to re-plan it, or --no-anneal-lr")
    protocol = resolve_protocol(args.protocol, args.env_id)
    atari = dict(game=game, sticky=sticky, max_frames=args.max_episode_frames, frame_stack=args.frame_stack, baselines=protocol == "baselines")
    envs = make_envs(N, **atari)
    agent = Agent(int(envs.single_action_space.n), args.frame_stack, args.lstm_hidden_size).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    gen = torch.Generator().manual_seed(args.seed)  # minibatch order
    global_step, iteration = (ckpt["global_step"], ckpt["iteration"]) if ckpt else (0, 0)
    if ckpt:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        set_rng_state(ckpt["rng"], torch=torch.default_generator, minibatch=gen)
    ro = Rollout(T, N, L, args.frame_stack, args.lstm_hidden_size, device)
    obs_np, info = envs.reset(seed=args.seed + global_step)  # fresh games after a resume (detail 10)
    ro.restart(obs_np, info["lives"], agent)
    stop = StopSignal()
    with RunLogger(args, run_dir_for(args, args.resume), global_step, resumed=ckpt is not None,
                   resolved_device=str(device), game=game, repeat_action_probability=sticky, protocol=protocol) as log:
        while iteration < num_iterations and not stop:
            iteration += 1
            lr = args.learning_rate * (1.0 - global_step / horizon) if args.anneal_lr else args.learning_rate  # detail 8
            optimizer.param_groups[0]["lr"] = lr
            prev_step, global_step = global_step, collect(agent, envs, ro, global_step, log, atari["baselines"])
            with torch.inference_mode():
                next_value = agent(ro.next_obs[None], ro.state, torch.from_numpy(ro.next_start).to(device)[None])[1][0]
                rewards, terminals, truncations = (torch.from_numpy(x).to(device) for x in (ro.rewards, ro.terminals, ro.truncations))
                advantages, returns = gae(rewards, ro.values, next_value, terminals, truncations, ro.trunc_values, args.gamma, args.gae_lambda)
            losses = update(agent, optimizer, ro, advantages, returns, args, gen)
            log.check_finite(losses.pop("loss"), global_step)
            log.scalars(global_step, {"charts/learning_rate": lr, "charts/SPS": log.sps(global_step), **losses})
            if stop:  # save right away: no evaluation, no periodic checkpoint
                break
            if every(global_step, prev_step, args.eval_interval) and iteration < num_iterations:  # the final one follows
                scores, capped = evaluate(agent, atari, args.eval_episodes, args.seed + 10_000, device, stop)
                if not stop:  # a signal cuts the evaluation short: its scores are incomplete
                    log.scalars(global_step, {"eval/episodic_return": np.mean(scores), "eval/capped_games": capped})
            if every(global_step, prev_step, args.checkpoint_interval) and iteration < num_iterations:
                save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizer, iteration, horizon, gen))
            log.progress(global_step, num_iterations * N * T)
        envs.close()
        # final or interrupted: saved before the final evaluation, which a signal may cut short
        save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizer, iteration, horizon, gen))
        if not stop:
            scores, capped = evaluate(agent, atari, args.eval_episodes, args.seed + 10_000, device, stop)
        if args.capture_video and not stop:
            record_video(agent, atari, log.run_dir / "videos", args.seed + 20_000, device)
        if stop:
            return log.interrupted(global_step)
        log.scalars(global_step, {"eval/episodic_return": np.mean(scores), "eval/capped_games": capped})
        log.summary(global_step, scores, eval_capped_games=capped, game=game, repeat_action_probability=sticky, protocol=protocol)


# ---------------------------------------------------------------- evaluation
def sample_actions(logits: torch.Tensor, generator: torch.Generator) -> np.ndarray:
    """a ~ pi(.|h), the evaluated policy (detail 9), drawn on the CPU from evaluation's own generator."""
    return torch.multinomial(logits.float().softmax(-1).cpu(), 1, generator=generator).squeeze(1).numpy()


@torch.inference_mode()
def evaluate(agent: Agent, atari: dict, episodes: int, seed: int, device, stop=None) -> tuple[list[float], int]:
    """Unclipped scores of `episodes` full games of the sampled policy, game i seeded seed + i, and how
    many hit the frame limit (detail 9); cut short (scores incomplete) once `stop` is true (a signal)."""
    envs = make_envs(episodes, **atari)
    obs, info = envs.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    state, start, lives = agent.initial_state(episodes, device), np.ones(episodes, np.float32), info["lives"]
    scores, finished, capped = np.zeros(episodes), np.zeros(episodes, dtype=bool), np.zeros(episodes, dtype=bool)
    forced = np.zeros(episodes, dtype=bool)
    while not finished.all() and not stop:
        logits, _, state = agent(torch.from_numpy(obs).to(device)[None], state, torch.from_numpy(start).to(device)[None])
        actions = sample_actions(logits[0], generator)
        if forced.any():  # detail 3 (baselines: FIRE after a lost life; never under machado)
            actions[forced] = envs.fire
        obs, reward, term, trunc, info = envs.step(actions)
        scores += reward * ~finished  # games that ended keep running; ignore them
        capped |= trunc & ~term & ~finished
        finished |= term | trunc
        terminal, cut, lost = learning_flags(term, trunc, info["lives"], lives, atari["baselines"])  # the memory resets as in training
        start, lives, forced = (terminal | cut).astype(np.float32), info["lives"], lost & (envs.fire is not None)
    envs.close()
    return scores.tolist(), int(capped.sum())


@torch.inference_mode()
def record_video(agent: Agent, atari: dict, video_dir: Path, seed: int, device) -> float:
    """One game of the sampled policy rendered to mp4 (AtariVectorEnv cannot render). Frames are
    stacked as the vector env stacks them: zero padding, the first real frame the one after FIRE (baselines);
    the memory is zeroed and FIRE forced as in training (details 3 and 5)."""
    env = AtariEnv(game=atari["game"], frameskip=1, repeat_action_probability=atari["sticky"], render_mode="rgb_array",
                   max_num_frames_per_episode=atari["max_frames"])
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False, grayscale_obs=True)
    env = gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True, disable_logger=True)
    frame, info = env.reset(seed=seed)
    meanings = env.unwrapped.get_action_meanings()
    fire = meanings.index("FIRE") if atari["baselines"] and "FIRE" in meanings else None  # detail 3
    if fire is not None:  # as use_fire_reset in the vector env
        frame, _, _, _, info = env.step(fire)
    stack = np.zeros((1, atari["frame_stack"], 84, 84), dtype=np.uint8)
    generator, score, done, forced = torch.Generator().manual_seed(seed), 0.0, False, False
    state, start, lives = agent.initial_state(1, device), 1.0, info["lives"]
    while not done:
        stack = np.concatenate([stack[:, 1:], frame[None, None]], axis=1)
        logits, _, state = agent(torch.from_numpy(stack).to(device)[None], state, torch.full((1, 1), start, device=device))
        action = int(sample_actions(logits[0], generator)[0])
        frame, reward, term, trunc, info = env.step(fire if forced else action)
        lost = info["lives"] < lives and not (term or trunc)
        score, done, start, lives = score + float(reward), term or trunc, float(lost and atari["baselines"]), info["lives"]
        forced = lost and fire is not None
    env.close()
    return score


def eval_only(args: Args) -> None:
    """Evaluate --checkpoint with its own env, network, seed, frame limit, frame stack and protocol: it repeats the run's final evaluation."""
    ckpt, device = load_checkpoint(args.checkpoint), pick_device(args.device)
    run = {"protocol": "auto", **ckpt["args"]}  # checkpoints written before --protocol existed
    game, sticky = atari_protocol(ckpt["env_id"])
    atari = dict(game=game, sticky=sticky, max_frames=run["max_episode_frames"], frame_stack=run["frame_stack"],
                 baselines=resolve_protocol(run["protocol"], ckpt["env_id"]) == "baselines")
    agent = Agent(ckpt["agent"]["actor.weight"].shape[0], run["frame_stack"], run["lstm_hidden_size"]).to(device, memory_format=torch.channels_last)
    agent.load_state_dict(ckpt["agent"])
    returns, capped = evaluate(agent, atari, args.eval_episodes, run["seed"] + 10_000, device)
    run_dir = run_dir_for(args, args.checkpoint)
    video = {"video_return": record_video(agent, atari, run_dir / "videos", run["seed"] + 20_000, device)} if args.capture_video else {}
    write_eval_only(run_dir, args, ckpt, returns, eval_capped_games=capped, **video)


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
