"""Tests for algos/rlpd.py: the stacked ensemble against ten separate critics (forward, gradients, a
subset's minimum in the target; results/ensemble_speed.py runs on it), the random pair of each
critic step, the tanh-Gaussian log-probability against torch.distributions, symmetric sampling row
by row, the Minari conversion (terminations and truncations apart; wrong spaces, NaN, empty and
missing datasets refused), and tiny runs on a dataset made by benchmark/datasets.py: copied alone,
resumed (the same weights as an uninterrupted run), repeated (the same metrics; another seed
differs), interrupted during pretraining, and bad input (a checkpoint of the older critic layout
among it). --compile against eager: tests/test_compile.py; the CUDA path: tests/test_cuda.py."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import (
    ALGOS,
    check_error,
    check_eval_only_after_move,
    check_ok,
    copy_alone,
    run_script,
    scalars,
    sigterm_on_call,
    summary,
)
from minari.data_collector import EpisodeBuffer

from benchmark import datasets as maker

spec = importlib.util.spec_from_file_location("rlpd", ALGOS / "rlpd.py")
rlpd = importlib.util.module_from_spec(spec)
sys.modules["rlpd"] = rlpd  # dataclasses look the module up while @dataclass runs
spec.loader.exec_module(rlpd)

TINY = dict(
    total_steps=150,
    learning_starts=100,
    utd_ratio=2,
    hidden_dim=16,
    batch_size=16,
    eval_episodes=1,
    eval_interval=0,
    checkpoint_interval=0,
)
DATASET_ID = "pendulum/noisy-v0"


@pytest.fixture(scope="module")
def datasets_root(tmp_path_factory) -> Path:
    """A Pendulum dataset made by the maker: 2 noisy-expert episodes of 200 steps."""
    root = tmp_path_factory.mktemp("minari")
    maker.make_dataset(
        maker.Args(env_id="Pendulum-v1", dataset_id=DATASET_ID, episodes=2, noise=0.5, root=root)
    )
    return root


def pendulum_spaces():
    env = gym.make("Pendulum-v1")
    return env.observation_space, env.action_space


# ---------------------------------------------------------------- the ensemble and the target
def separate_critics(critic: rlpd.EnsembleCritic) -> list[nn.Sequential]:
    """Each critic of the ensemble as its own nn.Linear/nn.LayerNorm MLP, weights copied out of the
    stacked layers (rows: weight, bias, LayerNorm gain and shift)."""
    nets = []
    for e in range(critic.num_qs):
        d_in, h = critic.layers[0].shape[1] - 3, critic.layers[0].shape[2]
        net = nn.Sequential(
            nn.Linear(d_in, h),
            nn.LayerNorm(h),
            nn.ReLU(),
            nn.Linear(h, h),
            nn.LayerNorm(h),
            nn.ReLU(),
            nn.Linear(h, 1),
        )
        with torch.no_grad():
            for linear, p, rows in zip((net[0], net[3], net[6]), critic.layers, (d_in, h, h)):
                linear.weight.copy_(p[e, :rows].T)
                linear.bias.copy_(p[e, rows])
            for norm, p in zip((net[1], net[4]), critic.layers):
                rows = p.shape[1] - 3
                norm.weight.copy_(p[e, rows + 1])
                norm.bias.copy_(p[e, rows + 2])
        nets.append(net)
    return nets


def test_stacked_ensemble_equals_ten_separate_critics():
    """Forward, gradients, a subset's Q-values and the target's minimum over a subset, against ten
    independent nn.Linear MLPs evaluated one by one."""
    torch.manual_seed(0)
    critic = rlpd.EnsembleCritic(10, 5, 8)
    # per-critic biases, LayerNorm gains and shifts that differ, so mixing them up shows
    with torch.no_grad():
        for p in critic.layers:
            p[:, -3:].add_(torch.randn_like(p[:, -3:]))
    separate = separate_critics(critic)
    obs, actions = torch.randn(32, 4), torch.rand(32, 1) * 2 - 1
    q = critic(obs, actions)
    expected = torch.stack([net(torch.cat([obs, actions], 1)).squeeze(-1) for net in separate])
    assert q.shape == (10, 32)
    torch.testing.assert_close(q, expected)
    q.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for e, net in enumerate(separate):
        torch.testing.assert_close(critic.layers[1].grad[e, :8], net[3].weight.grad.T)
        torch.testing.assert_close(critic.layers[0].grad[e, 6], net[1].weight.grad)
    members = torch.tensor([7, 2])
    torch.testing.assert_close(critic(obs, actions, members), expected[[7, 2]].detach())
    # y with the minimum over critics 7 and 2, computed member by member
    batch = {"next_obs": obs, "rewards": torch.randn(32), "terminated": (torch.rand(32) < 0.3)}
    batch["terminated"] = batch["terminated"].float()
    log_prob = torch.randn(32)
    y = rlpd.soft_q_target(critic, batch, actions, log_prob, members, torch.tensor(0.1), 0.9)
    next_q = torch.minimum(expected[7], expected[2]).detach()
    mask = 1 - batch["terminated"]
    torch.testing.assert_close(y, batch["rewards"] + 0.9 * mask * (next_q - 0.1 * log_prob))


def test_named_views_are_the_packed_layers_rows():
    """EnsembleLayer names the rows of each packed layer [E, in + 1 (+ 2), out] without copying
    them: weight [E, in, out], bias, LayerNorm gain and shift [E, 1, out] (none in the output
    layer); a subset's views are those rows of its members; the checkpoint keeps one tensor a
    layer."""
    critic = rlpd.EnsembleCritic(10, 5, 8)
    layers = critic.unpacked()
    for layer, p, (d_in, d_out, hidden) in zip(
        layers, critic.layers, [(5, 8, True), (8, 8, True), (8, 1, False)]
    ):
        assert layer.weight.shape == (10, d_in, d_out) and layer.bias.shape == (10, 1, d_out)
        assert layer.weight.data_ptr() == p.data_ptr()  # a view, not a copy
        assert torch.equal(layer.weight, p[:, :d_in]) and torch.equal(
            layer.bias, p[:, d_in:][:, :1]
        )
        if hidden:
            assert torch.equal(layer.ln_gain, p[:, d_in + 1 : d_in + 2])
            assert torch.equal(layer.ln_shift, p[:, d_in + 2 :])
            assert layer.ln_gain.eq(1).all() and layer.ln_shift.eq(0).all()
        else:
            assert layer.ln_gain is None and layer.ln_shift is None
    members = torch.tensor([7, 2])
    for subset, layer in zip(critic.unpacked(members), layers):
        assert torch.equal(subset.weight, layer.weight[members])
        assert torch.equal(subset.bias, layer.bias[members])
    assert list(critic.state_dict()) == ["layers.0", "layers.1", "layers.2"]


def test_ensemble_speed_runs_on_this_file():
    """results/ensemble_speed.py (the timing behind results/rlpd-measurements.md) still builds its
    separate critics from this file's ensemble (it refuses to time them if their Q-values differ)
    and reports both rates and their ratio."""
    proc = run_script(
        ALGOS.parent / "results" / "ensemble_speed.py",
        *("--hidden", "8", "--batch", "4", "--updates", "2", "--rounds", "2"),
        *("--script", str(ALGOS / "rlpd.py")),
    )
    check_ok(proc)
    rates = re.search(
        r"batched ([\d.]+) vs separate ([\d.]+) critic updates/s: ([\d.]+)x", proc.stdout
    )
    assert rates and float(rates.group(1)) > 0 and float(rates.group(2)) > 0, proc.stdout
    assert "rounds: batched " in proc.stdout and proc.stdout.count(" / ") == 2  # two rounds each


class RecordingCritic(rlpd.EnsembleCritic):
    """Remembers which critics each call asked for."""

    def forward(self, obs, actions, members=None):
        if members is not None:
            self.calls.append(members)
        return super().forward(obs, actions, members)


def update_inputs(utd: int, batch_size: int = 8) -> tuple[rlpd.Agent, dict, dict]:
    agent = rlpd.Agent(3, 1, 16, 10)
    optimizers = {
        "actor": torch.optim.Adam(agent.actor.parameters()),
        "critic": torch.optim.Adam(agent.critic.parameters()),
        "alpha": torch.optim.Adam([agent.log_alpha]),
    }
    batches = {
        "obs": torch.randn(utd, batch_size, 3),
        "actions": torch.rand(utd, batch_size, 1),
        "rewards": torch.randn(utd, batch_size),
        "next_obs": torch.randn(utd, batch_size, 3),
        "terminated": torch.zeros(utd, batch_size),
    }
    return agent, optimizers, batches


def test_each_critic_step_targets_two_distinct_random_critics():
    """An update round draws Z anew for each critic step: two distinct critics, every pair turns
    up, and the target critic is asked for exactly those."""
    torch.manual_seed(0)
    agent, optimizers, batches = update_inputs(utd=400)
    agent.target_critic = RecordingCritic(10, 4, 16).requires_grad_(False)
    agent.target_critic.load_state_dict(agent.critic.state_dict())
    agent.target_critic.calls = []
    hyper = rlpd.UpdateHyper(gamma=0.99, tau=0.005, num_min_qs=2, target_entropy=-0.5)
    rlpd.update(agent, optimizers, batches, hyper)
    pairs = [tuple(sorted(m.tolist())) for m in agent.target_critic.calls]
    assert len(pairs) == 400 and all(a != b for a, b in pairs)
    assert set(pairs) == set(itertools.combinations(range(10), 2))


def test_target_hand_computed_with_entropy_and_mask():
    """Critics that output constants 1..10: the minimum over all is 1; y = r + gamma (1 - terminated)
    (1 - alpha log pi). A truncation is not an input, so it bootstraps."""
    critic = rlpd.EnsembleCritic(10, 4, 8)
    with torch.no_grad():
        critic.layers[2][:, :8].zero_()  # the output layer's weight; its bias, row 8, is Q_i
        critic.layers[2][:, 8].copy_(torch.arange(1.0, 11.0).view(10, 1))
    batch = {
        "next_obs": torch.randn(3, 3),
        "rewards": torch.tensor([1.0, 2.0, 3.0]),
        "terminated": torch.tensor([0.0, 1.0, 0.0]),
    }
    log_prob = torch.tensor([0.5, 0.5, -1.0])
    all_ten, alpha = torch.arange(10), torch.tensor(0.2)
    y = rlpd.soft_q_target(critic, batch, torch.zeros(3, 1), log_prob, all_ten, alpha, 0.9)
    torch.testing.assert_close(y, torch.tensor([1 + 0.9 * (1 - 0.1), 2.0, 3 + 0.9 * (1 + 0.2)]))
    # the pair (9, 4): Q = 10 and 5, minimum 5
    pair, zero = torch.tensor([9, 4]), torch.tensor(0.0)
    y2 = rlpd.soft_q_target(critic, batch, torch.zeros(3, 1), torch.zeros(3), pair, zero, 1.0)
    torch.testing.assert_close(y2, batch["rewards"] + torch.tensor([5.0, 0.0, 5.0]))


def test_tanh_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    # float64, so that the reference's atanh(tanh(x)) round trip stays exact
    mean, log_std = (
        torch.randn(64, 3, dtype=torch.float64),
        torch.randn(64, 3, dtype=torch.float64).clamp(-2, 1),
    )
    x = mean + log_std.exp() * torch.randn(64, 3, dtype=torch.float64)
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), torch.distributions.TanhTransform()
    )
    torch.testing.assert_close(
        rlpd.tanh_gaussian_log_prob(x, mean, log_std), dist.log_prob(torch.tanh(x)).sum(-1)
    )
    far = torch.full((1, 1), 30.0)  # tanh rounds to 1 there; the stable form stays finite
    assert torch.isfinite(rlpd.tanh_gaussian_log_prob(far, far, torch.zeros(1, 1))).all()


def test_update_round_counts_and_temperature_direction():
    """One round: utd critic steps (each followed by the target update), one actor and one
    temperature step; alpha falls when the entropy is above the target."""
    torch.manual_seed(0)
    agent, optimizers, batches = update_inputs(utd=3)
    target_before = agent.target_critic.layers[0].clone()
    hyper = rlpd.UpdateHyper(gamma=0.99, tau=0.5, num_min_qs=2, target_entropy=-100.0)
    losses = rlpd.update(agent, optimizers, batches, hyper)
    steps = {name: next(iter(o.state.values()))["step"].item() for name, o in optimizers.items()}
    assert steps == {"actor": 1, "critic": 3, "alpha": 1}
    assert agent.log_alpha.item() < 0 and losses["alpha"].item() == pytest.approx(1.0)
    # three lerps with tau = 0.5 towards a moving critic: the target moved, but is not the critic
    assert not torch.equal(agent.target_critic.layers[0], target_before)
    assert not torch.equal(agent.target_critic.layers[0], agent.critic.layers[0])
    assert agent.target_critic.layers[0].is_leaf and not agent.target_critic.layers[0].requires_grad
    assert set(losses) == {
        "critic_loss",
        "q_values",
        "actor_loss",
        "alpha",
        "alpha_loss",
        "entropy",
    }


# ---------------------------------------------------------------- symmetric sampling
def filled(rows: int, reward: float, offset: float) -> rlpd.ReplayBuffer:
    index = np.arange(rows, dtype=np.float32)
    return rlpd.ReplayBuffer.holding(
        {
            "obs": np.stack([index + offset] * 3, 1),
            "actions": np.zeros((rows, 1)),
            "rewards": np.full(rows, reward),
            "next_obs": np.stack([index + offset + 1] * 3, 1),
            "terminated": np.zeros(rows),
        }
    )


@pytest.mark.parametrize("ratio, n_offline", [(0.5, 5), (0.3, 3), (1.0, 10), (0.0, 0)])
def test_each_minibatch_holds_the_ratio_of_prior_data_to_the_sample(ratio, n_offline):
    offline, online = filled(50, 1.0, 1000.0), filled(30, -1.0, 0.0)
    batches = rlpd.sample_mixed(
        offline, online, 4, 10, ratio, np.random.default_rng(0), torch.from_numpy
    )
    assert batches["obs"].shape == (4, 10, 3) and batches["rewards"].shape == (4, 10)
    for i in range(4):  # every minibatch of the round, row by row
        assert batches["rewards"][i].tolist() == [1.0] * n_offline + [-1.0] * (10 - n_offline)
        from_offline = batches["obs"][i, :, 0] >= 1000
        assert from_offline.tolist() == [True] * n_offline + [False] * (10 - n_offline)
        # whole rows, not mixed fields
        torch.testing.assert_close(batches["next_obs"][i], batches["obs"][i] + 1)


def test_without_prior_data_batches_are_online():
    batches = rlpd.sample_mixed(
        None, filled(30, -1.0, 0.0), 2, 6, 0.0, np.random.default_rng(0), torch.from_numpy
    )
    assert batches["rewards"].eq(-1).all()


# ---------------------------------------------------------------- Minari conversion
def write_dataset(
    root: Path, dataset_id: str, episodes: list[dict], env_id: str = "Pendulum-v1"
) -> Path:
    """A Minari dataset of hand-made episodes, written with Minari itself (not the maker)."""
    saved = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        # Minari warns about every optional metadata field left empty
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            minari.create_dataset_from_buffers(
                dataset_id, [EpisodeBuffer(id=i, **ep) for i, ep in enumerate(episodes)], env=env_id
            )
    finally:
        if saved is None:
            os.environ.pop("MINARI_DATASETS_PATH")
        else:
            os.environ["MINARI_DATASETS_PATH"] = saved
    return root / dataset_id


def episode(length: int, start: float, terminated: bool) -> dict:
    """obs[t] = (start + t, 0, 0); actions sweep the env's [-2, 2]; the last step terminates or truncates."""
    end = [False] * (length - 1) + [True]
    return {
        "observations": np.array([[start + t, 0.0, 0.0] for t in range(length + 1)], np.float32),
        "actions": np.linspace(-2.0, 2.0, length, dtype=np.float32).reshape(length, 1),
        "rewards": np.arange(length, dtype=np.float64) + start,
        "terminations": np.array(end if terminated else [False] * length),
        "truncations": np.array([False] * length if terminated else end),
    }


