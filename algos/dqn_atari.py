"""DQN (Nature) on Atari: Q-learning from pixels with experience replay and a target network.

Paper: V. Mnih, K. Kavukcuoglu, D. Silver, A. A. Rusu, J. Veness, M. G. Bellemare, A. Graves,
M. Riedmiller, A. K. Fidjeland, G. Ostrovski et al., "Human-level control through deep
reinforcement learning", Nature 518:529-533, 2015 (first version: arXiv:1312.5602, 2013).
Peer implementation: CleanRL `dqn_atari.py`, whose defaults and published scores we follow.

Idea: learn the optimal action value Q*(s, a) from pixels with one network for all games.
Two tricks make the bootstrapped regression stable: sample past transitions uniformly from a
large replay memory D (breaks the correlation of consecutive frames, reuses data), and
compute the targets with a copy theta^- of the weights refreshed only every C steps.

Equations (Nature, Methods "Training algorithm for deep Q-networks"):
  y_j      = r_j + gamma * (1 - d_j) * max_a' Q(s_{j+1}, a'; theta^-)
  L(theta) = E_{(s, a, r, s', d) ~ U(D)} [ (y_j - Q(s_j, a_j; theta))^2 ]
  theta^-  <- tau * theta + (1 - tau) * theta^-   every C = --target-network-frequency steps
              (tau = 1: the paper's hard copy)
  epsilon_t = max(end_e, start_e + (end_e - start_e) * t / H),   H = exploration_fraction * T

Implementation details:
 1. Environment: ale_py's C++ AtariVectorEnv with the literature preprocessing: up to 30
    no-op starts, frame skip 4 with a max over the last two frames, 84x84 grayscale, a stack
    of 4. `<Game>NoFrameskip-v4` -> no sticky actions (the DQN protocol); `ALE/<Game>-v5` ->
    sticky actions 0.25 (Machado et al. 2018). <Game> is any ROM ale_py ships, spelled as
    Gymnasium spells it (`ALE/Pitfall2-v5`, `TicTacToe3DNoFrameskip-v4`); other ids are
    refused in one line.
 2. Rewards: the network learns from sign(r) (Nature's clipping); `charts/episodic_return` is
    the unclipped full-game score (all lives) and `charts/episodic_length` is in agent steps.
 3. Life and FIRE protocol (`--protocol`; auto = baselines for NoFrameskip-v4, machado for v5).
    A lost life is a drop of `info["lives"]` within a game (after a game end the count is the
    next game's, and a game with bonus lives can end above it).
    - baselines (OpenAI baselines / CleanRL's EpisodicLife + FireReset, with which the published
      NoFrameskip-v4 scores were made): in games with FIRE, FIRE is pressed at reset and, as the
      next agent step, after each lost life (in place of the epsilon-greedy action); a lost
      life is terminal for learning (d = 1 in the replay). DQN learns off-policy, so the forced
      step is stored as an ordinary transition with action FIRE: a real (s, a, r, s') for
      Q-learning. It counts as an agent step.
    - machado (Machado et al. 2018): no FIRE and no life signal; only a game over has d = 1.
    Neither resets the game at a lost life, so the logged score and evaluation are whole games
    played under the same protocol.
 4. Autoreset mode SameStep: the step that ends a game returns the first observation of the
    next game and the real last one in `info["final_obs"]`, which becomes s' of the stored
    transition. No transition spans two games. Truncation (`--max-episode-frames`) stores
    d = 0, so the target bootstraps from the real final observation.
 5. Replay memory stores every 84x84 frame once (7 GB for 1M transitions instead of 28 GB
    with a stack of 4 per transition; results/dqn_atari-measurements.md), in one ring per
    environment so streams never interleave. Stacks are rebuilt at sampling; frames before a
    game's first frame are zeros, exactly what the env returns at reset. Each game costs one
    extra slot (its final frame). Sampling is uniform over stored transitions and vectorised.
 6. Nature CNN (32x8x8/4, 64x4x4/2, 64x3x3/1, 512), uint8 until the forward pass, which
    divides a float copy by 255 (the caller's tensor is never changed).
 7. Deviations from the paper, following CleanRL (its published scores, in zoo/dqn_atari.toml,
    are our anchor): Adam lr 1e-4 instead of RMSProp 2.5e-4; squared error instead of the
    paper's error clipping to [-1, 1] (a Huber loss); learning starts at 80k steps, not 50k.
 8. Steps count environment steps summed over envs. With several envs, the number of
    updates per env step (1 / --train-frequency) and the target period stay as with one.
 9. Evaluation: one AtariVectorEnv with one game per sub-env, seeds seed + 10000 + i, epsilon
    = --eval-epsilon (0.05, as Nature and CleanRL: a purely greedy agent can stall forever,
    e.g. never pressing FIRE under machado), FIRE forced after a lost life as in training
    (detail 3); the random actions come from a fixed-seed generator, so evaluation stays
    reproducible. --eval-only takes the env, seed, frame cap, epsilon and protocol from the
    checkpoint, so it repeats the run's own final evaluation. --capture-video saves its first
    game as the network sees it (84x84 grayscale): the vector env does not render, and a game
    replayed on another emulator wrapper would not be the one whose score is reported.
10. The checkpoint holds the replay memory, the epsilon horizon H and the numpy generator of
    epsilon-greedy and sampling. A resume restarts the emulators, cutting the game in progress.
11. H = exploration_fraction * T is fixed by the first run's --total-steps T: extending a run
    continues at end_e instead of exploring again and refilling the replay with random play.
    H is a length of exploration, as in Nature (1M frames whatever the run's length).
12. --compile runs the TD update (forward, loss, backward, Adam step) and the acting forward
    through torch.compile (CUDA graphs on a GPU); evaluation stays eager. Off by default: it has
    not yet been measured to win on a GPU.

Usage: python algos/dqn_atari.py --env-id BreakoutNoFrameskip-v4 --total-steps 10000000
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from ale_py import Action
from ale_py.roms import get_all_rom_ids
from ale_py.vector_env import AtariVectorEnv
from torch.utils.tensorboard import SummaryWriter

# Every line above the run harness (the class `Run`, at the bottom) that starts with `run.` or
# `Run.` is plumbing: Run(args, checks) checks the flags, seeds and picks run.device; run.start ...
# run.finish wrap the loop (logs, evaluations, checkpoints); Run.every and Run.polyak are helpers.


@dataclass
class Args:
    """DQN's flags (tyro): the common ones first, then the algorithm's; the module
    docstring at the top of dqn_atari.py gives the reasons for their defaults."""

    env_id: str = "BreakoutNoFrameskip-v4"
    """<Game>NoFrameskip-v4 or ALE/<Game>-v5"""
    protocol: Literal["auto", "baselines", "machado"] = "auto"
    """life and FIRE protocol (detail 3)"""
    seed: int = 1
    """random seed"""
    total_steps: int = 10_000_000
    """env steps summed over envs"""
    num_envs: int = 1
    """parallel games"""
    torch_deterministic: bool = True
    """deterministic torch algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: cuda if available"""
    compile: bool = False
    """torch.compile the update and acting (CUDA graphs on a GPU)"""
    exp_name: str = "dqn_atari"
    """experiment name"""
    run_dir: str | None = None
    """run directory (default: under runs/)"""
    checkpoint_interval: int = 1_000_000
    """env steps between checkpoints (0: at the end)"""
    resume: str | None = None
    """checkpoint to continue from"""
    eval_episodes: int = 10
    """evaluation games"""
    eval_interval: int = 1_000_000
    """env steps between evaluations (0: at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint"""
    checkpoint: str | None = None
    """checkpoint for --eval-only"""
    capture_video: bool = False
    """record the first evaluation game"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """W&B project"""
    # DQN
    buffer_size: int = 1_000_000
    """replay memory size in transitions"""
    learning_rate: float = 1e-4
    """Adam learning rate"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target update rate (1: hard copy)"""
    target_network_frequency: int = 1000
    """env steps between target network updates (C)"""
    batch_size: int = 32
    """minibatch size"""
    start_e: float = 1.0
    """initial exploration epsilon"""
    end_e: float = 0.01
    """final exploration epsilon"""
    exploration_fraction: float = 0.10
    """share of the first run's steps with decaying epsilon"""
    learning_starts: int = 80_000
    """env steps before learning starts"""
    train_frequency: int = 4
    """env steps between gradient updates"""
    max_episode_frames: int = 108_000
    """emulator frames before a game is cut (30 minutes)"""
    eval_epsilon: float = 0.05
    """exploration epsilon during evaluation"""


# ---------------------------------------------------------------- environment
def atari_protocol(env_id: str) -> tuple[str, float]:
    """(ALE ROM, sticky-action probability) of a pixel Atari id (detail 1); any other id stops
    in one line that names the file that fits it."""
    # as ale_py registers them: tic_tac_toe_3d -> TicTacToe3D
    games = {rom.title().replace("_", ""): rom for rom in get_all_rom_ids()}
    for prefix, suffix, sticky in (("", "NoFrameskip-v4", 0.0), ("ALE/", "-v5", 0.25)):
        name = env_id.removeprefix(prefix).removesuffix(suffix)
        if env_id != prefix + name + suffix:
            continue
        if name in games:
            return games[name], sticky
        if name.isalnum():
            message = f"no Atari ROM named {name!r} in ale_py for {env_id!r}; check the spelling"
            raise Run.fail(message)
    try:  # name the file that fits an id Gymnasium knows (ale_py registered the RAM ids)
        hint = "it has vector observations: use ppg.py"
        if isinstance(gym.make(env_id).action_space, gym.spaces.Box):
            hint = "its actions are continuous: use d4pg.py, naf.py or rlpd.py"
    except Exception:
        hint = "use ppg.py (vector observations) or d4pg.py, naf.py, rlpd.py (continuous actions)"
    raise Run.fail(
        f"{env_id!r} is not a pixel Atari id (<Game>NoFrameskip-v4, ALE/<Game>-v5); {hint}"
    )


def resolve_protocol(protocol: str, env_id: str) -> str:
    """The life and FIRE protocol of detail 3: `auto` follows the id's literature."""
    if protocol != "auto":
        return protocol
    return "baselines" if env_id.endswith("NoFrameskip-v4") else "machado"


def make_envs(args: Args, num_envs: int) -> AtariVectorEnv:
    """ale_py's C++ vector env with the literature preprocessing (detail 1). It reports raw data:
    reward clipping, lives and resets are ours (details 2-4)."""
    game, sticky = atari_protocol(args.env_id)
    baselines = resolve_protocol(args.protocol, args.env_id) == "baselines"
    envs = AtariVectorEnv(
        game,
        num_envs,
        repeat_action_probability=sticky,
        max_num_frames_per_episode=args.max_episode_frames,
        reward_clipping=False,
        episodic_life=False,
        life_loss_info=False,
        autoreset_mode="SameStep",
        use_fire_reset=baselines,
    )
    action_set = list(envs.ale.get_action_set())
    # the action pressed after a lost life, or None (detail 3)
    envs.fire = action_set.index(Action.FIRE) if baselines and Action.FIRE in action_set else None
    return envs


def learning_flags(terminated, truncated, lives, prev_lives, baselines: bool):
    """(d, life lost) of one vector step, numpy bool arrays (detail 3): d is a game over, or under
    baselines a lost life too."""
    # After a game end `lives` is the next game's, and a game with bonus lives can end above it:
    # compare within a game only (a life lost on a truncation's own step is not visible).
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    return terminated | (life_lost & baselines), life_lost


@dataclass
class EnvStep:
    """One vector step under detail 3's protocol: what the replay stores and the loop logs."""

    actions: np.ndarray  # [N] the actions pressed: FIRE where a life was just lost (detail 3)
    reward: np.ndarray  # [N] raw game points (the replay keeps their sign, detail 2)
    next_obs: np.ndarray  # [N, 4, 84, 84] what the agent sees next: a new game's first where ended
    real_next_obs: np.ndarray  # [N, 4, 84, 84] s': the game's real last observation where ended
    terminal: np.ndarray  # [N] d: a game over, or under baselines a lost life (detail 3)
    ended: np.ndarray  # [N] the game is over or cut: the next observation starts a new one


class LifeProtocol:
    """The vector env under detail 3's protocol, with detail 4's real final observations."""

    def __init__(self, envs, baselines: bool):
        """Wrap `envs` (make_envs' AtariVectorEnv); `baselines`: a lost life is terminal."""
        self.vec = envs
        self.baselines = baselines

    def reset(self, seed: int) -> np.ndarray:
        """Start every game (sub-env i with seed + i); the first observations."""
        obs, info = self.vec.reset(seed=seed)
        self.lives = info["lives"]
        self.forced = np.zeros(len(obs), bool)
        return obs

    def step(self, actions: np.ndarray) -> EnvStep:
        """Press `actions`, FIRE instead where the last step lost a life; -> EnvStep."""
        if self.forced.any():
            actions = np.where(self.forced, self.vec.fire, actions)
        obs, reward, term, trunc, info = self.vec.step(actions)
        terminal, lost = learning_flags(term, trunc, info["lives"], self.lives, self.baselines)
        ended = term | trunc
        real_next_obs = obs
        if ended.any():  # SameStep autoreset: the real last observation is in info (detail 4)
            # ended: [N] -> [N, 1, 1, 1], against the [N, 4, 84, 84] observations
            real_next_obs = np.where(ended[:, None, None, None], info["final_obs"], obs)
        self.lives, self.forced = info["lives"], lost & (self.vec.fire is not None)
        return EnvStep(
            actions=actions,
            reward=reward,
            next_obs=obs,
            real_next_obs=real_next_obs,
            terminal=terminal,
            ended=ended,
        )


# ---------------------------------------------------------------- network
class QNetwork(nn.Module):
    """Nature CNN: Q(s, .; theta) for all actions from a uint8 stack of four 84x84 frames."""

    def __init__(self, num_actions: int):
        """Three convolutions and two linear layers, as in Nature's Methods (detail 6)."""
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),  # 64 x 7 x 7 after the convolutions
            nn.ReLU(),
            nn.Linear(512, num_actions),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 4, 84, 84] uint8 frames -> [B, |A|] Q-values."""
        # channels_last while still uint8 (4x less to move); uint8 / float is float32 in one pass,
        # out of place, so a float input is not scaled in place
        return self.net(x.contiguous(memory_format=torch.channels_last) / 255.0)


# ---------------------------------------------------------------- algorithm
def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """epsilon_t: linear from start_e to end_e over `duration` steps, then end_e."""
    return max(end_e, start_e + (end_e - start_e) * t / duration)


def epsilon_greedy(q_network, obs, epsilon: float, num_actions: int, rng, to_device) -> np.ndarray:
    """a_t: a uniform random action with probability epsilon, else argmax_a Q(s_t, a; theta)
    (Nature, Algorithm 1); `to_device` moves the [N, 4, 84, 84] observations to the network."""
    explore = rng.random(len(obs)) < epsilon  # [N]
    actions = rng.integers(0, num_actions, len(obs))  # [N], drawn whether used or not
    if not explore.all():
        with torch.inference_mode():
            # the action copy: the one wait for a GPU per env step
            greedy = q_network(to_device(obs)).argmax(1).cpu().numpy()  # [N, |A|] -> [N]
        actions = np.where(explore, actions, greedy)
    return actions


def td_target(r: torch.Tensor, d: torch.Tensor, q_next_target: torch.Tensor, gamma: float):
    """y = r + gamma (1 - d) max_a' Q(s', a'; theta^-)  (Nature, Algorithm 1); [B] from
    r, d: [B] and the target network's q_next_target: [B, |A|]."""
    return r + gamma * (1.0 - d) * q_next_target.max(dim=1).values


