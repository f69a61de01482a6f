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
    h_t     = LSTM(CNN(o_t), (1 - start_t) h_{t-1})    start_t = 1 at an episode's first step
    delta_t = r_t + gamma (1 - term_t) V(h_{t+1}) - V(h_t)
    A_t     = delta_t + gamma lambda (1 - end_t) A_{t+1}                     (GAE, eq. 11-12)
    rho_t   = pi(a_t | h_t) / pi_old(a_t | h_t)
    L_clip  = E[ min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t) ]         (PPO eq. 7)
    loss    = -L_clip + c1 L_V - c2 H[pi]                               (PPO eq. 9, L_V clipped)

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
      learning. The forced FIRE is recorded as the action taken (its log-probability too, so the
      replay of detail 7 still matches) and counts as an agent step (one per life).
    - machado (Machado et al. 2018): no FIRE and no life signal; only a game over is terminal.
    Neither resets the game at a lost life, so the logged score and evaluation are whole games
    played under the same protocol. Time-limit truncation (`--max-episode-frames`) bootstraps
    from V(final observation), computed with one more LSTM step from the episode's own state
    (the state after its last step, before the reset).
 4. Forced FIRE steps are not the policy's choice: `acted` = 0 leaves them out of every policy
    term (clipped surrogate, entropy bonus, advantage normalisation, approx KL, clip fraction).
    Their value targets still train V.
 5. Network: Nature CNN (orthogonal, gain sqrt 2) -> 512 ReLU -> LSTM(512 -> H) -> policy head
    (gain 0.01) and value head (gain 1); LSTM weights orthogonal (gain 1), biases 0, as CleanRL.
    H = `--hidden-dim` 128, as CleanRL's nn.LSTM(512, 128) and RL Zoo (H = 512 is much slower
    on a CPU: results/recurrent_ppo_atari-measurements.md).
 6. Episode starts: start_t = 1 where o_t opens a learning episode: a new game (after a game
    over or a time-limit cut) or, under baselines only, the first frame after a lost life
    (under machado the memory runs through the whole game). Acting and training both zero
    (h, c) there, from the same stored flags, so memory never crosses an episode boundary.
    With `--frame-stack` > 1 the stack forgets too: its frames from before a lost life are zeroed
    (as at a new game), since EpisodicLife makes a lost life a `done` whose reset refills the stack.
 7. Sequences: the state (h, c) entering every `--seq-len` L-th step is stored while acting;
    training replays chunks of L steps of one env from their stored state (truncated BPTT, as
    sb3-contrib and Sample Factory). L = `--num-steps` (the default) gives CleanRL's
    whole-rollout sequences. A minibatch is a set of chunks: the N T / L chunks of a rollout are
    split into `--num-minibatches` (CleanRL: whole envs, N divisible by the minibatches). The
    stored states come from the acting weights (R2D2's "stored state"): in later epochs a chunk
    starts from a slightly stale state, the price of cutting sequences; the steps inside a chunk
    are recomputed with the current weights.
 8. Training pass: the CNN runs once over every frame of a minibatch; nn.LSTM then runs once per
    span of steps in which none of the minibatch's sequences starts an episode (one call per
    span: cuDNN's fused kernel on GPU; spans found on the host), zeroing the starting sequences'
    state at each span's first step. Acting is the same forward with L = 1 over all envs (no loop
    over envs). Replaying a rollout with the acting weights gives the log-probabilities and
    values recorded while acting (tested), which is what makes the PPO ratio correct.
    `Agent.memory_per_step` is the plain reference (CleanRL's get_states: one LSTM step at a
    time, the state zeroed where an episode starts), tested equal to the span-wise calls.
    `--compile` compiles the update step (CUDA graphs on a GPU) but for nn.LSTM, which runs
    eagerly (cuDNN) between its compiled parts; acting and GAE stay eager. Off by default: not
    yet measured to win on a GPU.
 9. PPO as ppo_atari.py (CleanRL defaults): Adam eps 1e-5 (fused), 4 epochs, advantages
    normalised per minibatch, clipped value loss, grad-norm 0.5, optional `--target-kl` early
    stop, channels_last convolutions; lr = 2.5e-4 (1 - step / S), with S = `--schedule-steps`,
    by default the first run's steps, kept in the checkpoint: extending an annealed run past S
    is refused (re-plan S, or --no-anneal-lr) rather than training at lr 0 or jumping up.
