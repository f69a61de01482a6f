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


@dataclass
class Args:
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


def make_envs(num_envs, game, sticky, max_frames, frame_stack, baselines) -> AtariVectorEnv:
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
    """(terminal, truncation, life lost) of one vector step, numpy bool arrays (detail 3)."""
    # After a game ends `lives` is the new game's; a game over at the time limit is terminal.
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    return terminated | (life_lost & baselines), truncated & ~terminated, life_lost


def clear_stale(obs: np.ndarray, stale: np.ndarray) -> np.ndarray:
    """Zero each env's `stale` oldest stacked frames: those from before a lost life (detail 6)."""
    return obs * (np.arange(obs.shape[1]) >= stale[:, None])[:, :, None, None]


class LifeProtocol:
    """The vector env under detail 3's protocol, with detail 6's episode starts and frame stack."""

    def __init__(self, envs, baselines: bool):
        self.vec, self.baselines = envs, baselines

    def reset(self, seed: int) -> np.ndarray:
        obs, info = self.vec.reset(seed=seed)
        self.lives, self.stale = info["lives"], np.zeros(len(obs), np.int64)
        self.start, self.forced = np.ones(len(obs), np.float32), np.zeros(len(obs), bool)
        return obs

    def step(self, actions: np.ndarray):
        """-> obs, reward, game ended, terminal, time-limit cut, final obs."""
        if self.forced.any():
            actions = np.where(self.forced, self.vec.fire, actions)
        obs, reward, term, trunc, info = self.vec.step(actions)
        terminal, cut, lost = learning_flags(term, trunc, info["lives"], self.lives, self.baselines)
        stale = np.maximum(self.stale - 1, 0)
        final = clear_stale(info["final_obs"], stale) if cut.any() else None
        self.stale = np.where(lost & self.baselines, obs.shape[1] - 1, stale * ~(term | trunc))
        self.lives, self.forced = info["lives"], lost & (self.vec.fire is not None)
        self.start = (terminal | cut).astype(np.float32)
        return clear_stale(obs, self.stale), reward, term | trunc, terminal, cut, final


