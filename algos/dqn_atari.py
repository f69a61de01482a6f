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
  epsilon_t = max(end_e, start_e + (end_e - start_e) * t / (exploration_fraction * T))

Implementation details:
 1. Environment: ale_py's C++ AtariVectorEnv with the literature preprocessing: up to 30
    no-op starts, frame skip 4 with a max over the last two frames, 84x84 grayscale, a stack
    of 4, FIRE on reset. `<Game>NoFrameskip-v4` -> no sticky actions (the DQN protocol);
    `ALE/<Game>-v5` -> sticky actions 0.25 (Machado et al. 2018). Other ids are refused.
 2. Rewards: the network learns from sign(r) (Nature's clipping); `charts/episodic_return` is
    the unclipped full-game score (all lives) and `charts/episodic_length` is in agent steps.
 3. A lost life is terminal for learning only (d = 1 in the replay), detected as a drop of
    `info["lives"]` within a game (after a game end the count is the next game's); the game
    (and the score) goes on. Deviation from CleanRL: unlike its EpisodicLife + FireReset
    wrappers, FIRE is not pressed after a lost life (only when a game starts); the agent
    learns to press it, which changes Breakout's early learning curve.
 4. Autoreset mode SameStep: the step that ends a game returns the first observation of the
    next game and the real last one in `info["final_obs"]`, which becomes s' of the stored
    transition. No transition spans two games. Truncation (`--max-episode-frames`) stores
    d = 0, so the target bootstraps from the real final observation.
 5. Replay memory stores every 84x84 frame once (~7.1 GB for 1M transitions instead of 28 GB
    for stacked s and s'), in one ring per environment so streams never interleave. Stacks
    are rebuilt at sampling; frames before a game's first frame are zeros, exactly what the
    env returns at reset. Each game costs one extra slot (its final frame). Sampling is
    uniform over stored transitions and fully vectorised.
 6. Nature CNN (32x8x8/4, 64x4x4/2, 64x3x3/1, 512), uint8 until the forward pass (x / 255).
 7. Deviations from the paper, following CleanRL (whose published scores are our anchor):
    Adam lr 1e-4 instead of RMSProp 2.5e-4; squared error instead of the paper's error
    clipping to [-1, 1] (a Huber loss); learning starts at 80k steps instead of 50k.
 8. Steps count environment steps summed over envs. With several envs, the number of
    updates per env step (1 / --train-frequency) and the target period stay as with one.
 9. Evaluation: one AtariVectorEnv with one sub-env per game, seeds seed + 10000 + i, epsilon
    = --eval-epsilon (0.05, as Nature and CleanRL): a purely greedy agent can stall forever
    in games that need FIRE after a lost life (detail 3), and the random actions come from a
    fixed-seed generator so evaluation stays reproducible. --eval-only takes the env, seed,
    frame cap and epsilon from the checkpoint: it repeats the run's own final evaluation.
10. Checkpoints hold the replay memory as tensors sharing the numpy storage (no copy while
    saving; a full memory adopts the loaded arrays, so ~7 GB on disk and in RAM, not twice).
    SIGINT/SIGTERM abandon any evaluation, save a checkpoint and exit 0 without summary.json
    (a second Ctrl-C kills). On resume the emulators restart (their state is not saved), so
    the game in progress is cut like a truncation; pass the same arguments plus --resume.

Usage: python dqn_atari.py --env-id BreakoutNoFrameskip-v4 --total-steps 10000000
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import signal
import time
import warnings
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

SCRIPT = "dqn_atari.py"


def fail(message: str) -> SystemExit:
    return SystemExit(f"{SCRIPT}: error: {message}")


@dataclass
class Args:
    env_id: str = "BreakoutNoFrameskip-v4"
    """Atari id: <Game>NoFrameskip-v4 (no sticky actions) or ALE/<Game>-v5 (sticky actions 0.25)"""
    seed: int = 1
    """seed of python, numpy, torch and the environments (--eval-only: the checkpoint's)"""
    total_steps: int = 10_000_000
    """environment steps in total, summed over envs"""
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
    """only evaluate --checkpoint, with its run's env, seed, --max-episode-frames and --eval-epsilon"""
    checkpoint: str | None = None
    """checkpoint for --eval-only"""
    capture_video: bool = False
    """record one evaluation game into <run_dir>/videos"""
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
    """fraction of total steps over which epsilon decays linearly"""
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
    """Map a Gymnasium Atari id to (ALE ROM name, sticky-action probability), or refuse it."""
    import ale_py.roms

    m = re.fullmatch(r"([A-Z][A-Za-z0-9]*)NoFrameskip-v4", env_id) or re.fullmatch(r"ALE/([A-Z][A-Za-z0-9]*)-v5", env_id)
    if m is None:
        hint = "for vector observations with discrete actions use ppg.py; for continuous actions use d4pg.py, naf.py or rlpd.py"
        if "-ram" in env_id:
            hint = "RAM observations are vectors: use ppg.py"
        else:
            try:  # name the file that fits an id Gymnasium knows
                space = gym.make(env_id).action_space
                hint = "its actions are continuous: use d4pg.py, naf.py or rlpd.py" if isinstance(space, gym.spaces.Box) else "it has vector observations: use ppg.py"
            except Exception:
                pass
        raise fail(f"{env_id!r} is not a pixel Atari id (<Game>NoFrameskip-v4 or ALE/<Game>-v5); {hint}")
    game = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", m.group(1)).lower()  # MsPacman -> ms_pacman
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = ale_py.roms.get_rom_path(game)
    except Exception:
        found = None
    if not found:
        raise fail(f"no Atari ROM named {game!r} for {env_id!r}; check the game name (e.g. BreakoutNoFrameskip-v4)")
    return game, 0.0 if env_id.endswith("NoFrameskip-v4") else 0.25


def make_env(args: Args, num_envs: int):
    from ale_py.vector_env import AtariVectorEnv

    game, sticky = atari_game(args.env_id)
    # clipping, life loss and reset bookkeeping are ours (details 2-4), so the env reports raw data
    return AtariVectorEnv(game, num_envs, repeat_action_probability=sticky, max_num_frames_per_episode=args.max_episode_frames,
                          reward_clipping=False, episodic_life=False, life_loss_info=False, autoreset_mode="SameStep")


# ---------------------------------------------------------------- network
class QNetwork(nn.Module):
    """Nature CNN: Q(s, .; theta) for all actions from a uint8 stack of four 84x84 frames."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, n_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # channels_last while still uint8 (4x less to move); .float() keeps the layout
        return self.net(x.contiguous(memory_format=torch.channels_last).float().div_(255.0))


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
    """Uniform replay memory that stores each frame once, one ring of slots per environment.

    Slot k of env e holds a frame and, if `valid`, the transition from the stack ending at
    that frame to the stack ending at slot k+1. A game's first frame is marked `first`, its
    final frame (s' of its last transition) gets a slot of its own that starts no transition.
    """

    def __init__(self, capacity: int, num_envs: int, frame_shape=(84, 84), stack: int = 4):
        self.n, self.cap, self.stack = num_envs, capacity // num_envs, stack
        self.frames = np.zeros((self.cap, num_envs, *frame_shape), np.uint8)  # slot-major: a filled prefix is contiguous
        self.actions = np.zeros((self.cap, num_envs), np.int64)
        self.rewards = np.zeros((self.cap, num_envs), np.float32)
        self.dones = np.zeros((self.cap, num_envs), np.bool_)
        self.first = np.zeros((self.cap, num_envs), np.bool_)
        self.valid = np.zeros((self.cap, num_envs), np.bool_)
        self.head = np.zeros(num_envs, np.int64)  # next slot to write, per env
        self.written = np.zeros(num_envs, np.int64)
        self.need_start = np.ones(num_envs, np.bool_)  # the next obs begins a game
        self.envs = np.arange(num_envs)

    def _write(self, e: np.ndarray, frame: np.ndarray, first: bool) -> None:
        h = self.head[e]
        self.frames[h, e], self.first[h, e], self.valid[h, e] = frame, first, False
        for k in range(1, self.stack):  # the oldest transitions' stacks reached back into slot h: they are gone
            self.valid[(h + k) % self.cap, e] = False
        self.head[e] = (h + 1) % self.cap
        self.written[e] += 1

    def add(self, frame, action, reward, next_frame, done, ended) -> np.ndarray:
        """Store one step of every env: the newest frames of s and s' (the real final obs if the game
        ended), a, r, d, and `ended` (game over or truncation: the next obs starts a new game).
        Returns flat ids."""
        start = np.flatnonzero(self.need_start)
        if start.size:
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
        if not self.valid.any():
            raise ValueError("the replay memory holds no transition yet")
        n_ids, valid, idx = int(min(self.written.max(), self.cap)) * self.n, self.valid.reshape(-1), np.empty(0, np.int64)
        while idx.size < batch_size:  # rejection rounds over the batch, not a loop over its elements
            cand = rng.integers(0, n_ids, 2 * batch_size)
            idx = np.concatenate([idx, cand[valid[cand]]])
        return idx[:batch_size]

    def state_dict(self) -> dict:
        m = int(min(self.written.max(), self.cap))
        # torch.from_numpy shares memory: saving writes the arrays without another 7 GB copy
        arrays = {k: torch.from_numpy(getattr(self, k)[:m]) for k in ("frames", "actions", "rewards", "dones", "first", "valid")}
        return {**arrays, "head": torch.from_numpy(self.head), "written": torch.from_numpy(self.written)}

    def load_state_dict(self, state: dict) -> None:
        m = state["frames"].shape[0]
        for k in ("frames", "actions", "rewards", "dones", "first", "valid"):
            if m == self.cap:  # a full memory adopts the loaded arrays: no second 7 GB copy
                setattr(self, k, state[k].numpy())
            else:
                getattr(self, k)[:m] = state[k].numpy()
        self.head[:], self.written[:] = state["head"].numpy(), state["written"].numpy()
        self.need_start[:] = True  # the envs restart after a resume


def store_step(rb: FrameReplayBuffer, obs, actions, reward, next_obs, terminated, truncated, info, lives):
    """Details 2-4 for one vector step: store (s, a, sign(r), real s', d) with d = game over or lost
    life. Returns (ended, the lives to compare with next step, flat ids of the stored transitions)."""
    ended = terminated | truncated
    # after a game end info["lives"] is the next game's count, and a game with bonus lives can end
    # above it: compare within a game only (a life lost on a truncation's own step is not visible)
    life_lost = (info["lives"] < lives) & ~ended
    next_frame = np.where(ended[:, None, None], info["final_obs"][:, -1], next_obs[:, -1]) if ended.any() else next_obs[:, -1]
    ids = rb.add(obs[:, -1], actions, np.sign(reward), next_frame, terminated | life_lost, ended)
    return ended, info["lives"].copy(), ids


# ---------------------------------------------------------------- checkpoints, evaluation
def save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, args: Args, what: str) -> dict:
    if not Path(path).is_file():
        raise fail(f"{what} {path!r} does not exist; give the path of a checkpoints/latest.pt")
    try:  # --eval-only maps the file, so the replay memory in it is never read
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=what != "--resume")
    except Exception as exc:
        raise fail(f"cannot read {what} {path!r} ({type(exc).__name__}); it is corrupt or not a torch checkpoint")
    if not isinstance(ckpt, dict) or ckpt.get("algo") != "dqn_atari":
        algo = ckpt.get("algo") if isinstance(ckpt, dict) else None
        raise fail(f"{path!r} is a checkpoint of {algo!r}, not dqn_atari; use the matching script")
    needed = ("env_id", "args", "n_actions", "q_network", "global_step") + (("target_network", "optimizer", "buffer", "rng", "updates") if what == "--resume" else ())
    missing = [key for key in needed if key not in ckpt]
    if missing:
        raise fail(f"{path!r} is incomplete (no {', '.join(missing)}); use a checkpoint written by dqn_atari.py")
    if what == "--resume":  # --eval-only takes env and network from the checkpoint
        if ckpt["env_id"] != args.env_id:
            raise fail(f"{path!r} was trained on {ckpt['env_id']}, not {args.env_id}; pass --env-id {ckpt['env_id']}")
        for key in ("num_envs", "buffer_size"):
            if ckpt["args"].get(key) != getattr(args, key):
                flag = "--" + key.replace("_", "-")
                raise fail(f"{path!r} has {flag} {ckpt['args'].get(key)}, not {getattr(args, key)}; resume with {flag} {ckpt['args'].get(key)}")
    return ckpt


def checkpoint_run_dir(path: str, run_dir: str | None) -> Path:
    """Where --resume and --eval-only write: --run-dir, else the run folder holding the checkpoint
    (the parent of its checkpoints/ folder; the run may have been moved since it was saved)."""
    if run_dir:
        return Path(run_dir)
    folder = Path(path).resolve().parent
    return folder.parent if folder.name == "checkpoints" else folder


def evaluate(q_network: nn.Module, args: Args, device: torch.device, episodes: int, stop=()) -> list[float] | None:
    """Unclipped full-game scores of `episodes` games, one sub-env each, epsilon-greedy (detail 9);
    None if a stop signal arrives meanwhile (the time is the checkpoint's)."""
    env = make_env(args, episodes)
    rng = np.random.default_rng(args.seed + 10_000)
    obs, _ = env.reset(seed=args.seed + 10_000)  # env i gets seed + 10000 + i
    returns, running, finished = np.zeros(episodes), np.zeros(episodes), np.zeros(episodes, np.bool_)
    while not finished.all():
        if stop:
            env.close()
            return None
        with torch.inference_mode():
            greedy = q_network(torch.from_numpy(obs).to(device)).argmax(1).cpu().numpy()
        actions = np.where(rng.random(episodes) < args.eval_epsilon, rng.integers(0, env.single_action_space.n, episodes), greedy)
        obs, reward, terminated, truncated, _ = env.step(actions)
        running += reward * ~finished
        newly = (terminated | truncated) & ~finished
        returns[newly], finished = running[newly], finished | newly
    env.close()
    return returns.tolist()


def record_video(q_network: nn.Module, args: Args, device: torch.device, folder: Path) -> None:
    """One game through Gymnasium's ALE env (AtariVectorEnv does not render), same preprocessing."""
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, RecordVideo

    gym.register_envs(ale_py)
    game, sticky = atari_game(args.env_id)
    name = "".join(part.capitalize() for part in game.split("_"))
    env = gym.make(f"ALE/{name}-v5", frameskip=1, repeat_action_probability=sticky, max_num_frames_per_episode=args.max_episode_frames, render_mode="rgb_array")
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False, grayscale_obs=True)
    env = RecordVideo(FrameStackObservation(env, 4, padding_type="zero"), str(folder), episode_trigger=lambda i: True, disable_logger=True)
    rng = np.random.default_rng(args.seed + 10_000)
    obs, _ = env.reset(seed=args.seed + 10_000)
    meanings = env.unwrapped.get_action_meanings()
    if "FIRE" in meanings:  # AtariVectorEnv presses FIRE on reset (use_fire_reset); so does the video game
        obs, *_ = env.step(meanings.index("FIRE"))
    done = False
    while not done:
        with torch.inference_mode():
            action = int(q_network(torch.from_numpy(np.asarray(obs))[None].to(device)).argmax(1).item())
        if rng.random() < args.eval_epsilon:
            action = int(rng.integers(env.action_space.n))
        obs, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    env.close()


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def check_args(args: Args) -> None:
    positive = ("total_steps", "num_envs", "buffer_size", "batch_size", "target_network_frequency", "train_frequency", "max_episode_frames", "eval_episodes")
    for key in positive:
        if getattr(args, key) < 1:
            raise fail(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    for key in ("checkpoint_interval", "eval_interval", "learning_starts"):
        if getattr(args, key) < 0:
            raise fail(f"--{key.replace('_', '-')} must be >= 0, got {getattr(args, key)}")
    for key in ("gamma", "start_e", "end_e", "eval_epsilon"):
        if not 0.0 <= getattr(args, key) <= 1.0:
            raise fail(f"--{key.replace('_', '-')} must be in [0, 1], got {getattr(args, key)}")
    for key in ("tau", "exploration_fraction"):
        if not 0.0 < getattr(args, key) <= 1.0:
            raise fail(f"--{key.replace('_', '-')} must be in (0, 1], got {getattr(args, key)}")
    if not args.learning_rate > 0:
        raise fail(f"--learning-rate must be > 0, got {args.learning_rate}")
    if args.buffer_size // args.num_envs < 16:
        raise fail(f"--buffer-size {args.buffer_size} leaves under 16 slots per env; use at least {16 * args.num_envs}")
    if args.learning_starts < args.batch_size:
        raise fail(f"--learning-starts {args.learning_starts} is below --batch-size {args.batch_size}; raise it")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise fail("--device cuda but CUDA is not available; use --device cpu or auto")
    if args.eval_only and not args.checkpoint:
        raise fail("--eval-only needs --checkpoint PATH")


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    t0 = time.time()  # summary's wall_time_s: the whole process
    check_args(args)
    atari_game(args.env_id)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else "cpu" if args.device == "auto" else args.device)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.use_deterministic_algorithms(args.torch_deterministic, warn_only=True)

    if args.eval_only:
        ckpt = load_checkpoint(args.checkpoint, args, "--checkpoint")
        for key in ("env_id", "seed", "max_episode_frames", "eval_epsilon"):  # the run's own final evaluation (detail 9)
            setattr(args, key, ckpt["args"].get(key, getattr(args, key)))
        run_dir = checkpoint_run_dir(args.checkpoint, args.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        q_network = QNetwork(ckpt["n_actions"]).to(device).to(memory_format=torch.channels_last)
        q_network.load_state_dict(ckpt["q_network"])
        returns = evaluate(q_network, args, device, args.eval_episodes)
        if args.capture_video:
            record_video(q_network, args, device, run_dir / "videos")
        result = {"script": SCRIPT, "algo": "dqn_atari", "env_id": args.env_id, "seed": args.seed, "checkpoint": str(args.checkpoint), "global_step": ckpt["global_step"],
                  "eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)), "eval_episodes": len(returns), "eval_returns": returns}
        write_json(run_dir / "eval.json", result)
        print(f"eval {args.env_id} (seed {args.seed}) over {len(returns)} games: {result['eval_mean']:.2f} +- {result['eval_std']:.2f}")
        return

    if args.track:
        try:
            import wandb
        except ImportError:
            raise fail("--track needs the wandb package; pip install wandb or drop --track") from None
    ckpt = load_checkpoint(args.resume, args, "--resume") if args.resume else None
    if ckpt is not None and args.total_steps < ckpt["global_step"]:
        raise fail(f"--total-steps {args.total_steps} is below the checkpoint's step {ckpt['global_step']}; raise it")
    if ckpt is None:
        run_dir = Path(args.run_dir or f"runs/{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}")
    else:
        run_dir = checkpoint_run_dir(args.resume, args.run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    args.run_dir = str(run_dir)
    if args.track:  # before the SummaryWriter exists, so sync_tensorboard sees it
        wandb.init(project=args.wandb_project_name, config=vars(args), sync_tensorboard=True, dir=str(run_dir), mode=os.environ.get("WANDB_MODE", "online"))
    try:
        write_json(run_dir / "config.json", asdict(args))

        envs = make_env(args, args.num_envs)
        n, n_actions = args.num_envs, int(envs.single_action_space.n)
        q_network = QNetwork(n_actions).to(device).to(memory_format=torch.channels_last)
        target_network = QNetwork(n_actions).to(device).to(memory_format=torch.channels_last)
        target_network.load_state_dict(q_network.state_dict())
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
        rb = FrameReplayBuffer(args.buffer_size, n)
        rng = np.random.default_rng(args.seed)  # exploration and replay sampling
        global_step, updates = 0, 0
        if ckpt is not None:
            q_network.load_state_dict(ckpt["q_network"])
            target_network.load_state_dict(ckpt["target_network"])
            optimizer.load_state_dict(ckpt["optimizer"])
            rb.load_state_dict(ckpt["buffer"])
            global_step, updates = ckpt["global_step"], ckpt["updates"]
            rng.bit_generator.state = ckpt["rng"]["numpy"]
            random.setstate((ckpt["rng"]["python"][0], tuple(ckpt["rng"]["python"][1]), ckpt["rng"]["python"][2]))
            torch.set_rng_state(ckpt["rng"]["torch"])
            cuda_states = ckpt["rng"].get("cuda") or []
            if torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda_states)
            del ckpt
        # purge what a killed run logged after its checkpoint; points at the checkpoint's own step
        # (the final evaluation of a finished run) were logged by a state we continue from
        writer = SummaryWriter(str(run_dir), purge_step=global_step + 1 if args.resume else None)
        if not args.resume:
            writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))
        nonfinite = torch.zeros((), dtype=torch.bool, device=device)  # any non-finite loss since the last look

        def check_finite() -> None:  # before saving, evaluating and logging; per update it would sync the GPU
            if nonfinite.item():
                raise fail(f"non-finite loss before step {global_step:,}; the last good checkpoint is kept; lower --learning-rate")

        def checkpoint() -> None:
            check_finite()
            py_state = random.getstate()
            save_checkpoint(run_dir / "checkpoints" / "latest.pt", {
                "algo": "dqn_atari", "env_id": args.env_id, "args": asdict(args), "run_dir": str(run_dir.resolve()), "global_step": global_step, "updates": updates,
                "n_actions": n_actions, "q_network": q_network.state_dict(), "target_network": target_network.state_dict(), "optimizer": optimizer.state_dict(),
                "buffer": rb.state_dict(), "rng": {"numpy": rng.bit_generator.state, "python": [py_state[0], list(py_state[1]), py_state[2]], "torch": torch.get_rng_state(),
                                                   "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}})

        stop = []

        def on_signal(signum, frame) -> None:
            stop.append(signum)
            for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal kills at once
                signal.signal(sig, signal.SIG_DFL)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)

        def interrupted() -> None:
            print(f"signal {stop[0]}: saved {run_dir / 'checkpoints' / 'latest.pt'} at step {global_step:,}; continue with --resume")
            writer.close()

        obs, info = envs.reset(seed=args.seed + global_step)  # a resumed run restarts the games (detail 10)
        lives = info["lives"].copy()
        ep_return, ep_length = np.zeros(n), np.zeros(n, np.int64)
        recent = deque(maxlen=20)
        log_every = max(1000, n)  # charts/ cadence in env steps, independent of updates
        start_step, start_time, last_print = global_step, time.time(), time.time()
        while global_step < args.total_steps:
            if stop:
                checkpoint()
                envs.close()
                return interrupted()
            epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_steps, global_step)
            explore, actions = rng.random(n) < epsilon, rng.integers(0, n_actions, n)
            if not explore.all():
                with torch.inference_mode():
                    greedy = q_network(torch.from_numpy(obs).to(device)).argmax(1).cpu().numpy()
                actions = np.where(explore, actions, greedy)
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            prev_step, global_step = global_step, global_step + n

            ended, lives, _ = store_step(rb, obs, actions, reward, next_obs, terminated, truncated, info, lives)
            ep_return += reward
            ep_length += 1
            for e in np.flatnonzero(ended):
                writer.add_scalar("charts/episodic_return", ep_return[e], global_step)
                writer.add_scalar("charts/episodic_length", ep_length[e], global_step)
                recent.append(ep_return[e])
                ep_return[e], ep_length[e] = 0.0, 0
            obs = next_obs

            if global_step > args.learning_starts:
                for _ in range(global_step // args.train_frequency - prev_step // args.train_frequency):
                    s, s_next, a, r, d = (torch.from_numpy(x).to(device) for x in rb.sample(args.batch_size, rng))
                    with torch.no_grad():
                        y = td_target(r, d.float(), target_network(s_next), args.gamma)
                    q = q_network(s).gather(1, a[:, None]).squeeze(1)
                    loss = F.mse_loss(q, y)
                    nonfinite.logical_or_(~torch.isfinite(loss))
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    updates += 1
                    if updates % 100 == 0:
                        check_finite()
                        writer.add_scalar("losses/td_loss", loss.item(), global_step)
                        writer.add_scalar("losses/q_values", q.mean().item(), global_step)
                if global_step // args.target_network_frequency > prev_step // args.target_network_frequency:
                    update_target(target_network, q_network, args.tau)

            if global_step // log_every > prev_step // log_every or global_step >= args.total_steps:
                writer.add_scalar("charts/SPS", (global_step - start_step) / (time.time() - start_time), global_step)
                writer.add_scalar("charts/learning_rate", args.learning_rate, global_step)
                writer.add_scalar("charts/epsilon", epsilon, global_step)
            if not stop and args.eval_interval and global_step < args.total_steps and global_step // args.eval_interval > prev_step // args.eval_interval:
                check_finite()
                returns = evaluate(q_network, args, device, args.eval_episodes, stop)
                if returns is not None:
                    writer.add_scalar("eval/episodic_return", float(np.mean(returns)), global_step)
            if not stop and args.checkpoint_interval and global_step < args.total_steps and global_step // args.checkpoint_interval > prev_step // args.checkpoint_interval:
                checkpoint()
            if time.time() - last_print > 5:
                last_print, sps = time.time(), (global_step - start_step) / (time.time() - start_time)
                ret = f"{np.mean(recent):.1f}" if recent else "-"
                print(f"step {global_step:,}/{args.total_steps:,} | {sps:.0f} SPS | return {ret} | eps {epsilon:.2f} | eta {(args.total_steps - global_step) / max(sps, 1e-9) / 60:.0f}m", flush=True)

        loop_time = max(time.time() - start_time, 1e-9)
        envs.close()
        checkpoint()
        returns = None if stop else evaluate(q_network, args, device, args.eval_episodes, stop)
        if returns is None:  # the run is complete but unevaluated: --resume with the same --total-steps evaluates it
            return interrupted()
        writer.add_scalar("eval/episodic_return", float(np.mean(returns)), global_step)
        if args.capture_video and not stop:
            record_video(q_network, args, device, run_dir / "videos")
        writer.close()
        write_json(run_dir / "summary.json", {
            "script": SCRIPT, "algo": "dqn_atari", "env_id": args.env_id, "seed": args.seed, "global_step": global_step,
            "eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)), "eval_episodes": len(returns), "eval_returns": returns,
            "wall_time_s": time.time() - t0, "sps": (global_step - start_step) / loop_time, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
        print(f"done: step {global_step:,} | eval {np.mean(returns):.2f} +- {np.std(returns):.2f} | {run_dir}")
    finally:
        if args.track:
            wandb.finish()


if __name__ == "__main__":
    train(tyro.cli(Args))
