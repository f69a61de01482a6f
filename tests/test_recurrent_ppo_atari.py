"""Tests of algos/recurrent_ppo_atari.py.

The property that makes recurrent PPO correct: replaying a stored rollout through the training
path gives the log-probabilities and values recorded while acting, with whole-rollout sequences
and with --seq-len chunks, with episode starts (game over, life loss, time limit) inside chunks;
the acting path against an independent per-env, per-step loop (including V(final observation) on
truncation); a reset at an episode start equals a fresh sequence from there, with one nn.LSTM call
per span, and the span-wise replay equals the file's per-step reference (Agent.memory_per_step,
CleanRL's get_states). A scripted fake of AtariVectorEnv (SameStep autoreset) drives these and the in-process
runs: resume equivalence (same weights and metrics as the uninterrupted run), the non-finite-loss
stop, evaluation (capped games, its own RNG). The life/FIRE protocols: FIRE forced after a lost life
under baselines (masked out of every policy term: surrogate, entropy, advantage statistics, approx
KL, clip fraction; in evaluation; on the real game), neither under machado; with a frame stack, a
lost life clears the stack as it clears the memory (rollout, bootstrap, evaluation, video). Tiny
runs on the real emulator by subprocess: outputs, determinism with a different-seed control,
copy-alone on a v5 id with --frame-stack 4, eval-only with video. Every bad-input message. (The
CUDA run is in tests/test_cuda.py.)
"""

from __future__ import annotations

import copy
import importlib.util
import json
import signal
import sys
from dataclasses import asdict
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    ALGOS,
    check_error,
    check_eval_only_after_move,
    check_ok,
    copy_alone,
    run_script,
    scalars,
    summary,
)
from torch.distributions import Categorical

SCRIPT = "recurrent_ppo_atari.py"
TINY = (
    "--num-envs",
    "2",
    "--num-steps",
    "32",
    "--seq-len",
    "8",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--eval-episodes",
    "1",
    "--max-episode-frames",
    "2000",
    "--hidden-dim",
    "32",
)

spec = importlib.util.spec_from_file_location("recurrent_ppo_atari", ALGOS / SCRIPT)
rppo = importlib.util.module_from_spec(spec)
sys.modules["recurrent_ppo_atari"] = rppo  # dataclasses resolve string annotations through it
spec.loader.exec_module(rppo)


# ------------------------------------------------------------------ a scripted AtariVectorEnv
class FakeAtari:
    """AtariVectorEnv's interface with SameStep autoreset. Frames are pseudo-random functions of
    (clock, env, whether it is an ended game's last frame), so a restart at the same clock shows
    the same frames; `events(c, i)` names what ends with env i's step from clock c:
    "life" (a life lost, the game goes on), "over" (game over) or "cut" (time limit)."""

    def __init__(
        self, num_envs, frame_stack, events, clock=lambda seed: 0, sigterm_at=None, fire=1
    ):
        self.num_envs, self.frame_stack, self.events, self.clock = (
            num_envs,
            frame_stack,
            events,
            clock,
        )
        self.single_action_space, self.fire = gym.spaces.Discrete(4), fire
        self.sigterm_at, self.calls, self.finals, self.taken = sigterm_at, 0, {}, []

    def frames(self, final=0):
        return np.stack(
            [
                np.random.default_rng([self.c, i, final]).integers(
                    0, 256, (self.frame_stack, 84, 84), dtype=np.uint8
                )
                for i in range(self.num_envs)
            ]
        )

    def reset(self, seed):
        self.c, self.lives = self.clock(seed), np.full(self.num_envs, 3)
        return self.frames(), {"lives": self.lives.copy()}

    def step(self, actions):
        self.calls += 1
        self.taken.append(np.array(actions))
        if self.calls == self.sigterm_at:
            signal.raise_signal(signal.SIGTERM)
        events = [self.events(self.c, i) for i in range(self.num_envs)]
        self.c += 1
        reward = ((np.asarray(actions) + self.c) % 3 == 0).astype(np.float64)
        term, trunc = (
            np.array([e == "over" for e in events]),
            np.array([e == "cut" for e in events]),
        )
        self.lives -= np.array([e == "life" for e in events])
        info = {}
        if (term | trunc).any():
            info["final_obs"] = self.frames(
                final=1
            )  # the ended games' last frames, before the reset
            self.finals.update(
                {(self.c - 1, i): info["final_obs"][i] for i in np.flatnonzero(term | trunc)}
            )
        self.lives[term | trunc] = 3
        info["lives"] = self.lives.copy()
        return self.frames(), reward, term, trunc, info

    def close(self):
        pass


# env 0: life lost at step 3, time limit at 10, game over at 17; env 1: game over at 5, life lost at 12, time limit at 20
SCRIPTED = {
    (3, 0): "life",
    (10, 0): "cut",
    (17, 0): "over",
    (5, 1): "over",
    (12, 1): "life",
    (20, 1): "cut",
}
AFTER_LIFE = {(4, 0), (13, 1)}  # baselines: episode starts, and FIRE forced there
EXPECTED_STARTS = {(0, 0), (0, 1), (11, 0), (18, 0), (6, 1), (21, 1)} | AFTER_LIFE


class OfflineRun(rppo.Run):
    """The harness's device helpers (host buffers, uploads) on the CPU, without a run folder,
    seeding or signal handlers; finished episodes are not logged."""

    def __init__(self):
        self.args = rppo.Args(device="cpu")
        self.device = torch.device("cpu")

    def episode(self, step, episodic_return, length):
        pass


def scripted_rollout(seq_len, T=24, hidden=16, frame_stack=1, baselines=True):
    torch.manual_seed(0)
    agent = rppo.Agent(4, frame_stack, hidden)
    with torch.no_grad():  # a livelier memory than at init, so a missed reset would show
        agent.lstm.weight_hh_l0.mul_(3.0)
        agent.actor.weight.mul_(100.0)
    fake = FakeAtari(
        2, frame_stack, lambda c, i: SCRIPTED.get((c, i)), fire=1 if baselines else None
    )
    envs = rppo.LifeProtocol(fake, baselines)
    run = OfflineRun()
    ro = rppo.Rollout(T, 2, seq_len, frame_stack, hidden, run)
    ro.restart(run.to_device(envs.reset(seed=0)), agent)
    assert rppo.collect(agent, envs, ro, 0, run) == 2 * T
    return agent, fake, ro


