"""Tests of algos/ppo_atari.py: GAE with truncation and life loss against hand-computed values and
a per-step loop, the step flags and truncation bootstrap on a fake and on the real env, forward
passes that leave the caller's tensor alone, env ids against ale_py's ROM list and Gymnasium's
registry, the sampled-policy evaluation and its capped-game count, the video's zero padding,
in-process runs on a stateless fake game (resume equivalence with controls that drop one restored
piece each, the learning-rate schedule across a resume, --frame-stack, W&B exit codes, signals),
tiny subprocess runs (outputs, copy-alone, determinism with a different-seed control, eval-only
with video, SIGTERM), and every bad-input message."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from ale_py import roms
from conftest import (
    ALGOS,
    ScriptedGames,
    check_error,
    check_ok,
    copy_alone,
    run_script,
    scalars,
    sigterm_on_call,
    summary,
)

SCRIPT = "ppo_atari.py"
TINY = (
    "--num-envs",
    "2",
    "--num-steps",
    "32",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "1",
    "--eval-episodes",
    "1",
    "--max-episode-frames",
    "2000",
)
TINY_ARGS = dict(
    num_envs=2,
    num_steps=32,
    num_minibatches=2,
    update_epochs=1,
    eval_episodes=1,
    max_episode_frames=200,
)


def load_module():
    spec = importlib.util.spec_from_file_location("ppo_atari", ALGOS / SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ppo_atari"] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


ppo = load_module()


# ------------------------------------------------------------------ math
def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_gae_hand_computed_with_life_loss_and_truncation():
    # gamma = lambda = 0.5. Env 0: life loss at t=1 (terminal), time limit at t=2 with
    # V(final obs) = 10. Env 1: no episode end.
    rewards = t([[1, 0], [0, 0], [1, 0], [1, 1]])
    values = t([[1, 0], [2, 0], [3, 0], [4, 0]])
    next_value = t([5, 2])
    terminals = t([[0, 0], [1, 0], [0, 0], [0, 0]])
    truncations = t([[0, 0], [0, 0], [1, 0], [0, 0]])
    trunc_values = t([[0, 0], [0, 0], [10, 0], [0, 0]])
    adv, ret = ppo.gae(rewards, values, next_value, terminals, truncations, trunc_values, 0.5, 0.5)
    # env 0, backwards: d3 = 1 + .5*5 - 4 = -.5; d2 = 1 + .5*10 - 3 = 3 (bootstrap from the final
    # obs, chain cut); d1 = 0 - 2 = -2 (no bootstrap, chain cut); A0 = (1 + .5*2 - 1) + .25*A1 = .5
    # env 1: d3 = 1 + .5*2 = 2, then A_t = .25 A_{t+1}
    expected = t([[0.5, 0.03125], [-2, 0.125], [3, 0.5], [-0.5, 2]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + values)


def gae_loop(r, v, nv, term, trunc, tv, gamma, lam):
    """Independent per-element reference: one env, one step at a time, python floats."""
    T, N = len(r), len(r[0])
    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        running = 0.0
        for i in reversed(range(T)):
            if term[i][n]:
                target, running = r[i][n], 0.0
            elif trunc[i][n]:
                target, running = r[i][n] + gamma * tv[i][n], 0.0
            else:
                target = r[i][n] + gamma * (v[i + 1][n] if i + 1 < T else nv[n])
            running = target - v[i][n] + gamma * lam * running
            adv[i][n] = running
    return adv


def test_gae_matches_per_step_loop():
    g = torch.Generator().manual_seed(0)
    T, N = 37, 5
    r, v, tv = (
        torch.randn(T, N, generator=g),
        torch.randn(T, N, generator=g),
        torch.randn(T, N, generator=g),
    )
    nv = torch.randn(N, generator=g)
    term = (torch.rand(T, N, generator=g) < 0.1).float()
    trunc = (torch.rand(T, N, generator=g) < 0.1).float() * (1 - term)
    adv, _ = ppo.gae(r, v, nv, term, trunc, tv, 0.99, 0.95)
    ref = gae_loop(
        r.tolist(), v.tolist(), nv.tolist(), term.tolist(), trunc.tolist(), tv.tolist(), 0.99, 0.95
    )
    torch.testing.assert_close(adv, torch.tensor(ref), rtol=1e-5, atol=1e-5)


class ValueOfMean(torch.nn.Module):
    """Fake agent: V(obs) = mean pixel; records the batches it saw."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, obs):
        self.seen.append(obs.clone())
        return torch.zeros(len(obs), 4), obs.float().mean((1, 2, 3))


class OneStep:
    """Fake vector env for LifeProtocol: reset gives `lives`, the step returns the given outcome."""

    fire = 1

    def __init__(self, lives, term, trunc, info):
        self.lives, self.outcome = lives, (term, trunc, info)

    def reset(self, seed=None):
        return np.zeros((len(self.lives), 4, 84, 84), np.uint8), {"lives": self.lives}

    def step(self, actions):
        term, trunc, info = self.outcome
        return np.zeros((len(term), 4, 84, 84), np.uint8), np.zeros(len(term)), term, trunc, info


