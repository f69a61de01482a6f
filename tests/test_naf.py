"""Tests for algos/naf.py: the NAF math against hand/brute-force references, the NEXT_STEP
autoreset handling on a counting env, and tiny end-to-end runs by subprocess."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    sigterm_on_call,
    summary,
)

spec = importlib.util.spec_from_file_location("naf", ALGOS / "naf.py")
naf = importlib.util.module_from_spec(spec)
sys.modules["naf"] = naf  # dataclasses look the module up while @dataclass runs
spec.loader.exec_module(naf)

TINY = [
    "--total-steps",
    "600",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    "--hidden-dim",
    "32",
    "--eval-interval",
    "300",
    "--eval-episodes",
    "1",
    "--checkpoint-interval",
    "300",
]


def random_net(obs_dim=4, act_dim=3, seed=0):
    torch.manual_seed(seed)
    net = naf.NAFNetwork(obs_dim, act_dim, 16)
    # Larger L entries than at init, so the quadratic is far from flat.
    with torch.no_grad():
        net.l_head.weight.mul_(5.0)
    return net


def one(net):
    """A single network as update() takes its networks (deviation h's twin makes two)."""
    return torch.nn.ModuleList([net])


# ---------------------------------------------------------------- NAF math
def test_q_at_mu_equals_v():
    net = random_net()
    V, mu, L, _ = net(torch.randn(64, 4))
    torch.testing.assert_close(naf.q_value(V, mu, L, mu), V)
    assert mu.abs().max() <= 1.0


def test_mu_is_tanh_of_the_fourth_output():
    """forward's last output is mu before tanh: the mu head's linear output on the trunk's features."""
    net = random_net()
    x = torch.randn(32, 4)
    _, mu, _, pre_tanh = net(x)
    torch.testing.assert_close(pre_tanh, net.mu_head(net.trunk(x)))
    torch.testing.assert_close(mu, torch.tanh(pre_tanh))


def test_pre_tanh_penalty_adds_to_the_loss_and_revives_a_saturated_mu():
    """Deviation g (on by default, 0.01): the loss is the TD loss plus penalty * the mean over batch
    and components of (mu before tanh)^2. With mu's head pushed far into tanh's tail (pre-tanh ~ 30,
    tanh' ~ 4e-26) the TD loss gives the mu head no gradient; the penalty gives it 2 penalty pre /
    (B |A|) per entry, pulling it back towards 0. The TD part is returned (and logged) on its own."""
    assert naf.Args().pre_tanh_penalty == 0.01
    batch = {
        "obs": torch.randn(6, 4),
        "actions": torch.rand(6, 3) * 2 - 1,
        "rewards": torch.randn(6),
        "next_obs": torch.randn(6, 4),
        "terminated": torch.zeros(6),
    }
    net, target = random_net(seed=0), random_net(seed=1)
    with torch.no_grad():
        net.mu_head.bias.fill_(30.0)
    td_only = naf.naf_loss([net], [target], batch, 0.99, penalty=0.0)[0]
    td_only.backward()
    assert net.mu_head.bias.grad.abs().max() == 0.0
    net.zero_grad()
    loss, td, _ = naf.naf_loss([net], [target], batch, 0.99, penalty=0.01)
    loss.backward()
    assert td.item() == td_only.item()
    pre_tanh = net(batch["obs"])[3].detach().double()
    assert loss.item() == pytest.approx(
        td_only.item() + 0.01 * (pre_tanh**2).sum().item() / 18, rel=1e-6
    )
    expected_bias_grad = (2 * 0.01 * pre_tanh / 18).sum(
        0
    )  # d/d bias_j of the penalty, summed over the batch
    torch.testing.assert_close(
        net.mu_head.bias.grad.double(), expected_bias_grad, rtol=1e-5, atol=1e-9
    )
    assert torch.all(
        net.mu_head.bias.grad > 0
    )  # gradient descent lowers the bias: mu moves back off the bound
    same = random_net(seed=0)
    with torch.no_grad():
        same.mu_head.bias.fill_(30.0)
    stepped = naf.update(
        one(same),
        one(target),
        torch.optim.SGD(same.parameters(), lr=0.0),
        batch,
        naf.Args(gamma=0.99, tau=0.005, max_grad_norm=0.0, pre_tanh_penalty=0.01),
    )
    assert (stepped[0].item(), stepped[1].item()) == (
        loss.item(),
        td_only.item(),
    )  # (loss, TD loss, Q): the log gets TD


def test_L_and_P_structure():
    """L is filled row by row from the head (checked with a per-element loop), its diagonal
    exponentiated; P = L L^T is symmetric positive definite."""
    net = random_net(act_dim=3)
    x = torch.randn(32, 4)
    _, _, L, _ = net(x)
    raw = net.l_head(net.trunk(x)).detach()
    for b in range(4):
        k = 0
        for i in range(3):
            for j in range(i + 1):
                expected = raw[b, k].exp() if i == j else raw[b, k]
                assert torch.isclose(L[b, i, j], expected), (b, i, j)
                k += 1
    assert torch.all(torch.triu(L, diagonal=1) == 0)
    P = L @ L.transpose(1, 2)
    torch.testing.assert_close(P, P.transpose(1, 2))
    assert torch.all(torch.linalg.eigvalsh(P) > 0)


@pytest.mark.parametrize("floor", [0.0, 0.3])
def test_advantage_nonpositive_and_matches_numpy(floor):
    net = random_net()
    V, mu, L, _ = net(torch.randn(128, 4))
    u = torch.rand(128, 3) * 2 - 1
    A = naf.advantage(u, mu, L, floor).detach().numpy()
    assert np.all(A <= 0)
    for b in range(8):
        d = (u[b] - mu[b]).detach().numpy().astype(np.float64)
        Lb = L[b].detach().numpy().astype(np.float64)
        assert A[b] == pytest.approx(
            -0.5 * d @ (Lb @ Lb.T + floor * np.eye(3)) @ d, rel=1e-4, abs=1e-5
        )


def test_curvature_floor_keeps_a_dead_direction_curved():
    """Deviation f: with L's first diagonal entry at exp(-30) (P_11 = exp(-60); the HalfCheetah runs'
    median P_11 printed as 0.000), A is flat along u_1 and mu_1 gets no gradient; the floor gives
    A = -floor/2 (u_1 - mu_1)^2 there, and a gradient floor (u_1 - mu_1)."""
    L = torch.tensor([[[float(np.exp(-30.0)), 0.0], [0.7, 1.3]]])
    u = torch.tensor([[0.5, -0.2]])
    for floor, expected_A, expected_grad in ((0.0, 0.0, 0.0), (0.2, -0.1 * 0.6**2, 0.2 * 0.6)):
        mu = torch.tensor([[-0.1, -0.2]], requires_grad=True)  # u - mu = (0.6, 0): along u_1 only
        A = naf.advantage(u, mu, L, floor)
        A.sum().backward()
        assert A.item() == pytest.approx(expected_A, abs=1e-7)
        assert mu.grad[0, 0].item() == pytest.approx(expected_grad, abs=1e-7)


def test_greedy_action_is_mu():
    net = random_net()
    V, mu, L, _ = net(torch.randn(16, 4))
    V, mu, L = V.detach(), mu.detach(), L.detach()
    q_mu = naf.q_value(V, mu, L, mu)
    for _ in range(50):
        u = (mu + 0.3 * torch.randn_like(mu)).clamp(-1, 1)
        assert torch.all(q_mu >= naf.q_value(V, mu, L, u))
    u = mu.clone().requires_grad_(True)
    naf.q_value(V, mu, L, u).sum().backward()
    assert u.grad.abs().max() < 1e-6
    u = (mu + 0.5).requires_grad_(True)
    naf.q_value(V, mu, L, u).sum().backward()
    assert u.grad.abs().max() > 1e-3  # elsewhere the gradient does not vanish


def test_td_target_hand_computed():
    # Transitions: ordinary, terminated, truncated (stored with terminated = 0), terminated at the time limit.
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])
    terminated = torch.tensor([0.0, 1.0, 0.0, 1.0])
    V_next = torch.tensor([10.0, 20.0, 30.0, 40.0])
    y = naf.td_target(r, terminated, V_next, 0.9)
    torch.testing.assert_close(y, torch.tensor([1 + 9.0, 2.0, 3 + 27.0, 4.0]))