# ---------------------------------------------------------------- network
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
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
            nn.init.orthogonal_(param, 1.0) if "weight" in name else nn.init.zeros_(param)
        self.actor = layer_init(nn.Linear(hidden_dim, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(hidden_dim, 1), std=1.0)

    def initial_state(self, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(2, 1, batch, self.lstm.hidden_size, device=device).unbind()

    def forward(self, obs: torch.Tensor, state: tuple, starts: torch.Tensor, spans=None):
        """Frames (L, B, C, 84, 84), (h, c) entering step 0, starts (L, B) -> logits, V, (h, c)."""
        x = obs.flatten(0, 1).to(torch.float32, memory_format=torch.channels_last) / 255.0
        out, state = self.memory(self.network(x).view(*starts.shape, -1), state, starts, spans)
        return self.actor(out), self.critic(out).squeeze(-1), state

    @torch.compiler.disable  # Dynamo does not trace nn.LSTM: eager (cuDNN on a GPU) when compiled
    def memory(self, x, state, starts, spans):
        """Features x (L, B, D) -> LSTM outputs, (h, c): one call per span (detail 8)."""
        # spans (L,), needed when L > 1: whether some sequence starts an episode at t, from the
        # host (a search on the device would make the host wait for a GPU)
        cuts = (spans[1:].nonzero()[:, 0] + 1).tolist() if len(x) > 1 else []
        bounds, (h, c), outputs = [0, *cuts, len(x)], state, []
        for t0, t1 in zip(bounds[:-1], bounds[1:]):
            # the steps [t0, t1) hold no episode start but at t0: zero those sequences' memory there
            keep = (1.0 - starts[t0])[None, :, None]
            out, (h, c) = self.lstm(x[t0:t1], (h * keep, c * keep))
            outputs.append(out)
        return torch.cat(outputs), (h, c)


# ---------------------------------------------------------------- PPO math
def bootstrap_values(agent: Agent, final_obs, cut, state, device) -> torch.Tensor:
    """V(real final observation) where the time limit cut the episode, else 0 (detail 3)."""
    # one more LSTM step from the episode's own state, before the reset zeroes it
    values = torch.zeros(len(cut), device=device)
    if cut.any():
        idx = torch.from_numpy(np.flatnonzero(cut)).to(device)
        final = torch.from_numpy(final_obs[cut]).to(device)[None]
        no_start = torch.zeros(1, len(idx), device=device)
        values[idx] = agent(final, (state[0][:, idx], state[1][:, idx]), no_start)[1][0]
    return values


def gae(rewards, values, next_value, terminals, truncations, truncation_values, gamma, gae_lambda):
    """GAE advantages and returns R_t = A_t + V(s_t), (T, N) tensors; next_value: V after T."""
    # terminals: V(s_{t+1}) = 0 (game over or life loss); truncations: V(s_{t+1}) = V(real final
    # observation), truncation_values, not values[t + 1] (a reset game). Either ends the chain.
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(truncations.bool(), truncation_values, next_values)
    deltas = rewards + gamma * (1.0 - terminals) * next_values - values
    carry = 1.0 - torch.maximum(terminals, truncations)
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    # one vector op per step, over N envs
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * carry[t] * last
        advantages[t] = last
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, acted: torch.Tensor) -> torch.Tensor:
    """Mean over the steps the policy chose (acted 1.0; forced FIRE 0.0, detail 4)."""
    return (x * acted).sum() / acted.sum().clamp(min=1)


def normalise(A: torch.Tensor, acted: torch.Tensor) -> torch.Tensor:
    """(A - mean) / std over the steps the policy chose (detail 4); as they are below two."""
    n, mean = acted.sum(), masked_mean(A, acted)
    # n - 1: as Tensor.std
    std = (((A - mean) ** 2 * acted).sum() / (n - 1)).sqrt()
    return torch.where(n > 1, (A - mean) / (std + 1e-8), A)


def ppo_losses(
    logprob, old_logprob, advantages, value, old_value, returns, clip_coef, clip_vloss, acted
):
    """-L_clip, L_V, approx KL and clip fraction; all but L_V over the policy's steps (detail 4)."""
    log_ratio = logprob - old_logprob
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    pg_loss = masked_mean(torch.max(-advantages * ratio, -advantages * clipped), acted)
    v_loss = (value - returns) ** 2
    if clip_vloss:
        v_clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        v_loss = torch.max(v_loss, (v_clipped - returns) ** 2)
    with torch.no_grad():
        # k3 estimator (Schulman's blog "Approximating KL")
        approx_kl = masked_mean((ratio - 1) - log_ratio, acted)
        clipfrac = masked_mean(((ratio - 1.0).abs() > clip_coef).float(), acted)
    return pg_loss, 0.5 * v_loss.mean(), approx_kl, clipfrac


class Rollout:
    """Storage of one rollout (T steps of N envs) and the acting memory carried to the next."""

    def __init__(self, T: int, N: int, seq_len: int, frame_stack: int, hidden_dim: int, device):
        self.seq_len = seq_len
        self.obs = torch.zeros((T, N, frame_stack, 84, 84), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((T, N), dtype=torch.long, device=device)
        self.logprobs, self.values, self.trunc_values = torch.zeros((3, T, N), device=device)
        # Host memory, pinned on a GPU so that copies from it need not wait; each is done before its
        # buffer is written again (the next action copy, or the read of the losses, waits for it).
        # Rewards and flags are born in numpy: kept on the host, moved once per rollout.
        cuda = self.obs.is_cuda
        self.host = torch.zeros((5, T, N), pin_memory=cuda)
        self.rewards, self.terminals, self.truncations, self.starts, self.acted = self.host.numpy()
        self.pinned_obs = torch.empty(self.obs.shape[1:], dtype=torch.uint8, pin_memory=cuda)
        # (h, c) entering the first step of each chunk of seq_len steps (detail 7)
        self.h0, self.c0 = torch.zeros((2, T // seq_len, N, hidden_dim), device=device)

    def restart(self, obs: np.ndarray, agent: Agent) -> None:
        """Fresh games (a new or resumed run): the acting memory starts at zero."""
        self.next_obs = to_device(self.pinned_obs, obs, self.obs.device)
        self.state = agent.initial_state(len(obs), self.obs.device)
        self.ep_return, self.ep_length = np.zeros(len(obs)), np.zeros(len(obs), np.int64)

    def sequences(self, x: torch.Tensor) -> torch.Tensor:
        """(T, N, ...) -> (L, K, ...), K = N T / L: sequence j N + n is env n's chunk j."""
        (T, N), L = x.shape[:2], self.seq_len
        return x.reshape(T // L, L, N, *x.shape[2:]).transpose(0, 1).reshape(L, -1, *x.shape[2:])


def to_device(pinned: torch.Tensor, array: np.ndarray, device) -> torch.Tensor:
    # through the host buffer `pinned`: the copy need not wait for a GPU
    return pinned.copy_(torch.from_numpy(array)).to(device, non_blocking=True)


@torch.inference_mode()
def collect(agent: Agent, envs: LifeProtocol, ro: Rollout, global_step: int, log) -> int:
    """Fill `ro` with one rollout of every env, one step at a time; returns the new step count."""
    (T, N), device = ro.rewards.shape, ro.obs.device
    for t in range(T):
        # where the replay of a chunk starts (detail 7)
        if t % ro.seq_len == 0:
            ro.h0[t // ro.seq_len], ro.c0[t // ro.seq_len] = ro.state[0][0], ro.state[1][0]
        ro.obs[t], ro.starts[t], ro.acted[t] = ro.next_obs, envs.start, ~envs.forced
        # from the pinned rows just written, as each copy below: the host need not wait for a GPU
        starts, acted = (ro.host[k, t].to(device, non_blocking=True) for k in (3, 4))
        logits, value, ro.state = agent(ro.next_obs[None], ro.state, starts[None])
        # NaN weights are caught after the update
        dist = Categorical(logits=logits[0], validate_args=False)
        # the actions taken, forced FIRE included (detail 3)
        action = torch.where(acted.bool(), dist.sample(), envs.vec.fire or 0)
        obs, reward, ended, terminal, cut, final = envs.step(action.cpu().numpy())
        ro.actions[t], ro.logprobs[t], ro.values[t] = action, dist.log_prob(action), value[0]
        ro.trunc_values[t] = bootstrap_values(agent, final, cut, ro.state, device)
        # rewards clipped for learning (Mnih et al. 2015)
        ro.rewards[t], ro.terminals[t], ro.truncations[t] = np.sign(reward), terminal, cut
        ro.next_obs, global_step = to_device(ro.pinned_obs, obs, device), global_step + N
        ro.ep_return, ro.ep_length = ro.ep_return + reward, ro.ep_length + 1
        for i in np.flatnonzero(ended):
            log.episode(global_step, ro.ep_return[i], ro.ep_length[i])
            ro.ep_return[i], ro.ep_length[i] = 0.0, 0
    # V after the last step, which GAE bootstraps from (once per rollout: a GPU makes the host wait)
    starts = torch.from_numpy(envs.start).to(device)[None]
    ro.next_value = agent(ro.next_obs[None], ro.state, starts)[1][0]
    return global_step


def ppo_step(agent: Agent, optimizer, mb: dict, spans: torch.Tensor, args: Args):
    """One gradient step of PPO (details 4, 9) on minibatch `mb` of sequences; its losses."""
    logits, value, _ = agent(mb["obs"], (mb["h0"][None], mb["c0"][None]), mb["starts"], spans)
    dist = Categorical(logits=logits, validate_args=False)  # NaNs: caught after the update
    acted, A = mb["acted"], mb["advantages"]
    # over the policy's own steps (detail 4)
    entropy = masked_mean(dist.entropy(), acted)
    A = normalise(A, acted) if args.norm_adv else A
    logprob, old, R = dist.log_prob(mb["actions"]), mb["logprobs"], mb["returns"]
    pg_loss, v_loss, approx_kl, clipfrac = ppo_losses(
        logprob, old, A, value, mb["values"], R, args.clip_coef, args.clip_vloss, acted
    )
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return torch.stack([loss, v_loss, pg_loss, entropy, approx_kl, clipfrac]).detach()


LOGGED = ("value_loss", "policy_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")


def update(step, ro: Rollout, advantages, returns, args: Args, generator) -> torch.Tensor:
    """K epochs of `step` (ppo_step, or compiled) on minibatches of sequences: loss, LOGGED."""
    starts, acted = ro.host[3:].to(ro.obs.device, non_blocking=True)
    batch = dict(obs=ro.obs, actions=ro.actions, logprobs=ro.logprobs, values=ro.values)
    batch |= dict(advantages=advantages, returns=returns, starts=starts, acted=acted)
    batch = {k: ro.sequences(v) for k, v in batch.items()}
    # detail 8's spans, found on the host
    host_starts, stats = ro.sequences(ro.host[3]), []
    h0, c0 = ro.h0.flatten(0, 1), ro.c0.flatten(0, 1)
    for epoch in range(args.update_epochs):
        order = torch.randperm(len(h0), generator=generator)
        for rows in order.split(len(h0) // args.num_minibatches):
            spans = host_starts[:, rows].any(1)
            rows = rows.to(ro.obs.device, non_blocking=True)
            mb = {k: v[:, rows] for k, v in batch.items()} | dict(h0=h0[rows], c0=c0[rows])
            # compiled: its outputs are kept (copied), so a new CUDA graph step (not in eager mode:
            # its first call imports Inductor, seconds)
            if args.compile:
                torch.compiler.cudagraph_mark_step_begin()
            stats.append(step(mb, spans).clone())
        # (waits for a GPU)
        if args.target_kl is not None and stats[-1][4] > args.target_kl:
            break
    stats = torch.stack(stats)
    var_y = batch["returns"].var()
    explained = 1 - (batch["returns"] - batch["values"]).var() / var_y
    explained = torch.where(var_y > 0, explained, torch.nan)
    return torch.cat([stats[-1, :5], stats[:, 5].mean().view(1), explained.view(1)])


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    check_args(args)
    if args.eval_only:
        return eval_only(args)
    atari, protocol = atari_settings(asdict(args)), resolve_protocol(args.protocol, args.env_id)
    device = seed_and_pick_device(args)
    T, N = args.num_steps, args.num_envs
    # whole rollouts
    total = args.total_steps // (N * T) * N * T
    envs = LifeProtocol(make_envs(N, **atari), atari["baselines"])
    agent = Agent(int(envs.vec.single_action_space.n), args.frame_stack, args.hidden_dim)
    agent = agent.to(device, memory_format=torch.channels_last)
    # a tensor: no recompile as it anneals
    lr = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, fused=True)
    # the minibatch order's
    generator = torch.Generator().manual_seed(args.seed)
    global_step, iteration, horizon = restore(args, agent, optimizer, generator, total)
    optimizer.param_groups[0]["lr"] = lr  # (a checkpoint's lr is replaced by the schedule's)
    gammas = dict(gamma=args.gamma, gae_lambda=args.gae_lambda)
    step = compiled(partial(ppo_step, agent, optimizer, args=args), args, device)
    ro = Rollout(T, N, args.seq_len, args.frame_stack, args.hidden_dim, device)
    # fresh games, also after a resume (detail 11)
    ro.restart(envs.reset(seed=args.seed + global_step), agent)
    stop = stop_signal()
    eval_seed = args.seed + 10_000
    evaluate_policy = partial(evaluate, agent, atari, args.eval_episodes, eval_seed, device, stop)

    def state() -> dict:
        return checkpoint_state(agent, optimizer, iteration, horizon, generator)

    run_dir, resumed = run_dir_for(args, args.resume), args.resume is not None
    about = dict(game=atari["game"], repeat_action_probability=atari["sticky"], protocol=protocol)
    with RunLogger(
        args, run_dir, global_step, total, resumed, resolved_device=str(device), **about
    ) as log:
        while global_step < total and not stop:
            iteration += 1
            # detail 9
            rate = args.learning_rate * (1.0 - global_step / horizon if args.anneal_lr else 1.0)
            lr.fill_(rate)
            global_step = collect(agent, envs, ro, global_step, log)
            rewards, terminals, cut = ro.host[:3].to(device, non_blocking=True)
            A, R = gae(rewards, ro.values, ro.next_value, terminals, cut, ro.trunc_values, **gammas)
            stats = update(step, ro, A, R, args, generator)
            log.check_finite(stats[0], global_step)
            losses = {"losses/" + k: v for k, v in zip(LOGGED, stats[1:].tolist())}
            log.scalars(global_step, {"charts/learning_rate": rate, **losses})
            log.scalars(global_step, {"charts/SPS": log.sps(global_step)})
            log.end_iteration(global_step, stop, evaluate_policy, state)
        envs.vec.close()
        log.finish(global_step, stop, evaluate_policy, state, **about)


# ---------------------------------------------------------------- the file's own plumbing
def check_args(args: Args) -> None:
    """Stop on a bad flag in one line, before anything runs."""
    positive = "num_envs num_steps seq_len num_minibatches update_epochs frame_stack hidden_dim"
    positive += " learning_rate clip_coef max_grad_norm max_episode_frames"
    values = {"--" + k.replace("_", "-"): getattr(args, k) for k in positive.split()}
    check_flags(args, [(v > 0, f"{k} must be positive, got {v}") for k, v in values.items()])
    T, N, L, M = args.num_steps, args.num_envs, args.seq_len, args.num_minibatches
    seqs, rollout, gammas = N * T // L, N * T, {"gamma": args.gamma, "gae-lambda": args.gae_lambda}
    rows = [(0 <= v <= 1, f"--{k} must be in [0, 1], got {v}") for k, v in gammas.items()]
    split = f"{seqs} sequences per rollout (num_envs * num_steps / seq_len) do not split into"
    enough = args.eval_only or args.total_steps >= rollout
    short = f"less than one rollout (num_envs * num_steps = {rollout}); raise it"
    rows += [
        (T % L == 0, f"--seq-len {L} does not divide --num-steps {T}; pick a divisor of {T}"),
        (seqs % M == 0, f"{split} --num-minibatches {M}; choose a divisor of {seqs}"),
        (enough, f"--total-steps {args.total_steps} is {short}"),
    ]
    check_flags(args, rows)


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


def checkpoint_state(agent: Agent, optimizer, iteration: int, horizon: int, generator) -> dict:
    """What a resume needs (detail 11); the acting memory restarts with the games."""
    rng = rng_state(torch=torch.default_generator, minibatch=generator)
    state = {"agent": agent.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng}
    return {**state, "iteration": iteration, "schedule_steps": horizon}


def restore(args: Args, agent: Agent, optimizer, generator, total: int) -> tuple[int, int, int]:
    """(global step, iteration, anneal horizon S), loading --resume's checkpoint (detail 9)."""
    same = ("num_envs", "num_steps", "seq_len", "frame_stack", "hidden_dim", "protocol")
    ckpt = resume_checkpoint(args, same) if args.resume else None
    horizon, why = total, ""
    if ckpt:
        horizon, why = ckpt["schedule_steps"], "the schedule of the checkpoint"
    if args.schedule_steps is not None:
        horizon, why = args.schedule_steps, "set by --schedule-steps"
    if args.anneal_lr and horizon < total:
        raise fail(
            f"--total-steps {args.total_steps} runs past the learning-rate anneal, which reaches 0"
            f" at step {horizon} ({why}); pass --schedule-steps {total} (or more) to re-plan it,"
            " or --no-anneal-lr"
        )
    if ckpt is None:
        return 0, 0, horizon
    agent.load_state_dict(ckpt["agent"])
    optimizer.load_state_dict(ckpt["optimizer"])
    set_rng_state(ckpt["rng"], torch=torch.default_generator, minibatch=generator)
    return ckpt["global_step"], ckpt["iteration"], horizon


def sample_actions(logits: torch.Tensor, generator: torch.Generator) -> np.ndarray:
    """a ~ pi(.|h), the evaluated policy (detail 10), drawn on the CPU from its own generator."""
    return torch.multinomial(logits.float().softmax(-1).cpu(), 1, generator=generator)[:, 0].numpy()


@torch.inference_mode()
def evaluate(agent: Agent, atari: dict, episodes: int, seed: int, device, stop=(), video_dir=None):
    """Unclipped scores of full games of the sampled policy (detail 10), and the capped games."""
    # game i seeded seed + i; cut short once `stop` is true (a signal)
    envs = LifeProtocol(make_envs(episodes, **atari), atari["baselines"])
    obs, generator = envs.reset(seed=seed), torch.Generator().manual_seed(seed)
    state, scores = agent.initial_state(episodes, device), np.zeros(episodes)
    finished, capped = np.zeros((2, episodes), bool)
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
    generator, score, done, forced = torch.Generator().manual_seed(seed), 0.0, False, False
    state, start, lives = agent.initial_state(1, device), 1.0, info["lives"]
    while not done:
        stack = np.concatenate([stack[:, 1:] * (start == 0), frame[None, None]], axis=1)
        starts = torch.full((1, 1), start, device=device)
        logits, _, state = agent(torch.from_numpy(stack).to(device)[None], state, starts)
        action = int(sample_actions(logits[0], generator)[0])
        frame, reward, term, trunc, info = env.step(fire if forced else action)
        lost = info["lives"] < lives and not (term or trunc)
        score, done, lives = score + float(reward), term or trunc, info["lives"]
        start, forced = float(lost and atari["baselines"]), lost and fire is not None
    env.close()
    return score


def eval_only(args: Args) -> None:
    """Evaluate --checkpoint with its run's settings: it repeats the run's final evaluation."""
    ckpt, device = load_checkpoint(args.checkpoint), seed_and_pick_device(args)
    # protocol auto: checkpoints from before --protocol
    weights = ckpt["agent"]
    frame_stack = weights["network.0.weight"].shape[1]
    run = {"protocol": "auto", **ckpt["args"], "frame_stack": frame_stack}
    atari = atari_settings(run)
    agent = Agent(len(weights["actor.bias"]), frame_stack, weights["lstm.weight_hh_l0"].shape[1])
    agent.to(device, memory_format=torch.channels_last).load_state_dict(weights)
    video_dir = run_dir_for(args, args.checkpoint) / "videos" if args.capture_video else None
    result = evaluate(agent, atari, args.eval_episodes, run["seed"] + 10_000, device, (), video_dir)
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
