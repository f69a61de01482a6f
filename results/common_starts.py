"""Re-evaluate a tuning study's final checkpoints on one common set of start states.

Every algorithm file evaluates episode i of a run with seed s from reset seed s + 10_000 + i, so
runs with neighbouring seeds share most of their evaluation start states (seeds 1-3 share 8 of
10), and a study's trial seeds 1-3 and validation seeds 1001-1005 see different start states.
This script takes each run's checkpoints/latest.pt (the final weights) and scores its greedy
policy, with the file's own evaluate(), on the same `--episodes` start states (reset seeds from
`--start-seed`), which no run evaluated on.

    python results/common_starts.py --study tune-naf-pendulum --preset naf-pendulum \\
        --groups validation/defaults validation/trial0028
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from scipy.stats import trim_mean

ROOT = Path(__file__).resolve().parents[1]
EVAL_SEED_OFFSET = 10_000  # evaluate() seeds episode i with seed + 10_000 + i


def load_algo(name: str) -> ModuleType:
    """algos/<name>.py as a module (its main() does not run on import)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "algos" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def naf_returns(naf: ModuleType, ckpt: dict, episodes: int, start_seed: int) -> list[float]:
    """naf.py's network rebuilt as its eval_only() rebuilds it, scored by its evaluate()."""
    saved = ckpt["args"]
    with naf.make_env(ckpt["env_id"]) as env:
        obs_dim = int(np.prod(env.observation_space.shape))
        act_dim = env.action_space.shape[0]
    options = {k: saved[k] for k in naf.NET_OPTIONS if k in saved}
    net = naf.NAFNetwork(obs_dim, act_dim, saved["hidden_dim"], **options)
    net.load_state_dict(ckpt["net"])
    return naf.evaluate(net, ckpt["env_id"], episodes, start_seed - EVAL_SEED_OFFSET, "cpu")


def appo_returns(appo: ModuleType, ckpt: dict, episodes: int, start_seed: int) -> list[float]:
    """appo.py's agent rebuilt as its eval_only() rebuilds it, scored by its evaluate()."""
    agent = appo.Agent(*appo.check_env(ckpt["env_id"]), ckpt["args"]["hidden_dim"])
    agent.load_state_dict({"moments": agent.moments} | ckpt["agent"])
    return appo.evaluate(agent, ckpt["env_id"], episodes, start_seed - EVAL_SEED_OFFSET, "cpu")


SCORERS = {"naf": naf_returns, "appo": appo_returns}


def iqm(values: list[float]) -> float:
    """Interquartile mean: the mean of the middle half."""
    return float(trim_mean(values, 0.25))


def main() -> None:
    """Score every run of the chosen groups and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True, help="a folder under runs/benchmark")
    parser.add_argument("--preset", required=True)
    parser.add_argument("--algo", choices=sorted(SCORERS), help="default: the preset's prefix")
    parser.add_argument(
        "--groups",
        nargs="+",
        default=["validation/defaults"],
        help="folders under the study holding <preset>/seed*/",
    )
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--start-seed", type=int, default=500_000)
    parser.add_argument("--json", type=Path, help="also write the per-run scores here")
    args = parser.parse_args()
    algo = args.algo or args.preset.split("-")[0]
    torch.set_num_threads(1)
    module = load_algo(algo)
    study = ROOT / "runs" / "benchmark" / args.study
    last = args.start_seed + args.episodes - 1
    print(f"{args.episodes} common start states (reset seeds {args.start_seed}..{last})\n")
    print("| runs | seeds | own evaluation: IQM (per seed) | common start states: IQM (per seed) |")
    print("|---|---|---|---|")
    table = {}
    for group in args.groups:
        runs = sorted((study / group / args.preset).glob("seed*"), key=lambda p: int(p.name[4:]))
        scores = {}
        for run in runs:
            ckpt = torch.load(run / "checkpoints/latest.pt", map_location="cpu", weights_only=False)
            common = SCORERS[algo](module, ckpt, args.episodes, args.start_seed)
            own = json.loads((run / "summary.json").read_text())["eval_mean"]
            scores[run.name] = {"own": float(own), "common": float(np.mean(common))}
        table[group] = scores
        own = [s["own"] for s in scores.values()]
        common = [s["common"] for s in scores.values()]
        print(
            f"| {group} | {', '.join(r.name[4:] for r in runs)} "
            f"| {iqm(own):.1f} ({', '.join(f'{v:.0f}' for v in own)}) "
            f"| {iqm(common):.1f} ({', '.join(f'{v:.0f}' for v in common)}) |"
        )
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