def test_loss_bootstraps_from_target_network():
    net, target = random_net(seed=0), random_net(seed=1)
    batch = {
        "obs": torch.randn(5, 4),
        "actions": torch.rand(5, 3) * 2 - 1,
        "rewards": torch.randn(5),
        "next_obs": torch.randn(5, 4),
        "terminated": torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0]),
    }
    loss, td, q_logged = naf.naf_loss([net], [target], batch, 0.99, penalty=0.0)
    with torch.no_grad():
        V_next = target(batch["next_obs"])[0]
        V, mu, L, _ = net(batch["obs"])
        q = [
            V[i] + naf.advantage(batch["actions"][i : i + 1], mu[i : i + 1], L[i : i + 1])[0]
            for i in range(5)
        ]
        y = [
            batch["rewards"][i] + (0.0 if batch["terminated"][i] else 0.99 * V_next[i])
            for i in range(5)
        ]
    expected = sum((q[i] - y[i]) ** 2 for i in range(5)) / 5
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5) and td.item() == loss.item()
    torch.testing.assert_close(q_logged, torch.stack(q))


def test_twin_networks_bootstrap_from_the_smaller_v():
    """Deviation h (--twin-q): y = r + gamma (1 - terminated) min(V_1'(x'), V_2'(x')), checked per
    sample; the loss is the sum of both networks' TD losses against that one y (plus each one's
    penalty), so each network's gradient is that of its own term; TD and Q returned are the first's."""
    nets, targets = (
        [random_net(seed=0), random_net(seed=2)],
        [random_net(seed=1), random_net(seed=3)],
    )
    batch = {
        "obs": torch.randn(7, 4),
        "actions": torch.rand(7, 3) * 2 - 1,
        "rewards": torch.randn(7),
        "next_obs": torch.randn(7, 4),
        "terminated": torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]),
    }
    loss, td, q_logged = naf.naf_loss(nets, targets, batch, 0.99, penalty=0.01)
    loss.backward()
    with torch.no_grad():
        V1, V2 = (t(batch["next_obs"])[0] for t in targets)
        assert torch.any(V1 < V2) and torch.any(V2 < V1)  # the minimum picks from both
        y = torch.stack(
            [
                batch["rewards"][i] + (0.0 if batch["terminated"][i] else 0.99 * min(V1[i], V2[i]))
                for i in range(7)
            ]
        )
    own = []
    for net in nets:
        alone = random_net(seed=0)  # the same weights, trained on its own term only
        alone.load_state_dict(net.state_dict())
        V, mu, L, pre_tanh = alone(batch["obs"])
        d = batch["actions"] - mu
        q = V - 0.5 * (L.transpose(1, 2) @ d.unsqueeze(-1)).squeeze(-1).square().sum(
            -1
        )  # d^T L L^T d = |L^T d|^2
        term = ((q - y) ** 2).mean() + 0.01 * pre_tanh.square().mean()
        term.backward()
        for p, p_alone in zip(net.parameters(), alone.parameters()):
            torch.testing.assert_close(p.grad, p_alone.grad)
        own.append((term.item(), ((q - y) ** 2).mean().item(), q.detach()))
    assert loss.item() == pytest.approx(own[0][0] + own[1][0], rel=1e-6)
    assert td.item() == pytest.approx(own[0][1], rel=1e-6)
    torch.testing.assert_close(q_logged, own[0][2])
    single = naf.naf_loss(nets[:1], targets[:1], batch, 0.99, penalty=0.01)[
        0
    ]  # one network: y from its own target
    assert single.item() != pytest.approx(own[0][0], rel=1e-3)


def hand_q(V, L, d, floor):
    """Q = V - 1/2 d^T (L L^T + floor I) d for d = u - mu, written as |L^T d|^2 + floor |d|^2."""
    return V - 0.5 * (
        (L.transpose(-1, -2) @ d.unsqueeze(-1)).squeeze(-1).square().sum(-1)
        + floor * d.square().sum(-1)
    )


def test_smoothed_target_value_is_the_mean_of_q_over_target_noise():
    """Deviation j (--target-noise sigma): the target's V'(x') - sigma^2/2 tr P'(x') is the mean of
    Q'(x', mu'(x') + eps) over eps ~ N(0, sigma^2 I), here by Monte Carlo over 200,000 draws per state
    of Q written out by hand, with the curvature floor on; sigma 0 gives V'(x') itself."""
    net, x, sigma, floor = random_net(seed=4), torch.randn(6, 4), 0.3, 0.2
    with torch.no_grad():
        V, _, L, _ = net(x)
        n, eps = (
            200_000,
            sigma * torch.randn(200_000, 6, 3, generator=torch.Generator().manual_seed(0)),
        )
        q = hand_q(V, L, eps, floor)  # [draws, states]: Q at mu + eps, so u - mu = eps
        smoothed = net.value(x, sigma, floor)
    assert torch.all(V - smoothed > 0.05)  # the smoothing is not a no-op here
    np.testing.assert_allclose(
        smoothed.numpy(), q.mean(0).numpy(), atol=float(4 * q.std(0).max() / n**0.5)
    )
    torch.testing.assert_close(net.value(x, 0.0, floor), V, rtol=0.0, atol=0.0)


def test_twins_bootstrap_from_the_smaller_smoothed_value():
    """With --twin-q and --target-noise, y = r + gamma (1 - terminated) min_i(V_i' - sigma^2/2 tr P_i'),
    tr P_i' summed from the diagonal of L_i' L_i'^T + floor I; update() passes sigma to the loss."""
    nets, targets = (
        [random_net(seed=0), random_net(seed=2)],
        [random_net(seed=1), random_net(seed=3)],
    )
    batch = {
        "obs": torch.randn(7, 4),
        "actions": torch.rand(7, 3) * 2 - 1,
        "rewards": torch.randn(7),
        "next_obs": torch.randn(7, 4),
        "terminated": torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]),
    }
    sigma, floor = 0.4, 0.1
    with torch.no_grad():
        smoothed = []
        for t in targets:
            V, _, L, _ = t(batch["next_obs"])
            trace = torch.diagonal(
                L @ L.transpose(1, 2) + floor * torch.eye(3), dim1=1, dim2=2
            ).sum(-1)
            smoothed.append(V - 0.5 * sigma**2 * trace)
        assert torch.any(smoothed[0] < smoothed[1]) and torch.any(
            smoothed[1] < smoothed[0]
        )  # the minimum picks from both
        y = batch["rewards"] + 0.99 * (1 - batch["terminated"]) * torch.minimum(*smoothed)
        q_by_hand = [
            hand_q(V, L, batch["actions"] - mu, floor)
            for V, mu, L, _ in (net(batch["obs"]) for net in nets)
        ]
        expected = [((q_i - y) ** 2).mean() for q_i in q_by_hand]
    loss, td, q = naf.naf_loss(nets, targets, batch, 0.99, floor, 0.0, sigma)
    torch.testing.assert_close(q, q_by_hand[0])
    assert td.item() == pytest.approx(expected[0].item(), rel=1e-6)
    assert loss.item() == pytest.approx(expected[0].item() + expected[1].item(), rel=1e-6)
    assert td.item() != pytest.approx(
        naf.naf_loss(nets, targets, batch, 0.99, floor, 0.0)[1].item(), rel=1e-3
    )
    hyper = dict(curvature_floor=floor, pre_tanh_penalty=0.0, target_noise=sigma)
    stepped = naf.update(
        torch.nn.ModuleList(nets),
        torch.nn.ModuleList(targets),
        torch.optim.SGD([p for n in nets for p in n.parameters()], lr=0.0),
        batch,
        naf.Args(gamma=0.99, tau=0.0, max_grad_norm=0.0, **hyper),
    )
    assert stepped[0].item() == pytest.approx(loss.item(), rel=1e-6)


