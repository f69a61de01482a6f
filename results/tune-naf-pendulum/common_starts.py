"""Re-evaluate the naf-pendulum study's final checkpoints on one common set of start states.

Every algorithm file evaluates episode i of a run with seed s from reset seed s + 10_000 + i, so
runs with neighbouring seeds share most of their evaluation start states (seeds 1-3 share 8 of
10), and the trial seeds 1-3 and the validation seeds 1001-1005 see different start states. On
Pendulum, whose dynamics are deterministic, the start state decides much of the return. This
script takes each run's checkpoints/latest.pt (the final weights) and scores it on the same
`--episodes` start states (reset seeds from `--start-seed`), which no run evaluated on.

    python results/tune-naf-pendulum/common_starts.py --runs-dir runs/benchmark/tune-naf-pendulum
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]


def load_naf():
    """algos/naf.py as a module (its main() does not run on import)."""
    spec = importlib.util.spec_from_file_location("naf", ROOT / "algos" / "naf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["naf"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def iqm(values: list[float]) -> float:
    """Interquartile mean: the mean of the middle half (scipy's trim_mean at 0.25)."""
    from scipy.stats import trim_mean

    return float(trim_mean(values, 0.25))


def score(naf, checkpoint: Path, episodes: int, start_seed: int) -> tuple[float, float]:
    """Mean return of the checkpoint's greedy policy over the common start states, and its
    mean return on the run's own evaluation (summary.json's eval_mean) for comparison."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    saved = ckpt["args"]
    with naf.make_env(ckpt["env_id"]) as env:
        obs_dim = int(np.prod(env.observation_space.shape))
        act_dim = env.action_space.shape[0]
    options = {k: saved[k] for k in naf.NET_OPTIONS if k in saved}
    net = naf.NAFNetwork(obs_dim, act_dim, saved["hidden_dim"], **options)
    net.load_state_dict(ckpt["net"])
    # evaluate() seeds episode i with seed + 10_000 + i
    returns = naf.evaluate(net, ckpt["env_id"], episodes, start_seed - 10_000, "cpu")
    own = json.loads((checkpoint.parents[1] / "summary.json").read_text())["eval_mean"]
    return float(np.mean(returns)), float(own)


def main() -> None:
    """Score every run of the chosen groups and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs/benchmark/tune-naf-pendulum")
    parser.add_argument(
        "--groups",
        nargs="+",
        default=["validation/defaults"],
        help="folders under --runs-dir holding naf-pendulum/seed*/",
    )
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--start-seed", type=int, default=500_000)
    parser.add_argument("--json", type=Path, help="also write the per-run scores here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    naf = load_naf()
    print(
        f"{args.episodes} common start states (reset seeds {args.start_seed}.."
        f"{args.start_seed + args.episodes - 1})\n"
    )
    print("| runs | seeds | own evaluation: IQM (per seed) | common start states: IQM (per seed) |")
    print("|---|---|---|---|")
    table = {}
    for group in args.groups:
        seeds = sorted(
            (args.runs_dir / group / "naf-pendulum").glob("seed*"), key=lambda p: int(p.name[4:])
        )
        scores = {
            p.name: score(naf, p / "checkpoints/latest.pt", args.episodes, args.start_seed)
            for p in seeds
        }
        table[group] = scores
        common = [c for c, _ in scores.values()]
        own = [o for _, o in scores.values()]
        names = ", ".join(p.name[4:] for p in seeds)
        print(
            f"| {group} | {names} | {iqm(own):.1f} ({', '.join(f'{o:.0f}' for o in own)}) "
            f"| {iqm(common):.1f} ({', '.join(f'{c:.0f}' for c in common)}) |"
        )
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
