"""Tests for algos/dqn_atari.py: the frame-deduplicated replay memory against a naive one that
stores whole stacks (fake and real env streams) and its resident size (results/dqn_memory.py),
life-loss flags under both life/FIRE protocols (FIRE forced after a lost life in training,
evaluation and the real game), the TD target and schedules by hand, the forward pass leaving the
caller's frames alone, env ids against ale_py's ROMs and Gymnasium's registry, resume equivalence on
a deterministic game (weights, optimizer, replay, RNG and logged metrics as the uninterrupted run),
the epsilon horizon kept across a resume, seeding (CUBLAS_WORKSPACE_CONFIG before the networks
exist, same seed same run, another seed another run), W&B finished with the run's exit code,
eval-only's env/seed from the checkpoint, signals, tiny runs by subprocess (outputs, copy-alone,
video, SIGTERM), and every bad-input message."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    ALGOS,
    ScriptedGames,
    check_error,
    check_eval_only_after_move,
    check_ok,
    copy_alone,
    run_script,
    scalars,
    sigterm_on_call,
    summary,
)

spec = importlib.util.spec_from_file_location("dqn_atari", ALGOS / "dqn_atari.py")
dqn = importlib.util.module_from_spec(spec)
sys.modules["dqn_atari"] = dqn  # dataclasses look the module up while the file executes
spec.loader.exec_module(dqn)

TINY = [
    "--total-steps",
    "600",
    "--learning-starts",
    "200",
    "--batch-size",
    "8",
    "--buffer-size",
    "1000",
    "--max-episode-frames",
    "2000",
    "--eval-episodes",
    "1",
    "--checkpoint-interval",
    "0",
    "--eval-interval",
    "300",
    "--device",
    "cpu",
]


def load(path) -> dict:
    return torch.load(path, weights_only=True)


# ---------------------------------------------------------------- replay memory vs. a naive reference
class NaiveReplay:
    """Stores full stacked s and s' per transition: the obviously correct, 4x larger reference."""

    def __init__(self):
        self.items = []

    def add(self, obs, action, reward, next_obs, done):
        ids = []
        for e in range(len(obs)):
            ids.append(len(self.items))
            self.items.append(
                (obs[e].copy(), next_obs[e].copy(), int(action[e]), float(reward[e]), bool(done[e]))
            )
        return ids


class FakeAtari:
    """A vector env with AtariVectorEnv's SameStep semantics and its reset stacks (zeros, then the
    first frame); frames are random so any mixing of two games is visible. Terminations,
    truncations, life losses and bonus lives happen at random; `life_lost` is the truth."""

    fire = None  # drive() presses its own actions

    def __init__(self, num_envs, rng, shape=(7, 7)):
        self.n, self.rng, self.shape = num_envs, rng, shape
        self.stacks = np.zeros((num_envs, 4, *shape), np.uint8)
        self.lives = np.full(num_envs, 3)
        self.life_lost = np.zeros(num_envs, np.bool_)

    def _reset(self, e):
        self.stacks[e] = 0
        self.stacks[e, -1] = self.rng.integers(1, 256, self.shape)
        self.lives[e] = 3

    def reset(self, seed=None):
        for e in range(self.n):
            self._reset(e)
        return self.stacks.copy(), {"lives": self.lives.copy()}

    def step(self, actions):
        self.stacks = np.roll(self.stacks, -1, axis=1)
        self.stacks[:, -1] = self.rng.integers(1, 256, (self.n, *self.shape))
        reward = self.rng.integers(-2, 3, self.n).astype(np.float32)
        truncated = self.rng.random(self.n) < 0.03  # (the frame cap: no life is lost on that step)
        self.life_lost = ~truncated & (self.rng.random(self.n) < 0.05)
        self.lives += (
            ~truncated & ~self.life_lost & (self.rng.random(self.n) < 0.05)
        )  # bonus lives: a game can end above 3
        self.lives -= self.life_lost
        terminated = self.lives == 0
        final = self.stacks.copy()
        for e in np.flatnonzero(terminated | truncated):
            self._reset(e)
        self.last = (
            self.stacks.copy(),
            reward,
            terminated,
            truncated,
            {"lives": self.lives.copy(), "final_obs": final},
        )
        return self.last


class IdBuffer(dqn.FrameReplayBuffer):
    """FrameReplayBuffer that keeps the flat ids its last add() gave the new transitions."""

    def add(self, *args):
        self.added = super().add(*args)
        return self.added


def drive(env, buffer, naive, steps, rng):
    """The training loop's own bookkeeping (LifeProtocol under baselines, store_step) feeds the
    buffer (an IdBuffer); the naive memory gets whole stacks and d from the env's truth (its raw step
    `env.last`, `env.life_lost`). Returns {flat id: naive id}."""
    envs = dqn.LifeProtocol(env, baselines=True)
    obs, mapping = envs.reset(seed=3), {}
    for _ in range(steps):
        actions = rng.integers(0, 4, env.n)
        step = envs.step(actions)
        dqn.store_step(buffer, obs, step)
        next_obs, reward, terminated, truncated, info = env.last
        flat = buffer.added
        real_next = np.stack(
            [
                info["final_obs"][e] if terminated[e] or truncated[e] else next_obs[e]
                for e in range(env.n)
            ]
        )
        # a flat id that is reused now refers to the newer transition
        mapping.update(
            zip(
                flat.tolist(),
                naive.add(obs, actions, np.sign(reward), real_next, terminated | env.life_lost),
            )
        )
        obs = next_obs
    return mapping