def test_life_protocol_and_bootstrap_fake_step():
    # env 0 goes on, 1 loses a life, 2 hits the time limit, 3 hits it at game over
    term, trunc = np.array([False, False, False, True]), np.array([False, False, True, True])
    final_obs = np.stack([np.full((4, 84, 84), 10 * (i + 1), dtype=np.uint8) for i in range(4)])
    info = {"lives": np.array([3, 2, 5, 5]), "final_obs": final_obs}
    envs = ppo.LifeProtocol(OneStep(np.array([3, 3, 1, 1]), term, trunc, info), True)
    envs.reset(seed=0)
    _, _, ended, terminal, cut, final = envs.step(np.zeros(4, np.int64))
    assert terminal.tolist() == [False, True, False, True] and cut.tolist() == [
        False,
        False,
        True,
        False,
    ]
    assert ended.tolist() == [False, False, True, True]
    assert envs.forced.tolist() == [False, True, False, False]  # FIRE is due where a life was lost
    agent = ValueOfMean()
    value = ppo.bootstrap_values(agent, final, cut, torch.device("cpu"))
    assert value.tolist() == [0.0, 0.0, 30.0, 0.0]  # V of env 2's real last observation only
    assert len(agent.seen) == 1 and torch.equal(agent.seen[0], torch.from_numpy(final_obs[[2]]))
    envs = ppo.LifeProtocol(
        OneStep(np.array([3]), term[:1], trunc[:1], {"lives": np.array([3])}), True
    )
    envs.reset(seed=0)
    _, _, _, _, cut, final = envs.step(np.zeros(1, np.int64))
    value = ppo.bootstrap_values(agent, final, cut, torch.device("cpu"))
    assert (
        not cut.any() and final is None and value.tolist() == [0.0] and len(agent.seen) == 1
    )  # no forward pass without a cut


def test_life_protocol_and_bootstrap_real_truncation():
    """On the real vector env with a 40-frame limit: the bootstrap is V(final_obs), not V(reset obs)."""
    torch.manual_seed(0)
    agent = ppo.Agent(4)
    envs = ppo.LifeProtocol(ppo.make_envs(2, "breakout", 0.0, 40, 4, True), True)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(30):
        obs, _, _, terminal, cut, final = envs.step(rng.integers(0, 4, size=2))
        value = ppo.bootstrap_values(agent, final, cut, torch.device("cpu"))
        if cut.any():
            break
    envs.vec.close()
    assert cut.all() and not terminal.any(), "both games should hit the 40-frame limit together"
    with torch.inference_mode():
        expected = agent(torch.from_numpy(final))[1]
        after_reset = agent(torch.from_numpy(obs))[1]
    torch.testing.assert_close(value, expected)
    assert not torch.allclose(value, after_reset)  # the returned obs is the new game's
    assert (obs[:, :3] == 0).all() and (final[:, :3] != 0).any()


def test_ppo_losses_clip():
    adv = t([1.0, -1.0, 1.0])
    old = torch.zeros(3)
    new = torch.log(t([1.5, 0.5, 1.0]))  # ratios 1.5 (clipped to 1.1), 0.5 (clipped to 0.9), 1
    values, old_values, returns = t([2.0, 0.0, 0.0]), t([0.0, 0.0, 0.0]), t([0.0, 0.0, 1.0])
    losses = ppo.ppo_losses(new, old, adv, values, old_values, returns, 0.1, True)
    assert set(losses) == {"policy_loss", "value_loss", "approx_kl", "clipfrac"}
    # -min(r A, clip(r) A): -1.1, +0.9, -1.0
    assert losses["policy_loss"].item() == pytest.approx((-1.1 + 0.9 - 1.0) / 3)
    # clipped value loss takes the max: (2-0)^2 vs (0.1-0)^2 -> 4; 0; (0-1)^2 vs (0-1)^2 -> 1
    assert losses["value_loss"].item() == pytest.approx(0.5 * (4 + 0 + 1) / 3)
    assert losses["clipfrac"].item() == pytest.approx(2 / 3)
    plain = ppo.ppo_losses(new, old, adv, values, old_values, returns, 0.1, False)
    assert plain["value_loss"].item() == pytest.approx(0.5 * (4 + 0 + 1) / 3)
    clipped = ppo.ppo_losses(new, old, adv, t([0.5, 0, 0]), old_values, t([1.0, 0, 0]), 0.1, True)
    assert clipped["value_loss"].item() == pytest.approx(
        0.5 * 0.81 / 3
    )  # (0.1 - 1)^2 > (0.5 - 1)^2
    # a forced FIRE (acted 0) is left out of the policy loss, not of the value loss
    masked = ppo.ppo_losses(
        new, old, adv, values, old_values, returns, 0.1, True, t([1.0, 0.0, 1.0])
    )
    assert masked["policy_loss"].item() == pytest.approx((-1.1 - 1.0) / 2) and masked[
        "value_loss"
    ].item() == pytest.approx(losses["value_loss"].item())


@pytest.mark.parametrize("stack", [1, 4])
def test_forward_leaves_the_callers_tensor_alone(stack):
    """A float, channels-last batch (the layout the network converts to) must not be scaled in place."""
    torch.manual_seed(0)
    agent = ppo.Agent(4, stack)
    frames = (torch.rand(2, stack, 84, 84) * 255).to(memory_format=torch.channels_last)
    before = frames.clone()
    logits, value = agent(frames)
    assert torch.equal(frames, before)
    ref_logits, ref_value = agent(
        before.contiguous()
    )  # a layout the network must convert (so copies) anyway
    assert (
        logits.shape == (2, 4)
        and torch.allclose(logits, ref_logits)
        and torch.allclose(value, ref_value)
    )


# ------------------------------------------------------------------ environment ids
@pytest.mark.parametrize(
    "env_id, game, sticky",
    [
        ("BreakoutNoFrameskip-v4", "breakout", 0.0),
        ("ALE/Breakout-v5", "breakout", 0.25),
        ("MsPacmanNoFrameskip-v4", "ms_pacman", 0.0),
        ("ALE/BeamRider-v5", "beam_rider", 0.25),
        ("ALE/Pitfall2-v5", "pitfall2", 0.25),
        ("ALE/TicTacToe3D-v5", "tic_tac_toe_3d", 0.25),
        ("UpNDownNoFrameskip-v4", "up_n_down", 0.0),
        ("ALE/Joust-v5", "joust", 0.25),
    ],
)
def test_atari_protocol(env_id, game, sticky):
    assert ppo.atari_protocol(env_id) == (game, sticky)


