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


@dataclass
class Args:
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
# (ALE ROM, sticky-action probability) of a pixel Atari id; others are refused (detail 1).
def atari_protocol(env_id: str) -> tuple[str, float]:
    # as ale_py registers them: tic_tac_toe_3d -> TicTacToe3D
    games = {rom.title().replace("_", ""): rom for rom in get_all_rom_ids()}
    for prefix, suffix, sticky in (("", "NoFrameskip-v4", 0.0), ("ALE/", "-v5", 0.25)):
        name = env_id.removeprefix(prefix).removesuffix(suffix)
        if env_id != prefix + name + suffix:
            continue
        if name in games:
            return games[name], sticky
        if name.isalnum():
            raise fail(f"no Atari ROM named {name!r} in ale_py for {env_id!r}; check the spelling")
    try:  # name the file that fits an id Gymnasium knows (ale_py registered the RAM ids)
        hint = "it has vector observations: use ppg.py"
        if isinstance(gym.make(env_id).action_space, gym.spaces.Box):
            hint = "its actions are continuous: use d4pg.py, naf.py or rlpd.py"
    except Exception:
        hint = "use ppg.py (vector observations) or d4pg.py, naf.py, rlpd.py (continuous actions)"
    raise fail(f"{env_id!r} is not a pixel Atari id (<Game>NoFrameskip-v4, ALE/<Game>-v5); {hint}")


# the life and FIRE protocol of detail 3: `auto` follows the id's literature
def resolve_protocol(protocol: str, env_id: str) -> str:
    if protocol != "auto":
        return protocol
    return "baselines" if env_id.endswith("NoFrameskip-v4") else "machado"


# clipping, lives and resets are ours (details 2-4): the env reports raw data
def make_envs(args: Args, num_envs: int) -> AtariVectorEnv:
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


# ---------------------------------------------------------------- network
# Nature CNN: Q(s, .; theta) for all actions from a uint8 stack of four 84x84 frames
class QNetwork(nn.Module):
    def __init__(self, num_actions: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, num_actions),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # channels_last while still uint8 (4x less to move); uint8 / float is float32 in one pass,
        # out of place, so a float input is not scaled in place
        return self.net(x.contiguous(memory_format=torch.channels_last) / 255.0)


# ---------------------------------------------------------------- algorithm
def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    return max(end_e, start_e + (end_e - start_e) * t / duration)


# y = r + gamma (1 - d) max_a' Q(s', a'; theta^-)  (Nature, Algorithm 1)
def td_target(r: torch.Tensor, d: torch.Tensor, q_next_target: torch.Tensor, gamma: float):
    return r + gamma * (1.0 - d) * q_next_target.max(dim=1).values


# theta^- <- theta^- + tau (theta - theta^-), one op for all tensors (tau = 1: exactly theta)
@torch.no_grad()
def update_target(target: nn.Module, online: nn.Module, tau: float) -> None:
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


# A numpy array on `device`. To a GPU it goes through pinned staging memory, so the host does
# not wait for the copy; the staging block is PyTorch's cached pinned memory, which is not reused
# before the copy that reads it is done (a buffer of our own, refilled early, could be).
def to_device(x: np.ndarray, device) -> torch.Tensor:
    x = torch.from_numpy(x)
    return x if str(device) == "cpu" else x.pin_memory().to(device, non_blocking=True)


# a random action with probability epsilon, else argmax_a Q(s, a); FIRE where `forced`
def epsilon_greedy(q_network, obs, epsilon: float, forced, envs, rng, device) -> np.ndarray:
    explore = rng.random(len(obs)) < epsilon
    actions = rng.integers(0, envs.single_action_space.n, len(obs))
    if not explore.all():
        with torch.inference_mode():
            # the action copy: the one wait for a GPU per env step
            greedy = q_network(to_device(obs, device)).argmax(1).cpu().numpy()
        actions = np.where(explore, actions, greedy)
    return np.where(forced, envs.fire, actions) if forced.any() else actions


