"""Phasic Policy Gradient (PPG) for discrete actions and flat observations.

Paper: Karl Cobbe, Jacob Hilton, Oleg Klimov, John Schulman, "Phasic Policy
Gradient", 2021, arXiv:2009.04416. Reference code: openai/phasic-policy-gradient;
peer: CleanRL ppg_procgen.py.

Idea. PPO trains policy and value function together, either in one network (the
value gradient disturbs the policy's features) or in two (the policy never
benefits from value learning). PPG alternates two phases. In the *policy phase*
it runs N_pi ordinary PPO iterations, keeping policy and value training apart.
In the *auxiliary phase* it goes E_aux times over every sample stored during
those N_pi iterations, distilling value knowledge into the policy network through
an auxiliary value head while a behavioural-cloning KL term keeps the policy
where it was. The policy's features thus learn from value targets, and the
value function gets many more epochs of sample reuse than the policy.

Equations (one state s, advantage A_hat from GAE, r = pi(a|s) / pi_old(a|s)):
    policy phase, E_pi epochs:  L_clip = -E[min(r A_hat, clip(r, 1-eps, 1+eps) A_hat)] - c_ent H[pi]
    policy phase, E_V epochs:   L_value = c_vf * 0.5 E[(V(s) - V_targ)^2]
    auxiliary phase, E_aux epochs over all stored samples:
        L_joint = 0.5 E[(V_aux(s) - V_targ)^2] + beta_clone E[KL(pi_old(.|s) || pi(.|s))]
        L_value = 0.5 E[(V(s) - V_targ)^2]        (trained in the same step)
    V_targ = A_hat + V_old, the GAE(lambda) return computed when the rollout was
    collected; pi_old is the policy just before the auxiliary phase, computed once.

Implementation details:
 1. Architectures (--arch). `dual` (the reference default): a policy network
    (trunk + policy head + auxiliary value head) and a separate value network.
    `shared`: one trunk carrying policy, value and auxiliary value heads; the
    value head reads the trunk's features detached (the reference's "detach"),
    so value training never reaches the trunk; the trunk learns value only
    through the auxiliary head in the auxiliary phase, as in the paper.
 2. Policy phase: max(E_pi, E_V) epochs of minibatches with one optimizer;
    epoch i adds the policy loss if i < E_pi and the value loss if i < E_V.
    With E_pi = E_V (the reference's and our defaults) this is the reference's
    `ppo.learn`; when they differ the reference runs the E_V value epochs first
    with a third optimizer. Advantages are normalised over the whole batch.
 3. Auxiliary phase after every N_pi policy iterations, with pi_old's logits
    computed once for all stored states before the first epoch; minibatches are
    drawn from all stored samples (--aux-num-minibatches).
 4. Separate Adam optimizers (eps 1e-5) for the policy and auxiliary phases, as
    in the reference; both, the phase counter and the samples stored for the
    next auxiliary phase are checkpointed, so a resume mid-phase continues it.
 5. Gymnasium semantics: vector envs autoreset in the NEXT_STEP mode; the step
    after a done is masked out of every loss and statistic (`valid`). GAE uses
    V(s_{t+1}) on truncation (under NEXT_STEP, s_{t+1} is the real final
    observation) and 0 on termination.
 6. Orthogonal init (sqrt 2 body, 0.01 policy head, 1 value heads), tanh MLPs,
    optional linear LR annealing (both optimizers). --norm-reward divides
    rewards by the running std of the discounted return and clips them to +-10,
    as the reference's RewardNormalizer (statistics in the checkpoint).
 7. Evaluation: greedy (argmax) policy on a separate env, episode i seeded with
    seed + 10000 + i. SIGINT/SIGTERM skip any evaluation still to come, save a
    checkpoint and exit 0 without summary.json (summary.json always means a
    finished run); a second signal kills the process at once.
 8. Resume restores the vectorised env's numpy state (classic control's
    vector_entry_point envs keep it in arrays), so a resumed run continues the
    same episodes and gives the same metrics as an uninterrupted one. Envs that
    fall back to SyncVectorEnv (e.g. Box2D) are reset at resume instead.

Deviations from the Procgen reference (N_pi 32, E_pi 1, E_V 1, E_aux 6,
beta_clone 1, lr 5e-4, gamma 0.999, lambda 0.95, 64 envs x 256 steps), chosen so
that CartPole-v1 is solved in about 50k steps, all tested on CartPole:
 a. small batches (8 envs x 32 steps) and N_pi 8, so an auxiliary phase comes
    every 2,048 steps instead of every 524k;
 b. E_pi = E_V = 10 and lr 1e-3 annealed: one epoch per batch learns too
    slowly for a 50k-step budget (the RL Zoo PPO preset uses 20 epochs);
 c. gamma 0.98, lambda 0.8, no entropy bonus (RL Zoo's tuned CartPole values);
 d. --no-norm-reward by default: CartPole's reward is a constant 1 and the
    rescaling made one of two test seeds unstable late; use --norm-reward for
    LunarLander-like rewards (without it LunarLander did not learn in 300k);
 e. gradient-norm clipping (0.5, CleanRL; the reference has none), applied to
    the policy side and the value side separately: one joint norm let the
    large value gradient shrink the policy's steps to nothing on LunarLander;
 f. unclipped value loss and MLPs instead of IMPALA CNNs (flat observations).
With --e-aux 0 the auxiliary phase is off and the file is plain PPO (separate
policy and value networks with --arch dual): the honest ablation.

Usage: python algos/ppg.py --env-id CartPole-v1 --total-steps 50000 --seed 1
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter

SCRIPT = "ppg.py"


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """Gymnasium id of an environment with discrete actions and flat observations"""
    seed: int = 1
    """seed of python, numpy, torch and the environments"""
    total_steps: int = 50_000
    """environment steps in total (summed over envs)"""
    num_envs: int = 8
    """parallel environments"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto = cuda if available"""
    exp_name: str = "ppg"
    """experiment name, part of the default run directory"""
    run_dir: Optional[str] = None
    """output directory (default runs/<env>__<exp>__<seed>__<time>)"""
    checkpoint_interval: int = 25_000
    """env steps between checkpoints (0: only at the end)"""
    resume: Optional[str] = None
    """checkpoint to continue from"""
    eval_episodes: int = 10
    """greedy evaluation episodes"""
    eval_interval: int = 10_000
    """env steps between evaluations (0: only at the end)"""
    eval_only: bool = False
    """evaluate --checkpoint and exit"""
    checkpoint: Optional[str] = None
    """checkpoint for --eval-only"""
    capture_video: bool = False
    """record the final evaluation episodes into <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "rl-training"
    """W&B project"""

    # PPO (policy phase)
    num_steps: int = 32
    """steps per env per rollout"""
    learning_rate: float = 1e-3
    """Adam learning rate of the policy phase"""
    anneal_lr: bool = True
    """anneal both learning rates linearly to 0"""
    gamma: float = 0.98
    """discount"""
    gae_lambda: float = 0.8
    """GAE lambda"""
    num_minibatches: int = 4
    """minibatches per policy-phase epoch"""
    clip_coef: float = 0.2
    """PPO ratio clip epsilon"""
    ent_coef: float = 0.0
    """entropy bonus c_ent"""
    vf_coef: float = 0.5
    """value loss weight in the policy phase"""
    max_grad_norm: float = 0.5
    """gradient-norm clip, applied to the policy and value networks separately"""
    norm_reward: bool = False
    """divide rewards by a running std of the discounted return (reference rnorm)"""
    hidden_dim: int = 64
    """width of the two hidden layers"""
    # PPG
    arch: Literal["dual", "shared"] = "dual"
    """dual: separate value network; shared: one trunk, value head detached"""
    n_pi: int = 8
    """N_pi: policy iterations per phase"""
    e_pi: int = 10
    """E_pi: policy epochs per iteration"""
    e_v: int = 10
    """E_V: value epochs per iteration"""
    e_aux: int = 6
    """E_aux: auxiliary epochs per phase (0: no auxiliary phase, i.e. PPO)"""
    beta_clone: float = 1.0
    """weight of KL(pi_old || pi) in the auxiliary phase"""
    aux_learning_rate: float = 1e-3
    """Adam learning rate of the auxiliary phase"""
    aux_num_minibatches: int = 8
    """minibatches per auxiliary epoch (over all N_pi rollouts)"""


def fail(message: str) -> SystemExit:
    return SystemExit(f"{SCRIPT}: error: {message}")


# ---------------------------------------------------------------- environment
def check_env(env_id: str) -> tuple[int, int]:
    """Observation size and action count, or a one-line refusal."""
    try:
        env = gym.make(env_id)
    except gym.error.Error as e:
        hint = "Atari ids belong to ppo_atari.py" if env_id.startswith("ALE/") else "check the id (e.g. CartPole-v1)"
        raise fail(f"unknown environment {env_id!r} ({e}); {hint}") from None
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) >= 2:
        raise fail(f"{env_id} has image observations {obs_space.shape}; use ppo_atari.py")
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        raise fail(f"{env_id} has observation space {obs_space}; ppg.py needs a flat Box")
    if isinstance(act_space, gym.spaces.Box):
        raise fail(f"{env_id} has continuous actions; use d4pg.py, naf.py or rlpd.py")
    if not isinstance(act_space, gym.spaces.Discrete):
        raise fail(f"{env_id} has action space {act_space}; ppg.py needs Discrete actions")
    return int(obs_space.shape[0]), int(act_space.n)


def make_envs(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """Gymnasium's native vector env where one exists (classic control), else sync."""
    try:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    except gym.error.Error:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def env_state(envs: gym.vector.VectorEnv) -> dict:
    """The numpy state (arrays, generators) of a native vector env; {} for a sync one."""
    if isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return {}
    state = {}
    for name, value in vars(envs.unwrapped).items():
        if isinstance(value, np.ndarray):
            state[name] = torch.from_numpy(value.copy())
        elif isinstance(value, np.random.Generator):
            state[name] = "rng:" + json.dumps(value.bit_generator.state)
    return state


