"""DQN (Nature) on Atari: Q-learning with a deep convolutional network, experience replay and a target network.

Paper: V. Mnih, K. Kavukcuoglu, D. Silver, A. A. Rusu, J. Veness, M. G. Bellemare, A. Graves,
M. Riedmiller, A. K. Fidjeland, G. Ostrovski et al., "Human-level control through deep
reinforcement learning", Nature 518:529-533, 2015 (first version: arXiv:1312.5602, 2013).
Peer implementation: CleanRL `dqn_atari.py`, whose defaults and published scores we follow.

Idea: learn the optimal action value Q*(s, a) from pixels with one network for all games.
Two tricks make the bootstrapped regression stable: sample past transitions uniformly from a
large replay memory D (breaks the correlation of consecutive frames, reuses data), and
compute the targets with a copy theta^- of the weights refreshed only every C steps.

Equations (Nature, Methods "Training algorithm for deep Q-networks"):
  y_j     = r_j + gamma * (1 - d_j) * max_a' Q(s_{j+1}, a'; theta^-)
  L(theta) = E_{(s, a, r, s', d) ~ U(D)} [ (y_j - Q(s_j, a_j; theta))^2 ]
  theta^- <- tau * theta + (1 - tau) * theta^-   every C = --target-network-frequency steps
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
 5. Replay memory stores every 84x84 frame once (~7.1 GB for 1M transitions instead of 28 GB
    for stacked s and s'), in one ring per environment so streams never interleave. Stacks
    are rebuilt at sampling; frames before a game's first frame are zeros, exactly what the
    env returns at reset. Each game costs one extra slot (its final frame). Sampling is
    uniform over stored transitions and fully vectorised.
 6. Nature CNN (32x8x8/4, 64x4x4/2, 64x3x3/1, 512), uint8 until the forward pass, which
    divides a float copy by 255 (the caller's tensor is never changed).
 7. Deviations from the paper, following CleanRL (whose published scores are our anchor):
    Adam lr 1e-4 instead of RMSProp 2.5e-4; squared error instead of the paper's error
    clipping to [-1, 1] (a Huber loss); learning starts at 80k steps instead of 50k.
 8. Steps count environment steps summed over envs. With several envs, the number of
    updates per env step (1 / --train-frequency) and the target period stay as with one.
 9. Evaluation: one AtariVectorEnv with one sub-env per game, seeds seed + 10000 + i, epsilon
    = --eval-epsilon (0.05, as Nature and CleanRL: a purely greedy agent can stall forever,
    e.g. never pressing FIRE under machado), FIRE forced after a lost life as in training
    (detail 3); the random actions come from a fixed-seed generator, so evaluation stays
    reproducible.
    --eval-only takes the env, seed, frame cap, epsilon and protocol from the checkpoint
    (auto for checkpoints older than --protocol): it repeats the run's own final evaluation.
    --capture-video saves the first game of that evaluation as the network sees it (84x84
    grayscale, 15 agent steps per second): the vector env does not render, and a game replayed
    on another emulator wrapper would not be the one whose score is reported.
10. Checkpoints hold the networks, the optimizer, the counters, the epsilon horizon H, the
    replay memory (as tensors sharing the numpy storage: no copy while saving; a full memory
    adopts the loaded arrays, so ~7 GB on disk and in RAM, not twice; with torch >= 2.6
    --eval-only maps the file and never reads it) and the state of exactly the generators used:
    torch's (initialisation; CUDA's on a GPU) and the numpy one of epsilon-greedy and replay
    sampling. SIGINT/SIGTERM abandon any evaluation, save a checkpoint and exit 0 without
    summary.json (a second one kills). On resume the emulators restart (their state is not
    saved), so the game in progress is cut like a truncation; pass the same arguments plus
    --resume. Resume and --eval-only write into --run-dir, else the folder above checkpoints/.
11. The epsilon horizon H = exploration_fraction * T is fixed by the run's first --total-steps
    T and kept in the checkpoint: a resume with a larger --total-steps (extending a 500k run
    to 10M) continues at end_e instead of jumping back to exploring. H is a length of
    exploration, as in Nature (1M frames whatever the run's length), not a share of whatever
    the run becomes; recomputing it would make the agent act near-randomly again and refill
    the replay with that. For a different H, start a new run.

Usage: python algos/dqn_atari.py --env-id BreakoutNoFrameskip-v4 --total-steps 10000000
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle OpenMP threads sleep instead of spinning

import importlib.util
import json
import random
import resource
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    env_id: str = "BreakoutNoFrameskip-v4"
    """Atari id: <Game>NoFrameskip-v4 (no sticky actions) or ALE/<Game>-v5 (sticky actions 0.25)"""
    protocol: Literal["auto", "baselines", "machado"] = "auto"
    """FIRE after a lost life and lives terminal for learning (baselines) or neither (machado); auto: baselines for v4 ids (detail 3)"""
    seed: int = 1
    """seed of torch, numpy and the environments (--eval-only: the checkpoint's)"""
    total_steps: int = 10_000_000
    """env steps in total, summed over envs; a resume may raise it, epsilon keeps the first run's horizon (detail 11)"""
    num_envs: int = 1
    """parallel environments"""
    torch_deterministic: bool = True
    """use deterministic torch algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto = cuda if available"""
    exp_name: str = "dqn_atari"
    """experiment name, part of the run directory"""
    run_dir: str | None = None
    """run directory (default runs/<env>__<exp>__<seed>__<unixtime>; with --resume/--eval-only: the checkpoint's)"""
    checkpoint_interval: int = 1_000_000
    """env steps between checkpoints (0: only at the end); each one writes the replay memory"""
    resume: str | None = None
    """checkpoint to continue from"""
    eval_episodes: int = 10
    """evaluation episodes (games)"""
    eval_interval: int = 1_000_000
    """env steps between evaluations (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint, with its run's env, seed, --max-episode-frames, --eval-epsilon and --protocol"""
    checkpoint: str | None = None
    """checkpoint for --eval-only"""
    capture_video: bool = False
    """save the first game of the final (or --eval-only) evaluation as the network sees it into <run_dir>/videos"""
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
    """fraction of the first run's --total-steps over which epsilon decays linearly (a resume keeps it)"""
    learning_starts: int = 80_000
    """env steps before learning starts"""
    train_frequency: int = 4
    """env steps between gradient updates"""
    max_episode_frames: int = 108_000
    """emulator frames before a game is truncated (108,000 = 30 minutes)"""
    eval_epsilon: float = 0.05
    """exploration epsilon during evaluation"""


# ---------------------------------------------------------------- environment
def atari_game(env_id: str) -> tuple[str, float]:
    """Map a Gymnasium Atari id to (ALE ROM, sticky-action probability), or refuse it (detail 1)."""
    from ale_py.roms import get_all_rom_ids

    games = {rom.title().replace("_", ""): rom for rom in get_all_rom_ids()}  # as ale_py registers them: tic_tac_toe_3d -> TicTacToe3D
    for prefix, suffix, sticky in (("", "NoFrameskip-v4", 0.0), ("ALE/", "-v5", 0.25)):
        name = env_id[len(prefix):-len(suffix)] if env_id.startswith(prefix) and env_id.endswith(suffix) else None
        if name in games:
            return games[name], sticky
        if name and name.isalnum():
            raise fail(f"no Atari ROM named {name!r} in ale_py for {env_id!r}; check the game name (e.g. BreakoutNoFrameskip-v4)")
    try:  # name the file that fits an id Gymnasium knows (importing ale_py registered the RAM ids)
        space = gym.make(env_id).action_space
        hint = "its actions are continuous: use d4pg.py, naf.py or rlpd.py" if isinstance(space, gym.spaces.Box) else "it has vector observations: use ppg.py"
    except Exception:
        hint = "for vector observations with discrete actions use ppg.py; for continuous actions use d4pg.py, naf.py or rlpd.py"
    raise fail(f"{env_id!r} is not a pixel Atari id (<Game>NoFrameskip-v4 or ALE/<Game>-v5); {hint}")


def resolve_protocol(protocol: str, env_id: str) -> str:
    """The life and FIRE protocol of detail 3: `auto` follows the id's literature."""
    return protocol if protocol != "auto" else "baselines" if env_id.endswith("NoFrameskip-v4") else "machado"


def make_env(args: Args, num_envs: int):
    from ale_py import Action
    from ale_py.vector_env import AtariVectorEnv

    game, sticky = atari_game(args.env_id)
    baselines = resolve_protocol(args.protocol, args.env_id) == "baselines"
    # clipping, life loss and reset bookkeeping are ours (details 2-4), so the env reports raw data
    envs = AtariVectorEnv(game, num_envs, repeat_action_probability=sticky, max_num_frames_per_episode=args.max_episode_frames,
                          reward_clipping=False, episodic_life=False, life_loss_info=False, autoreset_mode="SameStep", use_fire_reset=baselines)
    action_set = list(envs.ale.get_action_set())
    envs.fire = action_set.index(Action.FIRE) if baselines and Action.FIRE in action_set else None  # pressed after a lost life
    return envs


# ---------------------------------------------------------------- network
class QNetwork(nn.Module):
    """Nature CNN: Q(s, .; theta) for all actions from a uint8 stack of four 84x84 frames."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1),
                                 nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, n_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # channels_last while still uint8 (4x less to move); out of place, so a float input is not scaled in place
        return self.net(x.contiguous(memory_format=torch.channels_last).float() / 255.0)


# ---------------------------------------------------------------- algorithm
def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    return max(end_e, start_e + (end_e - start_e) * t / duration)


def td_target(r: torch.Tensor, d: torch.Tensor, q_next_target: torch.Tensor, gamma: float) -> torch.Tensor:
    """y = r + gamma (1 - d) max_a' Q(s', a'; theta^-)  (Nature, Algorithm 1)."""
    return r + gamma * (1.0 - d) * q_next_target.max(dim=1).values


def update_target(target: nn.Module, online: nn.Module, tau: float) -> None:
    for p_t, p in zip(target.parameters(), online.parameters()):
        p_t.data.copy_(tau * p.data + (1.0 - tau) * p_t.data)


class FrameReplayBuffer:
    """Uniform replay memory that stores each frame once, one ring of slots per environment (detail 5). Slot k of
    env e holds a frame and, if `valid`, the transition from the stack ending there to the stack ending at slot k+1.
    A game's first frame is marked `first`; its final frame (s' of its last transition) starts no transition."""

    ARRAYS = ("frames", "actions", "rewards", "dones", "first", "valid")

    def __init__(self, capacity: int, num_envs: int, frame_shape=(84, 84), stack: int = 4):
        self.n, self.cap, self.stack = num_envs, capacity // num_envs, stack
        self.frames = np.zeros((self.cap, num_envs, *frame_shape), np.uint8)  # slot-major: a filled prefix is contiguous
        self.actions, self.rewards = np.zeros((self.cap, num_envs), np.int64), np.zeros((self.cap, num_envs), np.float32)
        self.dones, self.first, self.valid = (np.zeros((self.cap, num_envs), np.bool_) for _ in range(3))
        self.head, self.written = np.zeros(num_envs, np.int64), np.zeros(num_envs, np.int64)  # next slot to write, per env
        self.need_start, self.envs = np.ones(num_envs, np.bool_), np.arange(num_envs)  # need_start: the next obs begins a game

    def _write(self, e: np.ndarray, frame: np.ndarray, first: bool) -> None:
        h = self.head[e]
        self.frames[h, e], self.first[h, e], self.valid[h, e] = frame, first, False
        for k in range(1, self.stack):  # the oldest transitions' stacks reached back into slot h: they are gone
            self.valid[(h + k) % self.cap, e] = False
        self.head[e] = (h + 1) % self.cap
        self.written[e] += 1

    def add(self, frame, action, reward, next_frame, done, ended) -> np.ndarray:
        """Store one step of every env: the newest frames of s and s' (the real final obs if the game ended), a, r, d,
        and `ended` (game over or truncation: the next obs starts a new game). Returns flat ids."""
        start = np.flatnonzero(self.need_start)
        self._write(start, frame[start], True)
        cur = (self.head - 1) % self.cap  # slot of the newest frame of s
        self.actions[cur, self.envs], self.rewards[cur, self.envs], self.dones[cur, self.envs] = action, reward, done
        self.valid[cur, self.envs] = True
        self._write(self.envs, next_frame, False)
        self.need_start = np.asarray(ended, np.bool_).copy()
        return cur * self.n + self.envs

    def get(self, idx: np.ndarray):
        """(s, s', a, r, d) for flat ids; stacks rebuilt from a window of stack + 1 frames."""
        slot, e = np.divmod(idx, self.n)
        slots = (slot[:, None] + np.arange(-(self.stack - 1), 2)) % self.cap  # s = window[:-1], s' = window[1:]
        window = self.frames[slots, e[:, None]]
        first = self.first[slots[:, 1:self.stack], e[:, None]]
        # a history frame is zero when a game starts after it (up to s's newest frame), as at env reset
        cut = np.flip(np.cumsum(np.flip(first, 1), 1), 1) > 0
        window[:, : self.stack - 1][cut] = 0
        return window[:, :-1], window[:, 1:], self.actions[slot, e], self.rewards[slot, e], self.dones[slot, e]

    def sample(self, batch_size: int, rng: np.random.Generator):
        return self.get(self.sample_ids(batch_size, rng))

    def sample_ids(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        n_ids, valid, idx = int(min(self.written.max(), self.cap)) * self.n, self.valid.reshape(-1), np.empty(0, np.int64)
        while idx.size < batch_size:  # rejection rounds over the batch, not a loop over its elements
            cand = rng.integers(0, n_ids, 2 * batch_size)
            idx = np.concatenate([idx, cand[valid[cand]]])
        return idx[:batch_size]

    def state_dict(self) -> dict:
        m = int(min(self.written.max(), self.cap))
        # torch.from_numpy shares memory: saving writes the arrays without another 7 GB copy
        return {**{k: torch.from_numpy(getattr(self, k)[:m]) for k in self.ARRAYS}, "head": torch.from_numpy(self.head), "written": torch.from_numpy(self.written)}

    def load_state_dict(self, state: dict) -> None:
        m = state["frames"].shape[0]
        for k in self.ARRAYS:
            if m == self.cap:  # a full memory adopts the loaded arrays: no second 7 GB copy
                setattr(self, k, state[k].numpy())
            else:
                getattr(self, k)[:m] = state[k].numpy()
        self.head[:], self.written[:] = state["head"].numpy(), state["written"].numpy()
        self.need_start[:] = True  # the envs restart after a resume


def learning_flags(terminated, truncated, lives, prev_lives, baselines: bool):
    """(d, life lost) of one vector step (detail 3): d = game over, or under baselines a lost life too. After a
    game end `lives` is the next game's count, and a game with bonus lives can end above it: compare within a
    game only (a life lost on a truncation's own step is not visible)."""
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    return terminated | (life_lost & baselines), life_lost


def store_step(rb: FrameReplayBuffer, obs, actions, reward, next_obs, terminated, truncated, info, lives, baselines: bool):
    """Details 2-4: store (s, a, sign(r), real s', d). Returns (ended, lives now, flat ids, life lost)."""
    ended = terminated | truncated
    done, life_lost = learning_flags(terminated, truncated, info["lives"], lives, baselines)
    next_frame = np.where(ended[:, None, None], info["final_obs"][:, -1], next_obs[:, -1]) if ended.any() else next_obs[:, -1]
    ids = rb.add(obs[:, -1], actions, np.sign(reward), next_frame, done, ended)
    return ended, info["lives"].copy(), ids, life_lost


def update(q_network: QNetwork, target_network: QNetwork, optimizer, batch, gamma: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One gradient step on (y - Q(s, a; theta))^2 over a uniform minibatch. Returns (loss, Q(s, a)), detached."""
    s, s_next, a, r, d = (torch.from_numpy(x).to(device) for x in batch)
    with torch.no_grad():
        y = td_target(r, d.float(), target_network(s_next), gamma)
    q = q_network(s).gather(1, a[:, None]).squeeze(1)
    loss = nn.functional.mse_loss(q, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach(), q.detach()


def checkpoint_state(q_network, target_network, optimizer, rb: FrameReplayBuffer, updates: int, horizon: float, rng) -> dict:
    return {"updates": updates, "exploration_steps": horizon, "n_actions": q_network.net[-1].out_features,
            "q_network": q_network.state_dict(), "target_network": target_network.state_dict(), "optimizer": optimizer.state_dict(),
            "buffer": rb.state_dict(), "rng": rng_state(torch=torch.default_generator, numpy=rng)}


RESUME_KEYS = ("n_actions", "q_network", "target_network", "optimizer", "buffer", "rng", "updates", "exploration_steps")


def require(ckpt: dict, path: str, keys: tuple[str, ...]) -> dict:
    """A checkpoint that lacks what this use needs is refused in one line."""
    if missing := [key for key in keys if key not in ckpt]:
        raise fail(f"{path!r} is incomplete (no {', '.join(missing)}); use a checkpoint written by dqn_atari.py")
    return ckpt


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    positive = np.nextafter(0.0, 1.0)  # the smallest float above 0: positive <= v means v > 0
    check_args(args, [(lo <= getattr(args, k) <= hi, f"--{k.replace('_', '-')} must be {text}, got {getattr(args, k)}") for keys, lo, hi, text in (
        (("num_envs", "buffer_size", "batch_size", "target_network_frequency", "train_frequency", "max_episode_frames"), 1, np.inf, ">= 1"),
        (("learning_starts",), 0, np.inf, ">= 0"), (("learning_rate",), positive, np.inf, "> 0"), (("tau", "exploration_fraction"), positive, 1, "in (0, 1]"),
        (("gamma", "start_e", "end_e", "eval_epsilon"), 0, 1, "in [0, 1]")) for k in keys] + [
        (args.buffer_size >= 16 * args.num_envs, f"--buffer-size {args.buffer_size} leaves under 16 slots per env; use at least {16 * args.num_envs}"),
        (args.learning_starts >= args.batch_size, f"--learning-starts {args.learning_starts} is below --batch-size {args.batch_size}; raise it")])
    seed_everything(args.seed, args.torch_deterministic)  # before any CUDA use: it sets CUBLAS_WORKSPACE_CONFIG
    if args.eval_only:
        return eval_only(args)
    device, rng = pick_device(args.device), np.random.default_rng(args.seed)  # rng: epsilon-greedy and replay sampling
    ckpt = require(resume_checkpoint(args, same=("num_envs", "buffer_size", "protocol")), args.resume, RESUME_KEYS) if args.resume else None
    global_step, updates = (ckpt["global_step"], ckpt["updates"]) if ckpt else (0, 0)
    horizon = ckpt["exploration_steps"] if ckpt else args.exploration_fraction * args.total_steps  # detail 11
    envs, protocol = make_env(args, args.num_envs), resolve_protocol(args.protocol, args.env_id)
    n, n_actions = args.num_envs, int(envs.single_action_space.n)
    q_network = QNetwork(n_actions).to(device).to(memory_format=torch.channels_last)
    target_network = QNetwork(n_actions).to(device).to(memory_format=torch.channels_last)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    rb = FrameReplayBuffer(args.buffer_size, n)
    if ckpt:
        for part, key in ((q_network, "q_network"), (target_network, "target_network"), (optimizer, "optimizer"), (rb, "buffer")):
            part.load_state_dict(ckpt.pop(key))  # popped: the replay memory then lives in rb only
        set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    stop = StopSignal()
    with RunLogger(args, run_dir_for(args, args.resume), global_step, resumed=ckpt is not None, exploration_steps=horizon, protocol=protocol) as log:
        obs, info = envs.reset(seed=args.seed + global_step)  # a resumed run restarts the games (detail 10)
        lives, ep_return, ep_length, forced = info["lives"].copy(), np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.bool_)
        while global_step < args.total_steps and not stop:
            epsilon = linear_schedule(args.start_e, args.end_e, horizon, global_step)
            explore, actions = rng.random(n) < epsilon, rng.integers(0, n_actions, n)
            if not explore.all():
                with torch.inference_mode():
                    greedy = q_network(torch.from_numpy(obs).to(device)).argmax(1).cpu().numpy()
                actions = np.where(explore, actions, greedy)
            actions = np.where(forced, envs.fire, actions) if forced.any() else actions  # detail 3: stored as taken
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            prev_step, global_step = global_step, global_step + n
            ended, lives, _, life_lost = store_step(rb, obs, actions, reward, next_obs, terminated, truncated, info, lives, protocol == "baselines")
            forced = life_lost & (envs.fire is not None)
            ep_return, ep_length, obs = ep_return + reward, ep_length + 1, next_obs
            for e in np.flatnonzero(ended):
                log.episode(global_step, ep_return[e], ep_length[e])
                ep_return[e], ep_length[e] = 0.0, 0

            if global_step > args.learning_starts:
                for _ in range(global_step // args.train_frequency - prev_step // args.train_frequency):
                    loss, q = update(q_network, target_network, optimizer, rb.sample(args.batch_size, rng), args.gamma, device)
                    log.check_finite(loss, global_step)
                    updates += 1
                    if updates % 100 == 0:  # as CleanRL
                        log.scalars(global_step, {"losses/td_loss": loss, "losses/q_values": q.mean()})
                if every(global_step, prev_step, args.target_network_frequency):
                    update_target(target_network, q_network, args.tau)
            if every(global_step, prev_step, max(1000, n)) or global_step >= args.total_steps or stop:
                log.scalars(global_step, {"charts/SPS": log.sps(global_step), "charts/learning_rate": args.learning_rate, "charts/epsilon": epsilon})
            if stop:  # save right away: no evaluation, no periodic checkpoint
                break
            if every(global_step, prev_step, args.eval_interval) and global_step < args.total_steps:
                returns = evaluate(q_network, args, device, args.eval_episodes, stop)
                if returns is not None:  # None: a signal came during the evaluation
                    log.scalars(global_step, {"eval/episodic_return": np.mean(returns)})
            if every(global_step, prev_step, args.checkpoint_interval) and global_step < args.total_steps and not stop:
                save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(q_network, target_network, optimizer, rb, updates, horizon, rng))
            log.progress(global_step, args.total_steps)
        envs.close()
        save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(q_network, target_network, optimizer, rb, updates, horizon, rng))
        returns = None if stop else evaluate(q_network, args, device, args.eval_episodes, stop, log.run_dir / "videos" if args.capture_video else None)
        if returns is None:  # complete but unevaluated: --resume with the same --total-steps evaluates it
            return log.interrupted(global_step)
        log.scalars(global_step, {"eval/episodic_return": np.mean(returns)})
        log.summary(global_step, returns, updates=updates, protocol=protocol)


# ---------------------------------------------------------------- evaluation
def evaluate(q_network: nn.Module, args: Args, device: torch.device, episodes: int, stop=(), video_dir: Path | None = None) -> list[float] | None:
    """Unclipped full-game scores of `episodes` games, one sub-env each (detail 9); None if a stop signal comes.
    With `video_dir`, game 0 is saved there as an mp4 of what the network sees (detail 9)."""
    env = make_env(args, episodes)
    rng = np.random.default_rng(args.seed + 10_000)
    obs, info = env.reset(seed=args.seed + 10_000)  # env i gets seed + 10000 + i
    returns, running, finished, frames = np.zeros(episodes), np.zeros(episodes), np.zeros(episodes, np.bool_), [obs[0, -1]]
    forced = np.zeros(episodes, np.bool_)
    while not finished.all() and not stop:
        with torch.inference_mode():
            greedy = q_network(torch.from_numpy(obs).to(device)).argmax(1).cpu().numpy()
        actions = np.where(rng.random(episodes) < args.eval_epsilon, rng.integers(0, env.single_action_space.n, episodes), greedy)
        actions = np.where(forced, env.fire, actions) if forced.any() else actions  # detail 3: FIRE after a lost life
        lives = info["lives"]
        obs, reward, terminated, truncated, info = env.step(actions)
        forced = learning_flags(terminated, truncated, info["lives"], lives, False)[1] & (env.fire is not None)
        running += reward * ~finished
        newly = (terminated | truncated) & ~finished
        if video_dir and not finished[0]:  # game 0's newest frame; at its end the real last one, not the next game's first
            frames.append(info["final_obs"][0, -1] if newly[0] else obs[0, -1])
        returns[newly], finished = running[newly], finished | newly
    env.close()
    if video_dir and not stop:
        from gymnasium.utils.save_video import save_video

        save_video([np.repeat(frame[:, :, None], 3, axis=2) for frame in frames], str(video_dir), fps=15, name_prefix="eval")
    return None if stop else returns.tolist()


def eval_only(args: Args) -> None:
    """Evaluate --checkpoint with its run's env, seed, frame cap, epsilon and protocol: the run's own final evaluation (detail 9)."""
    ckpt = require(load_checkpoint(args.checkpoint), args.checkpoint, ("n_actions", "q_network"))  # mapped: the replay is never read
    saved = {"protocol": "auto", **ckpt["args"]}  # checkpoints written before --protocol existed
    run = replace(args, **{key: saved[key] for key in ("env_id", "seed", "max_episode_frames", "eval_epsilon", "protocol")})
    device = pick_device(args.device)
    q_network = QNetwork(ckpt["n_actions"]).to(device).to(memory_format=torch.channels_last)
    q_network.load_state_dict(ckpt["q_network"])
    run_dir = run_dir_for(args, args.checkpoint)
    write_eval_only(run_dir, args, ckpt, evaluate(q_network, run, device, args.eval_episodes, video_dir=run_dir / "videos" if args.capture_video else None))


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