10. Evaluation as ppo_atari.py: the sampled policy (as the literature's PPO scores), full games
    on separate envs seeded seed + 10_000 + i, actions drawn on the CPU from evaluation's own
    generator. Memory, frame stack and FIRE follow training's protocol (details 3 and 6).
    `eval/capped_games` counts games cut by the frame limit. `--eval-only` takes env, network,
    seed, frame limit, frame stack and protocol from the checkpoint. `--capture-video` records
    one more game with gymnasium's AtariPreprocessing, stacked as the vector env stacks frames.
11. Checkpoints hold the network, optimizer, iteration, S and the generators drawn from (torch's
    default one, the minibatch order's). Not the emulators: a resumed run restarts its games
    (seeded seed + step) and the acting memory with them; the episodes in progress are lost.

Checkpoints written while the width flag was --lstm-hidden-size resume with the file that
wrote them.

Usage: python recurrent_ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-steps 10000000
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

# The run harness at the bottom of the file is reached through one name, `run` (class Run). Used
# above it: Run(args, checks), Run.fail, run.device, run.stop, run.compile, run.graph_step,
# run.to_device, run.host_buffer, run.upload, run.start, run.log, run.episode, run.check_finite,
# run.end_iteration, run.finish; in the plumbing after train(): run.resume_checkpoint,
# Run.rng_state, Run.set_rng_state, Run.load_checkpoint, run.video_dir, run.write_eval_only.


@dataclass
class Args:
    """Recurrent PPO's flags (tyro): the common ones first, then the algorithm's; the module
    docstring at the top of recurrent_ppo_atari.py gives the reasons for their defaults."""

    env_id: str = "BreakoutNoFrameskip-v4"
    """`<Game>NoFrameskip-v4` or `ALE/<Game>-v5` (sticky actions)"""
    protocol: Literal["auto", "baselines", "machado"] = "auto"
    """life and FIRE protocol (detail 3); auto: baselines for v4 ids, machado for v5"""
    seed: int = 1
    """seed of torch and the games"""
    total_steps: int = 10_000_000
    """agent steps summed over environments (4 frames each)"""
    num_envs: int = 8
    """parallel environments N"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: cuda if available"""
    compile: bool = False
    """torch.compile the update step around its eager LSTM (CUDA graphs on a GPU)"""
    exp_name: str = Path(__file__).stem
    """part of the run dir's name"""
    run_dir: str | None = None
    """default: runs/<env>__<exp>__<seed>__<time>"""
    checkpoint_interval: int = 500_000
    """env steps between checkpoints (0: at the end only)"""
    resume: str | None = None
    """checkpoint to continue from"""
    eval_episodes: int = 10
    """games per evaluation"""
    eval_interval: int = 0
    """env steps between evaluations (0: at the end only)"""
    eval_only: bool = False
    """only evaluate --checkpoint, with its run's settings"""
    checkpoint: str | None = None
    """checkpoint to evaluate with --eval-only"""
    capture_video: bool = False
    """record one game of the final evaluation to <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """Weights & Biases project"""
    max_episode_frames: int = 108_000
    """emulator frames after which a game is truncated"""
    frame_stack: int = 1
    """frames per observation (1: the LSTM remembers)"""
    # Recurrent PPO (CleanRL's defaults)
    hidden_dim: int = 128
    """LSTM units H"""
    seq_len: int = 128
    """steps per training sequence L (divides --num-steps)"""
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
# (id pattern, sticky-action probability)
ATARI_IDS = ((r"(\w+)NoFrameskip-v4", 0.0), (r"ALE/(\w+)-v5", 0.25))


def atari_protocol(env_id: str) -> tuple[str, float]:
    """(ROM id, sticky-action probability) of an env id (detail 1); others stop in one line."""
    # game names as Gymnasium ids spell them -> ROM ids (ale_py.registration.rom_id_to_name)
    games = {rom.title().replace("_", ""): rom for rom in get_all_rom_ids()}
    for pattern, sticky in ATARI_IDS:
        match = re.fullmatch(pattern, env_id)
        if match and match[1] in games:
            return games[match[1]], sticky
    raise Run.fail(not_atari(env_id, games))


def resolve_protocol(protocol: str, env_id: str) -> str:
    """The life and FIRE protocol of detail 3: `auto` follows the id's literature."""
    if protocol != "auto":
        return protocol
    return "baselines" if env_id.endswith("NoFrameskip-v4") else "machado"


def atari_settings(flags: dict) -> dict:
    """make_envs' keywords for a run's flags (details 1 and 3): Args, or a checkpoint's args."""
    game, sticky = atari_protocol(flags["env_id"])
    baselines = resolve_protocol(flags["protocol"], flags["env_id"]) == "baselines"
    return dict(
        game=game,
        sticky=sticky,
        max_frames=flags["max_episode_frames"],
        frame_stack=flags["frame_stack"],
        baselines=baselines,
    )


def make_envs(num_envs, game, sticky, max_frames, frame_stack, baselines) -> AtariVectorEnv:
    """ale_py's C++ vector env with detail 1's preprocessing; `.fire`: FIRE's index, or None."""
    # Raw rewards (clipped in collect, to keep the score) and no life-loss episodes (read from
    # info["lives"]), so a game over can be told apart from a lost life.
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
    # pressed after a lost life, under baselines only
    envs.fire = action_set.index(Action.FIRE) if baselines and Action.FIRE in action_set else None
    return envs


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
    the cut games' real final observations (None when no game was cut). Between steps, per env:
    `forced`: the next step must be FIRE (baselines, after a lost life, in games with FIRE);
    step() presses it whatever action it is given. `start` (1.0 or 0.0): the next observation
    opens a learning episode, where the memory starts from zero (detail 6). `lives`: the count.
    """

    def __init__(self, envs: AtariVectorEnv, baselines: bool):
        self.vec = envs
        self.baselines = baselines

    def reset(self, seed: int) -> np.ndarray:
        """New games (env i seeded seed + i); each opens an episode, none is forced."""
        obs, info = self.vec.reset(seed=seed)
        self.lives = info["lives"]
        self.stale = np.zeros(len(obs), np.int64)  # --frame-stack > 1 only: clear_stale_frames
        self.start = np.ones(len(obs), np.float32)
        self.forced = np.zeros(len(obs), bool)
        return obs

    def step(self, actions: np.ndarray):
        """One agent step of every env -> obs, reward, ended, terminal, cut, final obs."""
        if self.forced.any():
            actions = np.where(self.forced, self.vec.fire, actions)
        obs, reward, term, trunc, info = self.vec.step(actions)
        terminal, cut, lost = learning_flags(term, trunc, info["lives"], self.lives, self.baselines)
        final = info["final_obs"] if cut.any() else None
        obs, final, self.stale = clear_stale_frames(
            obs, final, self.stale, life_lost=lost & self.baselines, game_ended=term | trunc
        )
        self.lives = info["lives"]
        self.forced = lost & (self.vec.fire is not None)
        self.start = (terminal | cut).astype(np.float32)
        return obs, reward, term | trunc, terminal, cut, final


# ---------------------------------------------------------------- network
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std` and constant biases, as CleanRL initialises layers."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature CNN (Mnih et al. 2015) -> LSTM -> policy and value heads (detail 5)."""

    def __init__(self, num_actions: int, frame_stack: int, hidden_dim: int):
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
        self.lstm = nn.LSTM(512, hidden_dim)
        for name, param in self.lstm.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)
        self.actor = layer_init(nn.Linear(hidden_dim, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(hidden_dim, 1), std=1.0)

    def initial_state(self, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, c) of fresh games: zeros, (1, batch, H) each."""
        return torch.zeros(2, 1, batch, self.lstm.hidden_size, device=device).unbind()

    def forward(self, obs: torch.Tensor, state: tuple, starts: torch.Tensor, any_start=None):
        """Frames (L, B, C, 84, 84), (h, c) entering step 0, starts (L, B) -> logits (L, B, A),
        V (L, B), (h, c) after step L - 1. any_start (L,): see memory()."""
        x = obs.flatten(0, 1).to(torch.float32, memory_format=torch.channels_last) / 255.0
        features = self.network(x).view(*starts.shape, -1)  # (L B, 512) -> (L, B, 512)
        out, state = self.memory(features, state, starts, any_start)  # out: (L, B, H)
        return self.actor(out), self.critic(out).squeeze(-1), state

    @torch.compiler.disable  # Dynamo does not trace nn.LSTM: eager (cuDNN on a GPU) when compiled
    def memory(self, x, state, starts, any_start):
        """h_t = LSTM(x_t, (1 - start_t) h_{t-1}) over features x (L, B, D) -> outputs (L, B, H),
        final (h, c). One nn.LSTM call per span of steps (detail 8); memory_per_step is the
        plain one-step-at-a-time reference it equals."""
        # any_start (L,), from the host (a search on the device would make the host wait for a
        # GPU), needed when L > 1: whether some sequence starts an episode at t. A span ends
        # before each such t: starts at t = 3 and 6 of L = 10 give [0, 3), [3, 6), [6, 10).
        cuts = (any_start[1:].nonzero()[:, 0] + 1).tolist() if len(x) > 1 else []
        bounds = [0, *cuts, len(x)]
        h, c = state
        outputs = []
        for t0, t1 in zip(bounds[:-1], bounds[1:]):
            # no episode starts in (t0, t1): zero the memory of the sequences starting at t0 only
            keep = (1.0 - starts[t0])[None, :, None]  # (1, B, 1)
            out, (h, c) = self.lstm(x[t0:t1], (h * keep, c * keep))  # out: (t1 - t0, B, H)
            outputs.append(out)
        return torch.cat(outputs), (h, c)

    def memory_per_step(self, x, state, starts):
        """The reference for memory(): CleanRL's get_states, one LSTM step at a time with the
        state multiplied by 1 - start_t (L calls). Tested equal; not used in training."""
        h, c = state
        outputs = []
        for x_t, start_t in zip(x, starts):
            keep = (1.0 - start_t)[None, :, None]  # (1, B, 1)
            out, (h, c) = self.lstm(x_t[None], (h * keep, c * keep))  # out: (1, B, H)
            outputs.append(out)
        return torch.cat(outputs), (h, c)


# ---------------------------------------------------------------- PPO math
def bootstrap_values(agent: Agent, final_obs, cut, state, device) -> torch.Tensor:
    """V(real final observation) where the time limit cut the episode, else 0 (detail 3)."""
    # one more LSTM step from the episode's own state, before the reset zeroes it
    values = torch.zeros(len(cut), device=device)
    if cut.any():
        idx = torch.from_numpy(np.flatnonzero(cut)).to(device)  # the cut envs
        final = torch.from_numpy(final_obs[cut]).to(device)[None]  # (1, cut envs, C, 84, 84)
        no_start = torch.zeros(1, len(idx), device=device)
        state_of_cut = (state[0][:, idx], state[1][:, idx])  # (1, cut envs, H) each
        _, value, _ = agent(final, state_of_cut, no_start)
        values[idx] = value[0]
    return values


def gae(rewards, values, next_value, terminals, truncations, truncation_values, gamma, gae_lambda):
    """GAE (Schulman et al. 2016, eq. 11-12) over (T, N) tensors; next_value (N,): V after step
    T - 1. Returns the advantages A_t and the returns R_t = A_t + V(h_t)."""
    # V(h_{t+1}): the next step's value, and after the rollout's last step next_value
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])  # (T, N)
    # detail 3: a time-limit cut bootstraps from V(real final observation), not the reset game's
    next_values = torch.where(truncations.bool(), truncation_values, next_values)
    # delta_t = r_t + gamma (1 - term_t) V(h_{t+1}) - V(h_t): a terminal (a game over, or a lost
    # life under baselines) has no future
    deltas = rewards + gamma * (1.0 - terminals) * next_values - values
    # A_t = delta_t + gamma lambda (1 - end_t) A_{t+1}: a terminal or a cut ends the chain
    carry = 1.0 - torch.maximum(terminals, truncations)
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    # one vector op per step, over N envs
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * carry[t] * last
        advantages[t] = last
    return advantages, advantages + values


# The forced-FIRE rule (detail 4), here only: acted_t = 0 where step t was a forced FIRE, 1 where
# the policy chose. Every policy term (clipped surrogate, entropy bonus, advantage normalisation,
# approx KL, clip fraction) is a masked_mean over the acted steps; the value loss takes all steps.
def masked_mean(x: torch.Tensor, acted: torch.Tensor) -> torch.Tensor:
    """Mean of x over the steps the policy chose (acted 1.0), the forced-FIRE rule above."""
    return (x * acted).sum() / acted.sum().clamp(min=1)


def normalise(A: torch.Tensor, acted: torch.Tensor) -> torch.Tensor:
    """(A - mean) / std over the steps the policy chose (detail 4); as they are below two."""
    n = acted.sum()
    mean = masked_mean(A, acted)
    # n - 1: as Tensor.std
    std = (((A - mean) ** 2 * acted).sum() / (n - 1)).sqrt()
    return torch.where(n > 1, (A - mean) / (std + 1e-8), A)


def ppo_losses(
    logprob, old_logprob, advantages, value, old_value, returns, acted, *, clip_coef, clip_vloss
) -> dict:
    """PPO's -L_clip (eq. 7) and L_V (eq. 9), with approx KL and clip fraction for the logs;
    all but L_V over the policy's own steps (the forced-FIRE rule, detail 4)."""
    log_ratio = logprob - old_logprob
    ratio = log_ratio.exp()  # rho_t
    clipped = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    # -L_clip = -E[min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t)]
    policy_loss = masked_mean(torch.max(-advantages * ratio, -advantages * clipped), acted)
    # L_V = (V(h_t) - R_t)^2
    v_loss = (value - returns) ** 2
    if clip_vloss:  # deviation (detail 9, baselines and CleanRL): V kept within eps of the old V
        v_clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        v_loss = torch.max(v_loss, (v_clipped - returns) ** 2)
    with torch.no_grad():
        # k3 estimator (Schulman's blog "Approximating KL")
        approx_kl = masked_mean((ratio - 1) - log_ratio, acted)
        clipfrac = masked_mean(((ratio - 1.0).abs() > clip_coef).float(), acted)
    return {
        "policy_loss": policy_loss,
        "value_loss": 0.5 * v_loss.mean(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


# ---------------------------------------------------------------- rollouts
class Rollout:
    """Storage of one rollout (T steps of N envs) and the acting memory carried to the next."""

    def __init__(self, T: int, N: int, seq_len: int, frame_stack: int, hidden_dim: int, run):
        device = run.device
        self.seq_len = seq_len
        # on the device, (T, N, ...): what the actor saw and did
        self.obs = torch.zeros((T, N, frame_stack, 84, 84), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((T, N), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((T, N), device=device)  # log pi_old(a_t | h_t)
        self.values = torch.zeros((T, N), device=device)  # V_old(h_t)
        self.trunc_values = torch.zeros((T, N), device=device)  # V(final obs) where cut, else 0
        # on the host, (T, N) float each: rewards and flags are born in numpy, and move to the
        # device once per rollout (pinned on a GPU run, so the copies need not wait; each copy is
        # done before the next rollout writes its buffer again, after the losses were read)
        self.rewards = run.host_buffer((T, N))  # sign(r_t) (detail 2)
        self.terminals = run.host_buffer((T, N))  # 1: no V(h_{t+1}) (game over, lost life)
        self.truncations = run.host_buffer((T, N))  # 1: the time limit cut the game after t
        self.starts = run.host_buffer((T, N))  # 1: o_t opens an episode (detail 6)
        self.acted = run.host_buffer((T, N))  # 1: the policy chose a_t; 0: forced FIRE
        # (h, c) entering the first step of each chunk of seq_len steps (detail 7): (T / L, N, H)
        self.h0 = torch.zeros((T // seq_len, N, hidden_dim), device=device)
        self.c0 = torch.zeros((T // seq_len, N, hidden_dim), device=device)

    def restart(self, obs: torch.Tensor, agent: Agent) -> None:
        """Fresh games (a new or resumed run), their first frames on the device: the acting
        memory starts at zero."""
        self.next_obs = obs
        self.state = agent.initial_state(len(obs), self.obs.device)
        self.ep_return = np.zeros(len(obs))
        self.ep_length = np.zeros(len(obs), np.int64)

    def sequences(self, x: torch.Tensor) -> torch.Tensor:
        """(T, N, ...) -> (L, K, ...), K = N T / L: sequence k = j N + n is env n's chunk j,
        steps j L .. j L + L - 1. E.g. T = 6, N = 2, L = 3: sequence 3 (j = 1, n = 1) holds env
        1's steps 3, 4, 5, and x[4, 1] is its [1, 3]."""
        T, N = x.shape[:2]
        L = self.seq_len
        chunks = x.reshape(T // L, L, N, *x.shape[2:])  # [j, l, n] = x[j L + l, n]
        steps_first = chunks.transpose(0, 1)  # (L, T / L, N, ...): [l, j, n]
        return steps_first.reshape(L, -1, *x.shape[2:])  # [l, j N + n] = x[j L + l, n]


@torch.inference_mode()
def collect(agent: Agent, envs: LifeProtocol, ro: Rollout, global_step: int, run) -> int:
    """Fill `ro` with one rollout of every env, one step at a time; returns the new step count."""
    T, N = ro.rewards.shape
    for t in range(T):
        # where the replay of a chunk starts (detail 7)
        if t % ro.seq_len == 0:
            ro.h0[t // ro.seq_len] = ro.state[0][0]
            ro.c0[t // ro.seq_len] = ro.state[1][0]
        ro.obs[t] = ro.next_obs
        ro.starts[t] = torch.from_numpy(envs.start)
        ro.acted[t] = torch.from_numpy(~envs.forced)  # the forced-FIRE rule's mask
        starts = run.upload(ro.starts[t])  # (N,)
        acted = run.upload(ro.acted[t])
        # acting is the training forward with L = 1: (1, N, A) logits, (1, N) values
        logits, value, ro.state = agent(ro.next_obs[None], ro.state, starts[None])
        # NaN weights are caught after the update
        dist = Categorical(logits=logits[0], validate_args=False)
        # the actions taken, forced FIRE included (detail 3)
        action = torch.where(acted.bool(), dist.sample(), envs.vec.fire or 0)
        obs, reward, ended, terminal, cut, final = envs.step(action.cpu().numpy())
        ro.actions[t] = action
        ro.logprobs[t] = dist.log_prob(action)
        ro.values[t] = value[0]
        ro.trunc_values[t] = bootstrap_values(agent, final, cut, ro.state, run.device)
        # rewards clipped for learning (Mnih et al. 2015)
        ro.rewards[t] = torch.from_numpy(np.sign(reward))
        ro.terminals[t] = torch.from_numpy(terminal)
        ro.truncations[t] = torch.from_numpy(cut)
        ro.next_obs = run.to_device(obs)
        global_step += N
        ro.ep_return = ro.ep_return + reward
        ro.ep_length = ro.ep_length + 1
        for i in np.flatnonzero(ended):
            run.episode(global_step, ro.ep_return[i], ro.ep_length[i])
            ro.ep_return[i] = 0.0
            ro.ep_length[i] = 0
    # V after the last step, which GAE bootstraps from (once per rollout: a GPU makes the host wait)
    starts = torch.from_numpy(envs.start).to(run.device)[None]
    _, next_value, _ = agent(ro.next_obs[None], ro.state, starts)
    ro.next_value = next_value[0]
    return global_step


# ---------------------------------------------------------------- learning
def ppo_step(agent: Agent, optimizer, mb: dict, any_start: torch.Tensor, args: Args) -> dict:
    """One gradient step of PPO (eq. 9; details 4, 9) on minibatch `mb` of sequences, (L, B)
    each, replayed from their stored (h, c); its losses, detached."""
    state = (mb["h0"][None], mb["c0"][None])  # (1, B, H) each
    logits, value, _ = agent(mb["obs"], state, mb["starts"], any_start)  # (L, B, A), (L, B)
    dist = Categorical(logits=logits, validate_args=False)  # NaNs: caught after the update
    acted = mb["acted"]
    entropy = masked_mean(dist.entropy(), acted)
    advantages = mb["advantages"]
    if args.norm_adv:
        advantages = normalise(advantages, acted)
    losses = ppo_losses(
        logprob=dist.log_prob(mb["actions"]),
        old_logprob=mb["logprobs"],
        advantages=advantages,
        value=value,
        old_value=mb["values"],
        returns=mb["returns"],
        acted=acted,
        clip_coef=args.clip_coef,
        clip_vloss=args.clip_vloss,
    )
    # loss = -L_clip - c2 H[pi] + c1 L_V
    loss = losses["policy_loss"] - args.ent_coef * entropy + args.vf_coef * losses["value_loss"]
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return {
        "loss": loss.detach(),
        "value_loss": losses["value_loss"].detach(),
        "policy_loss": losses["policy_loss"].detach(),
        "entropy": entropy.detach(),
        "approx_kl": losses["approx_kl"].detach(),
        "clipfrac": losses["clipfrac"].detach(),
    }


LOGGED = ("value_loss", "policy_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")


def update(ppo_step, ro: Rollout, advantages, returns, args: Args, generator, run) -> dict:
    """K epochs of `ppo_step` (the function above with agent, optimizer and args bound; compiled
    with --compile) on minibatches of whole sequences. The last minibatch's losses (the total
    "loss" too), the mean clip fraction and the explained variance, 0-dim tensors by name."""
    starts = run.upload(ro.starts)
    acted = run.upload(ro.acted)
    per_step = dict(obs=ro.obs, actions=ro.actions, logprobs=ro.logprobs, values=ro.values)
    per_step |= dict(advantages=advantages, returns=returns, starts=starts, acted=acted)
    # (T, N, ...) -> (L, K, ...): K = N T / L sequences of L steps (Rollout.sequences)
    batch = {name: ro.sequences(x) for name, x in per_step.items()}
    # (T / L, N, H) -> (K, H): sequence j N + n's stored state, in the order of sequences()
    h0 = ro.h0.flatten(0, 1)
    c0 = ro.c0.flatten(0, 1)
    # (L, K) on the host, where detail 8's spans are found
    host_starts = ro.sequences(ro.starts)
    stats = []
    for _epoch in range(args.update_epochs):
        order = torch.randperm(len(h0), generator=generator)
        for rows in order.split(len(h0) // args.num_minibatches):
            any_start = host_starts[:, rows].any(1)  # (L,)
            rows = run.upload(rows)
            mb = {name: x[:, rows] for name, x in batch.items()}  # (L, B, ...)
            mb["h0"] = h0[rows]  # (B, H)
            mb["c0"] = c0[rows]
            run.graph_step()
            losses = ppo_step(mb, any_start)
            # kept (copied): a compiled step's next CUDA graph run overwrites its outputs
            stats.append({name: value.clone() for name, value in losses.items()})
        # (waits for a GPU)
        if args.target_kl is not None and stats[-1]["approx_kl"] > args.target_kl:
            break
    # one row per minibatch step, the columns in ppo_step's order: stacked once, on the device
    table = torch.stack([torch.stack(list(row.values())) for row in stats])  # (steps, 6)
    columns = dict(zip(stats[0], table.unbind(1)))  # name -> (steps,)
    result = {name: column[-1] for name, column in columns.items()}
    result["clipfrac"] = columns["clipfrac"].mean()
    var_y = batch["returns"].var()
    explained = 1 - (batch["returns"] - batch["values"]).var() / var_y
    result["explained_variance"] = torch.where(var_y > 0, explained, torch.nan)
    return result


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    """Recurrent PPO (Schulman et al. 2017, Algorithm 1, with an LSTM policy) on N Atari games."""
    # PPO's Algorithm 1 with memory; each iteration:
    # 1. anneal the learning rate (detail 9)
    # 2. run pi_old in N envs for T steps, storing (h, c) at each chunk's start   -> collect
    #      (per step: Agent.forward -> Agent.memory, LifeProtocol.step, bootstrap_values)
    # 3. advantages A_t and returns R_t                                           -> gae
    # 4. K epochs of minibatch steps on sequences replayed from their stored (h, c) -> update
    #      (per minibatch: ppo_step -> Agent.forward, normalise, ppo_losses)
    # 5. log; evaluate and checkpoint as due                            -> run.log, run.end_iteration
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)
    atari = atari_settings(asdict(args))
    protocol = resolve_protocol(args.protocol, args.env_id)
    T = args.num_steps
    N = args.num_envs
    # whole rollouts
    total = args.total_steps // (N * T) * N * T
    envs = LifeProtocol(make_envs(N, **atari), atari["baselines"])
    agent = Agent(int(envs.vec.single_action_space.n), args.frame_stack, args.hidden_dim)
    agent = agent.to(run.device, memory_format=torch.channels_last)
    # a tensor: no recompile as it anneals
    lr = torch.tensor(args.learning_rate, device=run.device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, fused=True)
    # draws the minibatch order (its own generator, kept in the checkpoint)
    generator = torch.Generator().manual_seed(args.seed)
    global_step, iteration, horizon = restore(args, run, agent, optimizer, generator, total)
    optimizer.param_groups[0]["lr"] = lr  # (a checkpoint's lr is replaced by the schedule's)
    ppo_update_step = run.compile(partial(ppo_step, agent, optimizer, args=args))
    ro = Rollout(T, N, args.seq_len, args.frame_stack, args.hidden_dim, run)
    # fresh games, also after a resume (detail 11)
    ro.restart(run.to_device(envs.reset(seed=args.seed + global_step)), agent)

    def state() -> dict:
        """The checkpoint's contents at this point of the loop (detail 11)."""
        return checkpoint_state(agent, optimizer, iteration, horizon, generator)

    def evaluate_policy(video_dir: Path | None) -> tuple[list[float], dict]:
        """Full games of the current policy on their own envs (detail 10)."""
        return evaluate(
            agent,
            atari,
            episodes=args.eval_episodes,
            seed=args.seed + 10_000,
            device=run.device,
            stop=run.stop,
            video_dir=video_dir,
        )

    about = dict(game=atari["game"], repeat_action_probability=atari["sticky"], protocol=protocol)
    with run.start(global_step, total, state=state, evaluate=evaluate_policy, **about):
        while global_step < total and not run.stop:
            iteration += 1
            # 1.
            rate = args.learning_rate * (1.0 - global_step / horizon if args.anneal_lr else 1.0)
            lr.fill_(rate)
            # 2.
            global_step = collect(agent, envs, ro, global_step, run)
            # 3.
            advantages, returns = gae(
                rewards=run.upload(ro.rewards),
                values=ro.values,
                next_value=ro.next_value,
                terminals=run.upload(ro.terminals),
                truncations=run.upload(ro.truncations),
                truncation_values=ro.trunc_values,
                gamma=args.gamma,
                gae_lambda=args.gae_lambda,
            )
            # 4.
            losses = update(ppo_update_step, ro, advantages, returns, args, generator, run)
            # 5.
            run.check_finite(losses["loss"], global_step)
            numbers = torch.stack([losses[name] for name in LOGGED]).tolist()  # one device read
            logged = {"losses/" + name: number for name, number in zip(LOGGED, numbers)}
            run.log(global_step, {"charts/learning_rate": rate, **logged})
            run.log(global_step, {"charts/SPS": run.sps(global_step)})
            run.end_iteration(global_step)
        envs.vec.close()
        run.finish(global_step, **about)


# ---------------------------------------------------------------- the file's own plumbing
def check_args(args: Args) -> list[tuple[bool, str]]:
    """(condition, message) rows for Run to check before anything runs, one line per bad flag."""
    positive = "num_envs num_steps seq_len num_minibatches update_epochs frame_stack hidden_dim"
    positive += " learning_rate clip_coef max_grad_norm max_episode_frames"
    values = {"--" + k.replace("_", "-"): getattr(args, k) for k in positive.split()}
    rows = [(v > 0, f"{k} must be positive, got {v}") for k, v in values.items()]
    if not all(ok for ok, _ in rows):
        return rows  # the rows below divide by these flags
    T = args.num_steps
    N = args.num_envs
    L = args.seq_len
    M = args.num_minibatches
    seqs = N * T // L
    rollout = N * T
    gammas = {"gamma": args.gamma, "gae-lambda": args.gae_lambda}
    rows += [(0 <= v <= 1, f"--{k} must be in [0, 1], got {v}") for k, v in gammas.items()]
    split = f"{seqs} sequences per rollout (num_envs * num_steps / seq_len) do not split into"
    enough = args.eval_only or args.total_steps >= rollout
    short = f"less than one rollout (num_envs * num_steps = {rollout}); raise it"
    rows += [
        (T % L == 0, f"--seq-len {L} does not divide --num-steps {T}; pick a divisor of {T}"),
        (seqs % M == 0, f"{split} --num-minibatches {M}; choose a divisor of {seqs}"),
        (enough, f"--total-steps {args.total_steps} is {short}"),
    ]
    return rows


def not_atari(env_id: str, games: dict[str, str]) -> str:
    """Why `env_id` is not an Atari id this file plays, and what to pass instead."""
    for pattern, _ in ATARI_IDS:
        # a game ale_py does not have
        if match := re.fullmatch(pattern, env_id):
            close = difflib.get_close_matches(match[1], games, n=1)
            hint = f"; did you mean {env_id.replace(match[1], close[0])}?" if close else ""
            return f"unknown Atari game {match[1]!r} in {env_id!r}{hint}"
    match = re.fullmatch(r"(?:ALE/)?(\w+?)(-ram)?(?:NoFrameskip|Deterministic)?-v\d+", env_id)
    if match and match[1] in games:
        what = "RAM observations are" if match[2] else "this frame-skip protocol is"
        game = match[1]
        return f"{env_id}: {what} not supported; use {game}NoFrameskip-v4 or ALE/{game}-v5"
    try:
        env = gym.make(env_id)
    except Exception:
        return f"unknown environment id {env_id!r}; use an Atari id such as ALE/Breakout-v5"
    env.close()
    if isinstance(env.action_space, gym.spaces.Box):
        return f"{env_id} is not an Atari game (continuous actions); use d4pg.py, naf.py or rlpd.py"
    if len(env.observation_space.shape) == 1:
        return f"{env_id} is not an Atari game (discrete actions, vector observations); use ppg.py"
    return f"{env_id} is not an Atari game; use BreakoutNoFrameskip-v4 or ALE/<Game>-v5"


def clear_stale_frames(obs, final_obs, stale, life_lost, game_ended):
    """--frame-stack > 1 under baselines (detail 6): zero each env's stacked frames from before a
    lost life, as EpisodicLife's reset would. stale (N,): how many of each env's oldest frames
    were stale after the previous step. -> obs, final_obs (None stays None), the new counts."""

    def zero_oldest(frames: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Frames (N, S, 84, 84) with env i's count[i] oldest of S zeroed."""
        keep = np.arange(frames.shape[1]) >= count[:, None]  # (N, S)
        return frames * keep[:, :, None, None]

    # one step on, the oldest frame has left the stack: one stale frame fewer
    carried = np.maximum(stale - 1, 0)
    if final_obs is not None:
        final_obs = zero_oldest(final_obs, carried)
    # a lost life makes all but the newest frame stale; a new game's stack starts clean
    stale = np.where(life_lost, obs.shape[1] - 1, carried * ~game_ended)
    return zero_oldest(obs, stale), final_obs, stale


def checkpoint_state(agent: Agent, optimizer, iteration: int, horizon: int, generator) -> dict:
    """What a resume needs (detail 11); the acting memory restarts with the games."""
    return {
        "agent": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": Run.rng_state(torch=torch.default_generator, minibatch=generator),
        "iteration": iteration,
        "schedule_steps": horizon,
    }


def restore(args: Args, run, agent: Agent, optimizer, generator, total: int):
    """(global step, iteration, anneal horizon S), loading --resume's checkpoint (detail 9)."""
    same = ("num_envs", "num_steps", "seq_len", "frame_stack", "hidden_dim", "protocol")
    ckpt = run.resume_checkpoint(same)
    horizon = total
    why = ""
    if ckpt is not None:
        horizon = ckpt["schedule_steps"]
        why = "the schedule of the checkpoint"
    if args.schedule_steps is not None:
        horizon = args.schedule_steps
        why = "set by --schedule-steps"
    if args.anneal_lr and horizon < total:
        raise Run.fail(
            f"--total-steps {args.total_steps} runs past the learning-rate anneal, which reaches 0"
            f" at step {horizon} ({why}); pass --schedule-steps {total} (or more) to re-plan it,"
            " or --no-anneal-lr"
        )
    if ckpt is None:
        return 0, 0, horizon
    agent.load_state_dict(ckpt["agent"])
    optimizer.load_state_dict(ckpt["optimizer"])
    Run.set_rng_state(ckpt["rng"], torch=torch.default_generator, minibatch=generator)
    return ckpt["global_step"], ckpt["iteration"], horizon


def sample_actions(logits: torch.Tensor, generator: torch.Generator) -> np.ndarray:
    """a ~ pi(.|h), the evaluated policy (detail 10), drawn on the CPU from its own generator."""
    return torch.multinomial(logits.float().softmax(-1).cpu(), 1, generator=generator)[:, 0].numpy()


@torch.inference_mode()
def evaluate(agent: Agent, atari: dict, episodes: int, seed: int, device, stop=(), video_dir=None):
    """Unclipped scores of full games of the sampled policy (detail 10), and the capped games."""
    # game i seeded seed + i; cut short once `stop` is true (a signal)
    envs = LifeProtocol(make_envs(episodes, **atari), atari["baselines"])
    obs = envs.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    state = agent.initial_state(episodes, device)
    scores = np.zeros(episodes)
    finished = np.zeros(episodes, bool)
    capped = np.zeros(episodes, bool)
    while not finished.all() and not stop:
        starts = torch.from_numpy(envs.start).to(device)[None]
        logits, _, state = agent(torch.from_numpy(obs).to(device)[None], state, starts)
        obs, reward, ended, _, cut, _ = envs.step(sample_actions(logits[0], generator))
        # games that ended keep running; ignore them
        scores += reward * ~finished
        capped |= cut & ~finished
        finished |= ended
    envs.vec.close()
    extra = {"eval_capped_games": int(capped.sum())}
    if video_dir is not None and not stop:
        extra["eval_video_return"] = record_video(agent, atari, video_dir, seed + 10_000, device)
    return scores.tolist(), extra


@torch.inference_mode()
def record_video(agent: Agent, atari: dict, video_dir: Path, seed: int, device) -> float:
    """One game of the sampled policy rendered to mp4 (AtariVectorEnv cannot render); its score."""
    # frames stacked as the vector env stacks them (zero padding), under training's protocol
    ale = dict(frameskip=1, repeat_action_probability=atari["sticky"], render_mode="rgb_array")
    env = AtariEnv(atari["game"], max_num_frames_per_episode=atari["max_frames"], **ale)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, terminal_on_life_loss=False)
    env = gym.wrappers.RecordVideo(env, str(video_dir), disable_logger=True)
    frame, info = env.reset(seed=seed)
    meanings = env.unwrapped.get_action_meanings()
    fire = meanings.index("FIRE") if atari["baselines"] and "FIRE" in meanings else None
    # as use_fire_reset in the vector env
    if fire is not None:
        frame, _, _, _, info = env.step(fire)
    stack = np.zeros((1, atari["frame_stack"], 84, 84), dtype=np.uint8)
    generator = torch.Generator().manual_seed(seed)
    score = 0.0
    done = False
    forced = False
    state = agent.initial_state(1, device)
    start = 1.0
    lives = info["lives"]
    while not done:
        # a new episode (start 1) clears the stack, as LifeProtocol's clear_stale_frames
        stack = np.concatenate([stack[:, 1:] * (start == 0), frame[None, None]], axis=1)
        starts = torch.full((1, 1), start, device=device)
        logits, _, state = agent(torch.from_numpy(stack).to(device)[None], state, starts)
        action = int(sample_actions(logits[0], generator)[0])
        frame, reward, term, trunc, info = env.step(fire if forced else action)
        lost = info["lives"] < lives and not (term or trunc)
        score = score + float(reward)
        done = term or trunc
        lives = info["lives"]
        start = float(lost and atari["baselines"])
        forced = lost and fire is not None
    env.close()
    return score


def eval_only(args: Args, run) -> None:
    """Evaluate --checkpoint with its run's settings: it repeats the run's final evaluation."""
    ckpt = Run.load_checkpoint(args.checkpoint)
    weights = ckpt["agent"]
    frame_stack = weights["network.0.weight"].shape[1]
    # protocol auto: checkpoints from before --protocol
    flags = {"protocol": "auto", **ckpt["args"], "frame_stack": frame_stack}
    atari = atari_settings(flags)
    agent = Agent(len(weights["actor.bias"]), frame_stack, weights["lstm.weight_hh_l0"].shape[1])
    agent.to(run.device, memory_format=torch.channels_last).load_state_dict(weights)
    result = evaluate(
        agent,
        atari,
        episodes=args.eval_episodes,
        seed=flags["seed"] + 10_000,
        device=run.device,
        stop=(),
        video_dir=run.video_dir,
    )
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