def set_env_state(envs: gym.vector.VectorEnv, state: dict) -> None:
    for name, value in state.items():
        if isinstance(value, str):
            rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = json.loads(value[4:])
            value = rng
        else:
            value = value.numpy().copy()
        setattr(envs.unwrapped, name, value)


# ------------------------------------------------------------------- networks
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(obs_dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(layer_init(nn.Linear(obs_dim, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, hidden)), nn.Tanh())


class Agent(nn.Module):
    """Policy trunk with policy and auxiliary value heads; value head on its own
    trunk (`dual`) or on the policy trunk's detached features (`shared`)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int, arch: str):
        super().__init__()
        self.arch = arch
        self.pi_body = mlp(obs_dim, hidden)
        self.pi_head = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.aux_head = layer_init(nn.Linear(hidden, 1), std=1.0)
        self.v_body = mlp(obs_dim, hidden) if arch == "dual" else None
        self.v_head = layer_init(nn.Linear(hidden, 1), std=1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Policy logits, V(s) and V_aux(s)."""
        h = self.pi_body(x)
        # `shared`: the value loss must not shape the policy's features (paper Sec. 3).
        h_v = self.v_body(x) if self.v_body is not None else h.detach()
        return self.pi_head(h), self.v_head(h_v).squeeze(-1), self.aux_head(h).squeeze(-1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.pi_head(self.pi_body(x))


def clip_grads(agent: Agent, max_norm: float) -> None:
    """Clip the policy side (trunk, policy and aux heads) and the value side apart: one
    joint norm would let the large value gradient shrink the policy's step."""
    value_side = [p for n, p in agent.named_parameters() if n.startswith("v_")]
    policy_side = [p for n, p in agent.named_parameters() if not n.startswith("v_")]
    nn.utils.clip_grad_norm_(policy_side, max_norm)
    nn.utils.clip_grad_norm_(value_side, max_norm)


# ------------------------------------------------------------- algorithm math
def gae(rewards, values, next_value, terminated, dones, gamma: float, lam: float) -> torch.Tensor:
    """GAE(lambda) advantages, [T, N]. values[t] = V(s_t); next_value = V(s_T).
    Termination cuts the bootstrap; truncation keeps V(s_{t+1}) (the real final
    observation under NEXT_STEP autoreset); any done cuts the lambda-trace."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        v_next = next_value if t == T - 1 else values[t + 1]
        delta = rewards[t] + gamma * v_next * (1.0 - terminated[t]) - values[t]
        last = delta + gamma * lam * (1.0 - dones[t]) * last
        advantages[t] = last
    return advantages


def discounted_returns(rewards, dones, ret, gamma: float):
    """Running discounted reward sums per env, [T, N]; `ret` carries over rollouts."""
    out = torch.zeros_like(rewards)
    for t in range(rewards.shape[0]):
        ret = rewards[t] + gamma * ret
        out[t] = ret
        ret = ret * (1.0 - dones[t])
    return out, ret


def update_moments(moments: list, x: torch.Tensor) -> list:
    """[count, mean, var] of all x seen so far (parallel variance formula)."""
    count, mean, var = moments
    n, m, v = x.numel(), x.mean().item(), x.var(unbiased=False).item()
    total = count + n
    delta = m - mean
    return [total, mean + delta * n / total, (var * count + v * n + delta**2 * count * n / total) / total]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def categorical_kl(logits_old: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(pi_old || pi) per state."""
    logp_old, logp = F.log_softmax(logits_old, -1), F.log_softmax(logits, -1)
    return (logp_old.exp() * (logp_old - logp)).sum(-1)


def ppo_losses(logits, value, actions, logprob_old, adv, v_targ, valid, clip_coef: float):
    """L_clip, the value loss 0.5 (V - V_targ)^2, entropy, approx KL, clip fraction."""
    dist = Categorical(logits=logits)
    log_ratio = dist.log_prob(actions) - logprob_old
    ratio = log_ratio.exp()
    pg = -torch.min(ratio * adv, ratio.clamp(1 - clip_coef, 1 + clip_coef) * adv)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - log_ratio, valid)
        clipfrac = masked_mean(((ratio - 1).abs() > clip_coef).float(), valid)
    return (masked_mean(pg, valid), 0.5 * masked_mean((value - v_targ) ** 2, valid),
            masked_mean(dist.entropy(), valid), approx_kl, clipfrac)


def aux_losses(logits, value, aux_value, logits_old, v_targ, valid):
    """KL(pi_old || pi), 0.5 (V_aux - V_targ)^2 and 0.5 (V - V_targ)^2 (paper Eq. 2-3)."""
    return (masked_mean(categorical_kl(logits_old, logits), valid),
            0.5 * masked_mean((aux_value - v_targ) ** 2, valid),
            0.5 * masked_mean((value - v_targ) ** 2, valid))


def policy_phase(agent: Agent, optimizer, batch: dict, args: Args) -> dict:
    """One PPO iteration: max(E_pi, E_V) epochs; epoch i trains the policy if
    i < E_pi and the value function if i < E_V (reference ppo.learn)."""
    n = batch["obs"].shape[0]
    mb_size = n // args.num_minibatches
    for epoch in range(max(args.e_pi, args.e_v)):
        for mb in torch.randperm(n, device=batch["obs"].device).split(mb_size):
            logits, value, _ = agent(batch["obs"][mb])
            pg, v_loss, entropy, approx_kl, clipfrac = ppo_losses(
                logits, value, batch["actions"][mb], batch["logprobs"][mb], batch["advantages"][mb],
                batch["returns"][mb], batch["valid"][mb], args.clip_coef)
            loss = 0.0
            if epoch < args.e_pi:
                loss = loss + pg - args.ent_coef * entropy
            if epoch < args.e_v:
                loss = loss + args.vf_coef * v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            clip_grads(agent, args.max_grad_norm)
            optimizer.step()
        # Stats of the last minibatch; with E_V > E_pi its policy terms come from a value-only epoch.
        stats = torch.stack([pg, v_loss, entropy, approx_kl, clipfrac]).detach()
    return dict(zip(["policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac"], stats.tolist()))


def auxiliary_phase(agent: Agent, optimizer, obs, v_targ, valid, args: Args) -> dict:
    """E_aux epochs over all stored samples of the phase (paper Alg. 1, lines 10-15)."""
    n = obs.shape[0]
    with torch.no_grad():  # pi_old, computed once before the phase
        logits_old = torch.cat([agent.logits(o) for o in obs.split(4096)])
    mb_size = n // args.aux_num_minibatches
    stats = torch.zeros(3, device=obs.device)
    for _ in range(args.e_aux):
        for mb in torch.randperm(n, device=obs.device).split(mb_size):
            logits, value, aux_value = agent(obs[mb])
            kl, aux_v, v = aux_losses(logits, value, aux_value, logits_old[mb], v_targ[mb], valid[mb])
            optimizer.zero_grad(set_to_none=True)
            (args.beta_clone * kl + aux_v + v).backward()
            clip_grads(agent, args.max_grad_norm)
            optimizer.step()
            stats += torch.stack([kl, aux_v, v]).detach()
    stats /= max(1, args.e_aux * args.aux_num_minibatches)
    return dict(zip(["kl", "aux_value", "value"], stats.tolist()))


# ------------------------------------------------- checkpoints and evaluation
SHAPE_ARGS = ("env_id", "arch", "hidden_dim", "num_envs", "num_steps", "n_pi")


def save_checkpoint(path: str, state: dict) -> None:
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, device) -> dict:
    if not os.path.isfile(path):
        raise fail(f"checkpoint {path} does not exist; pass a checkpoints/latest.pt of a ppg.py run")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise fail(f"checkpoint {path} cannot be read ({type(e).__name__}); it is corrupt or not a torch checkpoint") from None
    if not isinstance(ckpt, dict) or ckpt.get("algo") != "ppg":
        algo = ckpt.get("algo") if isinstance(ckpt, dict) else None
        raise fail(f"checkpoint {path} belongs to {algo or 'another program'}, not ppg; use the matching script")
    return ckpt