def test_soft_update_and_scale_action_and_noise():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    expected = 0.1 * a.weight.detach() + 0.9 * b.weight.detach()
    naf.Run.polyak(b, a, 0.1)  # the harness's soft update, as update() calls it
    torch.testing.assert_close(b.weight.detach(), expected)

    low, high = np.array([-2.0, 0.0]), np.array([2.0, 10.0])
    np.testing.assert_allclose(
        naf.scale_action(np.array([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]]), low, high),
        [[-2, 0], [0, 5], [2, 10]],
    )

    state = np.array([[0.5, -1.0]])
    eps = 0.3 * np.random.default_rng(7).standard_normal((1, 2))
    noise, new_state = naf.exploration_noise("ou", state, 0.3, np.random.default_rng(7))
    np.testing.assert_allclose(new_state, state - 0.15 * state + eps)
    np.testing.assert_allclose(noise, new_state)
    noise, same = naf.exploration_noise("gaussian", state, 0.3, np.random.default_rng(7))
    np.testing.assert_allclose(noise, eps)
    assert same is state


def test_noise_scale_decays_linearly_then_holds():
    constant = naf.Args(noise_scale=0.3, final_noise_scale=None)
    assert [naf.noise_scale(constant, t) for t in (0, 10**6)] == [0.3, 0.3]
    assert naf.noise_scale(naf.Args(noise_decay_steps=0), 5) == naf.Args().noise_scale
    decaying = naf.Args(noise_scale=0.3, final_noise_scale=0.1, noise_decay_steps=1000)
    np.testing.assert_allclose(
        [naf.noise_scale(decaying, t) for t in (0, 250, 500, 1000, 5000)],
        [0.3, 0.25, 0.2, 0.1, 0.1],
    )


def test_head_init_scale_scales_only_the_heads():
    torch.manual_seed(3)
    plain = naf.NAFNetwork(3, 2, 16)
    torch.manual_seed(3)
    small = naf.NAFNetwork(3, 2, 16, head_init_scale=0.1)
    for name, p in plain.named_parameters():
        factor = 0.1 if name.split(".")[0] in ("v_head", "mu_head", "l_head") else 1.0
        torch.testing.assert_close(dict(small.named_parameters())[name], factor * p)


def test_update_clips_the_gradient_norm_or_not():
    """--max-grad-norm reaches the step: the gradient update() leaves equals the loss's own
    gradient rescaled to the clip norm (a norm of 0 leaves it as it is)."""
    batch = {
        "obs": torch.randn(8, 4),
        "actions": torch.rand(8, 3) * 2 - 1,
        "rewards": 100 * torch.randn(8),
        "next_obs": torch.randn(8, 4),
        "terminated": torch.zeros(8),
    }
    reference = random_net(seed=0)
    naf.naf_loss([reference], [random_net(seed=1)], batch, 0.99)[0].backward()
    raw = torch.cat([p.grad.flatten() for p in reference.parameters()])
    assert raw.norm() > 1.0
    for max_norm, expected in ((1e-3, raw * 1e-3 / raw.norm()), (0.0, raw)):
        net = random_net(seed=0)
        naf.update(
            one(net),
            one(random_net(seed=1)),
            torch.optim.SGD(net.parameters(), lr=0.0),
            batch,
            naf.Args(gamma=0.99, max_grad_norm=max_norm, pre_tanh_penalty=0.0),
        )
        torch.testing.assert_close(
            torch.cat([p.grad.flatten() for p in net.parameters()]), expected, rtol=1e-4, atol=1e-9
        )