def load(path_or_id: str, by: str = "path", env_id: str = "Pendulum-v1"):
    env = gym.make(env_id)
    args = rlpd.Args(
        env_id=env_id,
        **({"dataset_path": path_or_id} if by == "path" else {"dataset_id": path_or_id}),
    )
    return rlpd.load_prior_data(args, env.observation_space, env.action_space)


def test_conversion_keeps_terminations_and_truncations_apart(tmp_path, monkeypatch):
    folder = write_dataset(
        tmp_path,
        "hand/mixed-v0",
        [episode(3, 0.0, terminated=True), episode(4, 10.0, terminated=False)],
    )
    data = load(str(folder))
    # the truncated episode's end bootstraps
    assert data["terminated"].tolist() == [0, 0, 1, 0, 0, 0, 0]
    assert data["obs"][:, 0].tolist() == [0, 1, 2, 10, 11, 12, 13]
    # the real final observations, no crossing
    assert data["next_obs"][:, 0].tolist() == [1, 2, 3, 11, 12, 13, 14]
    assert data["rewards"].tolist() == [0, 1, 2, 10, 11, 12, 13]
    # env actions [-2, 2] -> [-1, 1], the ends clipped inside tanh's range
    lim = 1 - 1e-5
    np.testing.assert_allclose(
        data["actions"][:, 0], [-lim, 0, lim, -lim, -1 / 3, 1 / 3, lim], rtol=1e-6
    )
    assert all(v.dtype == np.float32 for v in data.values())
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))  # the same dataset by id
    np.testing.assert_array_equal(load("hand/mixed-v0", by="id")["next_obs"], data["next_obs"])
    # the data/ folder also works
    np.testing.assert_array_equal(load(str(folder / "data"))["obs"], data["obs"])


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("wrong spaces", "but MountainCarContinuous-v0 has"),
        ("nan observation", "NaN or infinite values in its obs"),
        ("infinite reward", "NaN or infinite values in its rewards"),
        ("empty", "has no episodes"),
        ("missing", "cannot load dataset"),
    ],
)
def test_bad_datasets_are_refused_in_one_line(tmp_path, case, fragment):
    good = episode(3, 0.0, terminated=True)
    env_id = "MountainCarContinuous-v0" if case == "wrong spaces" else "Pendulum-v1"
    if case == "nan observation":
        good["observations"][2, 1] = np.nan
    elif case == "infinite reward":
        good["rewards"][1] = np.inf
    episodes = [] if case == "empty" else [good]
    folder = (
        tmp_path / "nowhere"
        if case == "missing"
        else write_dataset(tmp_path, "bad/case-v0", episodes)
    )
    with pytest.raises(SystemExit, match=fragment) as e:
        load(str(folder), env_id=env_id)
    assert str(e.value).startswith("rlpd.py: error: dataset") or case == "missing"
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- tiny runs
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, datasets_root) -> Path:
    """In process, with two pretraining rounds: 150 env steps, updates from step 100."""
    run = tmp_path_factory.mktemp("rlpd") / "run"
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    rlpd.train(
        rlpd.Args(
            dataset_path=str(datasets_root / DATASET_ID),
            pretrain_steps=2,
            seed=3,
            run_dir=str(run),
            **{**TINY, "eval_interval": 100},
        )
    )
    # train installed its stop handlers; give pytest its own back
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    return run