def checkpoint_run_dir(path: str) -> str:
    """Run dir of a checkpoint, from where the file lies (a stored path may be relative
    or stale after a move): the parent of its `checkpoints/` folder, else its folder."""
    folder = os.path.dirname(os.path.realpath(path))
    return os.path.dirname(folder) if os.path.basename(folder) == "checkpoints" else folder


def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, device, video_dir: Optional[str] = None) -> list[float]:
    """Greedy (argmax) returns of `episodes` episodes seeded seed + 10000 + i."""
    env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, video_dir, episode_trigger=lambda i: True, name_prefix="eval")
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                logits = agent.logits(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0))
            obs, reward, terminated, truncated, _ = env.step(int(logits.argmax()))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np_state[1].numpy().astype(np.uint32), *np_state[2:]))
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise fail("--device cuda but CUDA is not available; use --device cpu or auto")
    return torch.device("cuda" if name in ("auto", "cuda") and torch.cuda.is_available() else "cpu")


def eval_only(args: Args) -> None:
    if not args.checkpoint:
        raise fail("--eval-only needs --checkpoint PATH")
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint, device)
    c = ckpt["args"]
    obs_dim, n_actions = check_env(c["env_id"])
    agent = Agent(obs_dim, n_actions, c["hidden_dim"], c["arch"]).to(device)
    agent.load_state_dict(ckpt["agent"])
    run_dir = args.run_dir or checkpoint_run_dir(args.checkpoint)
    os.makedirs(run_dir, exist_ok=True)
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    returns = evaluate(agent, c["env_id"], args.eval_episodes, c["seed"], device, video_dir)
    result = {"script": SCRIPT, "algo": "ppg", "env_id": c["env_id"], "checkpoint": os.path.abspath(args.checkpoint),
              "global_step": ckpt["global_step"], "eval_mean": float(np.mean(returns)),
              "eval_std": float(np.std(returns)), "eval_episodes": len(returns), "eval_returns": returns}
    write_json(os.path.join(run_dir, "eval.json"), result)
    print(f"eval {c['env_id']} step {ckpt['global_step']:,}: {result['eval_mean']:.1f} +- {result['eval_std']:.1f} "
          f"over {len(returns)} episodes -> {os.path.join(run_dir, 'eval.json')}")