@pytest.mark.slow
def test_compiled_update_matches_the_eager_update():
    """--compile: the compiled update (twins, target smoothing, curvature floor, binding clip, fused
    Adam as train() builds it) leaves the eager update's loss, TD, Q and parameters, step after step;
    once Adam's state exists (the second call), later calls compile nothing new."""
    from torch._dynamo.utils import counters

    args = naf.Args(compile=True, twin_q=True, target_noise=0.2, curvature_floor=0.01)
    args.max_grad_norm = 1.0
    batch = {
        "obs": torch.randn(8, 4),
        "actions": torch.rand(8, 3) * 2 - 1,
        "rewards": 10 * torch.randn(8),
        "next_obs": torch.randn(8, 4),
        "terminated": torch.tensor([0.0, 1.0] * 4),
    }
    runs = []
    for _ in range(2):
        nets = torch.nn.ModuleList([random_net(seed=0), random_net(seed=2)])
        targets = torch.nn.ModuleList([random_net(seed=1), random_net(seed=3)])
        runs.append((nets, targets, torch.optim.Adam(nets.parameters(), lr=1e-3, fused=True)))
    learn, graphs = torch.compile(naf.update), []
    for _ in range(4):
        want = naf.update(*runs[0], batch, args)
        got = learn(*runs[1], batch, args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[1] == graphs[-1]
    for want, got in zip(*runs):
        torch.testing.assert_close(got.state_dict(), want.state_dict(), rtol=1e-4, atol=1e-5)


def test_update_clips_the_twins_gradient_norm_jointly():
    """With --twin-q (deviation h) the clip rescales the gradient of both networks by one factor, set
    by the norm over all their parameters together, as the HalfCheetah runs trained."""
    batch = {
        "obs": torch.randn(8, 4),
        "actions": torch.rand(8, 3) * 2 - 1,
        "rewards": 100 * torch.randn(8),
        "next_obs": torch.randn(8, 4),
        "terminated": torch.zeros(8),
    }
    reference = [random_net(seed=0), random_net(seed=2)]
    naf.naf_loss(reference, [random_net(seed=1), random_net(seed=3)], batch, 0.99)[0].backward()
    raw = [torch.cat([p.grad.flatten() for p in net.parameters()]) for net in reference]
    assert (
        raw[0].norm() / raw[1].norm() > 1.1 or raw[1].norm() / raw[0].norm() > 1.1
    )  # per-network clips would differ
    nets = torch.nn.ModuleList([random_net(seed=0), random_net(seed=2)])
    targets = torch.nn.ModuleList([random_net(seed=1), random_net(seed=3)])
    optimizer = torch.optim.SGD(nets.parameters(), lr=0.0)
    naf.update(nets, targets, optimizer, batch, naf.Args(max_grad_norm=1e-3, pre_tanh_penalty=0.0))
    joint = torch.cat(raw)
    torch.testing.assert_close(
        torch.cat([p.grad.flatten() for p in nets.parameters()]),
        joint * 1e-3 / joint.norm(),
        rtol=1e-4,
        atol=1e-9,
    )


def test_train_follows_the_noise_schedule_and_scales_the_heads(
    monkeypatch, tmp_path, restore_signals
):
    """The flags reach the loop: each step draws its noise at the scheduled sigma, each update's
    advantage gets --curvature-floor and each update's loss --pre-tanh-penalty and --target-noise, and the saved
    (untrained) network's heads are --head-init-scale times those of the same seed's default."""
    scales, real_noise = [], naf.exploration_noise
    monkeypatch.setattr(
        naf,
        "exploration_noise",
        lambda kind, state, scale, rng: scales.append(scale) or real_noise(kind, state, scale, rng),
    )
    floors, real_advantage = (
        [],
        naf.advantage,
    )  # the end of the chain train -> update -> naf_loss -> q_value
    monkeypatch.setattr(
        naf,
        "advantage",
        lambda u, mu, L, floor=0.0: floors.append(floor) or real_advantage(u, mu, L, floor),
    )
    penalties, real_loss = [], naf.naf_loss
    monkeypatch.setattr(
        naf,
        "naf_loss",
        lambda net, target, batch, gamma, floor, penalty, sigma: (
            penalties.append((penalty, sigma))
            or real_loss(net, target, batch, gamma, floor, penalty, sigma)
        ),
    )
    common = dict(
        total_steps=150,
        batch_size=16,
        hidden_dim=16,
        eval_episodes=1,
        eval_interval=0,
        checkpoint_interval=0,
    )
    naf.train(
        naf.Args(
            learning_starts=0,
            noise_scale=0.3,
            final_noise_scale=0.1,
            noise_decay_steps=100,
            curvature_floor=0.25,
            pre_tanh_penalty=0.125,
            target_noise=0.375,
            run_dir=str(tmp_path / "decay"),
            **common,
        )
    )
    np.testing.assert_allclose(scales, [0.3 - 0.2 * min(1.0, t / 100) for t in range(150)])
    assert floors == [0.25] * (
        150 - 16 + 1
    )  # one update (one advantage) per step once the buffer holds a batch
    assert penalties == [(0.125, 0.375)] * (150 - 16 + 1)
    for name, head_scale in (
        ("plain", 1.0),
        ("small", 0.1),
    ):  # no update before step 1000: the saved nets are the initial ones
        naf.train(
            naf.Args(
                learning_starts=1000,
                head_init_scale=head_scale,
                run_dir=str(tmp_path / name),
                **common,
            )
        )
    plain, small = (
        torch.load(tmp_path / n / "checkpoints" / "latest.pt", weights_only=True)["net"]
        for n in ("plain", "small")
    )
    for key, value in plain.items():
        factor = 0.1 if key.split(".")[0] in ("v_head", "mu_head", "l_head") else 1.0
        torch.testing.assert_close(small[key], factor * value)


def test_normalize_obs_against_numpy():
    """--normalize-obs (deviation e): after batches of 1, 4, 7 and 20 observations the trunk reads
    clip((x - mean) / sqrt(var + 1e-8), -10, 10) with numpy's mean and variance over all of them;
    without it the trunk reads x unchanged, and the moments stay out of the state dict. The target's
    V-only path (`value`) reads the same input and gives the full forward's V."""
    rng = np.random.default_rng(0)
    batches = [rng.normal([5.0, -2.0, 0.0], [1.0, 3.0, 0.01], (n, 3)) for n in (1, 4, 7, 20)]
    seen = np.concatenate(batches)
    x = np.array(
        [[5.0, -2.0, 0.0], [50.0, 100.0, -1.0]], np.float32
    )  # the second row far outside: clipped
    normalized = np.clip((x - seen.mean(0)) / np.sqrt(seen.var(0) + 1e-8), -10.0, 10.0)
    assert np.abs(normalized[1]).max() == 10.0  # the second row is clipped
    assert all(
        torch.isfinite(t).all()
        for t in naf.NAFNetwork(3, 1, 8, normalize_obs=True)(torch.as_tensor(x))
    )  # nothing seen yet
    for normalize, expected in ((True, normalized), (False, x)):
        net, trunk_inputs = naf.NAFNetwork(3, 1, 8, normalize_obs=normalize), []
        net.trunk.register_forward_pre_hook(lambda module, args: trunk_inputs.append(args[0]))
        for b in batches:
            net.observe(b)
        V = net(torch.as_tensor(x))[0]
        V_target_path = net.value(
            torch.as_tensor(x)
        )  # the target's V-only path reads the same input
        for trunk_input in trunk_inputs:
            np.testing.assert_allclose(trunk_input.numpy(), expected, rtol=1e-5, atol=1e-6)
        by_hand = net.v_head(net.trunk(torch.as_tensor(expected, dtype=torch.float32))).squeeze(-1)
        torch.testing.assert_close(V_target_path, by_hand, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(V_target_path, V, rtol=0.0, atol=0.0)
        assert len(trunk_inputs) == 3 and ("obs_moments" in net.state_dict()) is normalize


def test_layer_norm_standardises_each_hidden_layer():
    """--layer-norm (deviation i): each hidden layer is ReLU(gamma * (z - mean(z)) / sqrt(var(z) + 1e-5) + beta)
    of its pre-activation z = W h + b, the statistics per sample over the layer's units, computed here
    by hand from the linear weights; without the flag the trunk is the paper's, under the keys it always
    had (trunk.0, trunk.2), so checkpoints without it keep their format."""
    torch.manual_seed(0)
    net = naf.NAFNetwork(5, 2, 16, layer_norm=True)
    with torch.no_grad():  # gains and shifts away from their initial 1 and 0, so the test sees them
        for norm in (net.trunk[1], net.trunk[4]):
            norm.weight.uniform_(0.5, 2.0)
            norm.bias.uniform_(-1.0, 1.0)
    x = 3.0 * torch.randn(64, 5) + 2.0
    h = x
    for linear, norm in ((net.trunk[0], net.trunk[1]), (net.trunk[3], net.trunk[4])):
        z = h @ linear.weight.T + linear.bias
        z_hat = (z - z.mean(1, keepdim=True)) / (
            z.var(1, unbiased=False, keepdim=True) + 1e-5
        ).sqrt()
        h = torch.relu(norm.weight * z_hat + norm.bias)
    torch.testing.assert_close(net.features(x), h, rtol=1e-5, atol=1e-5)
    ln_keys = {"trunk.1.weight", "trunk.1.bias", "trunk.4.weight", "trunk.4.bias"}
    assert ln_keys <= net.state_dict().keys()
    plain = naf.NAFNetwork(5, 2, 16).state_dict().keys()
    assert {k for k in plain if k.startswith("trunk")} == {
        "trunk.0.weight",
        "trunk.0.bias",
        "trunk.2.weight",
        "trunk.2.bias",
    }
    assert net.state_dict().keys() - ln_keys == {k.replace("trunk.2", "trunk.3") for k in plain}


def test_normalize_obs_counts_every_observation_once(tmp_path, restore_signals):
    """--normalize-obs: after 300 Pendulum steps the moments are those of the 300 observations the
    steps returned, rebuilt here from the replay buffer; the target network reads the same moments;
    --eval-only of the checkpoint repeats the final evaluation."""
    run = tmp_path / "run"
    naf.train(
        naf.Args(
            total_steps=300,
            learning_starts=100,
            batch_size=16,
            hidden_dim=16,
            eval_episodes=1,
            eval_interval=0,
            checkpoint_interval=0,
            normalize_obs=True,
            run_dir=str(run),
        )
    )
    ckpt = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    buffer = ckpt["replay_buffer"]
    # Rows 0-199 are steps 1-200 (the episode is truncated at 200); step 201 resets (its observation
    # is row 200's x); rows 200-298 are steps 202-300.
    assert buffer["size"] == 299
    seen = np.concatenate(
        [buffer["next_obs"][:200], buffer["obs"][200:201], buffer["next_obs"][200:]]
    ).astype(np.float64)
    moments = ckpt["net"]["obs_moments"].numpy()
    np.testing.assert_array_equal(moments[0], 300)
    np.testing.assert_allclose(moments[1] / 300, seen.mean(0), rtol=1e-6)
    np.testing.assert_allclose(moments[2] / 300 - (moments[1] / 300) ** 2, seen.var(0), rtol=1e-6)
    torch.testing.assert_close(ckpt["target_net"]["obs_moments"], ckpt["net"]["obs_moments"])
    naf.train(
        naf.Args(eval_only=True, checkpoint=str(run / "checkpoints" / "latest.pt"), eval_episodes=1)
    )
    assert (
        json.loads((run / "eval.json").read_text())["eval_returns"] == summary(run)["eval_returns"]
    )


def test_replay_buffer_wraps_and_round_trips():
    buffer = naf.ReplayBuffer(5, 1, 1)
    for t in range(7):
        buffer.add(
            np.array([[t]]), np.array([[0.0]]), np.array([t]), np.array([[t + 1]]), np.array([0.0])
        )
    assert buffer.size == 5 and buffer.ptr == 2
    assert sorted(buffer.rewards.tolist()) == [2, 3, 4, 5, 6]
    other = naf.ReplayBuffer(5, 1, 1)
    other.load_state_dict(buffer.state_dict())
    np.testing.assert_array_equal(other.obs, buffer.obs)
    assert (other.ptr, other.size) == (2, 5)


# ---------------------------------------------------------------- NEXT_STEP autoreset
class CounterEnv(gym.Env):
    """obs = [t, T]: t counts steps, the episode terminates at t = T, T drawn in {2, 3, 4} at reset."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.T = 0, int(self.np_random.integers(2, 5))
        return np.array([0, self.T], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, self.T], np.float32), 1.0, self.t == self.T, False, {}


gym.register(
    "NafCounter-v0", entry_point=CounterEnv, max_episode_steps=3
)  # T = 4 gets truncated at t = 3


class ActionEchoEnv(gym.Env):
    """obs = the action the env received, in its bounds [-2, 3]."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-2.0, 3.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.asarray(action, np.float32), 0.0, False, False, {}


gym.register("NafActionEcho-v0", entry_point=ActionEchoEnv)


def test_step_and_store_scales_to_the_env_bounds_and_stores_u():
    """The env gets u in [-1, 1] mapped onto its own bounds [-2, 3]; the buffer keeps u itself."""
    envs = naf.make_envs("NafActionEcho-v0", 3)
    obs, _ = envs.reset(seed=0)
    buffer = naf.ReplayBuffer(10, 1, 1)
    u = np.array([[-1.0], [0.0], [1.0]], np.float32)
    next_obs, *_ = naf.step_and_store(envs, buffer, obs, u, np.zeros(3, bool))
    envs.close()
    np.testing.assert_allclose(next_obs[:, 0], [-2.0, 0.5, 3.0])
    np.testing.assert_allclose(buffer.actions[:3, 0], [-1.0, 0.0, 1.0])


def test_autoreset_step_is_not_stored():
    envs = naf.make_envs("NafCounter-v0", 3)
    obs, _ = envs.reset(seed=0)
    buffer = naf.ReplayBuffer(1000, 2, 1)
    autoreset = np.zeros(3, bool)
    stored, ends, truncations = 0, 0, 0
    for _ in range(40):
        stored += int((~autoreset).sum())
        u = np.zeros((3, 1), np.float32)
        obs, _, terminated, truncated, autoreset = naf.step_and_store(
            envs, buffer, obs, u, autoreset
        )
        ends += int(autoreset.sum())
        truncations += int((truncated & ~terminated).sum())
    envs.close()
    assert ends > 5 and truncations > 0
    assert buffer.size == stored < 40 * 3
    t, T, t_next = (
        buffer.obs[: buffer.size, 0],
        buffer.obs[: buffer.size, 1],
        buffer.next_obs[: buffer.size, 0],
    )
    np.testing.assert_array_equal(t_next, t + 1)  # no (final obs -> reset obs) row
    np.testing.assert_array_equal(buffer.next_obs[: buffer.size, 1], T)
    np.testing.assert_array_equal(
        buffer.terminated[: buffer.size], (t_next == T).astype(np.float32)
    )
    truncated_rows = (t_next == 3) & (T == 4)
    assert truncated_rows.any() and np.all(buffer.terminated[: buffer.size][truncated_rows] == 0)


# ---------------------------------------------------------------- end-to-end
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("naf") / "run"
    check_ok(
        run_script(
            "naf.py", *TINY, "--num-envs", "2", "--noise", "gaussian", "--run-dir", str(run_dir)
        )
    )
    return run_dir


@pytest.mark.slow
def test_tiny_run_outputs(tiny_run):
    s = summary(tiny_run)
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
    assert (s["script"], s["algo"], s["global_step"], s["eval_episodes"]) == (
        "naf.py",
        "naf",
        600,
        1,
    )
    assert json.loads((tiny_run / "config.json").read_text())["num_envs"] == 2
    assert [step for step, _ in scalars(tiny_run, "eval/episodic_return")] == [300, 600]
    assert (
        len(scalars(tiny_run, "charts/episodic_return")) == 2
    )  # each env: one 200-step episode in 300 steps
    assert scalars(tiny_run, "losses/td_loss") and scalars(tiny_run, "losses/q_values")
    # every 1000 env steps and at the last step, whatever the update schedule: a 600-step run has them too
    assert [step for step, _ in scalars(tiny_run, "charts/SPS")] == [600]
    assert scalars(tiny_run, "charts/learning_rate") == [(600, pytest.approx(1e-3))]
    ckpt = torch.load(tiny_run / "checkpoints" / "latest.pt", weights_only=True)
    assert ckpt["algo"] == "naf" and ckpt["global_step"] == 600
    # 600 env steps over 2 envs: 300 vector steps, minus one autoreset step per env after the first episode.
    assert ckpt["replay_buffer"]["size"] == 600 - 2 * 1
    assert "obs_moments" not in ckpt["net"]  # saved only with --normalize-obs
    assert ckpt["num_updates"] == (600 - 200) + 2  # updates start at step 200, 2 per vector step


@pytest.mark.slow
def test_eval_only_with_video(tiny_run, tmp_path):
    proc = run_script(
        "naf.py",
        "--eval-only",
        "--checkpoint",
        str(tiny_run / "checkpoints" / "latest.pt"),
        "--eval-episodes",
        "1",
        "--capture-video",
        "--run-dir",
        str(tmp_path),
    )
    check_ok(proc)
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["eval_episodes"] == 1 and result["global_step"] == 600
    assert list((tmp_path / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_copy_alone_runs(tmp_path):
    script = copy_alone("naf.py", tmp_path)
    check_ok(
        run_script(
            script,
            "--total-steps",
            "300",
            "--learning-starts",
            "100",
            "--eval-episodes",
            "1",
            cwd=tmp_path,
        )
    )
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("Pendulum-v1__naf__1__")
    assert summary(run_dir)["global_step"] == 300


@pytest.mark.slow
def test_sigterm_then_resume_keeps_buffer_and_curve(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *TINY,
        "--checkpoint-interval",
        "200",
        "--eval-interval",
        "200",
        "--run-dir",
        str(run_dir),
    ]
    cmd = [sys.executable, str(ALGOS / "naf.py"), *args, "--total-steps", "1000000"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"OMP_NUM_THREADS": "1", **__import__("os").environ},
    )
    ckpt_path = run_dir / "checkpoints" / "latest.pt"
    deadline = time.time() + 120
    while not ckpt_path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "interrupted: continue with --resume" in out and not (run_dir / "summary.json").exists()
    first = torch.load(ckpt_path, weights_only=True)
    n = first["global_step"]
    assert n >= 200

    check_ok(run_script("naf.py", *args, "--total-steps", str(n + 400), "--resume", str(ckpt_path)))
    s = summary(run_dir)
    assert s["global_step"] == n + 400
    last = torch.load(ckpt_path, weights_only=True)
    size = first["replay_buffer"]["size"]
    assert last["replay_buffer"]["size"] > size
    for key in naf.ReplayBuffer.FIELDS:
        torch.testing.assert_close(last["replay_buffer"][key][:size], first["replay_buffer"][key])
    assert last["num_updates"] == first["num_updates"] + 400
    steps = [step for step, _ in scalars(run_dir, "eval/episodic_return")]
    assert steps == sorted(set(steps)) and steps[-1] == n + 400 and steps[0] == 200


@pytest.mark.slow
def test_same_seed_same_metrics(tmp_path):
    args = [
        "--total-steps",
        "400",
        "--learning-starts",
        "200",
        "--batch-size",
        "32",
        "--hidden-dim",
        "32",
        "--eval-episodes",
        "1",
    ]
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        check_ok(run_script("naf.py", *args, "--seed", seed, "--run-dir", str(tmp_path / name)))
    a, b, c = (summary(tmp_path / n) for n in "abc")
    assert a["eval_returns"] == b["eval_returns"]
    assert scalars(tmp_path / "a", "charts/episodic_return") == scalars(
        tmp_path / "b", "charts/episodic_return"
    )
    a_ckpt, b_ckpt = (
        torch.load(tmp_path / n / "checkpoints" / "latest.pt", weights_only=True) for n in "ab"
    )
    for key in a_ckpt["net"]:
        torch.testing.assert_close(a_ckpt["net"][key], b_ckpt["net"][key], rtol=0, atol=0)
    assert (
        a["eval_returns"] != c["eval_returns"]
    )  # the seed matters, so equality above means something


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "env_id, fragment",
    [
        ("CartPole-v1", "ppg.py"),
        ("CarRacing-v3", "ppo_atari.py"),
        ("ALE/Pong-v5", "dqn_atari.py"),
        ("NoSuchEnv-v0", "cannot make environment"),
    ],
)
def test_unsupported_env_refused(env_id, fragment):
    with pytest.raises(SystemExit, match=fragment) as e:
        naf.make_env(env_id)
    assert str(e.value).startswith("naf.py: error:") and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        ({"batch_size": 0}, "--batch-size"),
        ({"buffer_size": 10}, "--buffer-size"),
        ({"tau": 0.0}, "--tau"),
        ({"gamma": 1.5}, "--gamma"),
        ({"learning_rate": -1.0}, "--learning-rate"),
        ({"num_envs": 0}, "--num-envs"),
        ({"updates_per_step": 0}, "--updates-per-step"),
        ({"noise_scale": -0.1}, "--noise-scale"),
        ({"final_noise_scale": -0.1}, "--final-noise-scale"),
        ({"noise_decay_steps": -1}, "--noise-decay-steps"),
        ({"max_grad_norm": -1.0}, "--max-grad-norm"),
        ({"head_init_scale": 0.0}, "--head-init-scale"),
        ({"hidden_dim": 0}, "--hidden-dim"),
        ({"curvature_floor": -0.1}, "--curvature-floor"),
        ({"pre_tanh_penalty": -0.01}, "--pre-tanh-penalty"),
        ({"pre_tanh_penalty": float("nan")}, "--pre-tanh-penalty"),
        ({"target_noise": -0.2}, "--target-noise"),
        ({"target_noise": float("nan")}, "--target-noise"),
        ({"eval_only": True}, "--checkpoint"),
    ],
)
def test_bad_hyperparameters(flags, fragment):
    with pytest.raises(SystemExit, match=fragment):
        naf.train(naf.Args(**flags))