def test_every_registered_atari_id_maps_to_its_rom():
    """Gymnasium's own registry (ale_py's entry points name the ROM) is the reference, and every
    name the file accepts resolves to a ROM file that exists."""
    import ale_py

    gym.register_envs(ale_py)
    checked = 0
    for env_id, spec in gym.registry.items():
        if (
            spec.entry_point == "ale_py.env:AtariEnv"
            and (env_id.endswith("NoFrameskip-v4") or env_id.startswith("ALE/"))
            and "-ram" not in env_id
        ):
            assert ppo.atari_protocol(env_id) == (
                spec.kwargs["game"],
                spec.kwargs["repeat_action_probability"],
            ), env_id
            checked += 1
    assert checked > 150  # the v4 legacy games and every v5 game
    for rom in ppo.atari_games().values():
        assert roms.get_rom_path(rom).exists(), rom


@pytest.mark.parametrize(
    "env_id, fragment",
    [
        ("CartPole-v1", "ppg.py"),
        ("Pendulum-v1", "d4pg.py"),
        ("Breakout-ram-v4", "RAM"),
        ("ALE/Breakout-ram-v5", "RAM"),
        ("Breakout-v4", "BreakoutNoFrameskip-v4 or ALE/Breakout-v5"),
        ("FooBarNoFrameskip-v4", "unknown Atari game 'FooBar'"),
        ("ALE/TicTacToe-v5", "did you mean ALE/TicTacToe3D-v5?"),
        ("ALE/Pitfall3-v5", "no such ROM"),
        ("NotAnEnv-v0", "unknown environment id"),
    ],
)
def test_atari_protocol_refuses(env_id, fragment):
    with pytest.raises(SystemExit) as info:
        ppo.atari_protocol(env_id)
    message = str(info.value.code)
    assert (
        message.startswith("ppo_atari.py: error:") and fragment in message and "\n" not in message
    ), message


# ------------------------------------------------------------------ evaluation and video
class FixedPolicy(torch.nn.Module):
    def __init__(self, probs):
        super().__init__()
        self.logits = torch.log(torch.tensor(probs))

    def forward(self, obs):
        return self.logits.expand(len(obs), -1), torch.zeros(len(obs))


ATARI = dict(game="breakout", sticky=0.0, max_frames=200, frame_stack=4, baselines=True)


def test_evaluate_counts_capped_games(monkeypatch):
    # game 0 ends at step 2 and is capped later (ignored), game 1 is capped at 3, game 2 at 5
    games = ScriptedGames([{2: "term", 4: "trunc"}, {3: "trunc"}, {5: "trunc"}])
    monkeypatch.setattr(ppo, "make_envs", lambda n, **_: games)
    returns, extra = ppo.evaluate(FixedPolicy([0.5, 0.5]), ATARI, 3, 10_001, "cpu")
    assert returns == [2.0, 3.0, 5.0] and extra == {"eval_capped_games": 2}


def test_evaluate_presses_fire_after_a_lost_life(monkeypatch):
    """Baselines protocol: the step after env 0 loses a life (step 2) presses FIRE (action 1) whatever the
    policy samples; env 1 never loses one and is never forced."""
    games = ScriptedGames([{2: "life", 6: "term"}, {6: "term"}])
    monkeypatch.setattr(ppo, "make_envs", lambda n, **_: games)
    ppo.evaluate(
        FixedPolicy([1.0, 1e-12, 1e-12, 1e-12]), ATARI, 2, 10_001, "cpu"
    )  # samples NOOP (0) only
    assert [a.tolist() for a in games.actions] == [[0, 0], [0, 0], [1, 0], [0, 0], [0, 0], [0, 0]]


@pytest.mark.parametrize("protocol, ended", [("baselines", True), ("machado", False)])
def test_noop_policy_on_real_breakout_follows_the_protocol(protocol, ended):
    """A policy that only presses NOOP on the real game: under baselines FIRE launches the ball at reset and
    after every lost life, so all 5 lives are lost and the game ends; under machado the ball is never
    launched and the game runs to the frame limit. (FIRE at reset only would lose one life, then stall.)"""
    atari = dict(ATARI, max_frames=20_000, baselines=protocol == "baselines")
    envs = ppo.make_envs(1, **atari)
    assert envs.fire == (1 if protocol == "baselines" else None)
    envs.close()
    scores, extra = ppo.evaluate(FixedPolicy([1.0, 1e-12, 1e-12, 1e-12]), atari, 1, 10_001, "cpu")
    assert extra["eval_capped_games"] == (0 if ended else 1)
    assert ended or scores == [0.0]


def test_evaluation_samples_the_policy(monkeypatch):
    """pi = (0.7, 0.3, 0, 0): the sampled policy takes action 1 about 30% of the time (argmax never),
    the same seed repeats the draw and another seed changes it."""
    episodes, made = 400, []
    monkeypatch.setattr(
        ppo, "make_envs", lambda n, **_: made.append(ScriptedGames([{1: "term"}] * n)) or made[-1]
    )
    policy = FixedPolicy([0.7, 0.3, 1e-12, 1e-12])
    for seed in (10_001, 10_001, 10_002):
        ppo.evaluate(policy, ATARI, episodes, seed, "cpu")
    first, again, other = (games.actions[0] for games in made)
    assert (
        set(first.tolist()) == {0, 1} and 0.2 < first.mean() < 0.4
    )  # binomial(400, 0.3): sd 0.023
    assert np.array_equal(first, again) and not np.array_equal(first, other)