def test_store_step_marks_only_real_life_losses():
    """One vector step through LifeProtocol and store_step, one case per env: a truncation ending a
    game that had a bonus life (the next game starts with fewer lives: no life was lost), a life lost
    mid-game, a bonus life, a game over. FIRE is forced next where a life was lost, and only there."""
    rb = IdBuffer(64, 4, frame_shape=(7, 7))
    rng = np.random.default_rng(0)
    obs, next_obs, final = (rng.integers(1, 256, (4, 4, 7, 7)).astype(np.uint8) for _ in range(3))
    lives = np.array([4, 3, 3, 1])
    info = {"lives": np.array([3, 2, 4, 3]), "final_obs": final}
    terminated, truncated = (
        np.array([False, False, False, True]),
        np.array([True, False, False, False]),
    )
    reward = np.array([2.0, -3.0, 0.0, 1.0])

    class OneStep:
        fire = 9  # FIRE is forced exactly where a life was lost

        def reset(self, seed=None):
            return obs, {"lives": lives}

        def step(self, actions):
            return next_obs, reward, terminated, truncated, info

    envs = dqn.LifeProtocol(OneStep(), baselines=True)
    envs.reset(seed=0)
    step = envs.step(np.arange(4))
    dqn.store_step(rb, obs, step)
    ended, new_lives, lost = step.ended, envs.lives, envs.forced
    s, s_next, a, r, d = rb.get(rb.added)
    assert d.tolist() == [False, True, False, True] and lost.tolist() == [
        False,
        True,
        False,
        False,
    ]  # the truncation still bootstraps
    assert ended.tolist() == [True, False, False, True] and new_lives.tolist() == [3, 2, 4, 3]
    assert r.tolist() == [1.0, -1.0, 0.0, 1.0] and a.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(s[:, -1], obs[:, -1])
    np.testing.assert_array_equal(
        s_next[:, -1], np.where(ended[:, None, None], final[:, -1], next_obs[:, -1])
    )


def assert_same(buffer, naive, mapping, ids):
    s, s_next, a, r, d = buffer.get(np.asarray(ids))
    for k, i in enumerate(ids):
        ref = naive.items[mapping[i]]
        np.testing.assert_array_equal(s[k], ref[0])
        np.testing.assert_array_equal(s_next[k], ref[1])
        assert (a[k], r[k], d[k]) == ref[2:]


