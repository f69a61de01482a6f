"""Collect the d4pg-defaults runs into runs.json and print the tables of README.md.

usage: python results/d4pg-defaults/collect.py D4PG_ROOT [D4PG_ROOT ...] --td3 TD3_ROOT
Each D4PG_ROOT holds <env-id>/s<seed>/ run folders of algos/d4pg.py; TD3_ROOT holds
<env-id>/s<seed>/ folders of `rl_zoo3.train -f`. TD3 runs already in
results/naf-ablations/runs.json (same preset, same machine) are read from there.
"""

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from benchmark.aggregate import iqm, rank_test
from benchmark.events import read_scalars

HERE = Path(__file__).parent
TASKS = {  # env id: (steps, --v-min, --v-max, its name in naf-ablations' runs.json)
    "Pendulum-v1": (20_000, -1600, 0, None),
    "InvertedPendulum-v5": (30_000, 0, 100, "td3-ip"),
    "InvertedDoublePendulum-v5": (50_000, 0, 940, None),
    "HalfCheetah-v5": (100_000, -500, 1500, "td3-hc"),
    "Hopper-v5": (100_000, -100, 400, "td3-hopper"),
    "Reacher-v5": (50_000, -60, 0, None),
}
SEEDS = range(1, 6)
# what a run may set beside the file's defaults: the task, its budget and support, bookkeeping
PER_RUN = (
    "env_id seed total_steps v_min v_max eval_interval checkpoint_interval run_dir resume device"
)


def file_defaults() -> dict:
    """algos/d4pg.py's Args defaults less PER_RUN, read from the file itself."""
    spec = importlib.util.spec_from_file_location("d4pg", HERE.parents[1] / "algos" / "d4pg.py")
    module = sys.modules["d4pg"] = importlib.util.module_from_spec(spec)  # dataclass needs it there
    spec.loader.exec_module(module)
    fields = dataclasses.fields(module.Args)
    return {f.name: f.default for f in fields if f.name not in PER_RUN.split()}


def check_config(folder: Path, env_id: str, defaults: dict) -> None:
    """Refuse a run that set anything but its task's budget and support (TASKS)."""
    config = json.loads((folder / "config.json").read_text())
    steps, v_min, v_max, _ = TASKS[env_id]
    wanted = defaults | {"total_steps": steps, "v_min": v_min, "v_max": v_max}
    differs = {key: config.get(key) for key, value in wanted.items() if config.get(key) != value}
    if differs:
        raise SystemExit(f"{folder}: not the defaults: {differs}")


def d4pg_runs(roots: list[Path]) -> dict[tuple[str, int], list[list[float]]]:
    runs, defaults = {}, file_defaults()
    for root in roots:
        for env_id in TASKS:
            for seed in SEEDS:
                folder = root / env_id / f"s{seed}"
                if (folder / "summary.json").exists():
                    check_config(folder, env_id, defaults)
                    curve = read_scalars(folder, ["eval/episodic_return"])["eval/episodic_return"]
                    runs[env_id, seed] = [[step, value] for step, value in curve]
    return runs


def td3_runs(root: Path) -> dict[tuple[str, int], list[list[float]]]:
    runs = {}
    for task in json.loads((HERE.parent / "naf-ablations" / "runs.json").read_text()):
        for env_id, (*_, name) in TASKS.items():
            if (
                task["task"] == name
                and task["variant"] in ("T", "TD3zoo")
                and task["seed"] in SEEDS
            ):
                runs[env_id, task["seed"]] = task["eval"]
    for env_id in TASKS:
        for seed in SEEDS:
            done = root / env_id / f"s{seed}" / "done"
            if done.exists():
                npz = next(done.parent.glob("td3/*/evaluations.npz"))
                data = np.load(npz)
                runs[env_id, seed] = [
                    [int(t), float(r.mean())] for t, r in zip(data["timesteps"], data["results"])
                ]
    return runs


def below_half(value: float, best: float) -> bool:
    """value < half of best, measured from best so that it holds for negative returns too."""
    return value < best - 0.5 * abs(best)


def dips(curve: list[list[float]]) -> int:
    """Evaluations below half the best after the curve first came within 10% of it."""
    values = [v for _, v in curve]
    best = max(values)
    first = next(i for i, v in enumerate(values) if v >= best - 0.1 * abs(best))
    return sum(below_half(v, best) for v in values[first:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("d4pg_roots", type=Path, nargs="+")
    parser.add_argument("--td3", type=Path, required=True)
    args = parser.parse_args()
    d4pg, td3 = d4pg_runs(args.d4pg_roots), td3_runs(args.td3)
    records = [
        {"algo": algo, "env_id": env_id, "seed": seed, "eval": curve}
        for algo, runs in (("d4pg", d4pg), ("td3", td3))
        for (env_id, seed), curve in sorted(runs.items())
    ]
    (HERE / "runs.json").write_text(json.dumps(records, indent=1) + "\n")

    print(
        "| task (steps) | d4pg.py, seeds 1-5: last (best) | IQM | RL Zoo TD3, seeds 1-5 | IQM |"
        " rank test p | last >= best / 2 | dips (d4pg / TD3) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    wins = 0
    for env_id, (steps, *_) in TASKS.items():
        ours = [d4pg.get((env_id, s)) for s in SEEDS]
        peer = [td3.get((env_id, s)) for s in SEEDS]
        done = [c for c in ours if c]
        last = [c[-1][1] for c in done]
        held = sum(not below_half(c[-1][1], max(v for _, v in c)) for c in done)
        cells = ", ".join(
            f"{c[-1][1]:,.1f} ({max(v for _, v in c):,.1f})" if c else "-" for c in ours
        )
        peer_last = [c[-1][1] for c in peer if c]
        row = [f"{env_id} ({steps // 1000}k)", cells]
        row.append(f"{iqm(last):,.1f}" if len(last) == 5 else "")
        row.append(", ".join(f"{c[-1][1]:,.1f}" if c else "-" for c in peer))
        row.append(f"{iqm(peer_last):,.1f}" if len(peer_last) == 5 else "")
        if len(last) == 5 and len(peer_last) == 5:
            row.append(f"{rank_test(last, peer_last)['p']:.2f}")
            wins += iqm(last) >= iqm(peer_last)
        else:
            row.append("")
        row += [
            f"{held}/{len(done)}",
            f"{sum(map(dips, done))} / {sum(dips(c) for c in peer if c)}",
        ]
        print("| " + " | ".join(row) + " |")
    print(f"\nd4pg's final IQM at least TD3's in {wins} task(s) with 5 seeds on both sides")
    print("\n| task | seed | d4pg.py evaluations |\n|---|---|---|")
    for (env_id, seed), curve in sorted(d4pg.items()):
        print(f"| {env_id} | {seed} | " + ", ".join(f"{v:,.0f}" for _, v in curve) + " |")


if __name__ == "__main__":
    main()