class Recorder(torch.nn.Module):
    """Uniform policy that records the observations it is shown."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, obs):
        self.seen.append(obs.clone())
        return torch.zeros(len(obs), 4), torch.zeros(len(obs))


@pytest.mark.slow
def test_video_starts_from_the_training_padding_and_samples(tmp_path, monkeypatch):
    envs = ppo.make_envs(
        1, "breakout", 0.0, 200, 4, True
    )  # the reference: what training sees after a reset
    reset_obs, _ = envs.reset(seed=0)
    envs.close()
    draws, real = [], ppo.sample_actions
    monkeypatch.setattr(ppo, "sample_actions", lambda *a: draws.append(real(*a)) or draws[-1])
    agent = Recorder()
    ppo.record_video(agent, ATARI, tmp_path / "videos", 20_001, "cpu")
    first, second = agent.seen[0][0], agent.seen[1][0]
    assert (reset_obs[0, :3] == 0).all() and (reset_obs[0, 3] != 0).any()
    assert (first[:3] == 0).all() and (
        first[3] != 0
    ).any()  # zero padding, as training, not a repeated frame
    assert (second[:2] == 0).all() and torch.equal(second[2], first[3])
    assert (
        len(draws) == len(agent.seen) > 40
    )  # a 200-frame game (noops, FIRE, skip 4), every action from evaluation's sampler
    assert (
        len({int(d[0]) for d in draws}) > 1
    )  # sampled: a uniform policy's argmax would repeat one action
    assert list((tmp_path / "videos").glob("*.mp4"))


# ------------------------------------------------------------------ in-process runs on a stateless fake game
class ConstantGame:
    """Stands in for AtariVectorEnv: the same frames after every step, reward = action, action 0
    ends the game. Stateless, so a resumed run sees what the uninterrupted run saw at the same
    steps (the real envs restart their games on resume)."""

    fire = 1

    def __init__(self, num_envs, frame_stack):
        self.single_action_space = gym.spaces.Discrete(4)
        self.frames = np.random.default_rng(0).integers(
            0, 256, (num_envs, frame_stack, 84, 84), dtype=np.uint8
        )
        self.lives = np.full(num_envs, 3)

    def reset(self, seed=None):
        return self.frames.copy(), {"lives": self.lives}

    def step(self, actions):
        info = {"lives": self.lives, "final_obs": self.frames}
        return (
            self.frames.copy(),
            actions.astype(np.float64),
            actions == 0,
            np.zeros(len(actions), bool),
            info,
        )

    def close(self):
        pass


FAKE = dict(
    num_envs=2,
    num_steps=16,
    num_minibatches=2,
    update_epochs=2,
    eval_episodes=2,
    checkpoint_interval=0,
    device="cpu",
)
LOSSES = (
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "charts/learning_rate",
)


@pytest.fixture
def constant_game(monkeypatch, restore_signals):
    monkeypatch.setattr(
        ppo, "make_envs", lambda num_envs, frame_stack, **_: ConstantGame(num_envs, frame_stack)
    )


def load(run_dir):
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)


def test_resume_equals_the_uninterrupted_run(tmp_path, constant_game, monkeypatch, fake_wandb):
    """SIGTERM in iteration 2 of 4, resume: iterations 3-4 log the same losses and end with the same
    weights and optimizer state as the uninterrupted run. Controls: a resume that leaves out the
    minibatch generator, torch's generator or the optimizer state ends elsewhere, so each is needed
    and proven restored."""
    ppo.train(ppo.Args(**FAKE, total_steps=128, track=True, run_dir=str(tmp_path / "whole")))
    assert fake_wandb.calls == [
        ("init", []),
        ("finish", 0),
    ]  # a finished run ends W&B with exit code 0
    step_then_signal, calls = sigterm_on_call(
        20, ConstantGame.step
    )  # during iteration 2 (steps 17-32)
    with monkeypatch.context() as m:
        m.setattr(ConstantGame, "step", step_then_signal)
        ppo.train(ppo.Args(**FAKE, total_steps=128, run_dir=str(tmp_path / "cut")))
    assert len(calls) == 32 and load(tmp_path / "cut")["global_step"] == 64
    for name in ("no_minibatch", "no_torch", "no_optimizer"):
        shutil.copytree(tmp_path / "cut", tmp_path / name)
    ppo.train(
        ppo.Args(
            **FAKE, total_steps=128, resume=str(tmp_path / "cut" / "checkpoints" / "latest.pt")
        )
    )

    whole, cut = load(tmp_path / "whole"), load(tmp_path / "cut")
    assert set(cut["rng"]) == {
        "torch",
        "minibatch",
    }  # exactly the generators drawn from (no CUDA here)
    for key, value in whole["agent"].items():
        assert torch.equal(value, cut["agent"][key]), key
    for key, state in whole["optimizer"]["state"].items():
        assert all(torch.equal(v, cut["optimizer"]["state"][key][k]) for k, v in state.items())
    for tag in LOSSES:
        assert [s for s, _ in scalars(tmp_path / "cut", tag)] == [32, 64, 96, 128], tag
        assert scalars(tmp_path / "whole", tag) == scalars(tmp_path / "cut", tag), tag
    assert summary(tmp_path / "whole")["eval_returns"] == summary(tmp_path / "cut")["eval_returns"]

    real_set_rng = ppo.Run.set_rng_state
    controls = {
        "no_minibatch": (
            ppo.Run,
            "set_rng_state",
            lambda state, **g: real_set_rng(state, torch=g["torch"]),
        ),
        "no_torch": (
            ppo.Run,
            "set_rng_state",
            lambda state, **g: real_set_rng(state, minibatch=g["minibatch"]),
        ),
        "no_optimizer": (torch.optim.Adam, "load_state_dict", lambda self, state: None),
    }
    for name, (owner, attribute, stand_in) in controls.items():
        with monkeypatch.context() as m:
            m.setattr(owner, attribute, stand_in)
            ppo.train(
                ppo.Args(
                    **FAKE,
                    total_steps=128,
                    resume=str(tmp_path / name / "checkpoints" / "latest.pt"),
                )
            )
        weights = load(tmp_path / name)["agent"]["network.0.weight"]
        assert not torch.equal(weights, whole["agent"]["network.0.weight"]), name


def test_learning_rate_schedule_survives_a_longer_resume(tmp_path, constant_game):
    """The anneal horizon is the run's, kept in the checkpoint: a resume to more steps is refused
    rather than restarting the schedule; --schedule-steps re-plans it explicitly."""
    run = tmp_path / "run"
    ppo.train(ppo.Args(**FAKE, total_steps=64, run_dir=str(run)))
    ckpt_path = str(run / "checkpoints" / "latest.pt")
    assert load(run)["schedule_steps"] == 64
    with pytest.raises(
        SystemExit,
        match=r"--total-steps 128 runs past the lr anneal's end at step 64 "
        r"\(the schedule of the checkpoint\); pass --schedule-steps 128",
    ):
        ppo.train(ppo.Args(**FAKE, total_steps=128, resume=ckpt_path))
    with pytest.raises(
        SystemExit,
        match=r"end at step 100 \(set by --schedule-steps\); pass --schedule-steps 128",
    ):
        ppo.train(
            ppo.Args(**FAKE, total_steps=128, schedule_steps=100, run_dir=str(tmp_path / "other"))
        )
    assert not (tmp_path / "other").exists()
    ppo.train(ppo.Args(**FAKE, total_steps=128, schedule_steps=256, resume=ckpt_path))
    lrs = scalars(run, "charts/learning_rate")
    assert lrs == [
        (32, pytest.approx(2.5e-4)),
        (64, pytest.approx(2.5e-4 / 2)),  # the first run: 0 at step 64
        (96, pytest.approx(2.5e-4 * (1 - 64 / 256))),
        (128, pytest.approx(2.5e-4 * (1 - 96 / 256))),
    ]
    assert load(run)["schedule_steps"] == 256
    ppo.train(
        ppo.Args(**FAKE, total_steps=160, anneal_lr=False, resume=ckpt_path)
    )  # a constant rate needs no horizon
    assert scalars(run, "charts/learning_rate")[-1] == (160, pytest.approx(2.5e-4))


class LifeLosingGame(ConstantGame):
    """ConstantGame whose env 0 loses a life at every 5th step (never a game over: no action ends it)."""

    def step(self, actions):
        self.calls = getattr(self, "calls", 0) + 1
        self.lives = self.lives - np.array([self.calls % 5 == 0] + [False] * (len(actions) - 1))
        return (
            self.frames.copy(),
            np.ones(len(actions)),
            np.zeros(len(actions), bool),
            np.zeros(len(actions), bool),
            {"lives": self.lives},
        )


@pytest.mark.parametrize("protocol", ["baselines", "machado"])
def test_rollout_forces_fire_after_a_lost_life_and_masks_it(
    tmp_path, monkeypatch, restore_signals, protocol
):
    """Baselines: the step after each lost life is FIRE (1) with acted = 0 (out of the policy loss), every
    other step the policy's; machado: nothing is forced."""
    game, batches, real = [], [], ppo.update

    def make(num_envs, frame_stack, baselines, **_):
        game.append(LifeLosingGame(num_envs, frame_stack))
        game[-1].fire = 1 if baselines else None
        return game[-1]

    monkeypatch.setattr(ppo, "make_envs", make)
    monkeypatch.setattr(
        ppo,
        "update",
        lambda ppo_step, batch, *a: batches.append(batch) or real(ppo_step, batch, *a),
    )
    monkeypatch.setattr(ppo, "evaluate", lambda *a, **k: ([0.0], {}))  # these games never end
    ppo.train(ppo.Args(**FAKE, total_steps=32, protocol=protocol, run_dir=str(tmp_path / "r")))
    actions, acted = batches[0]["actions"].reshape(16, 2), batches[0]["acted"].reshape(16, 2)
    forced_steps = (
        [5, 10, 15] if protocol == "baselines" else []
    )  # rows after the losses at steps 5, 10, 15 (1-based)
    assert acted[:, 1].tolist() == [1.0] * 16
    assert [t for t in range(16) if acted[t, 0] == 0] == forced_steps
    assert all(actions[t, 0] == 1 for t in forced_steps)
    assert len(set(actions[:, 1].tolist())) > 1  # env 1 is sampled from the policy throughout


