"""PPO for Atari: Proximal Policy Optimization with the Nature CNN on pixels.

Paper: J. Schulman, F. Wolski, P. Dhariwal, A. Radford, O. Klimov, "Proximal Policy
Optimization Algorithms", 2017, arXiv:1707.06347. Advantages: J. Schulman et al., "High-
Dimensional Continuous Control Using Generalized Advantage Estimation", 2015, arXiv:1506.02438.
Peer implementation: CleanRL `ppo_atari.py` (Huang et al. 2022, "The 37 Implementation Details
of Proximal Policy Optimization"), whose hyperparameters are the defaults here.

Idea: collect T steps from N environments with the current policy pi_old, estimate advantages
with GAE, then take several epochs of minibatch gradient steps on a clipped surrogate that
keeps the new policy pi_theta close to pi_old, so one batch of data can be reused safely.

Equations (r_t(theta) = pi_theta(a_t|s_t) / pi_old(a_t|s_t)):
    delta_t = r_t + gamma * (1 - term_t) * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lambda * (1 - end_t) * A_{t+1}            (GAE, eq. 11-12)
    L_clip  = E[ min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t) ]        (PPO eq. 7)
    L_V     = 1/2 E[ max((V - R_t)^2, (V_old + clip(V - V_old, -eps, eps) - R_t)^2) ]
    loss    = -L_clip + c1 L_V - c2 H[pi_theta]                          (PPO eq. 9)

Implementation details:
 1. Environments: ale_py's C++ `AtariVectorEnv` (threads), standard preprocessing: up to 30
    no-ops on reset, frame skip 4 with max-pool, 84x84 grayscale, stack of 4, FIRE on reset.
    `BreakoutNoFrameskip-v4` -> no sticky actions (DQN/PPO literature protocol);
    `ALE/Breakout-v5` -> sticky actions 0.25 (Machado et al. 2018). Other ids are refused.
 2. Rewards for learning are sign-clipped; `charts/episodic_return` is the unclipped score of
    the whole game (all lives), comparable with published numbers. `charts/episodic_length`
    counts agent steps (each is 4 frames).
 3. A life loss ends the GAE chain and is terminal for learning (as CleanRL's EpisodicLifeEnv),
    but the environment is not reset, so the score is the full game's. Deviation: unlike CleanRL's
    EpisodicLife+FireReset, FIRE is not pressed after a life loss (only when a game resets); the
    agent learns it, so Breakout's early curve may lag CleanRL's.
 4. Time-limit truncation (`--max-episode-frames`, 108,000 frames = 30 min) bootstraps from
    V(final observation). Deviation from CleanRL, which treats it as terminal (its issue #198).
    Autoreset mode is SameStep: the step that ends an episode returns the reset observation and
    the real last one in `info["final_obs"]`, so no transition crosses an episode boundary.
 5. Nature CNN with orthogonal init (gain sqrt 2 body, 0.01 policy head, 1 value head), shared
    trunk, uint8 frames divided by 255 inside the network.
 6. Adam eps 1e-5, lr 2.5e-4 annealed linearly to 0 over `--total-steps`, 4 epochs of 4
    minibatches, advantages normalised per minibatch, clipped value loss, global grad-norm 0.5,
    optional early stop of the epochs when the approximate KL exceeds `--target-kl`.
 7. Speed: channels_last convolutions, fused Adam, `torch.inference_mode()` for acting,
    preallocated uint8 rollout storage, V(final_obs) computed only for truncated envs.
 8. Evaluation: greedy (argmax) policy on separate envs seeded seed + 10_000 + i, full games,
    same sticky-action protocol. A greedy Breakout agent can stall without pressing FIRE; the
    frame limit bounds such an episode. `--eval-only` takes the env, seed and frame limit from
    the checkpoint, so it repeats the run's own final evaluation. `--capture-video` records one
    extra greedy game of the final (or eval-only) evaluation with gymnasium's AtariPreprocessing
    + RecordVideo, since the vector env does not render.
 9. Checkpoints hold the network, optimizer, step counters and RNG states (CUDA's too), not the
    emulator state: a resumed run restarts its games (fresh seeds), so an episode in progress is
    lost. SIGINT/SIGTERM cut short or skip any evaluation, save a checkpoint at the end of the
    current iteration and exit 0 without writing summary.json (summary.json means the run
    finished); a second signal kills the process.

Usage: python ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-steps 10000000
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import resource
import signal
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Optional

# Torch's OpenMP threads spin while waiting; on a busy or small machine they then steal the cores
# that the emulator threads and the other torch thread need (measured here: 5x slower on 2
# shared cores). Must be set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical

NAME = Path(__file__).name


def fail(message: str) -> SystemExit:
    return SystemExit(f"{NAME}: error: {message}")


@dataclass
class Args:
    env_id: str = "BreakoutNoFrameskip-v4"
    """`<Game>NoFrameskip-v4` (no sticky actions) or `ALE/<Game>-v5` (sticky actions 0.25)"""
    seed: int = 1
    """seed of python, numpy, torch and the environments (--eval-only: the checkpoint's)"""
    total_steps: int = 10_000_000
    """agent steps summed over environments (each is 4 frames)"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto = cuda if available"""
    exp_name: str = Path(__file__).stem
    """experiment name, part of the run dir"""
    run_dir: Optional[str] = None
    """default runs/<env>__<exp>__<seed>__<unixtime>"""
    checkpoint_interval: int = 500_000
    """save checkpoints/latest.pt every this many env steps (0: only at the end)"""
    resume: Optional[str] = None
    """continue the run of this checkpoint (outputs go to --run-dir, else the checkpoint's run dir)"""
    eval_episodes: int = 10
    """greedy evaluation games at each evaluation"""
    eval_interval: int = 0
    """evaluate every this many env steps (0: only at the end)"""
    eval_only: bool = False
    """only evaluate the policy of --checkpoint"""
    checkpoint: Optional[str] = None
    """checkpoint to evaluate with --eval-only"""
    capture_video: bool = False
    """record one greedy game of the final evaluation to <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """the wandb project"""
    max_episode_frames: int = 108_000
    """emulator frames after which a game is truncated (bootstrapped; --eval-only: the checkpoint's)"""

    # PPO (CleanRL defaults)
    num_envs: int = 8
    """parallel environments N"""
    num_steps: int = 128
    """steps per environment per rollout T"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
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
    target_kl: Optional[float] = None
    """stop the epochs early when the approximate KL exceeds this"""


# ---------------------------------------------------------------- environment
def atari_protocol(env_id: str) -> tuple[str, float]:
    """Map an env id to (ROM name, sticky-action probability); ValueError says what to use."""
    for pattern, sticky in ((r"([A-Za-z]+)NoFrameskip-v4", 0.0), (r"ALE/([A-Za-z]+)-v5", 0.25)):
        match = re.fullmatch(pattern, env_id)
        if match:
            game = re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()  # MsPacman -> ms_pacman
            if not rom_exists(game):
                raise ValueError(f"unknown Atari game {match.group(1)!r} in {env_id!r}; check the ROM name (e.g. BreakoutNoFrameskip-v4)")
            return game, sticky
    match = re.fullmatch(r"(?:ALE/)?([A-Za-z]+?)(-ram)?(?:NoFrameskip|Deterministic)?-v\d+", env_id)
    if match and rom_exists(re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()):
        g = match.group(1)
        what = "RAM observations are not supported (this file learns from pixels)" if match.group(2) else "this variant's frame-skip protocol is not supported"
        raise ValueError(f"{env_id}: {what}; use {g}NoFrameskip-v4 or ALE/{g}-v5")
    try:
        env = gym.make(env_id)
    except Exception:
        raise ValueError(f"unknown environment id {env_id!r}; use an Atari id such as BreakoutNoFrameskip-v4 or ALE/Breakout-v5")
    act, obs = env.action_space, env.observation_space
    env.close()
    if isinstance(act, gym.spaces.Box):
        raise ValueError(f"{env_id} is not an Atari game (continuous actions); use d4pg.py, naf.py or rlpd.py")
    if isinstance(act, gym.spaces.Discrete) and len(obs.shape) == 1:
        raise ValueError(f"{env_id} is not an Atari game (discrete actions, vector observations); use ppg.py")
    raise ValueError(f"{env_id} is not an Atari game; use BreakoutNoFrameskip-v4 or ALE/<Game>-v5")


def rom_exists(game: str) -> bool:
    from ale_py import roms

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return roms.get_rom_path(game) is not None
        except Exception:
            return False


def make_envs(game: str, sticky: float, num_envs: int, max_frames: int):
    from ale_py.vector_env import AtariVectorEnv

    # Raw rewards (we clip ourselves to keep the score) and no life-loss episodes (detected from
    # info["lives"]), so a game over can be told apart from a life loss.
    return AtariVectorEnv(
        game, num_envs, repeat_action_probability=sticky, max_num_frames_per_episode=max_frames,
        reward_clipping=False, episodic_life=False, life_loss_info=False, autoreset_mode="SameStep",
    )


# ---------------------------------------------------------------- network
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature CNN trunk (Mnih et al. 2015) shared by the policy and value heads."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 frames (B, 4, 84, 84) -> policy logits (B, A), values (B,)."""
        x = obs.to(torch.float32, memory_format=torch.channels_last).mul_(1.0 / 255.0)  # in place: no 2nd copy
        hidden = self.network(x)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


# ---------------------------------------------------------------- PPO math
def learning_flags(terminated, truncated, lives, prev_lives):
    """(terminal, truncation) for learning from one vector step (numpy bool arrays).

    A life loss is terminal for learning only (the game goes on). After a game ends, `lives` is
    that of the freshly reset game, so it is compared only where no episode ended. A game over
    that coincides with the time limit is terminal: there is nothing left to bootstrap.
    """
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    return terminated | life_lost, truncated & ~terminated


@torch.inference_mode()
def step_targets(agent, terminated, truncated, info: dict, prev_lives, device):
    """(terminal, truncation, V(real final obs) where truncated else 0) of one vector step.

    With autoreset SameStep the returned observation of an ended env is the new game's, so the
    bootstrap value comes from info["final_obs"]; it is computed only for the (rare) cut envs.
    """
    terminal, cut = learning_flags(terminated, truncated, info["lives"], prev_lives)
    trunc_value = torch.zeros(len(cut), device=device)
    if cut.any():
        idx = np.flatnonzero(cut)
        trunc_value[torch.from_numpy(idx).to(device)] = agent(torch.from_numpy(info["final_obs"][idx]).to(device))[1]
    return terminal, cut, trunc_value


def gae(rewards, values, next_value, terminals, truncations, truncation_values, gamma: float, gae_lambda: float):
    """Generalized advantage estimates and returns R_t = A_t + V(s_t), all (T, N) float tensors.

    terminals: 1 where s_{t+1} has value 0 for learning (game over or life loss).
    truncations: 1 where the episode was cut by the time limit; V(s_{t+1}) is then
    truncation_values (the value of the real final observation), not values[t + 1], which is a
    freshly reset game. Either ends the GAE chain: A_{t+1} belongs to another episode.
    next_value: V of the observation after the last step, shape (N,).
    """
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


def ppo_losses(new_logprob, old_logprob, advantages, new_value, old_value, returns, clip_coef: float, clip_vloss: bool):
    """Clipped surrogate policy loss (-L_clip), value loss L_V, approx KL, clip fraction."""
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:
        v_clipped = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((new_value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # k3 estimator (Schulman's blog "Approximating KL")
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return pg_loss, v_loss, approx_kl, clipfrac


# ---------------------------------------------------------------- checkpoints, evaluation
def atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(data, indent=2)))


def save_checkpoint(path: Path, agent, optimizer, args: Args, run_dir: Path, global_step: int, iteration: int) -> None:
    np_state = np.random.get_state()
    state = {
        "algo": Path(__file__).stem, "env_id": args.env_id, "args": asdict(args), "run_dir": str(run_dir),
        "global_step": global_step, "iteration": iteration,
        "agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
        "rng": {"python": list(random.getstate()[1]), "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
                "numpy_pos": int(np_state[2]), "torch": torch.get_rng_state()},
    }
    if torch.cuda.is_available():
        state["rng"]["cuda"] = torch.cuda.get_rng_state_all()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda p: torch.save(state, p))


def load_checkpoint(path: str, env_id: Optional[str], device) -> dict:
    """Load a checkpoint safely (no code runs) and refuse one of another algorithm or env."""
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
        assert isinstance(ckpt, dict) and {"algo", "env_id", "args", "agent", "global_step"} <= ckpt.keys()
    except FileNotFoundError:
        raise fail(f"checkpoint {path} does not exist; pass the path of a checkpoints/latest.pt")
    except Exception:
        raise fail(f"checkpoint {path} is corrupt or not a checkpoint; pass a checkpoints/latest.pt written by {NAME}")
    if ckpt["algo"] != Path(__file__).stem:
        raise fail(f"checkpoint {path} was written by {ckpt['algo']}, not {Path(__file__).stem}; use {ckpt['algo']}.py")
    if env_id is not None and ckpt["env_id"] != env_id:
        raise fail(f"checkpoint {path} is for {ckpt['env_id']}, not {env_id}; pass --env-id {ckpt['env_id']}")
    return ckpt


def restore_rng(rng: dict) -> None:
    random.setstate((3, tuple(rng["python"]), None))
    np.random.set_state(("MT19937", rng["numpy"].cpu().numpy().astype(np.uint32), rng["numpy_pos"], 0, 0.0))
    torch.set_rng_state(rng["torch"].cpu())
    if "cuda" in rng and torch.cuda.is_available():  # map_location may have moved them to the GPU
        torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"][:torch.cuda.device_count()]])


def evaluate(agent, game: str, sticky: float, episodes: int, seed: int, max_frames: int, device, stop=()) -> list[float]:
    """Unclipped scores of `episodes` full greedy games, env i seeded seed + i; cut short (scores
    incomplete) as soon as `stop` is non-empty (a signal arrived)."""
    envs = make_envs(game, sticky, episodes, max_frames)
    obs, _ = envs.reset(seed=seed)
    scores, finished = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    while not finished.all() and not stop:
        with torch.inference_mode():
            logits, _ = agent(torch.from_numpy(obs).to(device))
        obs, reward, term, trunc, _ = envs.step(logits.argmax(1).cpu().numpy())
        scores += reward * ~finished  # games that ended keep running; ignore them
        finished |= term | trunc
    envs.close()
    return scores.tolist()


def record_video(agent, game: str, sticky: float, video_dir: Path, seed: int, max_frames: int, device) -> float:
    """One greedy game rendered to mp4 (AtariVectorEnv cannot render)."""
    import ale_py

    gym.register_envs(ale_py)
    camel = "".join(part.capitalize() for part in game.split("_"))
    env = gym.make(f"ALE/{camel}-v5", frameskip=1, repeat_action_probability=sticky, render_mode="rgb_array",
                   max_num_frames_per_episode=max_frames)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False, grayscale_obs=True)
    env = gym.wrappers.FrameStackObservation(env, 4)
    env = gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True, disable_logger=True)
    obs, _ = env.reset(seed=seed)
    meanings = env.unwrapped.get_action_meanings()
    if "FIRE" in meanings:  # as use_fire_reset in the vector env
        obs, *_ = env.step(meanings.index("FIRE"))
    score, done = 0.0, False
    while not done:
        with torch.inference_mode():
            logits, _ = agent(torch.as_tensor(np.asarray(obs), device=device).unsqueeze(0))
        obs, reward, term, trunc, _ = env.step(int(logits.argmax(1)))
        score, done = score + float(reward), term or trunc
    env.close()
    return score


