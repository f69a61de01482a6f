"""Tests for algos/dqn_atari.py: the frame-deduplicated replay memory against a naive one that
stores whole stacks (fake and real env streams), life-loss flags, the TD target and schedules by
hand, env-id mapping, eval-only's env/seed from the checkpoint, W&B always finished, tiny runs by
subprocess (outputs, determinism, resume with the replay, copy-alone, video, SIGTERM), and every
bad-input message."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import os
import types
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ALGOS, check_error, check_ok, copy_alone, run_script, scalars, sigterm_on_call, summary

spec = importlib.util.spec_from_file_location("dqn_atari", ALGOS / "dqn_atari.py")
dqn = importlib.util.module_from_spec(spec)
sys.modules["dqn_atari"] = dqn  # dataclasses look the module up while the file executes
spec.loader.exec_module(dqn)

TINY = ["--total-steps", "600", "--learning-starts", "200", "--buffer-size", "1000", "--max-episode-frames", "2000",
        "--eval-episodes", "1", "--checkpoint-interval", "0", "--eval-interval", "300", "--device", "cpu"]


# ---------------------------------------------------------------- replay memory vs. a naive reference
class NaiveReplay:
    """Stores full stacked s and s' per transition: the obviously correct, 4x larger reference."""

    def __init__(self):
        self.items = []

    def add(self, obs, action, reward, next_obs, done):
        ids = []
        for e in range(len(obs)):
            ids.append(len(self.items))
            self.items.append((obs[e].copy(), next_obs[e].copy(), int(action[e]), float(reward[e]), bool(done[e])))
        return ids


class FakeAtari:
    """A vector env with AtariVectorEnv's SameStep semantics and its reset stacks (zeros, then the
    first frame); frames are random so any mixing of two games is visible. Terminations,
    truncations, life losses and bonus lives happen at random; `life_lost` is the truth."""

    def __init__(self, num_envs, rng, shape=(7, 7)):
        self.n, self.rng, self.shape = num_envs, rng, shape
        self.stacks = np.zeros((num_envs, 4, *shape), np.uint8)
        self.lives = np.full(num_envs, 3)
        self.life_lost = np.zeros(num_envs, np.bool_)

    def _reset(self, e):
        self.stacks[e] = 0
        self.stacks[e, -1] = self.rng.integers(1, 256, self.shape)
        self.lives[e] = 3

    def reset(self):
        for e in range(self.n):
            self._reset(e)
        return self.stacks.copy(), {"lives": self.lives.copy()}

    def step(self, actions):
        self.stacks = np.roll(self.stacks, -1, axis=1)
        self.stacks[:, -1] = self.rng.integers(1, 256, (self.n, *self.shape))
        reward = self.rng.integers(-2, 3, self.n).astype(np.float32)
        truncated = self.rng.random(self.n) < 0.03  # (the frame cap: no life is lost on that step)
        self.life_lost = ~truncated & (self.rng.random(self.n) < 0.05)
        self.lives += ~truncated & ~self.life_lost & (self.rng.random(self.n) < 0.05)  # bonus lives: a game can end above 3
        self.lives -= self.life_lost
        terminated = self.lives == 0
        final = self.stacks.copy()
        for e in np.flatnonzero(terminated | truncated):
            self._reset(e)
        return self.stacks.copy(), reward, terminated, truncated, {"lives": self.lives.copy(), "final_obs": final}


def drive(env, buffer, naive, steps, rng):
    """The training loop's own bookkeeping (store_step) feeds the buffer; the naive memory gets whole
    stacks and d from the env's truth (`env.life_lost`). Returns {flat id: naive id}."""
    obs, info = env.reset()
    lives, mapping = info["lives"].copy(), {}
    for _ in range(steps):
        actions = rng.integers(0, 4, env.n)
        next_obs, reward, terminated, truncated, info = env.step(actions)
        _, lives, flat = dqn.store_step(buffer, obs, actions, reward, next_obs, terminated, truncated, info, lives)
        real_next = np.stack([info["final_obs"][e] if terminated[e] or truncated[e] else next_obs[e] for e in range(env.n)])
        # a flat id that is reused now refers to the newer transition
        mapping.update(zip(flat.tolist(), naive.add(obs, actions, np.sign(reward), real_next, terminated | env.life_lost)))
        obs = next_obs
    return mapping