def test_frame_stack_sets_the_network_and_is_fixed_on_resume(tmp_path, constant_game):
    run = tmp_path / "run"
    ppo.train(ppo.Args(**FAKE, total_steps=32, frame_stack=1, run_dir=str(run)))
    ckpt = load(run)
    assert (
        ckpt["agent"]["network.0.weight"].shape == (32, 1, 8, 8)
        and ckpt["args"]["frame_stack"] == 1
    )
    with pytest.raises(SystemExit, match="was made with --frame-stack 1; pass --frame-stack 1"):
        ppo.train(ppo.Args(**FAKE, total_steps=64, resume=str(run / "checkpoints" / "latest.pt")))
    ppo.train(
        ppo.Args(
            eval_only=True,
            checkpoint=str(run / "checkpoints" / "latest.pt"),
            eval_episodes=2,
            device="cpu",
        )
    )
    assert (
        json.loads((run / "eval.json").read_text())["eval_episodes"] == 2
    )  # eval-only builds the 1-frame network


def test_real_env_stacks_the_requested_frames():
    envs = ppo.make_envs(2, "breakout", 0.0, 200, 1, True)
    obs, _ = envs.reset(seed=0)
    envs.close()
    assert obs.shape == (2, 1, 84, 84) and (obs != 0).any()