@pytest.mark.parametrize("num_envs,capacity", [(1, 60), (3, 150), (4, 4000)])
def test_buffer_matches_naive_on_synthetic_stream(num_envs, capacity):
    rng = np.random.default_rng(num_envs)
    buffer = IdBuffer(capacity, num_envs, frame_shape=(7, 7))
    naive = NaiveReplay()
    mapping = drive(FakeAtari(num_envs, rng), buffer, naive, 400, rng)
    ids = np.flatnonzero(buffer.valid.reshape(-1))
    assert len(ids) > 0.6 * min(capacity, 400 * num_envs)  # the ring is mostly usable
    assert_same(buffer, naive, mapping, ids.tolist())
    # every transition of the last third of each env's ring is still sampleable (nothing lost wrongly)
    recent = [
        i for i, t in mapping.items() if t >= len(naive.items) - num_envs * (buffer.slots // 3)
    ]
    assert buffer.valid.reshape(-1)[recent].all()
    # stored boundaries really occurred: some zero-padded stacks, some d=1, some truncated s' kept
    s, s_next, _, _, d = buffer.get(ids)
    assert (s[:, 0] == 0).all(axis=(1, 2)).any() and d.any() and not d.all()
    # sampling draws valid ids only, and returns exactly get() of them
    sample_rng = np.random.default_rng(0)
    sampled = buffer.sample_ids(256, sample_rng)
    assert buffer.valid.reshape(-1)[sampled].all()
    assert_same(buffer, naive, mapping, sampled.tolist())
    batch = buffer.sample(256, np.random.default_rng(0))
    for x, y in zip(batch, buffer.get(sampled)):  # as tensors
        np.testing.assert_array_equal(x.numpy(), y)
    # a round trip through the checkpoint form keeps every transition (the envs restart afterwards)
    restored = dqn.FrameReplayBuffer(capacity, num_envs, frame_shape=(7, 7))
    restored.load_state_dict(buffer.state_dict())
    assert_same(restored, naive, mapping, ids.tolist())
    assert restored.need_start.all()


def test_buffer_matches_naive_on_real_env_stream():
    """AtariVectorEnv's own reset stacks, life losses, game overs and truncations, two envs, ring wrap."""

    class Real:
        n = 2
        fire = None  # drive() presses its own actions

        def __init__(self):
            self.env = dqn.make_envs(dqn.Args(max_episode_frames=600), 2)

        def reset(self, seed):
            obs, info = self.env.reset(seed=seed)
            assert (obs[:, :3] == 0).all() and (
                obs[:, 3] > 0
            ).any()  # the padding the buffer reproduces
            self.lives = info["lives"].copy()
            return obs, info

        def step(self, actions):
            out = self.last = self.env.step(actions)
            # Breakout has no bonus lives and a new game starts with the most, so a drop is exact here
            self.life_lost, self.lives = out[4]["lives"] < self.lives, out[4]["lives"].copy()
            return out

    rng = np.random.default_rng(0)
    env = Real()
    buffer, naive = IdBuffer(2 * 200, 2), NaiveReplay()
    mapping = drive(env, buffer, naive, 700, rng)
    ends = sum(1 for item in naive.items if (item[0][:3] == 0).all())
    assert ends >= 4  # several games started inside the stream
    assert any(item[4] for item in naive.items)  # life losses / game overs as d = 1
    ids = np.flatnonzero(buffer.valid.reshape(-1))
    assert len(ids) > 300
    assert_same(buffer, naive, mapping, ids.tolist())


def test_a_full_memory_adds_each_frame_once_to_the_resident_memory():
    """results/dqn_memory.py (the measurement behind results/dqn_atari-measurements.md) at 6,000
    transitions: the resident memory it adds is each frame once, 6,000 x 84 x 84 bytes (40.4 MiB),
    plus 15 bytes of action, reward and flags per transition; an empty memory, or one storing each
    4-frame stack, falls outside."""
    proc = run_script(ALGOS.parent / "results" / "dqn_memory.py", "--capacity", "6000")
    check_ok(proc)
    grown = re.search(
        r"filled 6,000 transitions in \d+ s: RSS [\d,]+ MB, \+([\d.,]+) MB over the baseline",
        proc.stdout,
    )
    frames_mb = 6000 * 84 * 84 / 2**20
    assert grown and 0.9 * frames_mb < float(grown.group(1).replace(",", "")) < frames_mb + 12, (
        proc.stdout
    )
    assert "1000 batches of 32 sampled" in proc.stdout


# ---------------------------------------------------------------- math, network, env ids
def test_td_target_and_schedule_by_hand():
    r = torch.tensor([1.0, -1.0, 0.0])
    d = torch.tensor([0.0, 1.0, 0.0])
    q_next = torch.tensor([[1.0, 3.0], [5.0, 2.0], [-1.0, -2.0]])
    torch.testing.assert_close(
        dqn.td_target(r, d, q_next, 0.5), torch.tensor([1.0 + 1.5, -1.0, -0.5])
    )
    assert dqn.linear_schedule(1.0, 0.01, 100, 0) == 1.0
    assert dqn.linear_schedule(1.0, 0.01, 100, 50) == pytest.approx(0.505)
    assert dqn.linear_schedule(1.0, 0.01, 100, 1000) == 0.01
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    expected = 0.25 * a.weight.data + 0.75 * b.weight.data
    dqn.Run.polyak(b, a, 0.25)
    torch.testing.assert_close(b.weight.data, expected)
    dqn.Run.polyak(b, a, 1.0)  # the paper's hard copy, exact in every bit
    assert all(torch.equal(p_t, p) for p_t, p in zip(b.parameters(), a.parameters()))


def test_forward_leaves_the_callers_frames_alone():
    """A float input (plain or already channels_last, where .contiguous() and .float() return the same
    tensor) is not divided by 255 in place; the output is the network applied to x / 255."""
    torch.manual_seed(0)
    net = dqn.QNetwork(4)
    frames = torch.randint(0, 256, (2, 4, 84, 84)).float()
    for x in (frames.clone(), frames.clone().contiguous(memory_format=torch.channels_last)):
        out = net(x)
        torch.testing.assert_close(x, frames, rtol=0, atol=0)
        torch.testing.assert_close(out, net.net(frames / 255.0))
    torch.testing.assert_close(net(frames.to(torch.uint8)), net.net(frames / 255.0))


def test_every_gymnasium_atari_id_maps_to_its_rom():
    """Gymnasium's registry (ale_py registers it) names the ROM of each id: ours must agree, including
    ALE/Pitfall2-v5, ALE/TicTacToe3D-v5 and ALE/Atlantis2-v5, which the old pattern mangled."""
    import ale_py

    gym.register_envs(ale_py)
    ids = [
        i
        for i in gym.registry
        if "-ram" not in i
        and (i.startswith("ALE/") and i.endswith("-v5") or i.endswith("NoFrameskip-v4"))
    ]
    assert {
        "ALE/Pitfall2-v5",
        "ALE/TicTacToe3D-v5",
        "ALE/Atlantis2-v5",
        "MsPacmanNoFrameskip-v4",
    } <= set(ids) and len(ids) > 150
    for env_id in ids:
        assert dqn.atari_protocol(env_id) == (
            gym.spec(env_id).kwargs["game"],
            0.25 if env_id.endswith("-v5") else 0.0,
        ), env_id
    assert dqn.atari_protocol("TicTacToe3DNoFrameskip-v4") == (
        "tic_tac_toe_3d",
        0.0,
    )  # every ROM, registered as v4 or not
    assert ale_py.roms.get_rom_path("tic_tac_toe_3d")


@pytest.mark.parametrize(
    "env_id, fragment",
    [
        ("NoSuchGameNoFrameskip-v4", "no Atari ROM named 'NoSuchGame'"),
        ("ALE/Tictactoe3d-v5", "no Atari ROM named 'Tictactoe3d'"),
        ("CartPole-v1", "'CartPole-v1' is not a pixel Atari id"),
        ("CartPole-v1", "ppg.py"),
        ("Pendulum-v1", "d4pg.py, naf.py or rlpd.py"),
        ("Breakout-ram-v4", "use ppg.py"),
        ("ALE/Breakout-ram-v5", "use ppg.py"),
        ("Nonsense", "is not a pixel Atari id"),
    ],
)
def test_unknown_env_ids_refused_in_one_line(env_id, fragment):
    with pytest.raises(SystemExit) as e:
        dqn.atari_protocol(env_id)
    assert (
        str(e.value).startswith("dqn_atari.py: error:")
        and "\n" not in str(e.value)
        and fragment in str(e.value)
    )


# ---------------------------------------------------------------- in process, on a deterministic game
class FakeGames:
    """AtariVectorEnv's interface (SameStep autoreset) on a deterministic game: every game lasts L steps,
    a life is lost at step L // 2, frames and rewards depend only on the step within the game and the
    action, never on the seed. So restarting the games at a game boundary, as a resume does, changes
    nothing, and a resumed run can be compared with the uninterrupted one step for step."""

    L = 20
    frames = np.random.default_rng(0).integers(
        0, 256, (L + 1, 4, 84, 84), dtype=np.uint8
    )  # [step in game, action]

    def __init__(self, args, num_envs):
        self.n, self.single_action_space = num_envs, gym.spaces.Discrete(4)
        self.fire = 1 if dqn.resolve_protocol(args.protocol, args.env_id) == "baselines" else None

    def _start(self, e):
        self.t[e], self.stack[e] = 0, 0
        self.stack[e, -1] = self.frames[0, 0]

    def reset(self, seed=None):
        self.t, self.stack = np.zeros(self.n, np.int64), np.zeros((self.n, 4, 84, 84), np.uint8)
        for e in range(self.n):
            self._start(e)
        return self.stack.copy(), {"lives": np.full(self.n, 3)}

    def step(self, actions):
        self.t += 1
        self.stack = np.roll(self.stack, -1, axis=1)
        self.stack[:, -1] = self.frames[self.t, actions]
        reward, terminated, final = (
            (actions == self.t % 4).astype(np.float32),
            self.t == self.L,
            self.stack.copy(),
        )
        for e in np.flatnonzero(terminated):
            self._start(e)
        lives = np.where(self.t >= self.L // 2, 2, 3)
        return (
            self.stack.copy(),
            reward,
            terminated,
            np.zeros(self.n, np.bool_),
            {"lives": lives, "final_obs": final},
        )

    def close(self):
        pass


FAST = dict(
    learning_starts=40,
    batch_size=4,
    buffer_size=300,
    train_frequency=1,
    target_network_frequency=50,
    eval_episodes=1,
    eval_interval=100,
    checkpoint_interval=0,
    device="cpu",
)


@pytest.fixture
def fake_games(monkeypatch, restore_signals):
    monkeypatch.setattr(dqn, "make_envs", FakeGames)


@pytest.mark.slow
def test_resume_is_the_uninterrupted_run(tmp_path, monkeypatch, fake_games):
    """Cut by SIGTERM at step 120 (a game boundary) and resumed, a run ends with the same networks,
    optimizer, replay memory and RNG as the run that never stopped, and logs the same losses, episode
    returns and evaluations after the cut. At the cut, each restored piece holds state that the
    continuation depends on (a target network that lags, Adam moments, a used generator, a replay
    memory), so forgetting any of them would show."""
    args = dict(FAST, total_steps=220, learning_starts=20)
    dqn.train(dqn.Args(**args, run_dir=str(tmp_path / "whole")))
    real_store = dqn.store_step
    monkeypatch.setattr(dqn, "store_step", sigterm_on_call(120, real_store)[0])
    dqn.train(dqn.Args(**args, run_dir=str(tmp_path / "cut")))
    monkeypatch.setattr(dqn, "store_step", real_store)
    path = tmp_path / "cut" / "checkpoints" / "latest.pt"
    cut = load(path)
    assert (
        cut["global_step"] == 120
        and cut["updates"] == 100
        and not (tmp_path / "cut" / "summary.json").exists()
    )
    assert any(
        not torch.equal(cut["q_network"][k], cut["target_network"][k]) for k in cut["q_network"]
    )
    assert cut["optimizer"]["state"] and cut["buffer"]["valid"].any()
    assert cut["rng"]["numpy"] != np.random.default_rng(1).bit_generator.state

    dqn.train(dqn.Args(**args, resume=str(path)))
    whole, resumed = load(tmp_path / "whole" / "checkpoints" / "latest.pt"), load(path)
    assert (
        resumed["global_step"] == whole["global_step"] == 220
        and resumed["updates"] == whole["updates"] == 200
    )
    for part in ("q_network", "target_network"):
        for key in whole[part]:
            torch.testing.assert_close(resumed[part][key], whole[part][key], rtol=0, atol=0)
        assert not torch.equal(
            resumed[part]["net.0.weight"], cut[part]["net.0.weight"]
        )  # it trained after the cut
    for i, state in whole["optimizer"]["state"].items():
        for key in state:
            torch.testing.assert_close(
                resumed["optimizer"]["state"][i][key], state[key], rtol=0, atol=0
            )
    for key in whole["buffer"]:
        torch.testing.assert_close(resumed["buffer"][key], whole["buffer"][key], rtol=0, atol=0)
    assert resumed["rng"]["numpy"] == whole["rng"]["numpy"] and torch.equal(
        resumed["rng"]["torch"], whole["rng"]["torch"]
    )
    for tag in (
        "losses/td_loss",
        "losses/q_values",
        "charts/episodic_return",
        "charts/episodic_length",
        "eval/episodic_return",
    ):
        after = [(step, value) for step, value in scalars(tmp_path / "whole", tag) if step > 120]
        assert after and scalars(tmp_path / "cut", tag) == scalars(tmp_path / "whole", tag), (
            tag
        )  # one curve, no repeated point
    assert [step for step, _ in scalars(tmp_path / "cut", "eval/episodic_return")] == [
        100,
        200,
        220,
    ]
    assert summary(tmp_path / "cut")["eval_returns"] == summary(tmp_path / "whole")["eval_returns"]


def test_cublas_workspace_is_set_before_the_networks_exist(tmp_path, monkeypatch, fake_games):
    """CUBLAS_WORKSPACE_CONFIG (deterministic cuBLAS, read when CUDA starts) is set before any network
    exists, so before CUDA could be used."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = []

    class Recording(dqn.QNetwork):
        def __init__(self, n_actions):
            seen.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
            super().__init__(n_actions)

    monkeypatch.setattr(dqn, "QNetwork", Recording)
    dqn.train(dqn.Args(**FAST, total_steps=40, run_dir=str(tmp_path / "run")))
    assert seen == [":4096:8", ":4096:8"]


def test_wandb_finishes_with_the_exit_code(tmp_path, monkeypatch, fake_games, fake_wandb):
    """W&B starts before the TensorBoard writer and finishes with exit code 0 after a run, 1 after a crash."""
    dqn.train(dqn.Args(**FAST, total_steps=40, track=True, run_dir=str(tmp_path / "ok")))
    assert fake_wandb.calls == [("init", []), ("finish", 0)]
    assert summary(tmp_path / "ok")["global_step"] == 40
    fake_wandb.calls.clear()
    real_store, calls = dqn.store_step, []

    def crash_at_step_30(*args):
        calls.append(1)
        if len(calls) == 30:
            raise RuntimeError("emulator crashed")
        return real_store(*args)

    monkeypatch.setattr(dqn, "store_step", crash_at_step_30)
    with pytest.raises(RuntimeError, match="emulator crashed"):
        dqn.train(dqn.Args(**FAST, total_steps=40, track=True, run_dir=str(tmp_path / "crash")))
    assert fake_wandb.calls == [("init", []), ("finish", 1)]


def test_nonfinite_loss_stops_in_one_line_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch, fake_games, fake_wandb
):
    """A NaN loss at the first update (step 41) stops the run in one line (W&B finished with exit code
    1); the checkpoint of step 40 stays as it was and no summary.json is written."""
    real_update = dqn.update
    monkeypatch.setattr(
        dqn,
        "update",
        lambda *a, **k: (lambda losses: {**losses, "td_loss": losses["td_loss"] * float("nan")})(
            real_update(*a, **k)
        ),
    )
    run = tmp_path / "nan"
    with pytest.raises(SystemExit, match="non-finite loss at step 41;") as e:
        dqn.train(
            dqn.Args(
                **{**FAST, "checkpoint_interval": 20}, total_steps=100, track=True, run_dir=str(run)
            )
        )
    assert str(e.value).startswith("dqn_atari.py: error:") and "\n" not in str(e.value)
    assert fake_wandb.calls == [("init", []), ("finish", 1)]
    assert (
        load(run / "checkpoints" / "latest.pt")["global_step"] == 40
        and not (run / "summary.json").exists()
    )


@pytest.mark.slow
def test_same_seed_same_run_other_seed_other_run(tmp_path, restore_signals):
    """Three in-process runs on the real game: seeds 1, 1 and 2. The first two agree in every logged
    number, the final weights and the evaluation; the third differs (so the agreement means something)."""
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        dqn.train(
            dqn.Args(
                seed=seed,
                total_steps=200,
                learning_starts=100,
                train_frequency=1,
                batch_size=4,
                buffer_size=1000,
                max_episode_frames=400,
                eval_episodes=1,
                eval_interval=0,
                checkpoint_interval=0,
                device="cpu",
                run_dir=str(tmp_path / name),
            )
        )
    a, b, c = (load(tmp_path / name / "checkpoints" / "latest.pt") for name in "abc")
    for tag in (
        "losses/td_loss",
        "losses/q_values",
        "charts/episodic_return",
        "charts/episodic_length",
        "eval/episodic_return",
    ):
        assert scalars(tmp_path / "a", tag) == scalars(tmp_path / "b", tag), tag
    assert scalars(tmp_path / "a", "losses/td_loss")  # updates 1 and 101 were logged
    assert all(torch.equal(a["q_network"][k], b["q_network"][k]) for k in a["q_network"])
    assert torch.equal(a["buffer"]["frames"], b["buffer"]["frames"]) and torch.equal(
        a["buffer"]["actions"], b["buffer"]["actions"]
    )
    # another seed: another initialisation, other random actions and no-op starts
    assert not torch.equal(a["q_network"]["net.0.weight"], c["q_network"]["net.0.weight"])
    assert not torch.equal(a["buffer"]["frames"], c["buffer"]["frames"]) and not torch.equal(
        a["buffer"]["actions"], c["buffer"]["actions"]
    )


def test_signal_skips_due_evaluation_saves_and_second_signal_kills(
    tmp_path, monkeypatch, fake_games
):
    """SIGTERM on the step that reaches 100, where an evaluation is due: no evaluation, a checkpoint
    at step 100, no summary.json, and both handlers back to the default so a second signal kills."""
    real_eval, evals = dqn.evaluate, []
    stepping, steps = sigterm_on_call(100, dqn.store_step)
    monkeypatch.setattr(dqn, "store_step", stepping)
    monkeypatch.setattr(dqn, "evaluate", lambda *a, **k: evals.append(1) or real_eval(*a, **k))
    run = tmp_path / "run"
    dqn.train(dqn.Args(**{**FAST, "learning_starts": 1000}, total_steps=1000, run_dir=str(run)))
    assert len(steps) == 100 and evals == [] and not (run / "summary.json").exists()
    assert load(run / "checkpoints" / "latest.pt")["global_step"] == 100
    assert (
        signal.getsignal(signal.SIGINT) is signal.SIG_DFL
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )


def test_evaluation_gives_way_to_a_stop_signal(monkeypatch):
    """With a stop signal already caught, evaluation plays no step (the logger ignores its result)."""
    games = ScriptedGames([{6: "term"}, {6: "term"}])
    monkeypatch.setattr(dqn, "make_envs", lambda args, n: games)
    args, cpu = dqn.Args(eval_epsilon=0.0), torch.device("cpu")
    assert dqn.evaluate(Noop(), args, cpu, 2, stop=[signal.SIGTERM]) == [0.0, 0.0]
    assert games.actions == []


@pytest.mark.parametrize("protocol", ["baselines", "machado"])
def test_rollout_forces_fire_after_a_lost_life_into_the_replay(tmp_path, fake_games, protocol):
    """Each FakeGames game fills 21 replay slots (20 transitions, then its final frame) and loses a life on
    its 10th step (slot 9). Baselines: d = 1 there, and the next transition (slot 10) is FIRE (1), stored
    as taken; machado: d = 1 only at the game overs (slot 19) and slot 10 holds the epsilon-greedy action."""
    dqn.train(
        dqn.Args(
            **{**FAST, "learning_starts": 1000, "eval_interval": 0},
            start_e=1.0,
            end_e=1.0,
            total_steps=100,
            protocol=protocol,
            run_dir=str(tmp_path / "r"),
        )
    )
    buffer = load(tmp_path / "r" / "checkpoints" / "latest.pt")["buffer"]
    first, dones, actions = (buffer[key][:105, 0].numpy() for key in ("first", "dones", "actions"))
    slot = np.arange(105) % 21
    assert np.flatnonzero(first).tolist() == [
        0,
        21,
        42,
        63,
        84,
    ]  # the layout the slots above assume
    assert (
        np.flatnonzero(dones).tolist()
        == np.flatnonzero((slot == 19) | (slot == 9) & (protocol == "baselines")).tolist()
    )
    assert (actions[slot == 10] == 1).all() == (protocol == "baselines")
    assert len(set(actions[slot < 9].tolist())) > 1  # the other steps are the agent's (here random)
    assert summary(tmp_path / "r")["protocol"] == protocol


class Noop(torch.nn.Module):
    """Q-values whose argmax is NOOP (action 0) everywhere."""

    def forward(self, x):
        return torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(len(x), -1)


def test_evaluate_presses_fire_after_a_lost_life(monkeypatch):
    """The step after env 0 loses a life (step 2) presses FIRE (action 1) whatever the greedy policy
    picks; env 1 never loses one and is never forced."""
    games = ScriptedGames([{2: "life", 6: "term"}, {6: "term"}])
    monkeypatch.setattr(dqn, "make_envs", lambda args, n: games)
    assert dqn.evaluate(Noop(), dqn.Args(eval_epsilon=0.0), torch.device("cpu"), 2) == [6.0, 6.0]
    assert [a.tolist() for a in games.actions] == [[0, 0], [0, 0], [1, 0], [0, 0], [0, 0], [0, 0]]


@pytest.mark.parametrize("protocol", ["baselines", "machado"])
def test_noop_policy_on_real_breakout_follows_the_protocol(protocol, monkeypatch):
    """A greedy NOOP policy on the real game: under baselines FIRE launches the ball at reset and after each
    of the first 4 lost lives, so all 5 are lost and the game ends; under machado the ball is never launched
    and the game runs to the frame limit with score 0. (FIRE at reset only would lose one life, then stall.)"""
    real, fires, ends = dqn.make_envs, [], []

    def spy(args, n):
        env = real(args, n)
        assert env.fire == (1 if protocol == "baselines" else None)
        step = env.step

        def recording_step(actions):
            out = step(actions)
            fires.append(int(actions[0] == 1))
            ends.append((bool(out[2][0]), bool(out[3][0])))
            return out

        env.step = recording_step
        return env

    monkeypatch.setattr(dqn, "make_envs", spy)
    returns = dqn.evaluate(
        Noop(),
        dqn.Args(protocol=protocol, max_episode_frames=20_000, eval_epsilon=0.0),
        torch.device("cpu"),
        1,
    )
    assert ends[-1] == ((True, False) if protocol == "baselines" else (False, True))
    assert sum(fires) == (4 if protocol == "baselines" else 0)
    assert protocol == "baselines" or returns == [0.0]


def test_eval_only_plays_the_checkpoints_protocol(tmp_path, monkeypatch, restore_signals):
    """--eval-only evaluates under the run's --protocol (not the one passed now), and under auto for a
    checkpoint written before the flag existed."""
    seen = []
    monkeypatch.setattr(
        dqn, "evaluate", lambda q_network, run, *a, **k: seen.append(run.protocol) or [0.0]
    )
    for name, run_args in (
        ("old", {k: v for k, v in asdict(dqn.Args()).items() if k != "protocol"}),
        ("new", asdict(dqn.Args(protocol="machado"))),
    ):
        path = tmp_path / name / "latest.pt"
        path.parent.mkdir()
        torch.save(
            {
                "algo": "dqn_atari",
                "env_id": "BreakoutNoFrameskip-v4",
                "args": run_args,
                "n_actions": 4,
                "q_network": dqn.QNetwork(4).state_dict(),
                "global_step": 5,
            },
            path,
        )
        dqn.train(
            dqn.Args(eval_only=True, checkpoint=str(path), protocol="baselines", device="cpu")
        )
    assert seen == ["auto", "machado"]


@pytest.mark.slow
def test_eval_only_takes_env_seed_and_protocol_from_checkpoint(tmp_path, restore_signals):
    """A Pong checkpoint of a seed-7 run, evaluated without --env-id or --seed: the run's own evaluation."""
    torch.manual_seed(0)
    net = dqn.QNetwork(6)
    run_args = dqn.Args(env_id="ALE/Pong-v5", seed=7, max_episode_frames=240, eval_epsilon=0.5)
    path = tmp_path / "run" / "checkpoints" / "latest.pt"
    path.parent.mkdir(parents=True)
    torch.save(
        {
            "algo": "dqn_atari",
            "env_id": run_args.env_id,
            "args": asdict(run_args),
            "n_actions": 6,
            "q_network": net.state_dict(),
            "global_step": 5,
        },
        path,
    )
    dqn.train(dqn.Args(eval_only=True, checkpoint=str(path), eval_episodes=2, device="cpu"))
    result = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert (result["env_id"], result["seed"], result["global_step"], result["eval_episodes"]) == (
        "ALE/Pong-v5",
        7,
        5,
        2,
    )
    assert result["eval_returns"] == dqn.evaluate(net, run_args, torch.device("cpu"), 2)


# ---------------------------------------------------------------- end to end on the real game
@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dqn") / "run"
    check_ok(run_script("dqn_atari.py", *TINY, "--seed", "3", "--run-dir", str(run_dir)))
    return run_dir


@pytest.mark.slow
def test_tiny_run_outputs(base_run):
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
    ):
        assert key in s
    assert (
        s["global_step"] == 600
        and s["eval_episodes"] == 1
        and s["script"] == "dqn_atari.py"
        and "interrupted" not in s
    )
    assert s["sps"] > 0
    assert json.loads((base_run / "config.json").read_text())["exploration_steps"] == pytest.approx(
        60
    )  # 0.1 x 600
    for tag in (
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/SPS",
        "charts/learning_rate",
        "losses/td_loss",
        "eval/episodic_return",
    ):
        assert scalars(base_run, tag), tag
    assert [step for step, _ in scalars(base_run, "eval/episodic_return")] == [300, 600]
    for tag in (
        "charts/SPS",
        "charts/learning_rate",
        "charts/epsilon",
    ):  # every 1000 steps and at the end
        assert [step for step, _ in scalars(base_run, tag)] == [600], tag
    ckpt = load(base_run / "checkpoints" / "latest.pt")
    assert (
        ckpt["algo"] == "dqn_atari"
        and ckpt["global_step"] == 600
        and ckpt["updates"] == (600 - 200) // 4
    )
    assert set(ckpt["rng"]) == {
        "torch",
        "numpy",
    }  # exactly the generators the run draws from (CUDA's too on a GPU)
    assert ckpt["exploration_steps"] == pytest.approx(60) and ckpt["n_actions"] == 4
    assert ckpt["buffer"]["frames"].dtype == torch.uint8 and ckpt["buffer"]["frames"].shape[1:] == (
        1,
        84,
        84,
    )


@pytest.mark.slow
def test_resume_with_more_steps_keeps_epsilon_horizon_and_replay(
    base_run, restore_signals, monkeypatch
):
    """A 600-step run (epsilon reaches 0.01 at step 60) extended to 100,000 steps: at step 1000 epsilon
    is still 0.01, not the 0.9 of a horizon recomputed from the new total. Resumed from a moved copy,
    the run writes there, and the replay memory comes back intact. (Learning is kept past the end so
    that the check costs no gradient steps.)"""
    run_dir = base_run.parent / "extended"
    shutil.copytree(base_run, run_dir)
    path = run_dir / "checkpoints" / "latest.pt"
    before = load(path)
    monkeypatch.setattr(dqn, "store_step", sigterm_on_call(400, dqn.store_step)[0])
    dqn.train(
        dqn.Args(
            total_steps=100_000,
            learning_starts=100_000,
            batch_size=8,
            buffer_size=1000,
            max_episode_frames=2000,
            eval_episodes=1,
            checkpoint_interval=0,
            eval_interval=300,
            device="cpu",
            seed=3,
            resume=str(path),
        )
    )
    assert scalars(run_dir, "charts/epsilon") == [
        (600, pytest.approx(0.01)),
        (1000, pytest.approx(0.01)),
    ]
    assert [step for step, _ in scalars(run_dir, "eval/episodic_return")] == [300, 600, 900]
    after = load(path)
    assert after["global_step"] == 1000 and after["exploration_steps"] == pytest.approx(60)
    head = int(before["buffer"]["head"][0])
    wrapped = max(
        0, int(after["buffer"]["written"][0]) - 1000
    )  # slots the resumed run overwrote since
    assert wrapped < head - 400
    for key in (
        "frames",
        "actions",
        "rewards",
        "dones",
        "first",
    ):  # the replay data came back intact
        torch.testing.assert_close(
            after["buffer"][key][wrapped:head], before["buffer"][key][wrapped:head]
        )
    # still sampleable, except the 3 oldest whose stacks reached into overwritten slots
    torch.testing.assert_close(
        after["buffer"]["valid"][wrapped + 3 : head], before["buffer"]["valid"][wrapped + 3 : head]
    )
    assert after["buffer"]["first"][
        head
    ].item()  # the resumed stream starts a new game in the next slot


@pytest.mark.slow
def test_copied_alone_runs(tmp_path):
    script = copy_alone("dqn_atari.py", tmp_path)
    args = [
        "--total-steps",
        "300",
        "--learning-starts",
        "400",
        "--buffer-size",
        "500",
        "--max-episode-frames",
        "1000",
        "--eval-episodes",
        "1",
        "--num-envs",
        "2",
        "--device",
        "cpu",
    ]
    check_ok(run_script(script, *args, cwd=tmp_path))
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("BreakoutNoFrameskip-v4__dqn_atari__1__")
    assert summary(run_dir)["global_step"] == 300
    # no update ever ran (learning starts later), the charts are there all the same
    assert not scalars(run_dir, "losses/td_loss") and [
        step for step, _ in scalars(run_dir, "charts/SPS")
    ] == [300]


@pytest.mark.slow
def test_eval_only_with_video(base_run, tmp_path):
    """Without the run's seed (3) or frame cap: eval-only repeats the run's own final evaluation."""
    proc = run_script(
        "dqn_atari.py",
        "--eval-only",
        "--checkpoint",
        str(base_run / "checkpoints" / "latest.pt"),
        "--eval-episodes",
        "1",
        "--capture-video",
        "--run-dir",
        str(tmp_path),
        "--device",
        "cpu",
    )
    check_ok(proc)
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["eval_episodes"] == 1 and result["global_step"] == 600 and result["seed"] == 3
    assert result["eval_returns"] == summary(base_run)["eval_returns"]
    assert list((tmp_path / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_eval_only_of_a_moved_run_writes_beside_it(base_run, restore_signals):
    check_eval_only_after_move(
        base_run,
        lambda ckpt: dqn.train(
            dqn.Args(eval_only=True, checkpoint=ckpt, eval_episodes=1, device="cpu")
        ),
        seed=3,
    )


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path):
    """A real SIGTERM to a real process: checkpoint, exit status 0, no summary.json."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ALGOS / "dqn_atari.py"),
            *TINY[:1],
            "100000",
            *TINY[2:],
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    while (
        not (run_dir / "config.json").exists() and proc.poll() is None
    ):  # written once the handlers are installed
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "interrupted: continue with --resume" in out
    assert (
        load(run_dir / "checkpoints" / "latest.pt")["global_step"] < 100000
        and not (run_dir / "summary.json").exists()
    )


# ---------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "corrupt.pt").write_bytes(b"not a checkpoint")
    torch.save(
        {"algo": "ppo_atari", "env_id": "BreakoutNoFrameskip-v4", "args": {}, "global_step": 10},
        d / "other.pt",
    )

    def fake(
        env_id="BreakoutNoFrameskip-v4", num_envs=1, buffer_size=1_000_000, **keys
    ):  # every key present, dummy values
        args = {"num_envs": num_envs, "buffer_size": buffer_size, "protocol": "auto"}
        return {
            "algo": "dqn_atari",
            "harness": 1,
            "env_id": env_id,
            "args": args,
            "global_step": 10,
            **{k: 0 for k in dqn.RESUME_KEYS},
            **keys,
        }

    torch.save(fake(env_id="ALE/Pong-v5"), d / "pong.pt")
    torch.save(fake(num_envs=8), d / "eight.pt")
    torch.save(fake(), d / "at10.pt")
    incomplete = fake()
    del incomplete["q_network"], incomplete["exploration_steps"]
    torch.save(incomplete, d / "incomplete.pt")
    return d


BAD = [
    (
        {"env_id": "CartPole-v1"},
        "'CartPole-v1' is not a pixel Atari id (<Game>NoFrameskip-v4, ALE/<Game>-v5); it has vector observations: use ppg.py",
    ),
    ({"env_id": "Pendulum-v1"}, "its actions are continuous: use d4pg.py, naf.py or rlpd.py"),
    ({"env_id": "NoSuchGameNoFrameskip-v4"}, "no Atari ROM named 'NoSuchGame'"),
    ({"total_steps": 0}, "--total-steps must be positive, got 0"),
    ({"eval_episodes": 0}, "--eval-episodes must be at least 1, got 0"),
    ({"eval_interval": -1}, "--eval-interval and --checkpoint-interval must be >= 0"),
    ({"num_envs": 0}, "--num-envs must be >= 1, got 0"),
    ({"batch_size": 0}, "--batch-size must be >= 1, got 0"),
    ({"target_network_frequency": 0}, "--target-network-frequency must be >= 1, got 0"),
    ({"train_frequency": 0}, "--train-frequency must be >= 1, got 0"),
    ({"max_episode_frames": 0}, "--max-episode-frames must be >= 1, got 0"),
    ({"buffer_size": 10}, "--buffer-size must be >= 16 (16 slots per env)"),
    ({"buffer_size": 40, "num_envs": 4}, "--buffer-size must be >= 64 (16 slots per env)"),
    ({"learning_starts": 8}, "--learning-starts must be >= --batch-size 32"),
    ({"learning_starts": -1}, "--learning-starts must be >= 0, got -1"),
    ({"gamma": 1.5}, "--gamma must be in [0, 1], got 1.5"),
    ({"start_e": -0.5}, "--start-e must be in [0, 1], got -0.5"),
    ({"end_e": 2.0}, "--end-e must be in [0, 1], got 2.0"),
    ({"eval_epsilon": -0.1}, "--eval-epsilon must be in [0, 1], got -0.1"),
    ({"tau": 0.0}, "--tau must be in (0, 1], got 0.0"),
    ({"exploration_fraction": 1.5}, "--exploration-fraction must be in (0, 1], got 1.5"),
    ({"exploration_fraction": 0.0}, "--exploration-fraction must be in (0, 1], got 0.0"),
    ({"learning_rate": 0.0}, "--learning-rate must be > 0, got 0.0"),
    ({"eval_only": True}, "--eval-only needs --checkpoint PATH"),
    ({"eval_only": True, "checkpoint": "{d}/at10.pt", "resume": "{d}/at10.pt"}, "cannot --resume"),
    ({"eval_only": True, "checkpoint": "{d}/missing.pt"}, "does not exist"),
    ({"resume": "{d}/corrupt.pt"}, "corrupt or not one"),
    ({"resume": "{d}/other.pt"}, "was written by ppo_atari.py; use ppo_atari.py"),
    (
        {"resume": "{d}/pong.pt"},
        "is for ALE/Pong-v5; pass --env-id ALE/Pong-v5",
    ),
    ({"resume": "{d}/eight.pt"}, "was made with --num-envs 8; pass --num-envs 8"),
    (
        {"resume": "{d}/eight.pt", "num_envs": 8, "buffer_size": 1000},
        "was made with --buffer-size 1000000; pass --buffer-size 1000000",
    ),
    (
        {"resume": "{d}/at10.pt", "protocol": "machado"},
        "was made with --protocol auto; pass --protocol auto",
    ),
    ({"resume": "{d}/incomplete.pt"}, "is incomplete (no q_network, exploration_steps)"),
    ({"eval_only": True, "checkpoint": "{d}/incomplete.pt"}, "is incomplete (no q_network)"),
    (
        {"resume": "{d}/at10.pt", "total_steps": 5},
        "--total-steps is below the checkpoint's step; pass 10+",
    ),
]


@pytest.mark.parametrize(
    "flags, message", BAD, ids=[" ".join(f"{k}={v}" for k, v in f.items()) for f, _ in BAD]
)
def test_bad_input_one_line(flags, message, bad_checkpoints, tmp_path, restore_signals):
    flags = {k: v.format(d=bad_checkpoints) if isinstance(v, str) else v for k, v in flags.items()}
    with pytest.raises(SystemExit) as e:
        dqn.train(dqn.Args(**flags, device="cpu", run_dir=str(tmp_path / "r")))
    text = str(e.value)
    assert text.startswith("dqn_atari.py: error:") and "\n" not in text and message in text, text
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.slow
def test_bad_input_on_the_command_line(tmp_path):
    """The checks through the CLI: one stderr line, no traceback, nothing written."""
    check_error(
        run_script(
            "dqn_atari.py", "--env-id", "ALE/NoSuchGame-v5", "--run-dir", str(tmp_path / "a")
        ),
        "dqn_atari.py: error",
        "no Atari ROM",
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_cuda_without_cuda_is_one_line():
    with pytest.raises(SystemExit, match="CUDA is not available"):
        dqn.train(dqn.Args(device="cuda"))


def test_track_without_wandb_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails, installed or not
    with pytest.raises(SystemExit, match="--track needs wandb"):
        dqn.train(dqn.Args(track=True, run_dir=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()
