"""Critic updates per second of rlpd.py's batched critic ensemble against the same ensemble written
as separate `nn.Module` critics, back to back in one process (results/rlpd-measurements.md).

Both versions start from the same weights (the separate critics are copies of the batched members,
checked to give the same Q values), use the same target rule (the minimum over a fresh random pair
of target critics), the same Adam and the same Polyak update, on the same minibatch. The separate
version is the one a reader would write first: a Python loop over ten small modules, so ten times
the kernel launches and optimizer tensors. Rounds alternate between the two versions; the medians
are reported.

Usage (until it moved here from benchmark/, `python -m benchmark ensemble-speed`):
    python results/ensemble_speed.py [--hidden 64] [--batch 128] [--updates 100] [--rounds 3]
        [--device cpu|cuda] [--threads 1] [--script algos/rlpd.py]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]


class InputError(Exception):
    """Bad input: printed as one line, exit status 2."""


def load_rlpd(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("rlpd", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise InputError(f"cannot import {path}: pass the path of rlpd.py with --script")
    module = importlib.util.module_from_spec(spec)
    sys.modules["rlpd"] = module  # dataclasses in the file look their module up by name
    spec.loader.exec_module(module)
    return module


def separate_copies(ensemble: nn.Module) -> list[nn.Sequential]:
    """The members of a batched EnsembleCritic as ordinary modules with the same weights. Each of
    its layers is one tensor [num_qs, in + 1 (+ 2), out]: the weight's rows, the bias, then in a
    hidden layer LayerNorm's gain and shift."""
    critics = []
    for i in range(ensemble.num_qs):
        layers: list[nn.Module] = []
        for layer, p in enumerate(ensemble.layers):
            hidden = layer < len(ensemble.layers) - 1
            fan_in, fan_out = p.shape[1] - (3 if hidden else 1), p.shape[2]
            linear = nn.Linear(fan_in, fan_out, device=p.device)
            linear.weight.data.copy_(p[i, :fan_in].T)
            linear.bias.data.copy_(p[i, fan_in])
            layers.append(linear)
            if hidden:
                norm = nn.LayerNorm(fan_out, device=p.device)
                norm.weight.data.copy_(p[i, fan_in + 1])
                norm.bias.data.copy_(p[i, fan_in + 2])
                layers += [norm, nn.ReLU()]
        critics.append(nn.Sequential(*layers))
    return critics


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def make_steps(
    rlpd: ModuleType,
    num_qs: int,
    obs_dim: int,
    act_dim: int,
    hidden: int,
    batch: int,
    device: torch.device,
) -> tuple[Callable[[], None], Callable[[], None]]:
    """One critic update of each version (same weights, same minibatch, same target rule)."""
    gen = torch.Generator().manual_seed(0)
    obs, next_obs = (
        torch.randn(batch, obs_dim, generator=gen),
        torch.randn(batch, obs_dim, generator=gen),
    )
    act, next_act = (
        torch.rand(batch, act_dim, generator=gen) * 2 - 1,
        torch.rand(batch, act_dim, generator=gen) * 2 - 1,
    )
    obs, next_obs, act, next_act = (t.to(device) for t in (obs, next_obs, act, next_act))
    rewards, zeros, alpha, gamma, tau = (
        torch.randn(batch, generator=gen).to(device),
        torch.zeros(batch, device=device),
        0.1,
        0.99,
        0.005,
    )

    critic = rlpd.EnsembleCritic(num_qs, obs_dim + act_dim, hidden).to(device)
    target = copy.deepcopy(critic).requires_grad_(False)
    optimizer = torch.optim.Adam(critic.parameters(), lr=3e-4)
    members = separate_copies(critic)
    targets = [copy.deepcopy(m).requires_grad_(False) for m in members]
    member_optimizer = torch.optim.Adam([p for m in members for p in m.parameters()], lr=3e-4)
    x, next_x = torch.cat([obs, act], -1), torch.cat([next_obs, next_act], -1)
    with torch.no_grad():
        gap = (
            (critic(obs, act) - torch.stack([m(x).squeeze(-1) for m in members])).abs().max().item()
        )
    if gap > 1e-4:
        raise InputError(
            f"the separate critics do not reproduce the batched ensemble (max |dQ| {gap:.2e})"
        )
    batch_dict = {"next_obs": next_obs, "rewards": rewards, "terminated": zeros}

    def batched() -> None:
        with torch.no_grad():
            pair = torch.rand(num_qs, device=device).argsort()[:2]
            y = rlpd.soft_q_target(
                target, batch_dict, next_act, zeros, pair, torch.tensor(alpha, device=device), gamma
            )
        rlpd.gradient_step(optimizer, ((critic(obs, act) - y) ** 2).mean())
        soft_update(target, critic, tau)

    def separate() -> None:
        with torch.no_grad():
            pair = torch.randperm(num_qs)[:2].tolist()
            next_q = torch.min(targets[pair[0]](next_x), targets[pair[1]](next_x)).squeeze(-1)
            y = (
                rewards + gamma * next_q
            )  # the entropy term is zero here, as in `batched` (log pi = 0)
        loss = torch.stack([((m(x).squeeze(-1) - y) ** 2).mean() for m in members]).mean()
        rlpd.gradient_step(member_optimizer, loss)
        for member, member_target in zip(members, targets):
            soft_update(member_target, member, tau)

    return batched, separate