# ------------------------------------------------------------------ acting and replay
def test_acting_matches_a_per_env_per_step_loop():
    agent, envs, ro = scripted_rollout(seq_len=24)
    assert {(t, n) for t, n in zip(*np.nonzero(ro.starts.numpy()))} == EXPECTED_STARTS
    assert ro.terminals[:, 0].nonzero()[:, 0].tolist() == [3, 17]
    assert ro.truncations[:, 0].nonzero()[:, 0].tolist() == [10]
    assert ro.terminals[:, 1].nonzero()[:, 0].tolist() == [5, 12]
    assert ro.truncations[:, 1].nonzero()[:, 0].tolist() == [20]
    with torch.no_grad():
        for n in range(2):  # batch of one env, one step at a time
            h = c = torch.zeros(1, 1, 16)
            for t in range(24):
                if ro.starts[t, n]:
                    h, c = torch.zeros_like(h), torch.zeros_like(c)
                out, (h, c) = agent.lstm(
                    agent.network(ro.obs[t, n][None].float() / 255.0)[None], (h, c)
                )
                logp = agent.actor(out[0, 0]).log_softmax(-1)[ro.actions[t, n]]
                torch.testing.assert_close(logp, ro.logprobs[t, n], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(
                    agent.critic(out[0, 0])[0], ro.values[t, n], rtol=1e-5, atol=1e-5
                )
                if ro.truncations[
                    t, n
                ]:  # V(real final frame), one more step from the episode's own state
                    final = torch.from_numpy(envs.finals[(t, n)])[None].float() / 255.0
                    v_final = agent.critic(agent.lstm(agent.network(final)[None], (h, c))[0][0, 0])[
                        0
                    ]
                    torch.testing.assert_close(ro.trunc_values[t, n], v_final, rtol=1e-5, atol=1e-5)
                else:
                    assert ro.trunc_values[t, n] == 0
            # V after the last step, GAE's bootstrap: one more step (no episode starts there)
            out, _ = agent.lstm(agent.network(ro.next_obs[n][None].float() / 255.0)[None], (h, c))
            v_next = agent.critic(out[0, 0])[0]
            torch.testing.assert_close(ro.next_value[n], v_next, rtol=1e-5, atol=1e-5)
    assert (ro.trunc_values != 0).sum() == 2


@pytest.mark.parametrize("seq_len", [24, 8])
@pytest.mark.parametrize("baselines", [True, False])
def test_replay_through_the_training_path_gives_the_acting_outputs(seq_len, baselines, monkeypatch):
    """`update` with a zero learning rate: every minibatch sees the log-probs and values recorded
    while acting. With 8-step chunks, episode starts fall inside chunks (steps 4, 6, 11, 13, 18, 21;
    under machado not 4 and 13, the lost lives, where baselines also forces FIRE)."""
    agent, _, ro = scripted_rollout(seq_len, baselines=baselines)
    seen, real = [], rppo.ppo_losses

    def spy(**inputs):
        seen.append(
            (
                inputs["logprob"].detach().clone(),
                inputs["old_logprob"],
                inputs["value"].detach().clone(),
                inputs["old_value"],
                inputs["acted"],
            )
        )
        return real(**inputs)

    monkeypatch.setattr(rppo, "ppo_losses", spy)
    args = rppo.Args(num_envs=2, num_steps=24, seq_len=seq_len, num_minibatches=2, update_epochs=2)
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.0)
    zeros = torch.zeros(24, 2)
    step = partial(rppo.ppo_step, agent, optimizer, args=args)
    rppo.update(step, ro, zeros, zeros, args, torch.Generator().manual_seed(0), OfflineRun())
    assert len(seen) == 4 and seen[0][0].shape == (seq_len, 48 // seq_len // 2)
    for new_logprob, old_logprob, new_value, old_value, _ in seen:
        torch.testing.assert_close(new_logprob, old_logprob, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(new_value, old_value, rtol=1e-5, atol=1e-5)
    # the loss gets the acted mask: one epoch's minibatches hold the 2 forced steps (baselines) or none
    assert sum(int((acted == 0).sum()) for *_, acted in seen[:2]) == (2 if baselines else 0)
    # and all sequences at once, against the rollout's own layout
    starts = ro.sequences(ro.starts)
    with torch.no_grad():
        logits, values, _ = agent(
            ro.sequences(ro.obs),
            (ro.h0.flatten(0, 1)[None], ro.c0.flatten(0, 1)[None]),
            starts,
            starts.any(1),
        )
    torch.testing.assert_close(
        Categorical(logits=logits).log_prob(ro.sequences(ro.actions)),
        ro.sequences(ro.logprobs),
        rtol=1e-5,
        atol=1e-5,
    )
    torch.testing.assert_close(values, ro.sequences(ro.values), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("baselines", [True, False])
def test_rollout_forces_fire_after_a_lost_life_and_masks_it(baselines):
    """Baselines: the step after each lost life is FIRE (1), given to the env and recorded as taken, with
    acted = 0 (out of the policy loss) and an episode start; machado: nothing forced, and a lost life is
    neither terminal nor an episode start for the memory."""
    _, envs, ro = scripted_rollout(seq_len=8, baselines=baselines)
    forced = AFTER_LIFE if baselines else set()
    assert {(t, n) for t, n in zip(*np.nonzero((ro.acted == 0).numpy()))} == forced
    assert all(ro.actions[t, n] == 1 and envs.taken[t][n] == 1 for t, n in forced)
    assert {(t, n) for t, n in zip(*np.nonzero(ro.starts.numpy()))} == EXPECTED_STARTS - (
        set() if baselines else AFTER_LIFE
    )
    assert ro.terminals[:, 0].nonzero()[:, 0].tolist() == ([3, 17] if baselines else [17])
    assert ro.terminals[:, 1].nonzero()[:, 0].tolist() == ([5, 12] if baselines else [5])


def test_ppo_losses_leave_forced_steps_out_of_the_policy_loss():
    """ratio 1: the clipped surrogate is -A per step; acted = (1, 0, 1) averages steps 0 and 2 only, and the
    value loss still covers all three."""
    t = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    logp, adv, values, returns = (
        t([-1.0, -2.0, -0.5]),
        t([1.0, 5.0, 2.0]),
        t([0.0, 1.0, 2.0]),
        t([1.0, 1.0, 0.0]),
    )
    inputs = dict(logprob=logp, old_logprob=logp, advantages=adv, value=values, old_value=values)
    inputs |= dict(returns=returns, clip_coef=0.1, clip_vloss=False)
    unmasked = rppo.ppo_losses(**inputs, acted=t([1.0] * 3))
    masked = rppo.ppo_losses(**inputs, acted=t([1.0, 0.0, 1.0]))
    assert unmasked["policy_loss"].item() == pytest.approx(-8.0 / 3)
    assert masked["policy_loss"].item() == pytest.approx(-1.5)
    assert (
        unmasked["value_loss"].item()
        == masked["value_loss"].item()
        == pytest.approx(0.5 * (1 + 0 + 4) / 3)
    )


def test_ppo_losses_leave_forced_steps_out_of_approx_kl_and_clipfrac():
    """Only the forced step 1 moved (ratio e, far outside the clip): with acted = (1, 0, 1) the
    approximate KL (which drives --target-kl) and the clip fraction see no change; unmasked they do."""
    t = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    old, new, zeros = t([-1.0, -2.0, -0.5]), t([-1.0, -1.0, -0.5]), torch.zeros(3)
    inputs = dict(logprob=new, old_logprob=old, advantages=zeros, value=zeros, old_value=zeros)
    inputs |= dict(returns=zeros, clip_coef=0.1, clip_vloss=False)
    masked = rppo.ppo_losses(**inputs, acted=t([1.0, 0.0, 1.0]))
    assert masked["approx_kl"].item() == 0 and masked["clipfrac"].item() == 0
    unmasked = rppo.ppo_losses(**inputs, acted=torch.ones(3))
    assert unmasked["approx_kl"].item() == pytest.approx((np.e - 2) / 3)
    assert unmasked["clipfrac"].item() == pytest.approx(1 / 3)


def minibatch_step(agent, obs, actions, old_logprob, old_value, adv, returns, policy_steps):
    """Reference: one plain gradient step (SGD, lr 1) on the loss of one whole-rollout minibatch,
    with the entropy bonus and the advantage statistics taken over `policy_steps` (bool)."""
    no_starts = torch.zeros(8, 2), torch.zeros(8, dtype=torch.bool)
    logits, value, _ = agent(obs, agent.initial_state(obs.shape[1], "cpu"), *no_starts)
    dist = Categorical(logits=logits)
    chosen = adv[policy_steps]
    adv = (adv - chosen.mean()) / (chosen.std() + 1e-8)
    ratio = (dist.log_prob(actions) - old_logprob).exp()
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.9, 1.1))[~torch.from_numpy(FORCED)].mean()
    v_clipped = old_value + (value - old_value).clamp(-0.1, 0.1)
    v_loss = 0.5 * torch.max((value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    loss = pg - 0.5 * dist.entropy()[policy_steps].mean() + 0.5 * v_loss
    grads = torch.autograd.grad(loss, list(agent.parameters()))
    return [(p - g).detach() for p, g in zip(agent.parameters(), grads)]


FORCED = np.zeros((8, 2), bool)
FORCED[2, 0] = FORCED[5, 1] = True  # two forced FIRE steps (acted = 0)


def test_update_leaves_forced_steps_out_of_entropy_and_advantage_statistics():
    """One minibatch of two whole 8-step sequences, one epoch, SGD with lr 1: the weights move by
    minus the gradient of the loss whose entropy bonus and advantage normalisation cover only the
    policy's steps. The forced steps carry large advantages, so counting them would show."""
    torch.manual_seed(0)
    agent = rppo.Agent(4, 1, 8)
    ro = rppo.Rollout(8, 2, 8, 1, 8, OfflineRun())  # seq_len = T: sequence n is env n, as (T, N)
    ro.obs.copy_(torch.randint(0, 256, ro.obs.shape, dtype=torch.uint8))
    ro.actions.copy_(torch.randint(0, 4, (8, 2)))
    ro.acted[:] = torch.from_numpy(~FORCED)
    with torch.no_grad():
        no_starts = torch.zeros(8, 2), torch.zeros(8, dtype=torch.bool)
        logits, values, _ = agent(ro.obs, agent.initial_state(2, "cpu"), *no_starts)
    ro.logprobs.copy_(Categorical(logits=logits).log_prob(ro.actions) - 0.05 * torch.randn(8, 2))
    ro.values.copy_(values + 0.1 * torch.randn(8, 2))
    adv, returns = torch.randn(8, 2), torch.randn(8, 2)
    adv[torch.from_numpy(FORCED)] = 20.0
    args = rppo.Args(num_envs=2, num_steps=8, seq_len=8, num_minibatches=1, update_epochs=1)
    args.ent_coef, args.max_grad_norm = 0.5, 1e9
    ref_args = (ro.obs, ro.actions, ro.logprobs, ro.values, adv, returns)
    policy_steps = torch.from_numpy(~FORCED)
    expected = minibatch_step(copy.deepcopy(agent), *ref_args, policy_steps)
    unmasked = minibatch_step(copy.deepcopy(agent), *ref_args, torch.ones(8, 2, dtype=torch.bool))
    optimizer = torch.optim.SGD(agent.parameters(), lr=1.0)
    step = partial(rppo.ppo_step, agent, optimizer, args=args)
    rppo.update(step, ro, adv, returns, args, torch.Generator().manual_seed(0), OfflineRun())
    for param, want, other in zip(agent.parameters(), expected, unmasked):
        torch.testing.assert_close(param.detach(), want, rtol=1e-4, atol=1e-6)
    assert max((w - o).abs().max() for w, o in zip(expected, unmasked)) > 1e-3  # it can fail


def test_replay_without_the_resets_would_differ():
    """Control: the same replay with the start flags cleared no longer matches (the test can fail)."""
    agent, _, ro = scripted_rollout(seq_len=8)
    with torch.no_grad():
        _, values, _ = agent(
            ro.sequences(ro.obs),
            (ro.h0.flatten(0, 1)[None], ro.c0.flatten(0, 1)[None]),
            torch.zeros(8, 6),
            torch.zeros(8, dtype=torch.bool),
        )
    assert (values - ro.sequences(ro.values)).abs().max() > 1e-3


@pytest.mark.parametrize("chosen", [0, 1, 2, 7])
def test_normalise_uses_only_the_policy_steps(chosen):
    """Against boolean indexing of the chosen steps; fewer than two are left as they are."""
    advantages = torch.randn(4, 2, generator=torch.Generator().manual_seed(chosen)) * 3 + 1
    acted = (torch.arange(8) < chosen).float().view(4, 2)
    policy = advantages[acted.bool()]
    want = (advantages - policy.mean()) / (policy.std() + 1e-8) if chosen > 1 else advantages
    torch.testing.assert_close(rppo.normalise(advantages, acted), want)


def test_compiled_agent_runs_nn_lstm_eagerly_between_two_graphs():
    """--compile: Dynamo compiles the CNN and the heads and breaks the graph at `memory`, whose
    nn.LSTM runs eagerly, one call per span as without --compile. Outputs and gradients agree, and
    other episode starts (another span pattern) reuse the compiled graphs."""
    torch.manual_seed(0)
    agent = rppo.Agent(4, 1, 8)
    obs = torch.randint(0, 256, (10, 3, 1, 84, 84), dtype=torch.uint8)
    state = (torch.randn(1, 3, 8), torch.randn(1, 3, 8))
    calls = []
    agent.lstm.register_forward_hook(lambda module, inputs, output: calls.append(len(inputs[0])))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(agent)(obs, state, torch.zeros(10, 3), torch.zeros(10) > 0)
    assert explained.graph_count == 2 and explained.graph_break_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(agent, backend="aot_eager")

    def run(forward, starts):
        agent.zero_grad()
        calls.clear()
        logits, values, (h, c) = forward(obs, state, starts, starts.any(1))
        (logits.sum() + values.sum() + h.sum() + c.sum()).backward()
        return (logits, values, h, c), [p.grad.clone() for p in agent.parameters()], calls.copy()

    patterns = []
    for seed in (1, 2):
        starts = (torch.rand(10, 3, generator=torch.Generator().manual_seed(seed)) < 0.3).float()
        eager = run(agent, starts)
        with torch._dynamo.config.patch(error_on_recompile=seed > 1):
            got = run(compiled, starts)
        assert 1 < len(eager[2]) < 10 and got[2] == eager[2]  # the same nn.LSTM calls
        torch.testing.assert_close(got[:2], eager[:2], rtol=1e-5, atol=1e-5)
        patterns.append(eager[2])
    assert patterns[0] != patterns[1]


def test_sequences_layout():
    ro = rppo.Rollout(6, 2, 3, 1, 4, OfflineRun())
    x = torch.arange(12).view(6, 2)  # x[t, n] = 2 t + n
    seqs = ro.sequences(x)  # sequence k = j N + n: env n's steps 3 j .. 3 j + 2
    assert seqs.T.tolist() == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]]


def test_reset_at_start_equals_fresh_sequence_and_one_lstm_call_per_span():
    torch.manual_seed(1)
    agent = rppo.Agent(6, 2, 8)
    with torch.no_grad():
        agent.lstm.weight_hh_l0.mul_(3.0)
    obs = torch.randint(0, 256, (10, 3, 2, 84, 84), dtype=torch.uint8)
    state = (torch.randn(1, 3, 8), torch.randn(1, 3, 8))
    starts = torch.zeros(10, 3)
    starts[0, 0] = starts[3, 1] = starts[3, 2] = starts[6, 0] = 1.0
    calls = []
    agent.lstm.register_forward_hook(
        lambda module, inputs, output: calls.append(inputs[0].shape[0])
    )
    with torch.no_grad():
        logits, values, (h, c) = agent(obs, state, starts, starts.any(1))
        assert calls == [3, 3, 4]  # spans [0, 3), [3, 6), [6, 10): starts at 3 and 6 cut the batch
        # the per-step reference (CleanRL's loop) on the same CNN features
        features = agent.network(obs.flatten(0, 1).float() / 255.0).view(10, 3, -1)
        ref_out, (ref_h, ref_c) = agent.memory_per_step(features, state, starts)
        torch.testing.assert_close(logits, agent.actor(ref_out), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(values, agent.critic(ref_out).squeeze(-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c, ref_c, rtol=1e-5, atol=1e-5)
        fresh_logits, fresh_values, _ = agent(
            obs[3:, 1:2], agent.initial_state(1, "cpu"), torch.zeros(7, 1), torch.zeros(7) > 0
        )
        torch.testing.assert_close(logits[3:, 1:2], fresh_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(values[3:, 1:2], fresh_values, rtol=1e-5, atol=1e-5)
        _, no_reset_values, _ = agent(
            obs[:, 1:2],
            (state[0][:, 1:2], state[1][:, 1:2]),
            torch.zeros(10, 1),
            torch.zeros(10) > 0,
        )
    assert (no_reset_values[3:] - fresh_values).abs().max() > 1e-4  # the reset mattered


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_span_wise_memory_equals_the_per_step_reference(seed):
    """Agent.memory (one nn.LSTM call per span) against Agent.memory_per_step (CleanRL's
    get_states: one step at a time, the state zeroed where an episode starts) on random features
    and state: the same outputs, values and final (h, c). Starts at t = 0, twice in a row in one
    sequence (t = 4, 5), at consecutive steps in different sequences (5, 6), several at one step,
    and at the last step."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    agent = rppo.Agent(4, 1, 16)
    with torch.no_grad():  # a livelier memory than at init, so a missed reset would show
        agent.lstm.weight_hh_l0.mul_(3.0)
    L, B = 12, 5
    x = torch.randn(L, B, 512, generator=generator)
    state = (torch.randn(1, B, 16, generator=generator), torch.randn(1, B, 16, generator=generator))
    starts = torch.zeros(L, B)
    for t, b in [(0, 1), (0, 3), (4, 0), (5, 0), (5, 2), (6, 3), (6, 4), (11, 1)]:
        starts[t, b] = 1.0
    calls = []
    agent.lstm.register_forward_hook(lambda module, inputs, output: calls.append(len(inputs[0])))
    with torch.no_grad():
        out, (h, c) = agent.memory(x, state, starts, starts.any(1))
        assert calls == [4, 1, 1, 5, 1]  # spans [0, 4), [4, 5), [5, 6), [6, 11), [11, 12)
        ref_out, (ref_h, ref_c) = agent.memory_per_step(x, state, starts)
        assert calls[5:] == [1] * L
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
        values = agent.critic(out).squeeze(-1)
        torch.testing.assert_close(values, agent.critic(ref_out).squeeze(-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c, ref_c, rtol=1e-5, atol=1e-5)
        # control: without the resets the reference differs (the test can fail)
        no_reset_out, _ = agent.memory_per_step(x, state, torch.zeros(L, B))
    assert (no_reset_out - ref_out).abs().max() > 1e-3


# ------------------------------------------------------------------ math
def test_gae_hand_computed_with_life_loss_and_truncation():
    # gamma = lambda = 0.5. Env 0: life loss at t=1, time limit at t=2 with V(final obs) = 10.
    t = lambda rows: torch.tensor(rows, dtype=torch.float32)  # noqa: E731
    values = t([[1, 0], [2, 0], [3, 0], [4, 0]])
    adv, ret = rppo.gae(
        t([[1, 0], [0, 0], [1, 0], [1, 1]]),
        values,
        t([5, 2]),
        t([[0, 0], [1, 0], [0, 0], [0, 0]]),
        t([[0, 0], [0, 0], [1, 0], [0, 0]]),
        t([[0, 0], [0, 0], [10, 0], [0, 0]]),
        0.5,
        0.5,
    )
    expected = t([[0.5, 0.03125], [-2, 0.125], [3, 0.5], [-0.5, 2]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + values)


def test_orthogonal_lstm_zero_biases_and_frame_stack():
    agent = rppo.Agent(4, 4, 32)
    w = agent.lstm.weight_hh_l0.detach()  # (4H, H): orthonormal columns
    torch.testing.assert_close(w.T @ w, torch.eye(32), rtol=1e-4, atol=1e-4)
    assert agent.lstm.bias_ih_l0.abs().sum() == 0 and agent.lstm.bias_hh_l0.abs().sum() == 0
    assert agent.network[0].in_channels == 4 and agent.actor.in_features == 32


@pytest.mark.parametrize(
    "env_id, game, sticky",
    [
        ("BreakoutNoFrameskip-v4", "breakout", 0.0),
        ("ALE/Pitfall2-v5", "pitfall2", 0.25),
        ("ALE/TicTacToe3D-v5", "tic_tac_toe_3d", 0.25),
        ("MsPacmanNoFrameskip-v4", "ms_pacman", 0.0),
    ],
)
def test_atari_protocol(env_id, game, sticky):
    assert rppo.atari_protocol(env_id) == (game, sticky)


# ------------------------------------------------------------------ evaluation
def test_evaluate_counts_capped_games_resets_memory_and_keeps_training_rng(monkeypatch):
    events = {(4, 0): "cut", (2, 1): "life", (6, 1): "over", (1, 2): "over"}
    made, starts = [], []
    monkeypatch.setattr(
        rppo,
        "make_envs",
        lambda n, **atari: (
            made.append(FakeAtari(n, 1, lambda c, i: events.get((c, i)))) or made[-1]
        ),
    )
    torch.manual_seed(0)
    agent, before = rppo.Agent(4, 1, 8), torch.get_rng_state()
    agent.register_forward_hook(lambda module, inputs, output: starts.append(inputs[2][0].tolist()))
    atari = dict(game="breakout", sticky=0.0, max_frames=100, frame_stack=1, baselines=True)
    scores, extra = rppo.evaluate(agent, atari, 3, 10_001, "cpu")
    capped = extra["eval_capped_games"]
    assert capped == 1 and made[0].c == 7  # the games end at steps 4 (cut), 6 and 1
    assert [s[1] for s in starts] == [
        1,
        0,
        0,
        1,
        0,
        0,
        0,
    ]  # env 1: a new game, then a lost life after step 2
    assert starts[5][0] == 1 and starts[2][2] == 1  # env 0 after its cut, env 2 after its game over
    assert torch.equal(torch.get_rng_state(), before)
    assert rppo.evaluate(agent, atari, 3, 10_001, "cpu") == (scores, extra)


class NoopPolicy(torch.nn.Module):
    """The Agent interface with a policy that always samples NOOP (action 0)."""

    def initial_state(self, batch, device):
        return torch.zeros(1, batch, 1), torch.zeros(1, batch, 1)

    def forward(self, obs, state, starts):
        return (
            torch.tensor([0.0, -1e9, -1e9, -1e9]).expand(*starts.shape, 4),
            torch.zeros(starts.shape),
            state,
        )


def test_evaluate_presses_fire_after_a_lost_life(monkeypatch):
    """The step after env 0 loses a life (its 2nd step) presses FIRE (action 1) whatever the policy samples;
    env 1 never loses one and is never forced."""
    events, made = {(1, 0): "life", (5, 0): "over", (5, 1): "over"}, []
    monkeypatch.setattr(
        rppo,
        "make_envs",
        lambda n, **atari: (
            made.append(FakeAtari(n, 1, lambda c, i: events.get((c, i)))) or made[-1]
        ),
    )
    rppo.evaluate(
        NoopPolicy(),
        dict(game="breakout", sticky=0.0, max_frames=100, frame_stack=1, baselines=True),
        2,
        10_001,
        "cpu",
    )
    assert [a.tolist() for a in made[0].taken] == [[0, 0], [0, 0], [1, 0], [0, 0], [0, 0], [0, 0]]


@pytest.mark.parametrize("protocol, ended", [("baselines", True), ("machado", False)])
def test_noop_policy_on_real_breakout_follows_the_protocol(protocol, ended):
    """A policy that only presses NOOP on the real game: under baselines FIRE launches the ball at reset and
    after every lost life, so all 5 lives are lost and the game ends; under machado the ball is never
    launched and the game runs to the frame limit with score 0. (FIRE at reset only would lose one life, then stall.)"""
    atari = dict(
        game="breakout",
        sticky=0.0,
        max_frames=20_000,
        frame_stack=1,
        baselines=protocol == "baselines",
    )
    envs = rppo.make_envs(1, **atari)
    assert envs.fire == (1 if ended else None)
    envs.close()
    scores, extra = rppo.evaluate(NoopPolicy(), atari, 1, 10_001, "cpu")
    assert extra["eval_capped_games"] == (0 if ended else 1)
    assert ended or scores == [0.0]


@pytest.mark.parametrize("baselines", [True, False])
def test_a_lost_life_clears_the_frame_stack(baselines):
    """--frame-stack 4: the memory restarts after a lost life under baselines, and so does the
    stack, as at a new game (EpisodicLife's reset refills it): the 3, 2, 1 oldest frames of the
    next three observations are zero. Under machado, and after a game over, nothing is cleared."""
    _, _, ro = scripted_rollout(seq_len=8, frame_stack=4, baselines=baselines)
    zero = {
        (t, n): (ro.obs[t, n].flatten(1).amax(1) == 0).tolist() for t in range(24) for n in (0, 1)
    }
    expected = {key: [False] * 4 for key in zero}
    for t, n in AFTER_LIFE if baselines else ():
        for k in range(3):
            expected[t + k, n] = [True] * (3 - k) + [False] * (k + 1)
    assert zero == expected


def test_a_cut_soon_after_a_lost_life_bootstraps_from_the_cleared_stack():
    """The final observation of a time-limit cut 2 steps after a lost life keeps 1 stale frame
    (zeroed), as its observation would have."""
    events = {(0, 0): "life", (2, 0): "cut"}
    envs = rppo.LifeProtocol(FakeAtari(1, 4, lambda c, i: events.get((c, i))), True)
    envs.reset(seed=0)
    finals = [envs.step(np.zeros(1, np.int64))[-1] for _ in range(3)]
    assert finals[:2] == [None, None]
    assert (finals[2][0].reshape(4, -1).max(1) == 0).tolist() == [True, False, False, False]


def test_evaluate_clears_the_frame_stack_after_a_lost_life(monkeypatch):
    """Evaluation stacks frames as training does: env 0 loses a life in its 2nd step, so the next
    observation's oldest frame (of 2) is zero; env 1 never loses one."""
    events = {(1, 0): "life", (4, 0): "over", (4, 1): "over"}
    monkeypatch.setattr(
        rppo, "make_envs", lambda n, **atari: FakeAtari(n, 2, lambda c, i: events.get((c, i)))
    )
    torch.manual_seed(0)
    agent, oldest = rppo.Agent(4, 2, 8), []
    agent.register_forward_hook(
        lambda module, inputs, output: oldest.append(inputs[0][0, :, 0].flatten(1).amax(1).tolist())
    )
    atari = dict(game="breakout", sticky=0.0, max_frames=100, frame_stack=2, baselines=True)
    rppo.evaluate(agent, atari, 2, 10_001, "cpu")
    assert [[m == 0 for m in env_max] for env_max in oldest] == [
        [False, False],
        [False, False],
        [True, False],
        [False, False],
        [False, False],
    ]


class StackSpy(torch.nn.Module):
    """NoopPolicy that records each step's start flag and the peak pixel of each stacked frame."""

    def __init__(self):
        super().__init__()
        self.noop, self.seen = NoopPolicy(), []

    def initial_state(self, batch, device):
        return self.noop.initial_state(batch, device)

    def forward(self, obs, state, starts):
        self.seen.append((float(starts[0, 0]), obs[0, 0].flatten(1).amax(1).tolist()))
        return self.noop(obs, state, starts)


def test_video_game_clears_the_frame_stack_after_a_lost_life(monkeypatch, tmp_path):
    """The recorded game (real Breakout, NOOP with FIRE forced, 5 lives) stacks as training does."""
    monkeypatch.setattr(rppo.gym.wrappers, "RecordVideo", lambda env, *args, **kwargs: env)
    spy = StackSpy()
    atari = dict(game="breakout", sticky=0.0, max_frames=20_000, frame_stack=4, baselines=True)
    rppo.record_video(spy, atari, tmp_path, 1, "cpu")
    starts = [i for i, (start, _) in enumerate(spy.seen) if start == 1.0]
    assert len(starts) == 5  # the game's first observation, then one after each of 4 lost lives
    for i in starts[1:]:
        assert [m == 0 for m in spy.seen[i][1]] == [True, True, True, False]
        assert [m == 0 for m in spy.seen[i + 1][1]] == [True, True, False, False]


# ------------------------------------------------------------------ in process on the fake env
def periodic(c, i):
    return "over" if c % 32 == 31 else None  # every game ends with a rollout of 32 steps


def fake_factory(sigterm_at=None):
    """make_envs stand-in: clock = step count / 2 envs, so a resumed run (reset seeded seed + step) sees the same frames."""
    return lambda n, game, sticky, max_frames, frame_stack, baselines: FakeAtari(
        n,
        frame_stack,
        periodic,
        lambda seed: (seed - 1) // 2,
        sigterm_at if n == 2 else None,
        1 if baselines else None,
    )


FAKE_ARGS = dict(
    num_envs=2,
    num_steps=32,
    seq_len=8,
    num_minibatches=2,
    update_epochs=2,
    eval_episodes=1,
    hidden_dim=16,
    device="cpu",
    checkpoint_interval=0,
)


def test_resume_equals_uninterrupted_run(tmp_path, monkeypatch, restore_signals, capsys):
    """Games end with each rollout, so the restart on resume is where the uninterrupted run's games
    restart too: weights, optimizer, RNG and schedule must then give identical results."""
    monkeypatch.setattr(rppo, "make_envs", fake_factory())
    rppo.train(rppo.Args(**FAKE_ARGS, total_steps=128, run_dir=str(tmp_path / "a")))
    monkeypatch.setattr(rppo, "make_envs", fake_factory(sigterm_at=10))
    rppo.train(rppo.Args(**FAKE_ARGS, total_steps=128, run_dir=str(tmp_path / "b")))
    assert "interrupted: continue with --resume" in capsys.readouterr().out
    assert not (tmp_path / "b" / "summary.json").exists()
    monkeypatch.setattr(rppo, "make_envs", fake_factory())
    rppo.train(
        rppo.Args(
            **FAKE_ARGS, total_steps=128, resume=str(tmp_path / "b" / "checkpoints" / "latest.pt")
        )
    )
    a, b = (torch.load(tmp_path / r / "checkpoints" / "latest.pt", weights_only=True) for r in "ab")
    assert (
        a["global_step"] == b["global_step"] == 128
        and a["schedule_steps"] == b["schedule_steps"] == 128
    )
    for name, tensor in a["agent"].items():
        assert torch.equal(tensor, b["agent"][name]), name
    assert torch.equal(
        a["optimizer"]["state"][0]["exp_avg_sq"], b["optimizer"]["state"][0]["exp_avg_sq"]
    )
    for tag in (
        "losses/value_loss",
        "losses/policy_loss",
        "losses/approx_kl",
        "charts/learning_rate",
        "charts/episodic_return",
        "eval/episodic_return",
    ):
        assert scalars(tmp_path / "a", tag) == scalars(tmp_path / "b", tag), tag
    assert summary(tmp_path / "a")["eval_returns"] == summary(tmp_path / "b")["eval_returns"]


def test_resume_keeps_the_schedule_and_refuses_to_run_past_it(tmp_path, monkeypatch):
    monkeypatch.setattr(rppo, "make_envs", fake_factory())
    rppo.train(rppo.Args(**FAKE_ARGS, total_steps=128, run_dir=str(tmp_path / "a")))
    ckpt = str(tmp_path / "a" / "checkpoints" / "latest.pt")
    with pytest.raises(
        SystemExit,
        match="--total-steps 256 runs past the learning-rate anneal, which reaches 0 at step 128 "
        r"\(the schedule of the checkpoint\); pass --schedule-steps 256",
    ):
        rppo.train(rppo.Args(**FAKE_ARGS, total_steps=256, resume=ckpt))
    rppo.train(rppo.Args(**FAKE_ARGS, total_steps=256, resume=ckpt, schedule_steps=512))
    lrs = [lr for _, lr in scalars(tmp_path / "a", "charts/learning_rate")]
    assert lrs == pytest.approx(
        [2.5e-4, 1.25e-4, 2.5e-4 * 0.75, 2.5e-4 * 0.625]
    )  # re-planned from step 128 on
    assert torch.load(ckpt, weights_only=True)["schedule_steps"] == 512


def test_non_finite_loss_stops_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(rppo, "make_envs", fake_factory())
    with pytest.raises(
        SystemExit, match="recurrent_ppo_atari.py: error: non-finite loss at step 64"
    ):
        rppo.train(
            rppo.Args(
                **FAKE_ARGS,
                total_steps=128,
                learning_rate=1e38,
                anneal_lr=False,
                run_dir=str(tmp_path / "r"),
            )
        )
    assert (
        not (tmp_path / "r" / "summary.json").exists()
        and not (tmp_path / "r" / "checkpoints").exists()
    )


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(seq_len=48), "--seq-len 48 does not divide --num-steps 128"),
        (
            dict(num_envs=3, num_minibatches=4),
            "3 sequences per rollout (num_envs * num_steps / seq_len) do not split into --num-minibatches 4",
        ),
        (dict(num_envs=2, seq_len=32, num_minibatches=3), "8 sequences per rollout"),
        (dict(seq_len=0), "--seq-len must be positive"),
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(num_minibatches=0), "--num-minibatches must be positive"),
        (dict(frame_stack=0), "--frame-stack must be positive"),
        (dict(hidden_dim=-1), "--hidden-dim must be positive"),
        (dict(learning_rate=0.0), "--learning-rate must be positive"),
        (dict(max_episode_frames=0), "--max-episode-frames must be positive"),
        (dict(gamma=1.5), "--gamma must be in [0, 1], got 1.5"),
        (dict(gae_lambda=-0.1), "--gae-lambda must be in [0, 1], got -0.1"),
        (
            dict(anneal_lr=True, schedule_steps=512, total_steps=1024),
            "runs past the learning-rate anneal, which reaches 0 at step 512 (set by --schedule-steps)",
        ),
        (
            dict(total_steps=100),
            "--total-steps 100 is less than one rollout (num_envs * num_steps = 1024)",
        ),
        (
            dict(env_id="CartPole-v1"),
            "not an Atari game (discrete actions, vector observations); use ppg.py",
        ),
        (dict(env_id="Pendulum-v1"), "use d4pg.py, naf.py or rlpd.py"),
        (dict(env_id="NotAnEnv-v0"), "unknown environment id 'NotAnEnv-v0'"),
        (
            dict(env_id="Breakout-v4"),
            "frame-skip protocol is not supported; use BreakoutNoFrameskip-v4 or ALE/Breakout-v5",
        ),
        (dict(env_id="Breakout-ram-v4"), "RAM observations are not supported"),
        (dict(env_id="BreakoutsNoFrameskip-v4"), "unknown Atari game 'Breakouts'"),
        (dict(env_id="ALE/Breakouts-v5"), "did you mean ALE/Breakout-v5?"),
        (dict(eval_only=True), "--eval-only needs --checkpoint"),
        (dict(resume="/nonexistent/latest.pt"), "does not exist"),
    ],
)
def test_bad_args(kwargs, fragment, tmp_path):
    with pytest.raises(SystemExit) as info:
        rppo.train(rppo.Args(**{"run_dir": str(tmp_path / "r"), **kwargs}))
    message = str(info.value.code)
    assert message.startswith("recurrent_ppo_atari.py: error:") and fragment in message, message
    assert not (tmp_path / "r").exists()  # nothing half-written


def test_checkpoint_refusals(tmp_path):
    args = rppo.Args(seq_len=8, num_steps=32, num_envs=2)
    path = tmp_path / "run" / "checkpoints" / "latest.pt"
    meta = {"algo": "recurrent_ppo_atari", "harness": 1, "env_id": args.env_id}
    rppo.write_atomic(path, {**meta, "args": asdict(args), "global_step": 64, "agent": {}})
    for kwargs, fragment in [
        (dict(seq_len=16), "was made with --seq-len 8; pass --seq-len 8"),
        (dict(seq_len=8, frame_stack=4), "was made with --frame-stack 1; pass --frame-stack 1"),
        (
            dict(seq_len=8, protocol="machado"),
            "was made with --protocol auto; pass --protocol auto",
        ),
        (dict(seq_len=8, env_id="ALE/Pong-v5"), "is for BreakoutNoFrameskip-v4; pass --env-id"),
        (
            dict(seq_len=8, num_steps=16, total_steps=32),
            "--total-steps is below the checkpoint's step; pass 64+",
        ),
    ]:
        with pytest.raises(SystemExit, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            rppo.train(
                rppo.Args(
                    **{"num_steps": 32, "num_envs": 2, "num_minibatches": 2, **kwargs},
                    resume=str(path),
                )
            )
    (tmp_path / "other.pt").parent.mkdir(exist_ok=True)
    torch.save(
        {"algo": "ppo_atari", "env_id": "BreakoutNoFrameskip-v4", "args": {}, "global_step": 0},
        tmp_path / "other.pt",
    )
    with pytest.raises(SystemExit, match="written by ppo_atari.py; use ppo_atari.py"):
        rppo.train(rppo.Args(eval_only=True, checkpoint=str(tmp_path / "other.pt")))


# ------------------------------------------------------------------ end-to-end on the emulator, by subprocess
@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("base") / "run"
    proc = run_script(SCRIPT, *TINY, "--total-steps", "192", "--run-dir", str(run_dir))
    check_ok(proc)
    return run_dir


@pytest.mark.slow
def test_run_outputs(base_run):
    s = summary(base_run)
    for key in (
        "script",
        "algo",
        "env_id",
        "seed",
        "global_step",
        "eval_mean",
        "eval_std",
        "eval_episodes",
        "eval_returns",
        "sps",
        "eval_capped_games",
    ):
        assert key in s, key
    assert s["script"] == SCRIPT and s["global_step"] == 192 and s["eval_episodes"] == 1
    for tag in (
        "charts/SPS",
        "charts/learning_rate",
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "eval/episodic_return",
        "eval/capped_games",
    ):
        assert scalars(base_run, tag), tag
    assert [step for step, _ in scalars(base_run, "losses/value_loss")] == [64, 128, 192]
    assert [lr for _, lr in scalars(base_run, "charts/learning_rate")] == pytest.approx(
        [2.5e-4 * (1 - k / 3) for k in range(3)]
    )
    ckpt = torch.load(base_run / "checkpoints" / "latest.pt", weights_only=True)
    assert (
        ckpt["algo"] == "recurrent_ppo_atari"
        and ckpt["iteration"] == 3
        and ckpt["schedule_steps"] == 192
    )
    assert (
        ckpt["agent"]["lstm.weight_hh_l0"].shape == (128, 32)
        and ckpt["agent"]["network.0.weight"].shape[1] == 1
    )
    assert set(ckpt["rng"]) == {"torch", "minibatch"}


@pytest.mark.slow
def test_same_seed_same_metrics_other_seed_differs(base_run, tmp_path):
    check_ok(run_script(SCRIPT, *TINY, "--total-steps", "192", "--run-dir", str(tmp_path / "b")))
    for tag in (
        "losses/value_loss",
        "losses/policy_loss",
        "losses/entropy",
        "charts/episodic_return",
    ):
        assert scalars(base_run, tag) == scalars(tmp_path / "b", tag), tag
    assert summary(base_run)["eval_returns"] == summary(tmp_path / "b")["eval_returns"]
    check_ok(
        run_script(
            SCRIPT, *TINY, "--total-steps", "64", "--seed", "2", "--run-dir", str(tmp_path / "c")
        )
    )
    assert (
        scalars(base_run, "losses/value_loss")[0] != scalars(tmp_path / "c", "losses/value_loss")[0]
    )


@pytest.mark.slow
def test_eval_only_repeats_the_final_evaluation_with_video(base_run, restore_signals):
    check_eval_only_after_move(
        base_run,
        lambda path: rppo.train(
            rppo.Args(eval_only=True, checkpoint=path, eval_episodes=1, capture_video=True)
        ),
        1,
    )
    result = json.loads((base_run.parent / "moved" / "eval.json").read_text())
    assert result["eval_capped_games"] == 0 and result["eval_video_return"] >= 0
    assert list((base_run.parent / "moved" / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_copied_alone_runs_v5_with_frame_stack_and_video(tmp_path):
    script = copy_alone(SCRIPT, tmp_path / "alone")
    proc = run_script(
        script,
        *TINY,
        "--env-id",
        "ALE/Breakout-v5",
        "--frame-stack",
        "4",
        "--total-steps",
        "64",
        "--capture-video",
        cwd=tmp_path / "alone",
    )
    check_ok(proc)
    (run_dir,) = (tmp_path / "alone" / "runs").iterdir()
    assert run_dir.name.startswith("ALE-Breakout-v5__recurrent_ppo_atari__1__")
    assert json.loads((run_dir / "config.json").read_text())["repeat_action_probability"] == 0.25
    assert (
        torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["agent"][
            "network.0.weight"
        ].shape[1]
        == 4
    )
    assert list((run_dir / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_cli_error_is_one_line():
    check_error(
        run_script(SCRIPT, "--num-envs", "2", "--seq-len", "48"),
        "recurrent_ppo_atari.py: error:",
        "--seq-len 48 does not divide",
    )
