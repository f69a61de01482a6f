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
    no-ops on reset, frame skip 4 with max-pool, 84x84 grayscale, a stack of `--frame-stack`
    frames (4; 1 is the memoryless baseline of recurrent PPO) padded with zero frames after a
    reset. `<Game>NoFrameskip-v4` -> no sticky actions (DQN/PPO literature); `ALE/<Game>-v5` ->
    sticky actions 0.25 (Machado et al. 2018). <Game> is any ROM
    ale_py ships, named as Gymnasium names it (ms_pacman -> MsPacman, pitfall2 -> Pitfall2,
    tic_tac_toe_3d -> TicTacToe3D). Other ids are refused.
 2. Rewards for learning are sign-clipped; `charts/episodic_return` is the unclipped score of
    the whole game (all lives), comparable with published numbers. `charts/episodic_length`
    counts agent steps (each is 4 frames).
 3. Life and FIRE protocol (`--protocol`; auto = baselines for NoFrameskip-v4, machado for v5):
    - baselines (OpenAI baselines / CleanRL's EpisodicLife + FireReset, with which the published
      NoFrameskip-v4 scores were made): in games with FIRE, FIRE is pressed at reset and, as the
      next agent step, after each lost life; a lost life ends the GAE chain and is terminal for
      learning. That forced step is not the policy's choice, so it is left out of the policy loss
      (its value target still trains V); it counts as an agent step (one per life).
    - machado (Machado et al. 2018): no FIRE and no life signal; only a game over is terminal.
    Neither resets the game at a lost life, so the logged score and evaluation are whole games
    played under the same protocol.
 4. Time-limit truncation (`--max-episode-frames`, 108,000 frames = 30 min) bootstraps from
    V(final observation). Deviation from CleanRL, which treats it as terminal (its issue #198).
    Autoreset mode is SameStep: the step that ends an episode returns the reset observation and
    the real last one in `info["final_obs"]`, so no transition crosses an episode boundary.
 5. Nature CNN with orthogonal init (gain sqrt 2 body, 0.01 policy head, 1 value head), shared
    trunk, uint8 frames divided by 255 inside the network (on a copy: the caller's tensor is
    never changed).
 6. Adam eps 1e-5, lr 2.5e-4 annealed linearly, lr = 2.5e-4 (1 - step / H), 4 epochs of 4
    minibatches, advantages normalised per minibatch, clipped value loss, global grad-norm 0.5,
    optional early stop of the epochs when the approximate KL exceeds `--target-kl`. The anneal
    horizon H is the run's own: `--schedule-steps`, by default the steps the first run planned
    (--total-steps rounded down to whole rollouts), kept in the checkpoint. A resume (after preemption) continues the same schedule, whatever --total-steps
    says. Extending an annealed run past H is refused rather than guessed: holding the final
    rate would train at lr 0 (wasted compute), and stretching H to the new total would make the
    rate jump up (the old behaviour). Pass --schedule-steps (re-plans lr from the resume on) or
    --no-anneal-lr to say which you want.
 7. Speed: channels_last convolutions, fused Adam, `torch.inference_mode()` for acting,
    preallocated uint8 rollout storage, V(final_obs) computed only for truncated envs.
 8. Evaluation: the sampled policy, as the literature's PPO scores are measured (a greedy
    Breakout agent may never press FIRE and run to the frame limit), drawn from evaluation's own
    generator (seeded seed + 10_000; game i is seeded seed + 10_000 + i), so evaluating never moves
    the training generators and `--eval-only` repeats the run's own final evaluation (it takes the
    env, seed, frame limit and frame stack from the checkpoint). Full games, same sticky-action
    protocol; `eval/capped_games` (and `eval_capped_games` in summary.json and eval.json)
    counts games cut by the frame limit. `--capture-video` records one extra game of the same
    sampled policy (final or eval-only evaluation) with gymnasium's AtariPreprocessing +
    RecordVideo, since the vector env does not render; its frames are stacked as the vector env
    stacks them (zero padding, the first frame the one after FIRE).
 9. Checkpoints hold the network, optimizer, step counters, the anneal horizon and the state of
    exactly the generators the run draws from: torch's default one (initialisation, actions;
    CUDA's on a GPU) and the minibatch-order generator. Not the emulator state: a resumed run
    restarts its games (seeded seed + step), so an episode in progress is lost. SIGINT/SIGTERM
    skip any evaluation still due, save a checkpoint at the end of the current iteration and exit
    0 without summary.json (summary.json means the run finished); a second signal kills at once.
    --resume and --eval-only write into --run-dir, else the folder above checkpoints/.