def agent_state(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "latest.pt", weights_only=True)


def test_tiny_run_outputs(tiny_run):
    s = summary(tiny_run)
    assert (s["script"], s["algo"], s["global_step"], s["eval_episodes"], s["seed"]) == (
        "rlpd.py",
        "rlpd",
        150,
        1,
        3,
    )
    assert json.loads((tiny_run / "config.json").read_text())["offline_transitions"] == 400
    ckpt = agent_state(tiny_run)
    assert ckpt["offline_data"]["size"] == 400 and ckpt["replay_buffer"]["size"] == 150
    # (pretrain + online rounds) * utd
    assert ckpt["num_updates"] == 2 * 2 + 50 * 2 and ckpt["pretrain_done"] == 2
    # the last round, at step 0
    assert [step for step, _ in scalars(tiny_run, "pretrain/critic_loss")] == [0]
    assert [step for step, _ in scalars(tiny_run, "pretrain/eval_return")] == [0]
    assert [step for step, _ in scalars(tiny_run, "eval/episodic_return")] == [100, 150]
    # logged once updates run
    assert [step for step, _ in scalars(tiny_run, "losses/critic_loss")] == [100]
    # no 200-step episode ends within 150 steps
    assert scalars(tiny_run, "charts/episodic_return") == []
    assert [step for step, _ in scalars(tiny_run, "charts/SPS")] == [150]