@pytest.mark.slow
def test_bad_input_cli_is_one_line(tmp_path):
    """The same checks through the command line: one stderr line, no traceback, nothing written."""
    check_error(
        run_script("naf.py", "--env-id", "CartPole-v1", "--run-dir", str(tmp_path / "a")),
        "naf.py: error",
        "ppg.py",
    )
    check_error(
        run_script("naf.py", "--updates-per-step", "0", "--run-dir", str(tmp_path / "b")),
        "--updates-per-step",
    )
    assert not list(tmp_path.iterdir())


def test_bad_checkpoints(tiny_run, tmp_path):
    good = str(tiny_run / "checkpoints" / "latest.pt")
    other = tmp_path / "other.pt"
    torch.save({"algo": "d4pg", "env_id": "Pendulum-v1", "args": {}, "global_step": 1}, other)
    stranger = tmp_path / "stranger.pt"
    torch.save({"weights": torch.zeros(2)}, stranger)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    for path, fragment in (
        (other, "written by d4pg.py; use d4pg.py"),
        (corrupt, "corrupt"),
        (stranger, "not a checkpoint written by this library"),
        (tmp_path / "missing.pt", "does not exist"),
    ):
        with pytest.raises(SystemExit, match=fragment):
            naf.Run.load_checkpoint(str(path))
    assert (
        naf.Run.load_checkpoint(good)["net"]["v_head.bias"].device.type == "cpu"
    )  # always loaded on the CPU
    cases = [
        ({"env_id": "InvertedPendulum-v5"}, "is for Pendulum-v1"),
        ({"num_envs": 2, "hidden_dim": 64}, "--hidden-dim 32"),
        ({"hidden_dim": 32}, "--num-envs 2"),
        ({"hidden_dim": 32, "num_envs": 2, "buffer_size": 500}, "--buffer-size 1000000"),
        (
            {"hidden_dim": 32, "num_envs": 2, "total_steps": 599},
            "--total-steps is below the checkpoint's step; pass 600",
        ),
        (
            {"hidden_dim": 32, "num_envs": 2, "normalize_obs": True},
            "was made with --no-normalize-obs; pass --no-normalize-obs",
        ),
        (
            {"hidden_dim": 32, "num_envs": 2, "twin_q": True},
            "was made with --no-twin-q; pass --no-twin-q",
        ),
        (
            {"hidden_dim": 32, "num_envs": 2, "layer_norm": True},
            "was made with --no-layer-norm; pass --no-layer-norm",
        ),
    ]
    for flags, fragment in cases:  # refused before anything is written
        with pytest.raises(SystemExit, match=fragment):
            naf.train(naf.Args(resume=good, run_dir=str(tmp_path / "r"), **flags))
    older = (
        tmp_path / "older.pt"
    )  # a checkpoint of naf.py before the run harness: other keys, no "harness" mark
    torch.save(
        {k: v for k, v in torch.load(good, weights_only=True).items() if k != "harness"}, older
    )
    with pytest.raises(SystemExit, match="written by an older naf.py; resume it there"):
        naf.train(
            naf.Args(resume=str(older), hidden_dim=32, num_envs=2, run_dir=str(tmp_path / "r"))
        )
    before_flag = (
        tmp_path / "before_flag.pt"
    )  # written before --layer-norm existed: its args lack the key
    ckpt = torch.load(good, weights_only=True)
    torch.save(
        {**ckpt, "args": {k: v for k, v in ckpt["args"].items() if k != "layer_norm"}}, before_flag
    )
    with pytest.raises(SystemExit, match="predates --layer-norm; use the naf.py that wrote it"):
        naf.train(
            naf.Args(
                resume=str(before_flag), hidden_dim=32, num_envs=2, run_dir=str(tmp_path / "r")
            )
        )
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_bad_checkpoint_cli(tiny_run, tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"algo": "d4pg", "env_id": "Pendulum-v1", "args": {}, "global_step": 1}, other)
    check_error(
        run_script("naf.py", "--resume", str(other), "--run-dir", str(tmp_path / "r")),
        "naf.py: error",
        "written by d4pg.py",
    )
    good = str(tiny_run / "checkpoints" / "latest.pt")
    check_error(
        run_script("naf.py", "--resume", good, "--run-dir", str(tmp_path / "r")),
        "naf.py: error",
        "--hidden-dim 32",
    )
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- in process: outputs, signals, W&B
IN_PROCESS = dict(
    learning_starts=100, batch_size=32, hidden_dim=32, eval_episodes=1, checkpoint_interval=0
)