# Uniform replay memory that stores each frame once, one ring of slots per env (detail 5).
# Slot k of env e holds a frame and, if `valid`, the transition from the stack ending there to
# the stack ending at slot k + 1. A game's first frame is marked `first`; its final frame (s' of
# its last transition) starts no transition.
class FrameReplayBuffer:
    ARRAYS = ("frames", "actions", "rewards", "dones", "first", "valid")

    def __init__(self, capacity: int, num_envs: int, frame_shape=(84, 84), stack: int = 4):
        self.n, self.cap, self.stack = num_envs, capacity // num_envs, stack
        # slot-major: a filled prefix is contiguous
        self.frames = np.zeros((self.cap, num_envs, *frame_shape), np.uint8)
        self.actions = np.zeros((self.cap, num_envs), np.int64)
        self.rewards = np.zeros((self.cap, num_envs), np.float32)
        self.dones, self.first, self.valid = (np.zeros(self.actions.shape, bool) for _ in range(3))
        # per env: the next slot to write, slots written, and whether the next obs starts a game
        self.head, self.written = np.zeros(num_envs, np.int64), np.zeros(num_envs, np.int64)
        self.need_start = np.ones(num_envs, bool)

    def _write(self, e: np.ndarray, frame: np.ndarray, first: bool) -> None:
        h = self.head[e]
        # slot h, and the oldest transitions whose stacks reached back into it, are gone
        self.valid[(h + np.arange(self.stack)[:, None]) % self.cap, e] = False
        self.frames[h, e], self.first[h, e] = frame, first
        self.head[e], self.written[e] = (h + 1) % self.cap, self.written[e] + 1

    # one step of every env: the newest frames of s and s' (the real final one if the game
    # ended), a, r, d, and `ended` (the next obs starts a game); returns the flat ids
    def add(self, frame, action, reward, next_frame, done, ended) -> np.ndarray:
        start, e = np.flatnonzero(self.need_start), np.arange(self.n)
        self._write(start, frame[start], True)
        # the slot of s's newest frame
        cur = (self.head - 1) % self.cap
        self.actions[cur, e], self.rewards[cur, e], self.dones[cur, e] = action, reward, done
        self.valid[cur, e] = True
        self._write(e, next_frame, False)
        self.need_start = np.array(ended, bool)
        return cur * self.n + e

    # (s, s', a, r, d) of flat ids; stacks rebuilt from a window of stack + 1 frames
    def get(self, idx: np.ndarray):
        slot, e = np.divmod(idx, self.n)
        # s = window[:-1], s' = window[1:]
        slots = (slot[:, None] + np.arange(1 - self.stack, 2)) % self.cap
        window = self.frames[slots, e[:, None]]
        # a history frame is zero when a game starts after it (up to s's newest frame), as at reset
        first = self.first[slots[:, 1 : self.stack], e[:, None]]
        window[:, : self.stack - 1][np.flip(np.cumsum(np.flip(first, 1), 1), 1) > 0] = 0
        a, r, d = (x[slot, e] for x in (self.actions, self.rewards, self.dones))
        return window[:, :-1], window[:, 1:], a, r, d

    def sample(self, batch_size: int, rng: np.random.Generator, device="cpu"):
        return [to_device(x, device) for x in self.get(self.sample_ids(batch_size, rng))]

    # uniform over valid ids, in rejection rounds over the batch (not over its elements)
    def sample_ids(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        n_ids, valid = self.size() * self.n, self.valid.reshape(-1)
        idx = np.empty(0, np.int64)
        while idx.size < batch_size:
            candidates = rng.integers(0, n_ids, 2 * batch_size)
            idx = np.concatenate([idx, candidates[valid[candidates]]])
        return idx[:batch_size]

    def size(self) -> int:
        return int(min(self.written.max(), self.cap))

    def state_dict(self) -> dict:
        # torch.from_numpy shares memory: saving writes the arrays without another copy
        state = {k: torch.from_numpy(getattr(self, k)[: self.size()]) for k in self.ARRAYS}
        return state | {k: torch.from_numpy(getattr(self, k)) for k in ("head", "written")}

    def load_state_dict(self, state: dict) -> None:
        for k in self.ARRAYS:
            # a full memory adopts the loaded arrays: no second copy
            if len(state[k]) == self.cap:
                setattr(self, k, state[k].numpy())
            else:
                getattr(self, k)[: len(state[k])] = state[k].numpy()
        self.head[:], self.written[:] = state["head"].numpy(), state["written"].numpy()
        # the games restart after a resume
        self.need_start[:] = True


# (d, life lost) of one vector step (detail 3): d = game over, or under baselines a lost life
# too. After a game end `lives` is the next game's, and a game with bonus lives can end above
# it: compare within a game only (a life lost on a truncation's own step is not visible).
def learning_flags(terminated, truncated, lives, prev_lives, baselines: bool):
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    return terminated | (life_lost & baselines), life_lost


# Details 2-4: store (s, a, sign(r), real s', d); returns (ended, lives now, ids, life lost).
def store_step(
    buffer, obs, actions, reward, next_obs, terminated, truncated, info, lives, protocol
):
    ended, baselines = terminated | truncated, protocol == "baselines"
    done, life_lost = learning_flags(terminated, truncated, info["lives"], lives, baselines)
    next_frame = next_obs[:, -1]
    if ended.any():
        next_frame = np.where(ended[:, None, None], info["final_obs"][:, -1], next_frame)
    ids = buffer.add(obs[:, -1], actions, np.sign(reward), next_frame, done, ended)
    return ended, info["lives"].copy(), ids, life_lost


# one gradient step on (y - Q(s, a; theta))^2; returns the loss and the mean Q(s, a)
def update(q_network, target_network, optimizer, batch, gamma: float):
    s, s_next, a, r, d = batch
    with torch.no_grad():
        y = td_target(r, d.float(), target_network(s_next), gamma)
    q = q_network(s).gather(1, a[:, None]).squeeze(1)
    loss = nn.functional.mse_loss(q, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach(), q.detach().mean()


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    check_args(args)
    if args.eval_only:
        return eval_only(args)
    device = seed_and_pick_device(args)
    # rng: epsilon-greedy and replay sampling
    rng, n = np.random.default_rng(args.seed), args.num_envs
    envs, protocol = make_envs(args, n), resolve_protocol(args.protocol, args.env_id)
    num_actions = int(envs.single_action_space.n)
    q_network, target_network = (
        QNetwork(num_actions).to(device, memory_format=torch.channels_last) for _ in range(2)
    )
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    # what a checkpoint saves and a resume restores
    parts = dict(q_network=q_network, target_network=target_network, optimizer=optimizer)
    parts["buffer"] = buffer = FrameReplayBuffer(args.buffer_size, n)
    global_step, updates, horizon = restore(args, parts, rng)
    stop = stop_signal()
    evaluate_policy = partial(evaluate, q_network, args, device, args.eval_episodes, stop)
    act, td_update = compiled(q_network, args, device), compiled(update, args, device)

    def state() -> dict:
        return checkpoint_state(parts, updates, horizon, rng)

    run_dir = run_dir_for(args, args.resume)
    config, resumed = dict(exploration_steps=horizon, protocol=protocol), args.resume is not None
    with RunLogger(args, run_dir, global_step, args.total_steps, resumed, **config) as log:
        # a resume restarts the games (detail 10)
        obs, info = envs.reset(seed=args.seed + global_step)
        lives, forced = info["lives"].copy(), np.zeros(n, bool)
        ep_return, ep_length = np.zeros(n), np.zeros(n, np.int64)
        while global_step < args.total_steps and not stop:
            # --compile on a GPU: a new step of CUDA graphs, the last one's outputs have been read
            if args.compile:
                torch.compiler.cudagraph_mark_step_begin()
            epsilon = linear_schedule(args.start_e, args.end_e, horizon, global_step)
            actions = epsilon_greedy(act, obs, epsilon, forced, envs, rng, device)
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            prev_step, global_step = global_step, global_step + n
            ended, lives, _, life_lost = store_step(
                buffer, obs, actions, reward, next_obs, terminated, truncated, info, lives, protocol
            )
            # detail 3: FIRE as the next action after a lost life
            forced = life_lost & (envs.fire is not None)
            ep_return, ep_length, obs = ep_return + reward, ep_length + 1, next_obs
            for e in np.flatnonzero(ended):
                log.episode(global_step, ep_return[e], ep_length[e])
                ep_return[e], ep_length[e] = 0.0, 0

            if global_step > args.learning_starts:
                due = global_step // args.train_frequency - prev_step // args.train_frequency
                for _ in range(due):
                    batch = buffer.sample(args.batch_size, rng, device)
                    loss, q = td_update(q_network, target_network, optimizer, batch, args.gamma)
                    log.check_finite(loss, global_step)
                    updates += 1
                    # from the first update on (a short run logs one)
                    if updates % 100 == 1:
                        log.scalars(global_step, {"losses/td_loss": loss, "losses/q_values": q})
                if every(global_step, prev_step, args.target_network_frequency):
                    update_target(target_network, q_network, args.tau)
            last = global_step >= args.total_steps or stop
            if every(global_step, prev_step, max(1000, n)) or last:
                sps, lr = log.sps(global_step), args.learning_rate
                charts = {"charts/SPS": sps, "charts/learning_rate": lr, "charts/epsilon": epsilon}
                log.scalars(global_step, charts)
            log.end_iteration(global_step, stop, evaluate_policy, state)
        envs.close()
        log.finish(global_step, stop, evaluate_policy, state, updates=updates, protocol=protocol)


# ---------------------------------------------------------------- the file's plumbing
def check_args(args: Args) -> None:
    # (flags, test, the test in words): a bad value stops in one line before anything is built
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
    slots, batch = 16 * args.num_envs, args.batch_size
    rows += [
        (args.buffer_size >= slots, f"--buffer-size must be >= {slots} (16 slots per env)"),
        (args.learning_starts >= batch, f"--learning-starts must be >= --batch-size {batch}"),
    ]
    check_flags(args, rows)


def checkpoint_state(parts: dict, updates: int, horizon: float, rng) -> dict:
    state = {key: part.state_dict() for key, part in parts.items()}
    # the key keeps its older name, so that checkpoints written before still load in --eval-only
    n_actions = parts["q_network"].net[-1].out_features
    state |= {"updates": updates, "exploration_steps": horizon, "n_actions": n_actions}
    return state | {"rng": rng_state(torch=torch.default_generator, numpy=rng)}


RESUME_KEYS = (
    "n_actions q_network target_network optimizer buffer rng updates exploration_steps".split()
)


# a checkpoint that lacks what this use needs is refused in one line
def require(ckpt: dict, path: str, keys) -> dict:
    if missing := [key for key in keys if key not in ckpt]:
        raise fail(f"{path!r} is incomplete (no {', '.join(missing)}); use one written by {SCRIPT}")
    return ckpt


# --resume loads every part's state; returns (global_step, updates, epsilon horizon H)
def restore(args: Args, parts: dict, rng) -> tuple[int, int, float]:
    if not args.resume:
        return 0, 0, args.exploration_fraction * args.total_steps
    ckpt = resume_checkpoint(args, same=("num_envs", "buffer_size", "protocol"))
    for key, part in parts.items():
        part.load_state_dict(require(ckpt, args.resume, RESUME_KEYS)[key])
    set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    return ckpt["global_step"], ckpt["updates"], ckpt["exploration_steps"]


# Unclipped full-game scores of `episodes` games, one sub-env each (detail 9); with `video_dir`,
# game 0 is saved there as the network sees it.
def evaluate(q_network, args: Args, device, episodes: int, stop=(), video_dir=None) -> list[float]:
    envs = make_envs(args, episodes)
    rng = np.random.default_rng(args.seed + 10_000)
    # game i gets seed + 10000 + i
    obs, info = envs.reset(seed=args.seed + 10_000)
    returns, finished = np.zeros(episodes), np.zeros(episodes, bool)
    forced, frames = np.zeros(episodes, bool), [obs[0, -1]]
    while not finished.all() and not stop:
        actions = epsilon_greedy(q_network, obs, args.eval_epsilon, forced, envs, rng, device)
        lives = info["lives"]
        obs, reward, terminated, truncated, info = envs.step(actions)
        life_lost = learning_flags(terminated, truncated, info["lives"], lives, False)[1]
        forced = life_lost & (envs.fire is not None)
        # a finished game's score stays as it was
        returns += reward * ~finished
        newly = (terminated | truncated) & ~finished
        # at its end, game 0's real last frame, not the next game's first
        if video_dir and not finished[0]:
            frames.append(info["final_obs"][0, -1] if newly[0] else obs[0, -1])
        finished |= newly
    envs.close()
    if video_dir and not stop:
        # needs moviepy: imported when asked
        from gymnasium.utils.save_video import save_video

        rgb = [np.repeat(frame[:, :, None], 3, axis=2) for frame in frames]
        save_video(rgb, str(video_dir), fps=15, name_prefix="eval")
    return returns.tolist()


# --checkpoint evaluated with its run's env, seed, frame cap, epsilon and protocol (detail 9)
def eval_only(args: Args) -> None:
    device = seed_and_pick_device(args)
    # torch.load maps the file: the replay memory is never read
    ckpt = require(load_checkpoint(args.checkpoint), args.checkpoint, ("n_actions", "q_network"))
    # "auto" for checkpoints written before --protocol existed
    saved = {"protocol": "auto", **ckpt["args"]}
    keys = ("env_id", "seed", "max_episode_frames", "eval_epsilon", "protocol")
    run = replace(args, **{key: saved[key] for key in keys})
    q_network = QNetwork(ckpt["n_actions"]).to(device, memory_format=torch.channels_last)
    q_network.load_state_dict(ckpt["q_network"])
    video_dir = run_dir_for(args, args.checkpoint) / "videos" if args.capture_video else None
    write_eval_only(args, ckpt, evaluate(q_network, run, device, args.eval_episodes, (), video_dir))


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