# The replay memory D of detail 5. Each env has its own ring of slots (a [slots, num_envs] array
# per field); a slot holds one 84x84 frame and, where `valid`, the transition that starts there.
# One env's ring, stack 4, after game g (4 steps, frames g0..g4) and 2 steps of game h:
#
#   slot      0    1    2    3    4    5    6    7    8
#   frame     g0   g1   g2   g3   g4   h0   h1   h2   .    g4: g's final frame, s' of its last step
#   first     1    0    0    0    0    1    0    0    .    a game's first frame
#   valid     1    1    1    1    0    1    1    0    .    g4 and h2 start no transition (yet)
#   a, r, d   a0   a1   a2   a3   .    b0   b1   .    .
#                                                     ^ head: the next slot to write
#
# The transition at slot k: s = the frames of slots k-3..k; a, r, d of slot k; s' = the frames of
# slots k-2..k+1. A frame of an older game reads as zeros, as in the env's reset stack: s at slot 6
# is [0, 0, h0, h1] (slots 3 and 4 hold g's frames, before h's first at slot 5). When the ring
# wraps, writing slot k invalidates the transitions at k..k+3, whose s reaches back into it.
# The contract: get(ids) returns s, s', a, r, d exactly as a naive buffer storing both stacks of
# every transition would, in a quarter of the memory (tests/test_dqn_atari.py compares the two).
def frames_of_an_older_game(first: np.ndarray) -> np.ndarray:
    """[B, k] bool: True where a later one of k frames starts a game, so this frame is the older
    game's. first[:, j] flags frame j + 1; e.g. [0, 1, 0] -> [1, 1, 0] (a reversed running OR)."""
    return np.flip(np.cumsum(np.flip(first, 1), 1), 1) > 0