def test_run_dir_rule(tmp_path):
    assert (
        naf.Run.run_dir_for(naf.Args(), str(tmp_path / "run" / "checkpoints" / "latest.pt"))
        == (tmp_path / "run").resolve()
    )
    assert naf.Run.run_dir_for(naf.Args(), str(tmp_path / "copy.pt")) == tmp_path.resolve()
    assert naf.Run.run_dir_for(naf.Args(run_dir="elsewhere"), str(tmp_path / "copy.pt")) == Path(
        "elsewhere"
    )
    assert naf.Run.run_dir_for(naf.Args(seed=7), None).name.startswith("Pendulum-v1__naf__7__")


@pytest.mark.slow
def test_in_process_run_video_sps_wandb_and_eval_only(tmp_path, fake_wandb, restore_signals):
    run = tmp_path / "run"
    naf.train(
        naf.Args(
            seed=3,
            total_steps=300,
            eval_interval=0,
            capture_video=True,
            track=True,
            run_dir=str(run),
            **IN_PROCESS,
        )
    )
    s = summary(run)
    assert list(
        (run / "videos").glob("*.mp4")
    )  # --capture-video records the final evaluation of training
    assert s["sps"] > 0 and s["global_step"] == 300
    assert [step for step, _ in scalars(run, "charts/SPS")] == [300]
    assert fake_wandb.calls == [
        ("init", []),
        ("finish", 0),
    ]  # init before the SummaryWriter, finish at the end

    check_eval_only_after_move(
        run,
        lambda ckpt: naf.train(naf.Args(eval_only=True, checkpoint=ckpt, eval_episodes=1)),
        seed=3,
    )