def test_eval_only_after_move(tiny_run):
    check_eval_only_after_move(
        tiny_run,
        lambda c: rlpd.train(rlpd.Args(eval_only=True, checkpoint=c, eval_episodes=1)),
        seed=3,
    )


@pytest.mark.slow
def test_maker_dataset_trains_in_a_copied_file(tmp_path, datasets_root):
    """The file alone in an empty folder, its dataset found by id through MINARI_DATASETS_PATH."""
    script = copy_alone("rlpd.py", tmp_path)
    check_ok(
        run_script(
            script,
            "--dataset-id",
            DATASET_ID,
            "--total-steps",
            "120",
            "--learning-starts",
            "100",
            "--utd-ratio",
            "2",
            "--hidden-dim",
            "16",
            "--batch-size",
            "16",
            "--eval-episodes",
            "1",
            cwd=tmp_path,
            env={"MINARI_DATASETS_PATH": str(datasets_root)},
        )
    )
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("Pendulum-v1__rlpd__1__")
    assert summary(run_dir)["global_step"] == 120 and summary(run_dir)["num_updates"] == 40


def test_resume_continues_with_the_same_first_update(tmp_path, datasets_root, restore_signals):
    """Stop at step 120 and resume to 121 (the dataset folder gone by then: the checkpoint holds the
    prior data): the weights after the first update round equal an uninterrupted run's to 121."""
    dataset = tmp_path / "data"
    shutil.copytree(datasets_root / DATASET_ID, dataset)
    flags = {**TINY, "dataset_path": str(dataset)}
    rlpd.train(rlpd.Args(**{**flags, "total_steps": 121}, run_dir=str(tmp_path / "straight")))
    rlpd.train(rlpd.Args(**{**flags, "total_steps": 120}, run_dir=str(tmp_path / "split")))
    first = agent_state(tmp_path / "split")
    shutil.rmtree(dataset)
    rlpd.train(
        rlpd.Args(
            **{**flags, "total_steps": 121},
            resume=str(tmp_path / "split" / "checkpoints" / "latest.pt"),
        )
    )
    straight, resumed = agent_state(tmp_path / "straight"), agent_state(tmp_path / "split")
    assert resumed["global_step"] == 121 and resumed["num_updates"] == first["num_updates"] + 2
    for key in straight["agent"]:
        torch.testing.assert_close(resumed["agent"][key], straight["agent"][key], rtol=0, atol=0)
    assert (
        resumed["optimizers"]["critic"]["state"][0]["step"]
        == straight["optimizers"]["critic"]["state"][0]["step"]
    )
    for name in rlpd.ReplayBuffer.FIELDS:
        torch.testing.assert_close(
            resumed["replay_buffer"][name][:120], first["replay_buffer"][name]
        )
        torch.testing.assert_close(resumed["offline_data"][name], first["offline_data"][name])