# ---------------------------------------------------------------- training
def check_args(args: Args) -> None:
    batch = args.num_envs * args.num_steps
    positive = {"num-envs": args.num_envs, "num-steps": args.num_steps, "num-minibatches": args.num_minibatches,
                "update-epochs": args.update_epochs, "learning-rate": args.learning_rate, "clip-coef": args.clip_coef,
                "max-episode-frames": args.max_episode_frames, "max-grad-norm": args.max_grad_norm,
                "eval-episodes": args.eval_episodes}
    for name, value in positive.items():
        if not value > 0:
            raise fail(f"--{name} must be positive, got {value}")
    for name, value in {"gamma": args.gamma, "gae-lambda": args.gae_lambda}.items():
        if not 0 <= value <= 1:
            raise fail(f"--{name} must be in [0, 1], got {value}")
    for name, value in {"eval-interval": args.eval_interval, "checkpoint-interval": args.checkpoint_interval}.items():
        if value < 0:
            raise fail(f"--{name} must be >= 0, got {value}")
    if batch % args.num_minibatches:
        raise fail(f"num_envs * num_steps = {batch} is not divisible by --num-minibatches {args.num_minibatches}; choose a divisor")
    if not args.eval_only and args.total_steps < batch:
        raise fail(f"--total-steps {args.total_steps} is less than one rollout (num_envs * num_steps = {batch}); raise it")
    if args.eval_only and not args.checkpoint:
        raise fail("--eval-only needs --checkpoint PATH")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise fail("--device cuda but CUDA is not available; use --device cpu or auto")
    if args.track and importlib.util.find_spec("wandb") is None:
        raise fail("--track needs wandb (pip install wandb), or drop --track")


