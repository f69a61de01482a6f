"""What a naf.py checkpoint's three heads say on the states it trained on last.

Runs the network on the newest transitions of the checkpoint's replay buffer and prints
quantiles (10%, 50%, 90%) of:
- V(x), against which the episode returns / 1000 / (1 - gamma) can be read;
- |mu's pre-tanh output| and the share of mu's components past 0.99 in magnitude: a saturated
  tanh passes almost no gradient to the mu head (tanh'(3) = 0.01);
- the smallest and largest eigenvalue of P(x) = L(x) L(x)^T + floor I, the curvature of the
  advantage (floor: the run's --curvature-floor, naf.py's deviation f; 0 by default);
- A(x, u) = Q(x, u) - V(x) at the stored actions u;
and per action component j, the median of P_jj (the curvature along u_j alone) and the share
of states where mu_j is past 0.99. Without a floor, P_11 = L_11^2 has a single term, exp(2 l_11):
once l_11 drifts far below 0, A stops depending on u_1, and mu_1 gets no gradient.

Usage (from the repository root):
    python results/naf-ablations/naf_heads.py runs/<run>/checkpoints/latest.pt [more checkpoints]
"""

from __future__ import annotations

import sys

import torch

from gait import load_algo

LAST = 5_000  # transitions: the states the recent policy visited


def quantiles(t: torch.Tensor) -> list[float]:
    return [round(v, 2) for v in torch.quantile(t.flatten().float(), torch.tensor([0.1, 0.5, 0.9])).tolist()]


def heads(path: str) -> str:
    naf = load_algo("naf")
    ckpt = torch.load(path, weights_only=True, map_location="cpu")
    rb = ckpt["replay_buffer"]
    # The newest rows end just before the write pointer, also once the ring buffer has wrapped.
    newest = (rb["ptr"] - torch.arange(min(LAST, rb["size"]), 0, -1)) % rb["size"]
    obs, actions = rb["obs"][newest], rb["actions"][newest]
    net = naf.NAFNetwork(obs.shape[1], actions.shape[1], ckpt["args"]["hidden_dim"],
                         normalize_obs=ckpt["args"].get("normalize_obs", False), layer_norm=ckpt["args"].get("layer_norm", False))
    net.load_state_dict(ckpt["net"])
    floor = ckpt["args"].get("curvature_floor", 0.0)
    with torch.inference_mode():
        V, mu, L, pre_tanh = net(obs)
        P = L @ L.transpose(1, 2) + floor * torch.eye(L.shape[-1])
        eig, P_jj = torch.linalg.eigvalsh(P), P.diagonal(dim1=1, dim2=2)  # eigenvalues ascending
        A = naf.advantage(actions, mu, L, floor)
    return (f"{path} (step {ckpt.get('global_step')}): V {quantiles(V)} | |pre-tanh mu| {quantiles(pre_tanh.abs())}, "
            f"saturated {(mu.abs() > 0.99).float().mean().item():.0%} | eig min {quantiles(eig[:, 0])}, "
            f"eig max {quantiles(eig[:, -1])} | A(x, u) {quantiles(A)}\n"
            f"    per action component: median P_jj {[round(v, 3) for v in P_jj.median(0).values.tolist()]}, "
            f"mu_j saturated {[round(v, 2) for v in (mu.abs() > 0.99).float().mean(0).tolist()]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    for checkpoint in sys.argv[1:]:
        print(heads(checkpoint))