def test_same_seed_same_run_other_seed_differs(tmp_path, datasets_root, restore_signals):
    flags = {**TINY, "dataset_path": str(datasets_root / DATASET_ID), "total_steps": 120}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        rlpd.train(rlpd.Args(**flags, seed=seed, run_dir=str(tmp_path / name)))
    a, b, c = (agent_state(tmp_path / n)["agent"] for n in "abc")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert summary(tmp_path / "a")["eval_returns"] == summary(tmp_path / "b")["eval_returns"]
    assert scalars(tmp_path / "a", "losses/critic_loss") == scalars(
        tmp_path / "b", "losses/critic_loss"
    )
    # the seed matters
    assert not torch.equal(a["critic.layers.1"], c["critic.layers.1"])
    assert summary(tmp_path / "a")["eval_returns"] != summary(tmp_path / "c")["eval_returns"]


def test_signal_during_pretraining_then_resume_equals_an_uninterrupted_run(
    tmp_path, datasets_root, monkeypatch, restore_signals
):
    """SIGTERM in the 3rd of 5 pretraining rounds: a checkpoint at step 0 with 3 rounds done, no
    summary; the resume finishes pretraining and the run, identical to one never stopped (the envs
    restart from the same seed at step 0). No online update: learning starts after the last step.
    The 450 steps hold two 200-step episodes, and the two autoreset steps after them are not stored."""
    flags = {
        **TINY,
        "dataset_path": str(datasets_root / DATASET_ID),
        "pretrain_steps": 5,
        "total_steps": 450,
        "learning_starts": 1000,
    }
    rlpd.train(rlpd.Args(**flags, run_dir=str(tmp_path / "straight")))
    real_update = rlpd.update
    signalling, calls = sigterm_on_call(3, real_update)
    monkeypatch.setattr(rlpd, "update", signalling)
    rlpd.train(rlpd.Args(**flags, run_dir=str(tmp_path / "split")))
    ckpt = agent_state(tmp_path / "split")
    assert (ckpt["global_step"], ckpt["pretrain_done"], len(calls)) == (0, 3, 3)
    assert not (tmp_path / "split" / "summary.json").exists()
    monkeypatch.setattr(rlpd, "update", real_update)
    rlpd.train(rlpd.Args(**flags, resume=str(tmp_path / "split" / "checkpoints" / "latest.pt")))
    straight, resumed = agent_state(tmp_path / "straight"), agent_state(tmp_path / "split")
    assert resumed["pretrain_done"] == 5 and resumed["num_updates"] == 10
    for key in straight["agent"]:
        torch.testing.assert_close(resumed["agent"][key], straight["agent"][key], rtol=0, atol=0)
    for name in rlpd.ReplayBuffer.FIELDS:
        torch.testing.assert_close(
            resumed["replay_buffer"][name], straight["replay_buffer"][name], rtol=0, atol=0
        )
    assert (
        summary(tmp_path / "split")["eval_returns"]
        == summary(tmp_path / "straight")["eval_returns"]
    )
    assert straight["replay_buffer"]["size"] == 450 - 2
    # an autoreset row would hold Gymnasium's reward 0
    assert (straight["replay_buffer"]["rewards"] < 0).all()
    assert [step for step, _ in scalars(tmp_path / "straight", "charts/episodic_length")] == [
        200,
        401,
    ]