def test_store_step_marks_only_real_life_losses():
    """One vector step, one case per env: a truncation ending a game that had a bonus life (the next
    game starts with fewer lives: no life was lost), a life lost mid-game, a bonus life, a game over."""
    rb = dqn.FrameReplayBuffer(64, 4, frame_shape=(7, 7))
    rng = np.random.default_rng(0)
    obs, next_obs, final = (rng.integers(1, 256, (4, 4, 7, 7)).astype(np.uint8) for _ in range(3))
    lives = np.array([4, 3, 3, 1])
    info = {"lives": np.array([3, 2, 4, 3]), "final_obs": final}
    terminated, truncated = np.array([False, False, False, True]), np.array([True, False, False, False])
    ended, new_lives, ids = dqn.store_step(rb, obs, np.arange(4), np.array([2.0, -3.0, 0.0, 1.0]), next_obs, terminated, truncated, info, lives)
    s, s_next, a, r, d = rb.get(ids)
    assert d.tolist() == [False, True, False, True]  # the truncation still bootstraps
    assert ended.tolist() == [True, False, False, True] and new_lives.tolist() == [3, 2, 4, 3]
    assert r.tolist() == [1.0, -1.0, 0.0, 1.0] and a.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(s[:, -1], obs[:, -1])
    np.testing.assert_array_equal(s_next[:, -1], np.where(ended[:, None, None], final[:, -1], next_obs[:, -1]))


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
    buffer = dqn.FrameReplayBuffer(capacity, num_envs, frame_shape=(7, 7))
    naive = NaiveReplay()
    mapping = drive(FakeAtari(num_envs, rng), buffer, naive, 400, rng)
    ids = np.flatnonzero(buffer.valid.reshape(-1))
    assert len(ids) > 0.6 * min(capacity, 400 * num_envs)  # the ring is mostly usable
    assert_same(buffer, naive, mapping, ids.tolist())
    # every transition of the last third of each env's ring is still sampleable (nothing lost wrongly)
    recent = [i for i, t in mapping.items() if t >= len(naive.items) - num_envs * (buffer.cap // 3)]
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
    for x, y in zip(batch, buffer.get(sampled)):
        np.testing.assert_array_equal(x, y)


def test_buffer_matches_naive_on_real_env_stream():
    """AtariVectorEnv's own reset stacks, life losses, game overs and truncations, two envs, ring wrap."""

    class Real:
        n = 2

        def __init__(self):
            self.env = dqn.make_env(dqn.Args(max_episode_frames=600), 2)

        def reset(self):
            obs, info = self.env.reset(seed=3)
            assert (obs[:, :3] == 0).all() and (obs[:, 3] > 0).any()  # the padding the buffer reproduces
            self.lives = info["lives"].copy()
            return obs, info

        def step(self, actions):
            out = self.env.step(actions)
            # Breakout has no bonus lives and a new game starts with the most, so a drop is exact here
            self.life_lost, self.lives = out[4]["lives"] < self.lives, out[4]["lives"].copy()
            return out

    rng = np.random.default_rng(0)
    env = Real()
    buffer, naive = dqn.FrameReplayBuffer(2 * 200, 2), NaiveReplay()
    mapping = drive(env, buffer, naive, 700, rng)
    ends = sum(1 for item in naive.items if (item[0][:3] == 0).all())
    assert ends >= 4  # several games started inside the stream
    assert any(item[4] for item in naive.items)  # life losses / game overs as d = 1
    ids = np.flatnonzero(buffer.valid.reshape(-1))
    assert len(ids) > 300
    assert_same(buffer, naive, mapping, ids.tolist())


def test_td_target_and_schedule_by_hand():
    r = torch.tensor([1.0, -1.0, 0.0])
    d = torch.tensor([0.0, 1.0, 0.0])
    q_next = torch.tensor([[1.0, 3.0], [5.0, 2.0], [-1.0, -2.0]])
    torch.testing.assert_close(dqn.td_target(r, d, q_next, 0.5), torch.tensor([1.0 + 1.5, -1.0, -0.5]))
    assert dqn.linear_schedule(1.0, 0.01, 100, 0) == 1.0
    assert dqn.linear_schedule(1.0, 0.01, 100, 50) == pytest.approx(0.505)
    assert dqn.linear_schedule(1.0, 0.01, 100, 1000) == 0.01
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    expected = 0.25 * a.weight.data + 0.75 * b.weight.data
    dqn.update_target(b, a, 0.25)
    torch.testing.assert_close(b.weight.data, expected)


def test_checkpoint_run_dir_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert dqn.checkpoint_run_dir("moved/run/checkpoints/latest.pt", None) == tmp_path / "moved" / "run"
    assert dqn.checkpoint_run_dir("loose/latest.pt", None) == tmp_path / "loose"
    assert dqn.checkpoint_run_dir("moved/run/checkpoints/latest.pt", "elsewhere") == Path("elsewhere")


def test_evaluation_gives_way_to_a_stop_signal():
    net = dqn.QNetwork(4)
    assert dqn.evaluate(net, dqn.Args(), torch.device("cpu"), 2, stop=[signal.SIGTERM]) is None


@pytest.mark.slow
def test_eval_only_takes_env_seed_and_protocol_from_checkpoint(tmp_path):
    """A Pong checkpoint of a seed-7 run, evaluated without --env-id or --seed: the run's own evaluation."""
    torch.manual_seed(0)
    net = dqn.QNetwork(6)
    run_args = dqn.Args(env_id="ALE/Pong-v5", seed=7, max_episode_frames=240, eval_epsilon=0.5)
    path = tmp_path / "run" / "checkpoints" / "latest.pt"
    path.parent.mkdir(parents=True)
    torch.save({"algo": "dqn_atari", "env_id": run_args.env_id, "args": asdict(run_args), "n_actions": 6, "q_network": net.state_dict(), "global_step": 5}, path)
    dqn.train(dqn.Args(eval_only=True, checkpoint=str(path), eval_episodes=2, device="cpu"))
    result = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert (result["env_id"], result["seed"], result["global_step"], result["eval_episodes"]) == ("ALE/Pong-v5", 7, 5, 2)
    assert result["eval_returns"] == dqn.evaluate(net, run_args, torch.device("cpu"), 2)


@pytest.mark.slow
def test_track_inits_wandb_before_tensorboard_and_always_finishes(tmp_path, monkeypatch):
    calls = []
    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", sorted(p.name for p in Path(kw["dir"]).iterdir()))),
                                 finish=lambda: calls.append(("finish",)))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        tiny = dict(total_steps=64, learning_starts=32, buffer_size=64, max_episode_frames=200, eval_episodes=1, eval_interval=0,
                    checkpoint_interval=0, device="cpu", track=True)
        dqn.train(dqn.Args(**tiny, run_dir=str(tmp_path / "ok")))
        assert calls == [("init", ["checkpoints"]), ("finish",)]  # no event file yet at init
        assert json.loads((tmp_path / "ok" / "summary.json").read_text())["global_step"] == 64
        calls.clear()

        def broken(*args):
            raise dqn.fail("emulator failed")
        monkeypatch.setattr(dqn, "make_env", broken)
        with pytest.raises(SystemExit, match="emulator failed"):
            dqn.train(dqn.Args(**tiny, run_dir=str(tmp_path / "error")))
        assert [c[0] for c in calls] == ["init", "finish"]
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_env_ids_map_to_games():
    assert dqn.atari_game("BreakoutNoFrameskip-v4") == ("breakout", 0.0)
    assert dqn.atari_game("ALE/Breakout-v5") == ("breakout", 0.25)
    assert dqn.atari_game("MsPacmanNoFrameskip-v4") == ("ms_pacman", 0.0)
    assert dqn.atari_game("ALE/BeamRider-v5") == ("beam_rider", 0.25)


# ---------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dqn") / "run"
    check_ok(run_script("dqn_atari.py", *TINY, "--seed", "3", "--run-dir", str(run_dir)))
    return run_dir


@pytest.mark.slow
def test_tiny_run_outputs(base_run):
    s = summary(base_run)
    for key in ("script", "algo", "env_id", "seed", "global_step", "eval_mean", "eval_std", "eval_episodes", "eval_returns", "wall_time_s", "sps", "peak_rss_mb"):
        assert key in s
    assert s["global_step"] == 600 and s["eval_episodes"] == 1 and s["script"] == "dqn_atari.py" and "interrupted" not in s
    assert s["wall_time_s"] > 600 / s["sps"]  # the whole process vs. the training loop alone
    assert (base_run / "config.json").exists()
    for tag in ("charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate", "losses/td_loss", "eval/episodic_return"):
        assert scalars(base_run, tag), tag
    assert [step for step, _ in scalars(base_run, "eval/episodic_return")] == [300, 600]
    for tag in ("charts/SPS", "charts/learning_rate", "charts/epsilon"):  # every 1000 steps and at the end
        assert [step for step, _ in scalars(base_run, tag)] == [600], tag
    ckpt = torch.load(base_run / "checkpoints" / "latest.pt", weights_only=True)
    assert ckpt["algo"] == "dqn_atari" and ckpt["global_step"] == 600 and ckpt["updates"] == (600 - 200) // 4
    assert "cuda" in ckpt["rng"]  # the CUDA generators, [] without CUDA
    assert ckpt["buffer"]["frames"].dtype == torch.uint8 and ckpt["buffer"]["frames"].shape[1:] == (1, 84, 84)


@pytest.mark.slow
def test_same_seed_same_metrics(base_run, tmp_path):
    check_ok(run_script("dqn_atari.py", *TINY, "--seed", "3", "--run-dir", str(tmp_path / "again")))
    for tag in ("losses/td_loss", "losses/q_values", "charts/episodic_return"):
        assert scalars(base_run, tag) == scalars(tmp_path / "again", tag), tag
    assert summary(base_run)["eval_returns"] == summary(tmp_path / "again")["eval_returns"]


@pytest.mark.slow
def test_resume_continues_steps_curve_and_replay(base_run, tmp_path):
    run_dir = tmp_path / "moved"
    shutil.copytree(base_run, run_dir)
    before = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    args = [a if a != "600" else "1000" for a in TINY]
    check_ok(run_script("dqn_atari.py", *args, "--seed", "3", "--resume", str(run_dir / "checkpoints" / "latest.pt")))
    assert summary(run_dir)["global_step"] == 1000
    steps = [step for step, _ in scalars(run_dir, "losses/td_loss")]
    assert steps == sorted(set(steps)) and steps[0] <= 600 < steps[-1]  # one curve, no duplicated points
    assert [step for step, _ in scalars(run_dir, "eval/episodic_return")] == [300, 600, 900, 1000]
    assert [step for step, _ in scalars(run_dir, "charts/SPS")] == [600, 1000]
    after = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert after["updates"] == (1000 - 200) // 4
    head = int(before["buffer"]["head"][0])
    wrapped = max(0, int(after["buffer"]["written"][0]) - 1000)  # slots the resumed run overwrote since
    assert wrapped < head - 400
    for key in ("frames", "actions", "rewards", "dones", "first"):  # the replay data came back intact
        torch.testing.assert_close(after["buffer"][key][wrapped:head], before["buffer"][key][wrapped:head])
    # still sampleable, except the 3 oldest whose stacks reached into overwritten slots
    torch.testing.assert_close(after["buffer"]["valid"][wrapped + 3 : head], before["buffer"]["valid"][wrapped + 3 : head])
    assert after["buffer"]["first"][head].item()  # the resumed stream starts a new game in the next slot


@pytest.mark.slow
def test_copied_alone_runs(tmp_path):
    script = copy_alone("dqn_atari.py", tmp_path)
    args = ["--total-steps", "300", "--learning-starts", "400", "--buffer-size", "500", "--max-episode-frames", "1000",
            "--eval-episodes", "1", "--num-envs", "2", "--device", "cpu"]
    check_ok(run_script(script, *args, cwd=tmp_path))
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("BreakoutNoFrameskip-v4__dqn_atari__1__")
    assert summary(run_dir)["global_step"] == 300
    # no update ever ran (learning starts later), the charts are there all the same
    assert not scalars(run_dir, "losses/td_loss") and [step for step, _ in scalars(run_dir, "charts/SPS")] == [300]


@pytest.mark.slow
def test_eval_only_with_video(base_run, tmp_path):
    """Without the run's seed (3) or frame cap: eval-only repeats the run's own final evaluation."""
    proc = run_script("dqn_atari.py", "--eval-only", "--checkpoint", str(base_run / "checkpoints" / "latest.pt"), "--eval-episodes", "1",
                      "--capture-video", "--run-dir", str(tmp_path), "--device", "cpu")
    check_ok(proc)
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["eval_episodes"] == 1 and result["global_step"] == 600 and result["seed"] == 3
    assert result["eval_returns"] == summary(base_run)["eval_returns"]
    assert list((tmp_path / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ALGOS / "dqn_atari.py"), *TINY[:1], "100000", *TINY[2:], "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in proc.stdout:  # the first progress line: the loop (and the handlers) are running
        if line.startswith("step "):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert 0 < ckpt["global_step"] < 100000 and not (run_dir / "summary.json").exists()


# ---------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "corrupt.pt").write_bytes(b"not a checkpoint")
    torch.save({"algo": "ppo_atari", "env_id": "BreakoutNoFrameskip-v4"}, d / "other.pt")

    def fake(env_id="BreakoutNoFrameskip-v4", num_envs=1, buffer_size=1_000_000, **keys):  # every key present, dummy values
        return {"algo": "dqn_atari", "env_id": env_id, "args": {"num_envs": num_envs, "buffer_size": buffer_size}, "global_step": 10,
                **{k: 0 for k in ("n_actions", "q_network", "target_network", "optimizer", "buffer", "rng", "updates")}, **keys}
    torch.save(fake(env_id="ALE/Pong-v5"), d / "pong.pt")
    torch.save(fake(num_envs=8), d / "eight.pt")
    torch.save(fake(), d / "at10.pt")
    incomplete = fake()
    del incomplete["q_network"]
    torch.save(incomplete, d / "incomplete.pt")
    return d


BAD = [
    (["--env-id", "CartPole-v1"], ["CartPole-v1", "ppg.py"]),
    (["--env-id", "Pendulum-v1"], ["d4pg.py"]),
    (["--env-id", "Breakout-ram-v4"], ["ppg.py"]),
    (["--env-id", "NoSuchGameNoFrameskip-v4"], ["no Atari ROM"]),
    (["--total-steps", "0"], ["--total-steps"]),
    (["--buffer-size", "10"], ["--buffer-size"]),
    (["--learning-starts", "8"], ["--learning-starts"]),
    (["--gamma", "1.5"], ["--gamma"]),
    (["--eval-epsilon", "-0.1"], ["--eval-epsilon"]),
    (["--tau", "0"], ["--tau must be in (0, 1], got 0.0"]),
    (["--exploration-fraction", "1.5"], ["--exploration-fraction must be in (0, 1], got 1.5"]),
    (["--learning-rate", "0"], ["--learning-rate must be > 0, got 0.0"]),
    (["--eval-only"], ["--checkpoint"]),
    (["--eval-only", "--checkpoint", "{d}/missing.pt"], ["does not exist"]),
    (["--resume", "{d}/corrupt.pt"], ["corrupt"]),
    (["--resume", "{d}/other.pt"], ["ppo_atari"]),
    (["--resume", "{d}/pong.pt"], ["ALE/Pong-v5"]),
    (["--resume", "{d}/eight.pt"], ["--num-envs 8"]),
    (["--resume", "{d}/eight.pt", "--num-envs", "8", "--buffer-size", "1000"], ["--buffer-size 1000000"]),
    (["--eval-only", "--checkpoint", "{d}/incomplete.pt"], ["incomplete", "q_network"]),
    (["--eval-only", "--checkpoint", "{d}/at10.pt", "--eval-episodes", "0"], ["--eval-episodes"]),
    (["--resume", "{d}/at10.pt", "--total-steps", "5"], ["below the checkpoint's step 10"]),
]


@pytest.mark.parametrize("args,fragments", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_one_line(args, fragments, bad_checkpoints, tmp_path):
    args = [a.format(d=bad_checkpoints) for a in args]
    check_error(run_script("dqn_atari.py", *args, "--run-dir", str(tmp_path / "r")), *fragments)
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_one_line():
    check_error(run_script("dqn_atari.py", "--device", "cuda"), "CUDA")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="checks the message without wandb")
def test_track_without_wandb_is_one_line_and_writes_nothing(tmp_path):
    check_error(run_script("dqn_atari.py", "--track", *TINY, "--run-dir", str(tmp_path / "r")), "wandb")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_signal_skips_due_evaluation_saves_and_second_signal_kills(tmp_path, monkeypatch, restore_signals):
    """SIGTERM on the step that reaches 100, where an evaluation is due: no evaluation, a checkpoint
    at step 100, no summary.json, and both handlers back to the default so a second signal kills."""
    real_eval, evals = dqn.evaluate, []
    stepping, steps = sigterm_on_call(100, dqn.store_step)
    monkeypatch.setattr(dqn, "store_step", stepping)
    monkeypatch.setattr(dqn, "evaluate", lambda *a, **k: evals.append(1) or real_eval(*a, **k))
    run = tmp_path / "run"
    dqn.train(dqn.Args(total_steps=1000, learning_starts=50, buffer_size=1000, max_episode_frames=2000,
                       eval_episodes=1, eval_interval=100, run_dir=str(run), device="cpu"))
    assert len(steps) == 100 and evals == [] and not (run / "summary.json").exists()
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["global_step"] == 100
    assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