# ------------------------------------------------------------------ bad input, in process (fast)
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(num_envs=3, num_steps=5, num_minibatches=4), "not divisible by --num-minibatches"),
        (dict(total_steps=100), "less than one rollout"),
        (dict(total_steps=0), "--total-steps must be positive"),
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(num_minibatches=0), "--num-minibatches must be positive"),
        (dict(update_epochs=0), "--update-epochs must be positive"),
        (dict(learning_rate=-1.0), "--learning-rate must be positive"),
        (dict(clip_coef=0.0), "--clip-coef must be positive"),
        (dict(max_episode_frames=0), "--max-episode-frames must be positive"),
        (dict(frame_stack=0), "--frame-stack must be positive"),
        (dict(gamma=1.5), "--gamma must be in [0, 1]"),
        (dict(gae_lambda=-0.1), "--gae-lambda must be in [0, 1]"),
        (dict(eval_episodes=0), "--eval-episodes must be at least 1"),
        (
            dict(eval_only=True, checkpoint="/nonexistent/latest.pt", eval_episodes=0),
            "--eval-episodes must be at least 1",
        ),
        (dict(checkpoint_interval=-5), "--checkpoint-interval must be >= 0"),
        (dict(eval_interval=-1), "--eval-interval and --checkpoint-interval must be >= 0"),
        (dict(max_grad_norm=0.0), "--max-grad-norm must be positive"),
        (dict(num_steps=0), "--num-steps must be positive"),
        (dict(eval_only=True), "--eval-only needs --checkpoint"),
        (dict(eval_only=True, checkpoint="x.pt", resume="x.pt"), "cannot --resume"),
        (dict(eval_only=True, checkpoint="/nonexistent/latest.pt"), "does not exist"),
        (dict(env_id="CartPole-v1"), "use ppg.py"),
        (dict(env_id="Pendulum-v1"), "use d4pg.py, naf.py or rlpd.py"),
        (dict(env_id="ALE/Pitfall3-v5"), "no such ROM"),
        (dict(resume="/nonexistent/latest.pt"), "does not exist"),
    ],
)
def test_bad_args_in_process(kwargs, fragment, tmp_path):
    args = ppo.Args(**{"run_dir": str(tmp_path / "r"), **kwargs})
    with pytest.raises(SystemExit) as info:
        ppo.train(args)
    message = str(info.value.code)
    assert (
        message.startswith("ppo_atari.py: error:") and fragment in message and "\n" not in message
    ), message
    assert not (tmp_path / "r").exists()  # nothing half-written


# ------------------------------------------------------------------ in process on the real game: exits, eval-only, checkpoints
@pytest.fixture
def tiny_ckpt(tmp_path):
    """A checkpoint of a seed-3 run with 2 stacked frames at step 256, as train() writes it, in <tmp>/run/checkpoints."""
    torch.manual_seed(0)
    agent = ppo.Agent(4, 2)
    state = ppo.checkpoint_state(
        agent, torch.optim.Adam(agent.parameters()), 4, 256, torch.Generator()
    )
    path = tmp_path / "run" / "checkpoints" / "latest.pt"
    args = ppo.Args(seed=3, frame_stack=2, **TINY_ARGS)
    run = SimpleNamespace(args=args, checkpoint=path, stop_if_bad=lambda: None, state=lambda: state)
    ppo.Run.save(run, 256)  # what the run's harness writes
    return path, agent


def test_checkpoint_mismatch_in_process(tiny_ckpt):
    ckpt = str(tiny_ckpt[0])
    with pytest.raises(SystemExit, match="is for BreakoutNoFrameskip-v4; pass --env-id Breakout"):
        ppo.train(ppo.Args(**TINY_ARGS, frame_stack=2, resume=ckpt, env_id="ALE/Pong-v5"))
    with pytest.raises(SystemExit, match="was made with --num-envs 2; pass --num-envs 2"):
        ppo.train(ppo.Args(**{**TINY_ARGS, "num_envs": 4}, frame_stack=2, resume=ckpt))
    with pytest.raises(SystemExit, match="was made with --frame-stack 2; pass --frame-stack 2"):
        ppo.train(ppo.Args(**TINY_ARGS, resume=ckpt))
    with pytest.raises(SystemExit, match="was made with --protocol auto; pass --protocol auto"):
        ppo.train(ppo.Args(**TINY_ARGS, frame_stack=2, resume=ckpt, protocol="machado"))
    old = torch.load(ckpt, weights_only=True)
    del old["args"]["protocol"]  # as written before --protocol existed
    torch.save(old, ckpt)
    with pytest.raises(SystemExit, match="predates --protocol; use the ppo_atari.py that wrote it"):
        ppo.train(ppo.Args(**TINY_ARGS, frame_stack=2, resume=ckpt))
    with pytest.raises(SystemExit, match="--total-steps is below the checkpoint's step; pass 256+"):
        ppo.train(ppo.Args(**TINY_ARGS, frame_stack=2, resume=ckpt, total_steps=128))


@pytest.mark.slow
def test_signal_skips_eval_saves_and_finishes_wandb(
    tmp_path, monkeypatch, restore_signals, fake_wandb, capsys
):
    """SIGTERM in the first step: the rollout (which runs the truncation bootstrap, 10-step games)
    ends, the due evaluation is skipped, the checkpoint is saved, W&B finished, and a second
    signal would kill."""
    cuts, evals, real = [], [], ppo.bootstrap_values

    def spy(agent, final_obs, cut, device):
        if not cuts:
            os.kill(os.getpid(), signal.SIGTERM)
        cuts.append(int(cut.sum()))
        return real(agent, final_obs, cut, device)

    monkeypatch.setattr(ppo, "bootstrap_values", spy)
    monkeypatch.setattr(ppo, "evaluate", lambda *a, **k: evals.append(a) or ([0.0], {}))
    run_dir = tmp_path / "r"
    ppo.train(
        ppo.Args(
            **{**TINY_ARGS, "max_episode_frames": 40},
            total_steps=640,
            eval_interval=64,
            track=True,
            run_dir=str(run_dir),
            device="cpu",
        )
    )
    assert "interrupted: continue with --resume" in capsys.readouterr().out
    assert len(cuts) == 32 and sum(cuts) >= 4  # every 10-step game of both envs was truncated
    assert evals == [] and not (run_dir / "summary.json").exists()
    assert load(run_dir)["global_step"] == 64
    assert fake_wandb.calls == [("init", []), ("finish", 0)]
    assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL == signal.getsignal(signal.SIGTERM)