def test_nonfinite_loss_stops_and_keeps_last_checkpoint(tmp_path, monkeypatch, restore_signals):
    """Plain ensemble SAC (--offline-ratio 0); a NaN critic loss at the first update (step 100) stops in
    one line; the checkpoint saved at step 100, before that update, stays and no summary.json is written."""
    real_update = rlpd.update

    def nan_update(*args, **kwargs):
        losses = real_update(*args, **kwargs)
        return {**losses, "critic_loss": losses["critic_loss"] * float("nan")}

    monkeypatch.setattr(rlpd, "update", nan_update)
    run = tmp_path / "run"
    with pytest.raises(SystemExit, match="non-finite loss at step 100"):
        rlpd.train(
            rlpd.Args(**{**TINY, "offline_ratio": 0.0, "checkpoint_interval": 50}, run_dir=str(run))
        )
    ckpt = agent_state(run)
    assert (ckpt["global_step"], ckpt["num_updates"]) == (100, 0)
    assert not (run / "summary.json").exists()


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "flags, fragment",
    [
        ({}, "--offline-ratio > 0 needs prior data"),
        ({"offline_ratio": 1.5}, "--offline-ratio must be in [0, 1], got 1.5"),
        ({"dataset_id": "a-v0", "dataset_path": "b"}, "--dataset-id or --dataset-path, not both"),
        ({"offline_ratio": 0.0, "dataset_path": "b"}, "--offline-ratio 0 uses no prior data"),
        ({"offline_ratio": 0.0, "pretrain_steps": 10}, "--pretrain-steps trains on prior data"),
        ({"dataset_path": "b", "pretrain_steps": -1}, "--pretrain-steps must be non-negative"),
        ({"offline_ratio": 0.0, "utd_ratio": 0}, "--utd-ratio"),
        ({"offline_ratio": 0.0, "num_min_qs": 11}, "--num-min-qs must be between 1 and --num-qs"),
        ({"offline_ratio": 0.0, "num_min_qs": 0}, "--num-min-qs"),
        ({"offline_ratio": 0.0, "batch_size": 0}, "--batch-size"),
        ({"offline_ratio": 0.0, "buffer_size": 0}, "--buffer-size"),
        ({"offline_ratio": 0.0, "hidden_dim": 0}, "--hidden-dim"),
        ({"offline_ratio": 0.0, "learning_rate": 0.0}, "--learning-rate"),
        ({"offline_ratio": 0.0, "tau": 0.0}, "--tau"),
        ({"offline_ratio": 0.0, "gamma": 1.5}, "--gamma"),
        ({"offline_ratio": 0.0, "init_temperature": 0.0}, "--init-temperature"),
        ({"offline_ratio": 0.0, "learning_starts": -1}, "--learning-starts"),
        ({"offline_ratio": 0.0, "num_envs": 0}, "--num-envs"),
        ({"offline_ratio": 0.0, "eval_only": True}, "--checkpoint"),
    ],
)
def test_bad_hyperparameters(flags, fragment, tmp_path):
    with pytest.raises(SystemExit, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        rlpd.train(rlpd.Args(run_dir=str(tmp_path / "r"), **flags))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "env_id, fragment",
    [
        ("CartPole-v1", "ppg.py"),
        ("CarRacing-v3", "ppo_atari.py"),
        ("NoSuchEnv-v0", "cannot make environment"),
    ],
)
def test_unsupported_env_refused(env_id, fragment):
    with pytest.raises(SystemExit, match=fragment) as e:
        rlpd.make_env(env_id)
    assert str(e.value).startswith("rlpd.py: error:") and "\n" not in str(e.value)