def rate(step: Callable[[], None], updates: int, device: torch.device) -> float:
    """Updates per second of `updates` calls (after the caller's warm-up), the GPU drained at both ends."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(updates):
        step()
    sync()
    return updates / (time.perf_counter() - start)


def measure(
    hidden: int,
    batch: int,
    updates: int,
    rounds: int,
    device_name: str,
    threads: int,
    script: Path,
    num_qs: int = 10,
    obs_dim: int = 3,
    act_dim: int = 1,
) -> dict[str, Any]:
    """Print and return the median updates per second of each version and their ratio."""
    for name, value in (
        ("--hidden", hidden),
        ("--batch", batch),
        ("--updates", updates),
        ("--rounds", rounds),
        ("--threads", threads),
    ):
        if value < 1:
            raise InputError(f"{name} must be positive, got {value}")
    if device_name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda, but torch sees no CUDA device")
    device = torch.device(device_name)
    torch.set_num_threads(threads)
    rlpd = load_rlpd(script)
    torch.manual_seed(0)
    batched, separate = make_steps(rlpd, num_qs, obs_dim, act_dim, hidden, batch, device)
    for step in (batched, separate):  # warm-up: allocator, kernels, Adam state
        for _ in range(5):
            step()
    rates: dict[str, list[float]] = {"batched": [], "separate": []}
    for r in range(rounds):
        order = ("batched", "separate") if r % 2 == 0 else ("separate", "batched")
        for name in order:
            rates[name].append(rate(batched if name == "batched" else separate, updates, device))
    result = {name: statistics.median(values) for name, values in rates.items()}
    result["ratio"] = result["batched"] / result["separate"]
    where = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {threads} thread(s)"
    )
    print(
        f"{num_qs} critics, hidden {hidden}, batch {batch}, {where}; rounds: "
        + "; ".join(f"{k} " + " / ".join(f"{v:.1f}" for v in vs) for k, vs in rates.items())
    )
    print(
        f"batched {result['batched']:.1f} vs separate {result['separate']:.1f} critic updates/s: "
        f"{result['ratio']:.2f}x (medians of {rounds} rounds of {updates} updates)"
    )
    return {**result, "rounds": rates}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python results/ensemble_speed.py", description=__doc__.split("\n\n")[0]
    )
    add = parser.add_argument
    add("--hidden", type=int, default=64, help="units per hidden layer (presets 64, paper 256)")
    add("--batch", type=int, default=128, help="minibatch size (presets 128, paper 256)")
    add("--updates", type=int, default=100, help="timed updates per round")
    add("--rounds", type=int, default=3, help="rounds per version, alternating; medians reported")
    add("--device", default="cpu", help="cpu or cuda")
    add("--threads", type=int, default=1, help="torch CPU threads (the zoo's runs use one)")
    add("--script", type=Path, default=ROOT / "algos" / "rlpd.py")
    args = parser.parse_args(argv)
    try:
        measure(
            args.hidden,
            args.batch,
            args.updates,
            args.rounds,
            args.device,
            args.threads,
            args.script,
        )
    except InputError as e:
        print(f"ensemble_speed.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