def test_signal_skips_due_evaluation_and_saves_at_once(
    tmp_path, fake_wandb, restore_signals, monkeypatch
):
    """A SIGTERM during the env step that reaches step 100, where an evaluation is due: no evaluation
    (periodic or final), no summary, the checkpoint holds step 100, a second Ctrl-C would kill at
    once, and the W&B run is finished."""
    real_eval, evals = naf.evaluate, []
    step_then_signal, steps = sigterm_on_call(100, naf.step_and_store)
    monkeypatch.setattr(naf, "step_and_store", step_then_signal)
    monkeypatch.setattr(naf, "evaluate", lambda *a, **k: evals.append(1) or real_eval(*a, **k))
    run = tmp_path / "run"
    naf.train(
        naf.Args(total_steps=1000, eval_interval=100, track=True, run_dir=str(run), **IN_PROCESS)
    )
    assert len(steps) == 100 and evals == [] and not (run / "summary.json").exists()
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["global_step"] == 100
    assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    assert fake_wandb.calls[-1] == ("finish", 0)


def test_nonfinite_loss_stops_and_keeps_last_checkpoint(
    tmp_path, fake_wandb, restore_signals, monkeypatch
):
    """A NaN loss at the first update (step 150) stops training in one line; the checkpoint of
    step 100 stays as it was, no summary.json is written, and W&B hears of the failure."""
    real_loss = naf.naf_loss

    def nan_loss(*args, **kwargs):
        loss, td, q = real_loss(*args, **kwargs)
        return loss * float("nan"), td, q

    monkeypatch.setattr(naf, "naf_loss", nan_loss)
    run = tmp_path / "run"
    with pytest.raises(
        SystemExit, match=r"non-finite loss at step 150; try lower learning rates"
    ) as e:
        naf.train(
            naf.Args(
                total_steps=300,
                run_dir=str(run),
                track=True,
                **{**IN_PROCESS, "learning_starts": 150, "checkpoint_interval": 100},
            )
        )
    assert str(e.value).startswith("naf.py: error:") and "\n" not in str(e.value)
    assert fake_wandb.calls[-1] == ("finish", 1)
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["global_step"] == 100
    assert not (run / "summary.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error needs a machine without CUDA")
def test_device_cuda_without_cuda_refused():
    with pytest.raises(SystemExit, match="CUDA is not available"):
        naf.train(naf.Args(device="cuda"))