def test_resume_refuses_other_data_flags(tiny_run, tmp_path, datasets_root):
    good = str(tiny_run / "checkpoints" / "latest.pt")
    same = {**TINY, "dataset_path": str(datasets_root / DATASET_ID), "pretrain_steps": 2, "seed": 3}
    cases = [
        ({"dataset_path": "elsewhere"}, "--dataset-path"),
        ({"offline_ratio": 0.25}, "--offline-ratio 0.5"),
        ({"pretrain_steps": 0}, "--pretrain-steps 2"),
        ({"num_qs": 5, "num_min_qs": 2}, "--num-qs 10"),
        ({"hidden_dim": 32}, "--hidden-dim 16"),
        ({"total_steps": 149}, "below the checkpoint's step; pass 150+"),
        ({"env_id": "MountainCarContinuous-v0"}, "is for Pendulum-v1"),
    ]
    for flags, fragment in cases:
        with pytest.raises(SystemExit, match=fragment):
            rlpd.train(rlpd.Args(**{**same, **flags}, resume=good, run_dir=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


def test_checkpoint_of_the_older_critic_layout_is_refused(tiny_run, tmp_path, datasets_root):
    """Critics saved as separate weights, biases, LayerNorm gains and shifts (rlpd.py before one
    tensor a layer): --resume and --eval-only refuse them in one line that names the cause."""
    ckpt = agent_state(tiny_run)
    for name in ("critic", "target_critic"):
        for layer in range(3):
            p = ckpt["agent"].pop(f"{name}.layers.{layer}")
            rows = p.shape[1] - (3 if layer < 2 else 1)
            old = {"weights": p[:, :rows], "biases": p[:, rows : rows + 1]}
            if layer < 2:
                old |= {"ln_gains": p[:, rows + 1 : rows + 2], "ln_biases": p[:, rows + 2 :]}
            ckpt["agent"] |= {f"{name}.{k}.{layer}": v for k, v in old.items()}
    path = tmp_path / "old.pt"
    torch.save(ckpt, path)
    flags = {
        **TINY,
        "dataset_path": str(datasets_root / DATASET_ID),
        "pretrain_steps": 2,
        "seed": 3,
    }
    calls = [
        rlpd.Args(**flags, resume=str(path), run_dir=str(tmp_path / "r")),
        rlpd.Args(eval_only=True, checkpoint=str(path), eval_episodes=1),
    ]
    for args in calls:
        with pytest.raises(SystemExit) as e:
            rlpd.train(args)
        assert str(e.value) == (
            f"rlpd.py: error: checkpoint {path} has the critics' older layout; "
            "use the rlpd.py that wrote it"
        )
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_bad_input_cli_is_one_line(tmp_path):
    """Through the command line: one stderr line, no traceback, nothing written."""
    check_error(
        run_script("rlpd.py", "--run-dir", str(tmp_path / "a")), "rlpd.py: error", "--dataset-id"
    )
    check_error(
        run_script(
            "rlpd.py", "--dataset-path", str(tmp_path / "none"), "--run-dir", str(tmp_path / "b")
        ),
        "rlpd.py: error",
        "cannot load dataset",
    )
    assert not list(tmp_path.iterdir())