class FrameReplayBuffer:
    """Uniform replay memory D that stores each frame once, one ring per env (detail 5, the
    diagram above); sampling returns s, s', a, r, d as a buffer of whole stacks would."""

    ARRAYS = ("frames", "actions", "rewards", "dones", "first", "valid")

    def __init__(self, capacity: int, num_envs: int, frame_shape=(84, 84), stack: int = 4):
        """Empty rings of capacity // num_envs slots each."""
        self.num_envs = num_envs
        self.slots = capacity // num_envs  # per env
        self.stack = stack
        # slot-major [slots, num_envs], so a filled prefix is contiguous; id = slot * num_envs + env
        self.frames = np.zeros((self.slots, num_envs, *frame_shape), np.uint8)
        self.actions = np.zeros((self.slots, num_envs), np.int64)
        self.rewards = np.zeros((self.slots, num_envs), np.float32)
        self.dones = np.zeros(self.actions.shape, bool)
        self.first = np.zeros(self.actions.shape, bool)
        self.valid = np.zeros(self.actions.shape, bool)
        self.head = np.zeros(num_envs, np.int64)  # per env: the next slot to write
        self.written = np.zeros(num_envs, np.int64)  # per env: slots written so far
        self.need_start = np.ones(num_envs, bool)  # per env: the next obs starts a game

    def _write(self, e: np.ndarray, frame: np.ndarray, first: bool) -> None:
        """Write one frame at the head of the rings of envs `e` ([E]) and advance their heads."""
        h = self.head[e]  # [E]
        # slot h, and the oldest transitions whose stacks reached back into it, are gone
        self.valid[(h + np.arange(self.stack)[:, None]) % self.slots, e] = False  # [stack, E]
        self.frames[h, e] = frame
        self.first[h, e] = first
        self.head[e] = (h + 1) % self.slots
        self.written[e] = self.written[e] + 1

    def add(self, frame, action, reward, next_frame, done, ended) -> np.ndarray:
        """One step of every env: the newest frames ([N, 84, 84]) of s and s' (the real final one
        if the game ended), a, r, d, and `ended` (the next obs starts a game); -> the flat ids."""
        start = np.flatnonzero(self.need_start)
        e = np.arange(self.num_envs)
        self._write(start, frame[start], True)  # a game's first frame: s has not been stored yet
        cur = (self.head - 1) % self.slots  # [N] the slot of s's newest frame
        self.actions[cur, e] = action
        self.rewards[cur, e] = reward
        self.dones[cur, e] = done
        self.valid[cur, e] = True
        self._write(e, next_frame, False)
        self.need_start = np.array(ended, bool)
        return cur * self.num_envs + e

    def get(self, idx: np.ndarray):
        """(s, s', a, r, d) of flat ids [B]; the stacks are rebuilt from a window of 5 frames."""
        slot, e = np.divmod(idx, self.num_envs)  # [B], [B]
        slots = (slot[:, None] + np.arange(1 - self.stack, 2)) % self.slots  # [B, 5]: k-3..k+1
        window = self.frames[slots, e[:, None]]  # [B, 5, 84, 84]; s = window[:, :4], s' = [:, 1:]
        first = self.first[slots[:, 1 : self.stack], e[:, None]]  # [B, 3]: slots k-2..k
        window[:, : self.stack - 1][frames_of_an_older_game(first)] = 0  # slots k-3..k-1
        a = self.actions[slot, e]
        r = self.rewards[slot, e]
        d = self.dones[slot, e]
        return window[:, :-1], window[:, 1:], a, r, d

    def sample(self, batch_size: int, rng: np.random.Generator, to_device=torch.as_tensor):
        """A uniform minibatch (s, s', a, r, d) as tensors, moved by `to_device`."""
        return [to_device(x) for x in self.get(self.sample_ids(batch_size, rng))]

    def sample_ids(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Uniform over valid ids, in rejection rounds over the batch (not over its elements)."""
        n_ids = self.size() * self.num_envs
        valid = self.valid.reshape(-1)  # [slots * num_envs], by flat id
        idx = np.empty(0, np.int64)
        while idx.size < batch_size:
            candidates = rng.integers(0, n_ids, 2 * batch_size)
            idx = np.concatenate([idx, candidates[valid[candidates]]])
        return idx[:batch_size]

    def size(self) -> int:
        """Slots in use per env (the rings fill at the same pace)."""
        return int(min(self.written.max(), self.slots))

    def state_dict(self) -> dict:
        """The filled part of every array, for the checkpoint."""
        # torch.from_numpy shares memory: saving writes the arrays without another copy
        state = {k: torch.from_numpy(getattr(self, k)[: self.size()]) for k in self.ARRAYS}
        return state | {k: torch.from_numpy(getattr(self, k)) for k in ("head", "written")}

    def load_state_dict(self, state: dict) -> None:
        """Restore state_dict(); the games restart after a resume, so each starts a new one."""
        for k in self.ARRAYS:
            # a full memory adopts the loaded arrays: no second copy
            if len(state[k]) == self.slots:
                setattr(self, k, state[k].numpy())
            else:
                getattr(self, k)[: len(state[k])] = state[k].numpy()
        self.head[:] = state["head"].numpy()
        self.written[:] = state["written"].numpy()
        self.need_start[:] = True


def store_step(buffer: FrameReplayBuffer, obs: np.ndarray, step: EnvStep) -> None:
    """Store (s, a, sign(r), s', d) of every env (details 2-4): the newest frame of s and of the
    real s', the pressed action, the clipped reward."""
    next_frame = step.real_next_obs[:, -1]  # [N, 84, 84]
    buffer.add(
        obs[:, -1], step.actions, np.sign(step.reward), next_frame, step.terminal, step.ended
    )


def update(q_network, target_network, optimizer, batch, gamma: float) -> dict[str, torch.Tensor]:
    """One gradient step on L(theta) = (y - Q(s, a; theta))^2 over a minibatch (Nature, Methods);
    -> {"td_loss", "q_values" (the mean Q(s, a))}, 0-dim tensors."""
    s, s_next, a, r, d = batch  # s, s_next: [B, 4, 84, 84] uint8; a: [B] int64; r: [B]; d: [B] bool
    with torch.no_grad():
        y = td_target(r, d.float(), target_network(s_next), gamma)  # [B]
    q = q_network(s).gather(1, a[:, None]).squeeze(1)  # [B, |A|] -> [B, 1] -> [B]
    # Nature clips the error y - Q to [-1, 1] (a Huber loss); deviation 7: CleanRL's squared error
    loss = nn.functional.mse_loss(q, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"td_loss": loss.detach(), "q_values": q.detach().mean()}


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    """Deep Q-learning with experience replay (Mnih et al. 2015, Algorithm 1), N envs in step."""
    # Algorithm 1, for each env step (N envs side by side):
    # 1. a = random with probability epsilon_t, else argmax_a Q(s, a; theta)  -> epsilon_greedy
    # 2. play a (FIRE instead after a lost life), observe r and s'            -> LifeProtocol.step
    # 3. store (s, a, sign(r), s', d) in the replay memory D                  -> store_step
    # 4. every --train-frequency steps, sample a uniform minibatch from D     -> buffer.sample
    # 5. descend (y - Q(s, a; theta))^2, y = r + gamma (1 - d) max Q(s', .; theta^-)
    #                                                                          -> update, td_target
    # 6. every C = --target-network-frequency steps, theta^- <- theta         -> Run.polyak
    run = Run(args, checks=check_args(args))
    if args.eval_only:
        return eval_only(args, run)

    # ------------------------------------------------ set up
    rng = np.random.default_rng(args.seed)  # epsilon-greedy and replay sampling
    n = args.num_envs
    protocol = resolve_protocol(args.protocol, args.env_id)
    vec_env = make_envs(args, n)
    num_actions = int(vec_env.single_action_space.n)
    envs = LifeProtocol(vec_env, baselines=protocol == "baselines")
    q_network = QNetwork(num_actions).to(run.device, memory_format=torch.channels_last)
    target_network = QNetwork(num_actions).to(run.device, memory_format=torch.channels_last)
    target_network.load_state_dict(q_network.state_dict())
    # deviation 7: Adam, not Nature's RMSProp
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    buffer = FrameReplayBuffer(args.buffer_size, n)
    # what a checkpoint saves under these keys and a resume restores
    parts = dict(q_network=q_network, target_network=target_network, optimizer=optimizer)
    parts["buffer"] = buffer
    global_step, updates, horizon = restore(run, parts, rng)
    act = run.compile(q_network)
    td_update = run.compile(update)

    with run.start(
        global_step,
        args.total_steps,
        state=lambda: checkpoint_state(parts, updates, horizon, rng),
        evaluate=partial(evaluate, q_network, args, run.device, args.eval_episodes, run.stop),
        exploration_steps=horizon,
        protocol=protocol,
    ):
        # a resume restarts the games (detail 10)
        obs = envs.reset(seed=args.seed + global_step)
        ep_return = np.zeros(n)
        ep_length = np.zeros(n, np.int64)
        while global_step < args.total_steps and not run.stop:
            run.graph_step()
            # ------------------------------------------------ collect (steps 1-3)
            epsilon = linear_schedule(args.start_e, args.end_e, horizon, global_step)
            actions = epsilon_greedy(act, obs, epsilon, num_actions, rng, run.to_device)
            step = envs.step(actions)
            prev_step = global_step
            global_step += n
            store_step(buffer, obs, step)
            obs = step.next_obs
            ep_return = ep_return + step.reward
            ep_length = ep_length + 1
            for e in np.flatnonzero(step.ended):
                run.episode(global_step, ep_return[e], ep_length[e])
                ep_return[e] = 0.0
                ep_length[e] = 0

            # ------------------------------------------------ learn (steps 4-6)
            if global_step > args.learning_starts:
                # the multiples of f in (prev_step, global_step]; with one env this is CleanRL's
                # `global_step % train_frequency == 0`
                f = args.train_frequency
                due = global_step // f - prev_step // f
                for _ in range(due):
                    batch = buffer.sample(args.batch_size, rng, run.to_device)
                    losses = td_update(
                        q_network, target_network, optimizer, batch, gamma=args.gamma
                    )
                    run.check_finite(losses["td_loss"], global_step)
                    updates += 1
                    if updates % 100 == 1:  # from the first update on (a short run logs one)
                        log_losses(run, global_step, losses)
                if Run.every(global_step, prev_step, args.target_network_frequency):
                    Run.polyak(target_network, q_network, args.tau)

            # ------------------------------------------------ log
            last = global_step >= args.total_steps or run.stop
            if Run.every(global_step, prev_step, max(1000, n)) or last:
                charts = {
                    "charts/SPS": run.sps(global_step),
                    "charts/learning_rate": args.learning_rate,
                    "charts/epsilon": epsilon,
                }
                run.log(global_step, charts)
            run.end_iteration(global_step)
        envs.vec.close()
        run.finish(global_step, updates=updates, protocol=protocol)


# ---------------------------------------------------------------- the file's plumbing
def check_args(args: Args) -> list[tuple[bool, str]]:
    """(condition, message) rows of the DQN flags: a bad value stops in one line before anything
    is built."""
    # (flags, test, the test in words)
    bounds = [
        ("num_envs buffer_size batch_size train_frequency", lambda v: v >= 1, ">= 1"),
        ("target_network_frequency max_episode_frames", lambda v: v >= 1, ">= 1"),
        ("learning_starts", lambda v: v >= 0, ">= 0"),
        ("learning_rate", lambda v: v > 0, "> 0"),
        ("tau exploration_fraction", lambda v: 0 < v <= 1, "in (0, 1]"),
        ("gamma start_e end_e eval_epsilon", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ]
    rows = [
        (ok(getattr(args, k)), f"--{k.replace('_', '-')} must be {text}, got {getattr(args, k)}")
        for keys, ok, text in bounds
        for k in keys.split()
    ]
    slots = 16 * args.num_envs
    batch = args.batch_size
    rows += [
        (args.buffer_size >= slots, f"--buffer-size must be >= {slots} (16 slots per env)"),
        (args.learning_starts >= batch, f"--learning-starts must be >= --batch-size {batch}"),
    ]
    return rows


def log_losses(run: Run, step: int, losses: dict[str, torch.Tensor]) -> None:
    """losses/<name> of a dict of 0-dim tensors, read from the device in one copy."""
    values = torch.stack(list(losses.values())).tolist()
    run.log(step, {f"losses/{name}": value for name, value in zip(losses, values)})


def checkpoint_state(parts: dict, updates: int, horizon: float, rng) -> dict:
    """The checkpoint's algorithm part: every part's state, the counters, the epsilon horizon H
    and the generators drawn from (detail 10)."""
    state = {key: part.state_dict() for key, part in parts.items()}
    # the key keeps its older name, so that checkpoints written before still load in --eval-only
    n_actions = parts["q_network"].net[-1].out_features
    state |= {"updates": updates, "exploration_steps": horizon, "n_actions": n_actions}
    return state | {"rng": Run.rng_state(torch=torch.default_generator, numpy=rng)}


RESUME_KEYS = (
    "n_actions q_network target_network optimizer buffer rng updates exploration_steps".split()
)


def require(ckpt: dict, path: str, keys) -> dict:
    """`ckpt`, or a one-line refusal when it lacks what this use needs."""
    if missing := [key for key in keys if key not in ckpt]:
        message = f"{path!r} is incomplete (no {', '.join(missing)}); use one written by {SCRIPT}"
        raise Run.fail(message)
    return ckpt


def restore(run: Run, parts: dict, rng) -> tuple[int, int, float]:
    """--resume loads every part's state and the generators; -> (global_step, updates, epsilon
    horizon H), or a new run's (0, 0, exploration_fraction * total_steps)."""
    args = run.args
    ckpt = run.resume_checkpoint(same=("num_envs", "buffer_size", "protocol"))
    if ckpt is None:
        return 0, 0, args.exploration_fraction * args.total_steps
    for key, part in parts.items():
        part.load_state_dict(require(ckpt, args.resume, RESUME_KEYS)[key])
    Run.set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    return ckpt["global_step"], ckpt["updates"], ckpt["exploration_steps"]


def evaluate(q_network, args: Args, device, episodes: int, stop=(), video_dir=None) -> list[float]:
    """Unclipped full-game scores of `episodes` games, one sub-env each (detail 9); with
    `video_dir`, game 0 is saved there as the network sees it."""
    vec_env = make_envs(args, episodes)
    num_actions = int(vec_env.single_action_space.n)
    baselines = resolve_protocol(args.protocol, args.env_id) == "baselines"
    envs = LifeProtocol(vec_env, baselines)
    rng = np.random.default_rng(args.seed + 10_000)
    to_device = partial(torch.as_tensor, device=device)
    # game i gets seed + 10000 + i
    obs = envs.reset(seed=args.seed + 10_000)
    returns = np.zeros(episodes)
    finished = np.zeros(episodes, bool)
    frames = [obs[0, -1]]
    while not finished.all() and not stop:
        actions = epsilon_greedy(q_network, obs, args.eval_epsilon, num_actions, rng, to_device)
        step = envs.step(actions)
        obs = step.next_obs
        # a finished game's score stays as it was
        returns += step.reward * ~finished
        if video_dir and not finished[0]:
            # at its end, game 0's real last frame, not the next game's first
            frames.append(step.real_next_obs[0, -1])
        finished |= step.ended
    envs.vec.close()
    if video_dir and not stop:
        # needs moviepy: imported when asked
        from gymnasium.utils.save_video import save_video

        rgb = [np.repeat(frame[:, :, None], 3, axis=2) for frame in frames]
        save_video(rgb, str(video_dir), fps=15, name_prefix="eval")
    return returns.tolist()


def eval_only(args: Args, run: Run) -> None:
    """--checkpoint evaluated with its run's env, seed, frame cap, epsilon and protocol (detail 9)."""
    # torch.load maps the file: the replay memory is never read
    ckpt = Run.load_checkpoint(args.checkpoint)
    require(ckpt, args.checkpoint, ("n_actions", "q_network"))
    # "auto" for checkpoints written before --protocol existed
    saved = {"protocol": "auto", **ckpt["args"]}
    keys = ("env_id", "seed", "max_episode_frames", "eval_epsilon", "protocol")
    run_args = replace(args, **{key: saved[key] for key in keys})
    q_network = QNetwork(ckpt["n_actions"]).to(run.device, memory_format=torch.channels_last)
    q_network.load_state_dict(ckpt["q_network"])
    returns = evaluate(q_network, run_args, run.device, args.eval_episodes, (), run.video_dir)
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