def test_track_without_wandb_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(SystemExit, match="--track needs wandb"):
        naf.train(naf.Args(track=True, run_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- resume equivalence, OU restart
class ConstantObsBandit(gym.Env):
    """Observation always zero, reward -|u - 0.3|^2, episodes of 1000 steps: the env holds no state
    that a resume could lose, so a resumed run must repeat the uninterrupted one exactly."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return (
            np.zeros(3, np.float32),
            -float(np.sum((np.asarray(action) - 0.3) ** 2)),
            False,
            False,
            {},
        )


gym.register("ConstantObsBandit-v0", entry_point=ConstantObsBandit, max_episode_steps=1000)


@pytest.mark.parametrize(
    "noise, normalize_obs, twin_q, layer_norm",
    [
        ("ou", False, False, False),
        ("gaussian", False, False, False),
        ("ou", True, False, False),
        ("gaussian", True, True, True),
    ],
)
def test_resumed_run_equals_uninterrupted_run(
    tmp_path, restore_signals, noise, normalize_obs, twin_q, layer_norm
):
    """Train 200 steps, resume to 400; train 400 straight: the same weights, target network,
    optimizer moments, buffer and TD losses after the resume (network, optimizer, buffer, OU state
    and both generators restored). With --twin-q the twin and its target are restored too, with
    --normalize-obs every network holds the one set of moments, and with --layer-norm the norms'
    gains and shifts are trained, saved and restored."""
    common = dict(
        env_id="ConstantObsBandit-v0",
        learning_starts=50,
        batch_size=16,
        hidden_dim=16,
        eval_episodes=1,
        eval_interval=0,
        checkpoint_interval=0,
        noise=noise,
        normalize_obs=normalize_obs,
        twin_q=twin_q,
        layer_norm=layer_norm,
    )
    naf.train(naf.Args(total_steps=200, run_dir=str(tmp_path / "split"), **common))
    naf.train(
        naf.Args(
            total_steps=400, resume=str(tmp_path / "split" / "checkpoints" / "latest.pt"), **common
        )
    )
    naf.train(naf.Args(total_steps=400, run_dir=str(tmp_path / "straight"), **common))
    split, straight = (
        torch.load(tmp_path / n / "checkpoints" / "latest.pt", weights_only=True)
        for n in ("split", "straight")
    )
    parts = (
        ("net", "target_net", "twin_net", "twin_target_net") if twin_q else ("net", "target_net")
    )
    assert [key for key in straight if key.endswith("net")] == list(parts)
    for part in parts:
        for key in straight[part]:
            torch.testing.assert_close(split[part][key], straight[part][key], rtol=0, atol=0)
    torch.testing.assert_close(
        split["optimizer"]["state"], straight["optimizer"]["state"], rtol=0, atol=0
    )
    torch.testing.assert_close(
        split["replay_buffer"]["actions"], straight["replay_buffer"]["actions"], rtol=0, atol=0
    )
    losses = [scalars(tmp_path / n, "losses/td_loss") for n in ("split", "straight")]
    assert [p for p in losses[0] if p[0] > 200] == [p for p in losses[1] if p[0] > 200] != []
    assert ("trunk.1.weight" in straight["net"]) is layer_norm
    if layer_norm:  # trained: the gain moved off its initial 1
        assert not torch.equal(straight["net"]["trunk.1.weight"], torch.ones(16))
    if twin_q:  # two networks, initialised apart, trained apart, reading one set of moments
        assert not torch.equal(
            straight["net"]["v_head.weight"], straight["twin_net"]["v_head.weight"]
        )
        for part in parts[1:]:
            torch.testing.assert_close(
                straight[part]["obs_moments"], straight["net"]["obs_moments"], rtol=0, atol=0
            )
        naf.train(
            naf.Args(
                eval_only=True,
                checkpoint=str(tmp_path / "straight" / "checkpoints" / "latest.pt"),
                eval_episodes=1,
            )
        )
        assert (
            json.loads((tmp_path / "straight" / "eval.json").read_text())["eval_returns"]
            == summary(tmp_path / "straight")["eval_returns"]
        )


def test_ou_noise_restarts_with_each_episode(monkeypatch, tmp_path, restore_signals):
    """The OU state is zero when a new episode's first action is drawn: the reset step in between
    (whose action the env ignores) must not advance it (it used to add a second increment)."""
    states_in, real_noise = [], naf.exploration_noise
    monkeypatch.setattr(
        naf,
        "exploration_noise",
        lambda kind, state, *a: states_in.append(state.copy()) or real_noise(kind, state, *a),
    )
    naf.train(
        naf.Args(
            total_steps=205,
            learning_starts=0,
            batch_size=16,
            hidden_dim=16,
            eval_episodes=1,
            eval_interval=0,
            checkpoint_interval=0,
            noise_scale=0.3,
            run_dir=str(tmp_path / "run"),
        )
    )
    # Pendulum ends its episode at step 200; step 201 is the reset step; step 202 is the new episode's first.
    assert np.all(states_in[0] == 0) and np.all(states_in[201] == 0)
    assert np.all(states_in[200] != 0)  # within an episode the state carries over


# ---------------------------------------------------------------- the screening copies in results/
SCREENS = ALGOS.parent / "results" / "naf-ablations"
SCREENED = "9ba4e32"  # the commit whose naf.py the screens ran (results/naf-ablations/README.md)


def screening_copy(name: str, tmp_path: Path) -> Path:
    """`git show 9ba4e32:algos/naf.py > naf_screened.py`, then `patch -o <name>.py naf_screened.py
    < <name>.patch`, as results/naf-ablations/README.md documents it: naf_screened.py is naf.py as
    the screens ran it. Fails if any hunk is refused; skipped without the repository's history."""
    screened = tmp_path / "naf_screened.py"
    shown = subprocess.run(
        ["git", "-C", str(SCREENS), "show", f"{SCREENED}:algos/naf.py"], capture_output=True
    )
    if shown.returncode != 0:
        pytest.skip(f"needs naf.py at {SCREENED} from the repository's git history")
    screened.write_bytes(shown.stdout)
    copy = tmp_path / f"{name}.py"
    with open(SCREENS / f"{name}.patch") as patch_file:
        made = subprocess.run(
            ["patch", "-s", "-o", str(copy), str(screened)],
            stdin=patch_file,
            capture_output=True,
            text=True,
        )
    assert made.returncode == 0 and not copy.with_suffix(".py.rej").exists(), (
        made.stdout + made.stderr
    )
    return copy


def import_copy(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look the module up while @dataclass runs
    spec.loader.exec_module(module)
    return module


def target_inputs(module, monkeypatch) -> list[tuple]:
    """Record the (r, terminated, V_next, gamma) each call of the module's naf_loss hands to td_target."""
    seen, real = [], module.td_target
    monkeypatch.setattr(module, "td_target", lambda *a: seen.append(a) or real(*a))
    return seen


def twin_batch(module, obs_dim=4, act_dim=3, n=8):
    """Two target networks with far-from-flat quadratics and a random batch."""
    torch.manual_seed(0)
    targets = [module.NAFNetwork(obs_dim, act_dim, 16) for _ in range(2)]
    with torch.no_grad():
        for target in targets:
            target.l_head.weight.mul_(5.0)
    batch = {
        "obs": torch.randn(n, obs_dim),
        "actions": torch.rand(n, act_dim) * 2 - 1,
        "rewards": torch.randn(n),
        "next_obs": torch.randn(n, obs_dim),
        "terminated": torch.zeros(n),
    }
    return targets, batch


@pytest.mark.parametrize(
    "name, flags, key, value",
    [
        ("naf_margin", ["--pre-tanh-margin", "2"], "pre_tanh_margin", 2.0),
        ("naf_param", ["--noise", "param", "--layer-norm"], "noise", "param"),
        ("naf_td3min", ["--twin-q"], "twin_q", True),
        ("naf_reward_scale", ["--reward-scale", "0.1"], "reward_scale", 0.1),
    ],
)
def test_screening_patch_applies_to_naf_and_runs(name, flags, key, value, tmp_path):
    """The results document each screening copy as `patch -o copy.py naf_screened.py < copy.patch`,
    naf_screened.py being naf.py at 9ba4e32; that must keep working, and the copy must run with its
    flag."""
    copy = screening_copy(name, tmp_path)
    check_ok(run_script(copy, *TINY, *flags, "--run-dir", str(tmp_path / "run"), cwd=tmp_path))
    assert json.loads((tmp_path / "run" / "config.json").read_text())[key] == value
    assert (tmp_path / "run" / "summary.json").exists()


def test_td3min_copy_judges_both_targets_at_the_acting_targets_mu(tmp_path, monkeypatch):
    """naf_td3min's V_next is min_i Q'_i(x', mu'_0(x')), against a NumPy quadratic form; where the two mu's
    differ it lies below naf.py's min_i V'_i(x')."""
    copy = import_copy(screening_copy("naf_td3min", tmp_path))
    targets, batch = twin_batch(copy)
    with (
        torch.no_grad()
    ):  # V'_0 > V'_1 everywhere, so naf.py's target would be V'_1 and the twin's term decides
        targets[0].v_head.bias.add_(10.0)
    seen = target_inputs(copy, monkeypatch)
    copy.naf_loss([copy.NAFNetwork(4, 3, 16)], targets, batch, 0.99)
    with torch.no_grad():
        outs = [
            [t.numpy() for t in target(batch["next_obs"])[:3]] for target in targets
        ]  # V, mu, L
    mu0 = outs[0][1]
    q_at_mu0 = [
        V - 0.5 * np.einsum("bj,bjk,bk->b", mu0 - mu, L @ L.transpose(0, 2, 1), mu0 - mu)
        for V, mu, L in outs
    ]
    V_next = seen[0][2].numpy()
    np.testing.assert_allclose(V_next, np.minimum(*q_at_mu0), rtol=1e-5, atol=1e-5)
    assert (
        V_next < np.minimum(outs[0][0], outs[1][0]) - 1e-3
    ).all()  # the twin judged at mu'_0, not at its own maximum


def test_reward_scale_copy_scales_the_reward_in_the_target_from_its_flag(
    tmp_path, monkeypatch, restore_signals
):
    """naf_reward_scale's train() takes --reward-scale into the target (not only from the command line), and the
    target sees c * r while the replayed rewards stay raw."""
    copy = import_copy(screening_copy("naf_reward_scale", tmp_path))
    copy.train(
        copy.Args(
            total_steps=60,
            learning_starts=40,
            batch_size=8,
            hidden_dim=16,
            eval_episodes=1,
            eval_interval=0,
            checkpoint_interval=0,
            reward_scale=0.1,
            run_dir=str(tmp_path / "run"),
        )
    )
    assert copy.REWARD_SCALE == 0.1
    targets, batch = twin_batch(copy)
    seen = target_inputs(copy, monkeypatch)
    copy.naf_loss([copy.NAFNetwork(4, 3, 16)], targets, batch, 0.99)
    torch.testing.assert_close(seen[0][0], 0.1 * batch["rewards"], rtol=0, atol=0)
