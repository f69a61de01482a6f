"""Read the screening runs' TensorBoard scalars into signals.json; print the README's tables."""
import json
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

RUNS = {"seed1": "seed1", "seed3": "seed3", "dense-seed3": "dense-seed3", "dense-seed2": "dense-seed2"}
out = {}
for name, folder in RUNS.items():
    acc = EventAccumulator(f"/tmp/d4pg-collapse/{folder}", size_guidance={"scalars": 0})
    acc.Reload()
    tags = [t for t in acc.Tags()["scalars"] if t.startswith(("diag/", "eval/", "charts/episodic_return"))]
    out[name] = {t: [[e.step, round(e.value, 6)] for e in acc.Scalars(t)] for t in tags}
Path(__file__).with_name("signals.json").write_text(json.dumps(out))

DIAG = ["q_mean", "q_max", "p_low_atom", "p_high_atom", "target_low_atom", "target_high_atom",
        "critic_loss", "td_abs", "critic_grad_norm", "actor_grad_norm", "action_saturation",
        "dqda_norm_mean"]


def at(series, step, window=1000):
    # mean of the points in (step - window, step]: diag is logged every 1,000 updates
    v = [x for s, x in series if step - window < s <= step]
    return np.mean(v) if v else float("nan")


for name, sig in out.items():
    ev = sig["eval/episodic_return"]
    print(f"\n## {name} eval:", ", ".join(f"{s // 1000}k {v:.0f}" for s, v in ev))
    print("| step | eval | " + " | ".join(DIAG) + " | train ret |")
    for step in range(30000 if not name.startswith("dense") else 0, 50001, 2500):
        if step == 0:
            continue
        e = dict((s, v) for s, v in ev).get(step, float("nan"))
        row = [f"{at(sig['diag/' + c], step, 2500):.4g}" for c in DIAG]
        row.append(f"{at(sig['charts/episodic_return'], step, 2500):.0f}")
        print(f"| {step / 1000:g}k | {e:.0f} | " + " | ".join(row) + " |")
    if "eval/abs_x_max" in sig:
        print("| step | eval | min | full | |x| max | |x| mean | sat. | Q eval |")
        cols = ["episodic_return", "min", "full_share", "abs_x_max", "abs_x_mean", "saturation", "q_mean"]
        d = {c: dict((s, v) for s, v in sig["eval/" + c]) for c in cols}
        for s in sorted(d["episodic_return"]):
            print(f"| {s // 1000}k | " + " | ".join(f"{d[c][s]:.3g}" for c in cols) + " |")
    # z-score of each diag signal in the 5k before each big drop against the held stretch
    drops = [s for s, v in ev if v < 0.5 * 9340 and s >= 10000]
    if drops:
        first = drops[0]
        held = [s for s, v in ev if 10000 <= s < first - 5000]
        print(f"first eval below half: {first}; z of the 5k before it against {held[0]}-{first - 5000}:")
        z = {}
        for c in DIAG:
            a = [v for s, v in sig["diag/" + c] if held[0] <= s < first - 5000]
            b = [v for s, v in sig["diag/" + c] if first - 5000 <= s < first]
            z[c] = (np.mean(b) - np.mean(a)) / (np.std(a) / np.sqrt(len(b)) + 1e-12)
        print("  " + ", ".join(f"{c} {v:+.1f}" for c, v in z.items()))