def test_non_finite_loss_stops_keeps_checkpoint_and_fails_wandb(
    tmp_path, constant_game, fake_wandb, monkeypatch
):
    """A huge learning rate blows the second update up: one line, the checkpoint of step 32 kept as it
    was, no summary, and W&B finished with the failure's exit code."""
    real, calls = ppo.update, []

    def blow_up_second(ppo_step, batch, generator, args, run):
        calls.append(1)
        if len(calls) == 2:  # ppo_step with its agent and optimizer bound
            ppo_step.args[1].param_groups[0]["lr"].fill_(1e38)
        return real(ppo_step, batch, generator, args, run)

    monkeypatch.setattr(ppo, "update", blow_up_second)
    with pytest.raises(
        SystemExit, match="non-finite loss at step 64; try lower learning rates"
    ) as info:
        ppo.train(
            ppo.Args(
                **{**FAKE, "checkpoint_interval": 32},
                total_steps=128,
                track=True,
                run_dir=str(tmp_path / "r"),
            )
        )
    assert "\n" not in str(info.value.code) and load(tmp_path / "r")["global_step"] == 32
    assert fake_wandb.calls == [("init", []), ("finish", 1)]  # the failure's exit code reaches W&B
    assert not (tmp_path / "r" / "summary.json").exists()


@pytest.mark.slow
def test_eval_only_uses_checkpoint_seed_and_run_dir(tiny_ckpt, tmp_path, monkeypatch):
    path, agent = tiny_ckpt
    calls, real = [], ppo.evaluate
    monkeypatch.setattr(
        ppo, "evaluate", lambda *a, **k: calls.append((a[1], *a[2:4])) or real(*a, **k)
    )
    monkeypatch.chdir(tmp_path)  # a relative run dir would land here
    quick = dict(eval_only=True, eval_episodes=1, num_envs=1, device="cpu")
    ppo.train(ppo.Args(**quick, checkpoint=str(path), seed=7, max_episode_frames=108_000))
    result = json.loads((tmp_path / "run" / "eval.json").read_text())  # beside checkpoints/
    atari = dict(
        game="breakout", sticky=0.0, max_frames=200, frame_stack=2, baselines=True
    )  # the run's frame limit, stack, protocol
    assert calls == [(atari, 1, 10_003)]  # the run's seed, as its final evaluation
    returns, extra = real(agent, atari, 1, 10_003, "cpu")
    assert (
        result["seed"] == 3
        and result["eval_returns"] == returns
        and result["eval_capped_games"] == extra["eval_capped_games"]
    )
    moved = tmp_path / "elsewhere" / "x.pt"
    moved.parent.mkdir()
    shutil.copy(path, moved)
    ppo.train(ppo.Args(**quick, checkpoint=str(moved)))
    ppo.train(ppo.Args(**quick, checkpoint=str(path), run_dir=str(tmp_path / "out")))
    assert (tmp_path / "elsewhere" / "eval.json").exists() and (
        tmp_path / "out" / "eval.json"
    ).exists()
    machado = torch.load(path, weights_only=True)
    machado["args"]["protocol"] = "machado"
    torch.save(machado, moved)
    ppo.train(ppo.Args(**quick, checkpoint=str(moved)))
    assert calls[-1][0]["baselines"] is False  # eval-only plays the checkpoint's protocol
    assert not (tmp_path / "runs").exists()


def test_checkpoint_keeps_cuda_rng(monkeypatch):
    """Simulated CUDA: the harness adds the CUDA generators to the two this file draws from."""
    states = [torch.arange(16, dtype=torch.uint8)]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    agent = ppo.Agent(4)
    state = ppo.checkpoint_state(
        agent, torch.optim.Adam(agent.parameters()), 0, 64, torch.Generator()
    )
    assert set(state["rng"]) == {"torch", "minibatch", "cuda"} and torch.equal(
        state["rng"]["cuda"][0], states[0]
    )


@pytest.mark.skipif(
    importlib.util.find_spec("wandb") is not None, reason="checks the message without wandb"
)
def test_track_without_wandb_in_process(tmp_path):
    with pytest.raises(SystemExit, match="--track needs wandb"):
        ppo.train(ppo.Args(track=True, run_dir=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_missing_in_process():
    with pytest.raises(SystemExit, match="CUDA is not available"):
        ppo.train(ppo.Args(device="cuda"))


# ------------------------------------------------------------------ end-to-end, by subprocess
@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("base") / "run"
    proc = run_script(
        SCRIPT,
        *TINY,
        "--total-steps",
        "256",
        "--checkpoint-interval",
        "128",
        "--run-dir",
        str(run_dir),
    )
    check_ok(proc)
    return run_dir, proc


@pytest.mark.slow
def test_run_outputs(base_run):
    run_dir, proc = base_run
    assert "done: 256 steps" in proc.stdout
    s = summary(run_dir)
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
        "eval_capped_games",
        "sps",
    ):
        assert key in s, key
    assert (
        s["script"] == SCRIPT
        and s["algo"] == "ppo_atari"
        and s["global_step"] == 256
        and s["eval_episodes"] == 1
    )
    assert s["sps"] > 0
    config = json.loads((run_dir / "config.json").read_text())
    assert (
        config["num_envs"] == 2
        and config["repeat_action_probability"] == 0.0
        and config["frame_stack"] == 4
    )
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
    ):
        assert scalars(run_dir, tag), tag
    assert scalars(run_dir, "eval/capped_games") == [(256, s["eval_capped_games"])]
    assert [step for step, _ in scalars(run_dir, "losses/value_loss")] == [64, 128, 192, 256]
    lrs = [lr for _, lr in scalars(run_dir, "charts/learning_rate")]
    assert lrs == pytest.approx(
        [2.5e-4 * (1 - k / 4) for k in range(4)]
    )  # annealed to 0 at the end
    ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert (
        ckpt["algo"] == "ppo_atari"
        and ckpt["env_id"] == "BreakoutNoFrameskip-v4"
        and ckpt["global_step"] == 256
    )
    assert (
        ckpt["agent"]["actor.weight"].shape == (4, 512)
        and ckpt["schedule_steps"] == 256
        and ckpt["iteration"] == 4
    )
    assert set(ckpt["rng"]) == {
        "torch",
        "minibatch",
    }  # not python's or numpy's: this file never draws from them