def check_args(args: Args) -> None:
    batch = args.num_envs * args.num_steps
    for name in ("num_envs", "num_steps", "num_minibatches", "aux_num_minibatches", "n_pi", "e_pi", "eval_episodes", "hidden_dim"):
        if getattr(args, name) < 1:
            raise fail(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("e_v", "e_aux", "total_steps", "eval_interval", "checkpoint_interval"):
        if getattr(args, name) < 0:
            raise fail(f"--{name.replace('_', '-')} must not be negative")
    if batch % args.num_minibatches:
        raise fail(f"--num-minibatches {args.num_minibatches} does not divide num-envs x num-steps = {batch}; pick a divisor")
    if args.e_aux and (args.n_pi * batch) % args.aux_num_minibatches:
        raise fail(f"--aux-num-minibatches {args.aux_num_minibatches} does not divide n-pi x num-envs x num-steps = "
                   f"{args.n_pi * batch}; pick a divisor")
    if not args.resume and not args.eval_only and args.total_steps < batch:
        raise fail(f"--total-steps {args.total_steps} is below one rollout (num-envs x num-steps = {batch}); raise it")


# --------------------------------------------------------------------- train
def train(args: Args) -> None:
    process_start = time.time()
    check_args(args)
    if args.eval_only:
        return eval_only(args)
    device = resolve_device(args.device)
    obs_dim, n_actions = check_env(args.env_id)
    ckpt = load_checkpoint(args.resume, device) if args.resume else None
    if ckpt is not None:
        for name in SHAPE_ARGS + ("e_aux",):
            old, new = ckpt["args"][name], getattr(args, name)
            if (old != new) if name != "e_aux" else (bool(old) != bool(new)):
                raise fail(f"checkpoint has --{name.replace('_', '-')} {old} but this run {new}; pass the checkpoint's value")
        if args.total_steps < ckpt["global_step"]:
            raise fail(f"--total-steps {args.total_steps:,} is below the checkpoint's step {ckpt['global_step']:,}; "
                       f"pass at least {ckpt['global_step']}")
    if args.track:
        try:
            import wandb
        except ImportError:
            raise fail("--track needs the wandb package; pip install wandb or drop --track") from None

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(args.torch_deterministic)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    if ckpt is not None:
        run_dir = args.run_dir or checkpoint_run_dir(args.resume)
    else:
        run_dir = args.run_dir or f"runs/{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    ckpt_path = os.path.join(run_dir, "checkpoints", "latest.pt")
    write_json(os.path.join(run_dir, "config.json"), asdict(args))

    envs = make_envs(args.env_id, args.num_envs)
    agent = Agent(obs_dim, n_actions, args.hidden_dim, args.arch).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    aux_optimizer = torch.optim.Adam(agent.parameters(), lr=args.aux_learning_rate, eps=1e-5)

    T, N = args.num_steps, args.num_envs
    batch_size = T * N
    obs = torch.zeros((T, N, obs_dim), device=device)
    actions = torch.zeros((T, N), dtype=torch.long, device=device)
    logprobs, rewards, values = (torch.zeros((T, N), device=device) for _ in range(3))
    terminated, dones, valid = (torch.zeros((T, N), device=device) for _ in range(3))
    # Samples kept for the auxiliary phase: states, V_targ and the valid mask of N_pi rollouts.
    n_store = args.n_pi if args.e_aux else 0
    aux_obs = torch.zeros((n_store, batch_size, obs_dim), device=device)
    aux_vtarg, aux_valid = torch.zeros((n_store, batch_size), device=device), torch.zeros((n_store, batch_size), device=device)

    global_step, iteration, phase_iteration, aux_phases = 0, 0, 0, 0
    reward_moments, reward_ret = [0, 0.0, 1.0], torch.zeros(N, device=device)
    train_time, aux_time = 0.0, 0.0
    recent_returns: deque = deque(maxlen=10)
    episode_return, episode_length = np.zeros(N), np.zeros(N, dtype=np.int64)
    next_obs_np, _ = envs.reset(seed=args.seed)
    next_autoreset = np.zeros(N, dtype=bool)  # NEXT_STEP: the coming step only resets these envs
    if ckpt is not None:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        aux_optimizer.load_state_dict(ckpt["aux_optimizer"])
        global_step, iteration = ckpt["global_step"], ckpt["iteration"]
        phase_iteration, aux_phases = ckpt["phase_iteration"], ckpt["aux_phases"]
        train_time, aux_time = ckpt["train_time_s"], ckpt["aux_time_s"]
        recent_returns.extend(ckpt["recent_returns"])
        if phase_iteration:
            aux_obs[:phase_iteration] = ckpt["aux_obs"]
            aux_vtarg[:phase_iteration] = ckpt["aux_vtarg"]
            aux_valid[:phase_iteration] = ckpt["aux_valid"]
        if ckpt["env_state"] and env_state(envs):  # same episodes continue (detail 8)
            set_env_state(envs, ckpt["env_state"])
            next_obs_np = ckpt["next_obs"].numpy()
            next_autoreset = ckpt["next_autoreset"].numpy().copy()
            episode_return = ckpt["episode_return"].numpy().copy()
            episode_length = ckpt["episode_length"].numpy().copy()
        else:
            next_obs_np, _ = envs.reset(seed=args.seed + iteration)
        reward_moments, reward_ret = ckpt["reward_moments"], ckpt["reward_ret"].to(device)
        set_rng_state(ckpt["rng"])
    next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)

    if args.track:  # before the SummaryWriter: sync_tensorboard only sees writers opened later
        wandb.init(project=args.wandb_project_name, config=asdict(args), sync_tensorboard=True, dir=run_dir,
                   name=os.path.basename(run_dir), mode=os.environ.get("WANDB_MODE", "online"))
    # Points at global_step were logged before that checkpoint was saved: purge only later ones.
    writer = SummaryWriter(run_dir, purge_step=global_step + 1 if ckpt is not None else None)
    if ckpt is None:
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))

    def close(exit_code: int = 0) -> None:  # every exit path after wandb.init
        writer.close()
        envs.close()
        if args.track:
            wandb.finish(exit_code=exit_code)

    def checkpoint_state() -> dict:
        return {"algo": "ppg", "env_id": args.env_id, "args": asdict(args), "run_dir": os.path.abspath(run_dir),
                "global_step": global_step, "iteration": iteration, "phase_iteration": phase_iteration,
                "aux_phases": aux_phases, "agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
                "aux_optimizer": aux_optimizer.state_dict(), "aux_obs": aux_obs[:phase_iteration].cpu(),
                "aux_vtarg": aux_vtarg[:phase_iteration].cpu(), "aux_valid": aux_valid[:phase_iteration].cpu(),
                "env_state": env_state(envs), "next_obs": next_obs.cpu(),
                "next_autoreset": torch.from_numpy(next_autoreset.copy()),
                "episode_return": torch.from_numpy(episode_return.copy()),
                "episode_length": torch.from_numpy(episode_length.copy()),
                "recent_returns": list(recent_returns), "train_time_s": train_time, "aux_time_s": aux_time,
                "reward_moments": reward_moments, "reward_ret": reward_ret.cpu(), "rng": rng_state()}

    stop = {"signal": None}

    def on_signal(signum, frame):
        stop.update(signal=signum)
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal kills at once
            signal.signal(sig, signal.SIG_DFL)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    num_iterations = args.total_steps // batch_size
    start_time, start_step, last_print = time.time(), global_step, 0.0
    while iteration < num_iterations and not stop["signal"]:
        iteration += 1
        t_iter = time.time()
        frac = 1.0 - (iteration - 1) / num_iterations if args.anneal_lr else 1.0
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        aux_optimizer.param_groups[0]["lr"] = frac * args.aux_learning_rate

        for step in range(T):
            obs[step] = next_obs
            valid[step] = torch.as_tensor(~next_autoreset, dtype=torch.float32, device=device)
            with torch.inference_mode():
                logits, value, _ = agent(next_obs)
                dist = Categorical(logits=logits)
                action = dist.sample()
                logprobs[step], values[step], actions[step] = dist.log_prob(action), value, action
            next_obs_np, reward, term, trunc, _ = envs.step(action.cpu().numpy())
            done = term | trunc
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            terminated[step] = torch.as_tensor(term, dtype=torch.float32, device=device)
            dones[step] = torch.as_tensor(done, dtype=torch.float32, device=device)
            next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
            real = ~next_autoreset
            episode_return += np.where(real, reward, 0.0)
            episode_length += real
            for i in np.flatnonzero(done & real):
                recent_returns.append(float(episode_return[i]))
                writer.add_scalar("charts/episodic_return", episode_return[i], global_step + (step + 1) * N)
                writer.add_scalar("charts/episodic_length", episode_length[i], global_step + (step + 1) * N)
            episode_return[done], episode_length[done] = 0.0, 0
            next_autoreset = done
        global_step += batch_size

        with torch.no_grad():
            next_value = agent(next_obs)[1]
            r = rewards
            if args.norm_reward:  # reference RewardNormalizer: r / std(discounted return), clipped to 10
                ret, reward_ret = discounted_returns(rewards, dones, reward_ret, args.gamma)
                reward_moments = update_moments(reward_moments, ret[valid.bool()])
                r = (rewards / np.sqrt(reward_moments[2] + 1e-8)).clamp(-10.0, 10.0)
            advantages = gae(r, values, next_value, terminated, dones, args.gamma, args.gae_lambda)
            returns = advantages + values  # V_targ
            w = valid.flatten()
            adv = advantages.flatten()
            mean = masked_mean(adv, w)
            std = masked_mean((adv - mean) ** 2, w).sqrt()
            batch = {"obs": obs.reshape(batch_size, obs_dim), "actions": actions.flatten(),
                     "logprobs": logprobs.flatten(), "advantages": (adv - mean) / (std + 1e-8),
                     "returns": returns.flatten(), "valid": w}
        stats = policy_phase(agent, optimizer, batch, args)
        if args.e_aux:
            aux_obs[phase_iteration] = batch["obs"]
            aux_vtarg[phase_iteration], aux_valid[phase_iteration] = batch["returns"], w
            phase_iteration += 1
        aux_stats = None
        if args.e_aux and phase_iteration == args.n_pi:
            t_aux = time.time()
            aux_stats = auxiliary_phase(agent, aux_optimizer, aux_obs.reshape(-1, obs_dim), aux_vtarg.flatten(),
                                        aux_valid.flatten(), args)
            phase_iteration, aux_phases = 0, aux_phases + 1
            aux_time += time.time() - t_aux
        train_time += time.time() - t_iter

        all_stats = list(stats.values()) + (list(aux_stats.values()) if aux_stats else [])
        if not all(np.isfinite(all_stats)):
            close(exit_code=1)
            raise fail(f"non-finite loss at step {global_step}; the last good checkpoint is kept; lower --learning-rate")
        with torch.no_grad():
            var_y = masked_mean((batch["returns"] - masked_mean(batch["returns"], w)) ** 2, w)
            resid = batch["returns"] - values.flatten()
            explained_var = 1 - masked_mean((resid - masked_mean(resid, w)) ** 2, w) / var_y if var_y > 0 else torch.tensor(float("nan"))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("charts/aux_learning_rate", aux_optimizer.param_groups[0]["lr"], global_step)
        for k, v in stats.items():
            writer.add_scalar(f"losses/{k}", v, global_step)
        writer.add_scalar("losses/explained_variance", float(explained_var), global_step)
        if aux_stats:
            for k, v in aux_stats.items():
                writer.add_scalar(f"losses/aux/{k}", v, global_step)
        writer.add_scalar("charts/aux_phase_time_fraction", aux_time / max(train_time, 1e-9), global_step)
        sps = int((global_step - start_step) / max(time.time() - start_time, 1e-9))
        writer.add_scalar("charts/SPS", sps, global_step)

        if stop["signal"]:  # skip any evaluation still to come; saved right after the loop
            break
        if args.eval_interval and iteration < num_iterations and global_step // args.eval_interval > (global_step - batch_size) // args.eval_interval:
            eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed, device)
            writer.add_scalar("eval/episodic_return", float(np.mean(eval_returns)), global_step)
        if args.checkpoint_interval and iteration < num_iterations and global_step // args.checkpoint_interval > (global_step - batch_size) // args.checkpoint_interval:
            save_checkpoint(ckpt_path, checkpoint_state())
        if time.time() - last_print > 5 or iteration == num_iterations:
            last_print = time.time()
            ret = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            eta = (args.total_steps - global_step) / max(sps, 1)
            print(f"step {global_step:,}/{args.total_steps:,} | {sps:,} SPS | return {ret} | "
                  f"aux {aux_time / max(train_time, 1e-9):.0%} | eta {eta / 60:.1f}m", flush=True)

    sps = (global_step - start_step) / max(time.time() - start_time, 1e-9)  # the training loop only
    save_checkpoint(ckpt_path, checkpoint_state())
    if stop["signal"]:
        print(f"signal {stop['signal']}: checkpoint saved at step {global_step:,} -> {ckpt_path}", flush=True)
        return close()
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed, device, video_dir)
    writer.add_scalar("eval/episodic_return", float(np.mean(eval_returns)), global_step)
    wall = time.time() - process_start  # the whole process: startup, training, final checkpoint and eval
    write_json(os.path.join(run_dir, "summary.json"), {
        "script": SCRIPT, "algo": "ppg", "env_id": args.env_id, "seed": args.seed, "arch": args.arch,
        "global_step": global_step, "eval_mean": float(np.mean(eval_returns)), "eval_std": float(np.std(eval_returns)),
        "eval_episodes": len(eval_returns), "eval_returns": eval_returns, "wall_time_s": wall,
        "sps": sps, "aux_phases": aux_phases,
        "aux_phase_time_fraction": aux_time / max(train_time, 1e-9),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    print(f"done: step {global_step:,} | eval {np.mean(eval_returns):.1f} +- {np.std(eval_returns):.1f} | {run_dir}")
    close()


if __name__ == "__main__":
    train(tyro.cli(Args))