Usage: python ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-steps 10000000
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
    """seed of torch and the environments (--eval-only: the checkpoint's)"""
    total_steps: int = 10_000_000
    """agent steps summed over environments (each is 4 frames); a resume keeps the checkpoint's lr anneal (see --schedule-steps)"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto = cuda if available"""
    exp_name: str = Path(__file__).stem
    """experiment name, part of the run dir"""
    run_dir: str | None = None
    """default runs/<env>__<exp>__<seed>__<unixtime>"""
    checkpoint_interval: int = 500_000
    """save checkpoints/latest.pt every this many env steps (0: only at the end)"""
    resume: str | None = None
    """continue the run of this checkpoint (outputs go to --run-dir, else the checkpoint's run dir)"""
    eval_episodes: int = 10
    """evaluation games (sampled policy) at each evaluation"""
    eval_interval: int = 0
    """evaluate every this many env steps (0: only at the end)"""
    eval_only: bool = False
    """only evaluate the policy of --checkpoint (its env, seed, frame limit and frame stack)"""
    checkpoint: str | None = None
    """checkpoint to evaluate with --eval-only"""
    capture_video: bool = False
    """record one game of the final (or --eval-only) evaluation's policy to <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """the wandb project"""
    max_episode_frames: int = 108_000
    """emulator frames after which a game is truncated (bootstrapped; --eval-only: the checkpoint's)"""
    frame_stack: int = 4
    """frames per observation (1: no stacking, the feed-forward baseline of recurrent PPO); fixed on resume"""

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
    """step at which the annealed lr reaches 0 (default: this run's steps; on resume the checkpoint's: a longer resume must re-plan it here)"""
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
    # Raw rewards (we clip ourselves to keep the score) and no life-loss episodes (detected from
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
    """Nature CNN trunk (Mnih et al. 2015) shared by the policy and value heads."""

    def __init__(self, num_actions: int, frame_stack: int = 4):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(frame_stack, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 frames (B, frame_stack, 84, 84) -> policy logits (B, A), values (B,)."""
        # copy=True: scaling in place then touches only our copy, never the caller's (float) tensor
        x = obs.to(torch.float32, memory_format=torch.channels_last, copy=True).mul_(1.0 / 255.0)
        hidden = self.network(x)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


def sample_actions(agent: Agent, obs: np.ndarray, device, generator: torch.Generator) -> np.ndarray:
    """a ~ pi(.|s), the evaluated policy (detail 8), drawn on the CPU from evaluation's own generator."""
    with torch.inference_mode():
        logits, _ = agent(torch.as_tensor(obs, device=device))
    return torch.multinomial(logits.float().softmax(-1).cpu(), 1, generator=generator).squeeze(1).numpy()


# ---------------------------------------------------------------- PPO math
def learning_flags(terminated, truncated, lives, prev_lives, baselines: bool):
    """(terminal, truncation, life lost) for learning from one vector step (numpy bool arrays). Under the
    baselines protocol a life loss is terminal for learning only (the game goes on). After a game ends,
    `lives` is that of the freshly reset game, so it is compared only where no episode ended. A game over
    at the time limit is terminal."""
    life_lost = (lives < prev_lives) & ~(terminated | truncated)
    return terminated | (life_lost & baselines), truncated & ~terminated, life_lost


@torch.inference_mode()
def step_targets(agent, terminated, truncated, info: dict, prev_lives, baselines: bool, device):
    """(terminal, truncation, life lost, V(real final obs) where truncated else 0) of one vector step. With autoreset
    SameStep the returned observation of an ended env is the new game's, so the bootstrap value comes
    from info["final_obs"]; it is computed only for the (rare) cut envs."""
    terminal, cut, life_lost = learning_flags(terminated, truncated, info["lives"], prev_lives, baselines)
    trunc_value = torch.zeros(len(cut), device=device)
    if cut.any():
        idx = np.flatnonzero(cut)
        trunc_value[torch.from_numpy(idx).to(device)] = agent(torch.from_numpy(info["final_obs"][idx]).to(device))[1]
    return terminal, cut, life_lost, trunc_value


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


def update(agent: Agent, optimizer, batch: dict, generator: torch.Generator, args: Args) -> dict:
    """K epochs of minibatch steps on the PPO loss (eq. 9), minibatch order drawn from `generator`.
    Returns the last minibatch's losses, the epochs' mean clip fraction, the explained variance and the total loss."""
    batch_size = len(batch["actions"])
    minibatch_size, clipfracs = batch_size // args.num_minibatches, []
    for epoch in range(args.update_epochs):
        order = torch.randperm(batch_size, generator=generator).to(batch["actions"].device)
        for start in range(0, batch_size, minibatch_size):
            mb = order[start:start + minibatch_size]
            logits, new_value = agent(batch["obs"][mb])
            dist = Categorical(logits=logits, validate_args=False)  # NaNs: caught after the update
            new_logprob, entropy = dist.log_prob(batch["actions"][mb]), dist.entropy().mean()
            mb_adv = batch["advantages"][mb]
            if args.norm_adv:
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            pg_loss, v_loss, approx_kl, clipfrac = ppo_losses(new_logprob, batch["logprobs"][mb], mb_adv, new_value, batch["values"][mb],
                                                              batch["returns"][mb], args.clip_coef, args.clip_vloss, batch["acted"][mb])
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            clipfracs.append(clipfrac)
        if args.target_kl is not None and approx_kl.item() > args.target_kl:
            break
    var_y = batch["returns"].var()
    return {"loss": loss.detach(), "losses/value_loss": v_loss.detach(), "losses/policy_loss": pg_loss.detach(), "losses/entropy": entropy.detach(),
            "losses/approx_kl": approx_kl, "losses/clipfrac": torch.stack(clipfracs).mean(),
            "losses/explained_variance": (1 - (batch["returns"] - batch["values"]).var() / var_y).item() if var_y > 0 else float("nan")}


def checkpoint_state(agent, optimizer, iteration: int, horizon: int, generator) -> dict:
    return {"iteration": iteration, "schedule_steps": horizon, "agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": rng_state(torch=torch.default_generator, minibatch=generator)}


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    batch_size = args.num_envs * args.num_steps
    positive = {"num-envs": args.num_envs, "num-steps": args.num_steps, "num-minibatches": args.num_minibatches,
                "update-epochs": args.update_epochs, "learning-rate": args.learning_rate, "clip-coef": args.clip_coef,
                "max-episode-frames": args.max_episode_frames, "max-grad-norm": args.max_grad_norm, "frame-stack": args.frame_stack}
    check_args(args, [
        *[(value > 0, f"--{name} must be positive, got {value}") for name, value in positive.items()],
        *[(0 <= value <= 1, f"--{name} must be in [0, 1], got {value}") for name, value in {"gamma": args.gamma, "gae-lambda": args.gae_lambda}.items()],
        (batch_size % max(args.num_minibatches, 1) == 0, f"num_envs * num_steps = {batch_size} is not divisible by --num-minibatches {args.num_minibatches}; choose a divisor"),
        (args.eval_only or args.total_steps >= batch_size, f"--total-steps {args.total_steps} is less than one rollout (num_envs * num_steps = {batch_size}); raise it"),
    ])
    if args.eval_only:
        return eval_only(args)
    game, sticky = atari_protocol(args.env_id)
    device = pick_device(args.device)
    seed_everything(args.seed, args.torch_deterministic)
    ckpt = resume_checkpoint(args, same=("num_envs", "num_steps", "frame_stack", "protocol")) if args.resume else None
    num_iterations = args.total_steps // batch_size
    horizon = args.schedule_steps if args.schedule_steps is not None else ckpt["schedule_steps"] if ckpt else num_iterations * batch_size
    if args.anneal_lr and horizon < num_iterations * batch_size:
        raise fail(f"--total-steps {args.total_steps} runs past the learning-rate anneal, which reaches 0 at step {horizon} "
                   f"({'set by --schedule-steps' if args.schedule_steps is not None else 'the schedule of the checkpoint'}); "
                   f"pass --schedule-steps {num_iterations * batch_size} (or more) to re-plan it, or --no-anneal-lr")

    protocol = resolve_protocol(args.protocol, args.env_id)
    atari = dict(game=game, sticky=sticky, max_frames=args.max_episode_frames, frame_stack=args.frame_stack, baselines=protocol == "baselines")
    envs = make_envs(args.num_envs, **atari)
    agent = Agent(int(envs.single_action_space.n), args.frame_stack).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    generator = torch.Generator().manual_seed(args.seed)  # minibatch order
    global_step, iteration = (ckpt["global_step"], ckpt["iteration"]) if ckpt else (0, 0)
    if ckpt:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        set_rng_state(ckpt["rng"], torch=torch.default_generator, minibatch=generator)
    T, N = args.num_steps, args.num_envs
    obs = torch.zeros((T, N, args.frame_stack, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros((T, N), dtype=torch.long, device=device)
    logprobs, values, trunc_values = (torch.zeros((T, N), device=device) for _ in range(3))
    # rewards and flags are born in numpy: kept on the host, moved once per rollout, not 3 copies a step
    rewards_np, terminals_np, truncations_np, acted_np = (np.zeros((T, N), np.float32) for _ in range(4))
    obs_np, info = envs.reset(seed=args.seed + global_step)  # fresh games after a resume
    next_obs, lives, forced = torch.from_numpy(obs_np).to(device), info["lives"], np.zeros(N, dtype=bool)
    score, length = np.zeros(N), np.zeros(N, dtype=np.int64)
    eval_returns, eval_capped, eval_step = [], 0, -1
    stop = StopSignal()
    with RunLogger(args, run_dir_for(args, args.resume), global_step, resumed=ckpt is not None,
                   resolved_device=str(device), game=game, repeat_action_probability=sticky, protocol=protocol) as log:
        while iteration < num_iterations and not stop:
            iteration += 1
            lr = args.learning_rate * (1.0 - global_step / horizon) if args.anneal_lr else args.learning_rate  # detail 6
            optimizer.param_groups[0]["lr"] = lr
            with torch.inference_mode():
                for t in range(T):
                    obs[t] = next_obs
                    logits, values[t] = agent(next_obs)
                    # NaN weights are caught after the update; validation here would cost a sync per step
                    dist = Categorical(logits=logits, validate_args=False)
                    action = dist.sample()
                    if forced.any():  # detail 3: FIRE after a lost life, not the policy's choice
                        action[torch.from_numpy(forced).to(device)] = envs.fire
                    actions[t], logprobs[t], acted_np[t] = action, dist.log_prob(action), ~forced
                    obs_np, reward, term, trunc, info = envs.step(action.cpu().numpy())
                    global_step += N
                    terminal, cut, lost, trunc_values[t] = step_targets(agent, term, trunc, info, lives, atari["baselines"], device)
                    lives, forced = info["lives"], lost & (envs.fire is not None)
                    rewards_np[t], terminals_np[t], truncations_np[t] = np.sign(reward), terminal, cut  # clipped (Mnih 2015)
                    next_obs = torch.from_numpy(obs_np).to(device)
                    score, length = score + reward, length + 1
                    for i in np.flatnonzero(term | trunc):
                        log.episode(global_step, score[i], length[i])
                        score[i], length[i] = 0.0, 0
                next_value = agent(next_obs)[1]
                rewards, terminals, truncations = (torch.from_numpy(x).to(device) for x in (rewards_np, terminals_np, truncations_np))
                advantages, returns = gae(rewards, values, next_value, terminals, truncations, trunc_values, args.gamma, args.gae_lambda)

            batch = {"obs": obs.reshape(-1, args.frame_stack, 84, 84), "actions": actions.reshape(-1), "logprobs": logprobs.reshape(-1),
                     "advantages": advantages.reshape(-1), "returns": returns.reshape(-1), "values": values.reshape(-1),
                     "acted": torch.from_numpy(acted_np).to(device).reshape(-1)}
            losses = update(agent, optimizer, batch, generator, args)
            log.check_finite(losses.pop("loss"), global_step)
            log.scalars(global_step, {"charts/learning_rate": lr, "charts/SPS": log.sps(global_step), **losses})
            if stop:  # save right away: no evaluation, no periodic checkpoint
                break
            if every(global_step, global_step - batch_size, args.eval_interval):
                returns_now, capped_now = evaluate(agent, atari, args.eval_episodes, args.seed + 10_000, device, stop)
                if not stop:  # a signal cuts the evaluation short: its scores are incomplete
                    eval_returns, eval_capped, eval_step = returns_now, capped_now, global_step
                    log.scalars(global_step, {"eval/episodic_return": np.mean(eval_returns), "eval/capped_games": eval_capped})
            if every(global_step, global_step - batch_size, args.checkpoint_interval) and iteration < num_iterations:
                save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizer, iteration, horizon, generator))
            log.progress(global_step, num_iterations * batch_size)
        envs.close()
        # final or interrupted: saved before the final evaluation, which a signal may cut short
        save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(agent, optimizer, iteration, horizon, generator))
        if eval_step != global_step and not stop:
            returns_now, capped_now = evaluate(agent, atari, args.eval_episodes, args.seed + 10_000, device, stop)
            if not stop:
                eval_returns, eval_capped = returns_now, capped_now
                log.scalars(global_step, {"eval/episodic_return": np.mean(eval_returns), "eval/capped_games": eval_capped})
        if args.capture_video and not stop:
            record_video(agent, atari, log.run_dir / "videos", args.seed + 20_000, device)
        if stop:
            return log.interrupted(global_step)
        log.summary(global_step, eval_returns, eval_capped_games=eval_capped, game=game, repeat_action_probability=sticky, protocol=protocol)


# ---------------------------------------------------------------- evaluation
def evaluate(agent: Agent, atari: dict, episodes: int, seed: int, device, stop=None) -> tuple[list[float], int]:
    """Unclipped scores of `episodes` full games of the sampled policy, game i seeded seed + i, and how
    many hit the frame limit (detail 8); cut short (scores incomplete) once `stop` is true (a signal)."""
    envs = make_envs(episodes, **atari)
    obs, info = envs.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    scores, finished, capped = np.zeros(episodes), np.zeros(episodes, dtype=bool), np.zeros(episodes, dtype=bool)
    forced = np.zeros(episodes, dtype=bool)
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
    return scores.tolist(), int(capped.sum())


def record_video(agent: Agent, atari: dict, video_dir: Path, seed: int, device) -> float:
    """One game of the sampled policy rendered to mp4 (AtariVectorEnv cannot render). Frames are
    stacked as the vector env stacks them: zero padding, the first real frame the one after FIRE."""
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
    while not done:
        stack = np.concatenate([stack[:, 1:], frame[None, None]], axis=1)
        action, lives = int(sample_actions(agent, stack, device, generator)[0]), info["lives"]
        frame, reward, term, trunc, info = env.step(fire if forced else action)
        score, done = score + float(reward), term or trunc
        forced = fire is not None and info["lives"] < lives and not done
    env.close()
    return score


def eval_only(args: Args) -> None:
    """Evaluate --checkpoint with its own env, seed, frame limit, frame stack and protocol: it repeats the run's final evaluation."""
    ckpt, device = load_checkpoint(args.checkpoint), pick_device(args.device)
    run = {"frame_stack": 4, "protocol": "auto", **ckpt["args"]}  # checkpoints written before these flags existed
    game, sticky = atari_protocol(ckpt["env_id"])
    atari = dict(game=game, sticky=sticky, max_frames=run["max_episode_frames"], frame_stack=run["frame_stack"],
                 baselines=resolve_protocol(run["protocol"], ckpt["env_id"]) == "baselines")
    agent = Agent(ckpt["agent"]["actor.weight"].shape[0], run["frame_stack"]).to(device, memory_format=torch.channels_last)
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