@pytest.mark.slow
def test_same_seed_same_metrics(base_run, tmp_path):
    run_dir, _ = base_run
    proc = run_script(
        SCRIPT,
        *TINY,
        "--total-steps",
        "256",
        "--checkpoint-interval",
        "128",
        "--run-dir",
        str(tmp_path / "b"),
    )
    check_ok(proc)
    for tag in (
        "losses/value_loss",
        "losses/policy_loss",
        "losses/entropy",
        "charts/episodic_return",
    ):
        assert scalars(run_dir, tag) == scalars(tmp_path / "b", tag), tag
    assert summary(run_dir)["eval_returns"] == summary(tmp_path / "b")["eval_returns"]
    other = run_script(
        SCRIPT, *TINY, "--total-steps", "64", "--seed", "2", "--run-dir", str(tmp_path / "c")
    )
    check_ok(
        other
    )  # the control: another seed changes the first update, so the equality above means something
    assert (
        scalars(run_dir, "losses/value_loss")[0] != scalars(tmp_path / "c", "losses/value_loss")[0]
    )


@pytest.mark.slow
def test_resume_continues_step_count_and_curve(base_run, tmp_path):
    """Extending a finished run on the real env with an explicit re-plan of the anneal."""
    run_dir = tmp_path / "run"
    shutil.copytree(base_run[0], run_dir)
    proc = run_script(
        SCRIPT,
        *TINY,
        "--total-steps",
        "512",
        "--schedule-steps",
        "512",
        "--resume",
        str(run_dir / "checkpoints" / "latest.pt"),
    )
    check_ok(proc)
    assert summary(run_dir)["global_step"] == 512
    steps = [step for step, _ in scalars(run_dir, "losses/value_loss")]
    assert steps == [64 * k for k in range(1, 9)]  # no gap, no duplicate
    assert [step for step, _ in scalars(run_dir, "eval/episodic_return")] == [256, 512]
    lrs = [lr for _, lr in scalars(run_dir, "charts/learning_rate")][4:]
    assert lrs == pytest.approx([2.5e-4 * (1 - k / 8) for k in range(4, 8)])
    assert (
        torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["global_step"] == 512
    )


@pytest.mark.slow
def test_copied_alone_runs_v5(tmp_path):
    script = copy_alone(SCRIPT, tmp_path / "alone")
    proc = run_script(
        script, *TINY, "--env-id", "ALE/Breakout-v5", "--total-steps", "64", cwd=tmp_path / "alone"
    )
    check_ok(proc)
    (run_dir,) = (tmp_path / "alone" / "runs").iterdir()
    assert run_dir.name.startswith("ALE-Breakout-v5__ppo_atari__1__")
    assert json.loads((run_dir / "config.json").read_text())["repeat_action_probability"] == 0.25
    assert summary(run_dir)["env_id"] == "ALE/Breakout-v5"


@pytest.mark.slow
def test_eval_only_with_video(base_run, tmp_path):
    run_dir, _ = base_run
    out = tmp_path / "eval"
    proc = run_script(
        SCRIPT,
        "--eval-only",
        "--checkpoint",
        str(run_dir / "checkpoints" / "latest.pt"),
        "--eval-episodes",
        "2",
        "--seed",
        "7",
        "--capture-video",
        "--run-dir",
        str(out),
    )
    check_ok(proc)
    result = json.loads((out / "eval.json").read_text())
    assert (
        result["global_step"] == 256
        and result["eval_episodes"] == 2
        and len(result["eval_returns"]) == 2
    )
    assert (
        result["seed"] == 1 and 0 <= result["eval_capped_games"] <= 2
    )  # the run's own seed, not --seed
    assert "eval_video_return" in result and "eval at step 256" in proc.stdout
    videos = list((out / "videos").glob("*.mp4"))
    assert videos and videos[0].stat().st_size > 1000


@pytest.mark.slow
def test_sigterm_saves_checkpoint_and_exits_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ALGOS / SCRIPT),
        *TINY,
        "--total-steps",
        "1000000",
        "--checkpoint-interval",
        "0",
        "--run-dir",
        str(run_dir),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.stdout.readline().startswith("step ")  # a progress line: training is under way
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "interrupted" in out
    ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert 0 < ckpt["global_step"] < 1_000_000 and ckpt["global_step"] % 64 == 0
    assert not (run_dir / "summary.json").exists()


# ------------------------------------------------------------------ bad input, by subprocess
@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path):
    check_error(run_script(SCRIPT, "--env-id", "CartPole-v1"), "ppo_atari.py: error:", "ppg.py")
    foreign = tmp_path / "dqn.pt"
    torch.save(
        {
            "algo": "dqn_atari",
            "env_id": "BreakoutNoFrameskip-v4",
            "args": {},
            "agent": {},
            "global_step": 0,
        },
        foreign,
    )
    check_error(
        run_script(SCRIPT, "--eval-only", "--checkpoint", str(foreign)), "written by dqn_atari"
    )
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    check_error(run_script(SCRIPT, "--resume", str(corrupt)), "corrupt")