def train(args: Args) -> None:
    process_start = time.time()  # summary's wall_time_s: the whole process
    check_args(args)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(args.torch_deterministic, warn_only=device.type == "cuda")
    torch.backends.cudnn.deterministic = args.torch_deterministic

    ckpt = None
    if args.eval_only or args.resume:
        path = args.checkpoint if args.eval_only else args.resume
        ckpt = load_checkpoint(path, None if args.eval_only else args.env_id, device)
        if not args.eval_only:
            for key in ("num_envs", "num_steps"):  # they define the batch and the schedule so far
                if ckpt["args"][key] != getattr(args, key):
                    raise fail(f"--{key.replace('_', '-')} {getattr(args, key)} differs from the checkpoint's {ckpt['args'][key]}; resume with the same value")
            if args.total_steps < ckpt["global_step"]:
                raise fail(f"--total-steps {args.total_steps} is below the checkpoint's step {ckpt['global_step']}; pass at least that")
        # the folder holding checkpoints/ (where it is now, never the path stored in the checkpoint)
        ckpt_dir = Path(path).resolve().parent
        default_dir = ckpt_dir.parent if ckpt_dir.name == "checkpoints" else ckpt_dir
    env_id = ckpt["env_id"] if args.eval_only else args.env_id
    try:
        game, sticky = atari_protocol(env_id)
    except ValueError as e:
        raise fail(str(e))
    if ckpt is not None:
        run_dir = Path(args.run_dir) if args.run_dir else default_dir
    else:
        run_dir = Path(args.run_dir or f"runs/{env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}")
    run_dir.mkdir(parents=True, exist_ok=True)

    envs = make_envs(game, sticky, args.num_envs, args.max_episode_frames)
    agent = Agent(int(envs.single_action_space.n)).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    if ckpt is not None:
        try:
            agent.load_state_dict(ckpt["agent"])
        except RuntimeError:
            raise fail(f"checkpoint's network does not fit {env_id}'s action set; use a checkpoint of this game")

    if args.eval_only:  # the run's own seed and frame limit: the same games as its final evaluation
        envs.close()
        seed, max_frames = ckpt["args"]["seed"], ckpt["args"]["max_episode_frames"]
        returns = evaluate(agent, game, sticky, args.eval_episodes, seed + 10_000, max_frames, device)
        result = {"script": NAME, "algo": Path(__file__).stem, "env_id": env_id, "checkpoint": str(args.checkpoint),
                  "seed": seed, "global_step": ckpt["global_step"], "eval_mean": float(np.mean(returns)),
                  "eval_std": float(np.std(returns)), "eval_episodes": len(returns), "eval_returns": returns}
        if args.capture_video:
            result["video_return"] = record_video(agent, game, sticky, run_dir / "videos", seed + 20_000, max_frames, device)
        write_json(run_dir / "eval.json", result)
        print(f"eval {env_id} step {ckpt['global_step']:,}: {result['eval_mean']:.1f} +- {result['eval_std']:.1f} over {len(returns)} games")
        return

    global_step, iteration = 0, 0
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        global_step, iteration = ckpt["global_step"], ckpt["iteration"]
        restore_rng(ckpt["rng"])
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, config=vars(args), sync_tensorboard=True, dir=str(run_dir),
                   name=run_dir.name, mode=os.environ.get("WANDB_MODE", "online"))
    from torch.utils.tensorboard import SummaryWriter

    # purge_step = step + 1: what was logged at the checkpoint's own step belongs to it (its
    # losses and evaluation); anything later came from after the save and is hidden.
    writer = SummaryWriter(str(run_dir), purge_step=global_step + 1 if ckpt else None)
    if ckpt is None:
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    write_json(run_dir / "config.json", {**vars(args), "run_dir": str(run_dir), "resolved_device": str(device),
                                          "game": game, "repeat_action_probability": sticky})
    stop = []

    def on_signal(signum, _frame):  # the loop saves at the next safe point; a second signal kills
        stop.append(signum)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    def shutdown(exit_code: int = 0) -> None:  # every exit path: flush the events, end the W&B run
        writer.close()
        if args.track:
            wandb.finish(exit_code=exit_code)

    T, N = args.num_steps, args.num_envs
    batch_size, minibatch_size = T * N, T * N // args.num_minibatches
    num_iterations = args.total_steps // batch_size
    obs = torch.zeros((T, N, 4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros((T, N), dtype=torch.long, device=device)
    logprobs, values, trunc_values = (torch.zeros((T, N), device=device) for _ in range(3))
    # rewards and flags are born in numpy: kept on the host, moved once per rollout, not 3 copies a step
    rewards_np, terminals_np, truncations_np = (np.zeros((T, N), np.float32) for _ in range(3))
    gen = torch.Generator().manual_seed(args.seed + iteration)  # minibatch order

    obs_np, info = envs.reset(seed=args.seed + global_step)  # fresh games after a resume
    next_obs = torch.from_numpy(obs_np).to(device)
    lives = info["lives"]
    score, length = np.zeros(N), np.zeros(N, dtype=np.int64)
    recent = deque(maxlen=20)
    start_time, start_step, last_print = time.time(), global_step, 0.0
    train_end = start_time  # end of the last iteration's update: sps excludes evaluations and saves after it
    ckpt_path = run_dir / "checkpoints" / "latest.pt"
    eval_returns, eval_step = [], -1

    while iteration < num_iterations:
        iteration += 1
        lr = args.learning_rate * (1.0 - global_step / (num_iterations * batch_size)) if args.anneal_lr else args.learning_rate
        for group in optimizer.param_groups:
            group["lr"] = lr

        with torch.inference_mode():
            for t in range(T):
                obs[t] = next_obs
                logits, values[t] = agent(next_obs)
                # NaN weights are caught after the update; validation here would cost a sync per step
                dist = Categorical(logits=logits, validate_args=False)
                action = dist.sample()
                actions[t], logprobs[t] = action, dist.log_prob(action)
                obs_np, reward, term, trunc, info = envs.step(action.cpu().numpy())
                global_step += N
                terminal, cut, trunc_values[t] = step_targets(agent, term, trunc, info, lives, device)
                lives = info["lives"]
                rewards_np[t], terminals_np[t], truncations_np[t] = np.sign(reward), terminal, cut  # clipped (Mnih 2015)
                next_obs = torch.from_numpy(obs_np).to(device)
                score += reward
                length += 1
                for i in np.flatnonzero(term | trunc):
                    writer.add_scalar("charts/episodic_return", score[i], global_step)
                    writer.add_scalar("charts/episodic_length", length[i], global_step)
                    recent.append(score[i])
                    score[i], length[i] = 0.0, 0
            next_value = agent(next_obs)[1]
            rewards, terminals, truncations = (torch.from_numpy(x).to(device) for x in (rewards_np, terminals_np, truncations_np))
            advantages, returns = gae(rewards, values, next_value, terminals, truncations, trunc_values, args.gamma, args.gae_lambda)

        b_obs, b_actions = obs.reshape(-1, 4, 84, 84), actions.reshape(-1)
        b_logprobs, b_advantages, b_returns, b_values = (x.reshape(-1) for x in (logprobs, advantages, returns, values))
        clipfracs = []
        for epoch in range(args.update_epochs):
            order = torch.randperm(batch_size, generator=gen).to(device)
            for start in range(0, batch_size, minibatch_size):
                mb = order[start:start + minibatch_size]
                logits, new_value = agent(b_obs[mb])
                dist = Categorical(logits=logits, validate_args=False)  # NaNs: caught after the update
                new_logprob, entropy = dist.log_prob(b_actions[mb]), dist.entropy().mean()
                mb_adv = b_advantages[mb]
                if args.norm_adv:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss, v_loss, approx_kl, clipfrac = ppo_losses(new_logprob, b_logprobs[mb], mb_adv, new_value, b_values[mb],
                                                                  b_returns[mb], args.clip_coef, args.clip_vloss)
                loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                clipfracs.append(clipfrac)
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break
        if not torch.isfinite(loss):
            kept = f"the last good checkpoint is {ckpt_path}" if ckpt_path.exists() else "no checkpoint was written"
            shutdown(exit_code=1)
            raise fail(f"non-finite loss at step {global_step:,} ({kept}); try a lower --learning-rate")

        with torch.no_grad():
            var_y = b_returns.var()
            explained_var = (1 - (b_returns - b_values).var() / var_y).item() if var_y > 0 else float("nan")
        sps = int((global_step - start_step) / (time.time() - start_time))
        for tag, value in {"charts/learning_rate": lr, "charts/SPS": sps, "losses/value_loss": v_loss.item(),
                           "losses/policy_loss": pg_loss.item(), "losses/entropy": entropy.item(),
                           "losses/approx_kl": approx_kl.item(), "losses/clipfrac": torch.stack(clipfracs).mean().item(),
                           "losses/explained_variance": explained_var}.items():
            writer.add_scalar(tag, value, global_step)
        train_end = time.time()

        if not stop and args.eval_interval and global_step // args.eval_interval > (global_step - batch_size) // args.eval_interval:
            returns_now = evaluate(agent, game, sticky, args.eval_episodes, args.seed + 10_000, args.max_episode_frames, device, stop)
            if not stop:  # a signal cuts the evaluation short: its scores are incomplete
                eval_returns, eval_step = returns_now, global_step
                writer.add_scalar("eval/episodic_return", float(np.mean(eval_returns)), global_step)
        interrupted = bool(stop)
        if interrupted or iteration == num_iterations or (args.checkpoint_interval and global_step // args.checkpoint_interval > (global_step - batch_size) // args.checkpoint_interval):
            save_checkpoint(ckpt_path, agent, optimizer, args, run_dir, global_step, iteration)
        if time.time() - last_print > 5 or iteration == num_iterations:
            last_print = time.time()
            eta = (num_iterations * batch_size - global_step) / max(sps, 1)
            ret = f"{np.mean(recent):.1f}" if recent else "-"
            print(f"step {global_step:,}/{num_iterations * batch_size:,} | {sps} SPS | return {ret} | eta {int(eta // 3600)}h{int(eta % 3600 // 60):02d}m", flush=True)
        if interrupted:
            print(f"interrupted: checkpoint saved at step {global_step:,} to {ckpt_path}; continue with --resume {ckpt_path}")
            envs.close()
            shutdown()
            return
    envs.close()

    if eval_step != global_step:  # the final checkpoint is saved: a signal from here on just ends the run
        returns_now = evaluate(agent, game, sticky, args.eval_episodes, args.seed + 10_000, args.max_episode_frames, device, stop)
        if not stop:
            eval_returns = returns_now
            writer.add_scalar("eval/episodic_return", float(np.mean(eval_returns)), global_step)
    if args.capture_video and not stop:
        record_video(agent, game, sticky, run_dir / "videos", args.seed + 20_000, args.max_episode_frames, device)
    if stop:
        print(f"interrupted during the final evaluation: checkpoint saved at step {global_step:,} to {ckpt_path}; "
              f"finish with --resume {ckpt_path} --total-steps {args.total_steps}")
        shutdown()
        return
    write_json(run_dir / "summary.json", {
        "script": NAME, "algo": Path(__file__).stem, "env_id": env_id, "seed": args.seed, "global_step": global_step,
        "eval_mean": float(np.mean(eval_returns)), "eval_std": float(np.std(eval_returns)),
        "eval_episodes": len(eval_returns), "eval_returns": eval_returns, "wall_time_s": time.time() - process_start,
        # env steps of this process per second of its training loop (no startup, final evaluation or checkpoint)
        "sps": (global_step - start_step) / max(train_end - start_time, 1e-9),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "game": game, "repeat_action_probability": sticky,
    })
    print(f"eval {env_id}: {np.mean(eval_returns):.1f} +- {np.std(eval_returns):.1f} over {len(eval_returns)} games")
    shutdown()


if __name__ == "__main__":
    train(tyro.cli(Args))
