"""Measure dqn_atari's replay memory: fill its frame-deduplicated buffer to capacity with random
84x84 frames (every page touched, unlike a fresh np.zeros) and report the peak resident memory and
the sampling speed.

    python -m benchmark.dqn_memory                    # the default 1,000,000 transitions
    python -m benchmark.dqn_memory --capacity 100000
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_dqn(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("dqn_atari", path)
    assert spec and spec.loader, f"cannot import {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules["dqn_atari"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000, help="transitions in the buffer")
    parser.add_argument("--script", type=Path, default=ROOT / "algos" / "dqn_atari.py")
    args = parser.parse_args(argv)

    dqn = load_dqn(args.script)
    print(f"after import: peak RSS {peak_rss_mb():,.0f} MB")
    start = time.time()
    buffer = dqn.FrameReplayBuffer(args.capacity, 1)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (4096, 1, 84, 84), dtype=np.uint8)
    action, reward, done = np.zeros(1, np.int64), np.ones(1, np.float32), np.zeros(1, bool)
    for i in range(args.capacity):
        ended = np.array([i % 5000 == 4999])  # games of 5,000 steps, so episode boundaries are stored too
        buffer.add(frames[i % 4096], action, reward, frames[(i + 1) % 4096], done, ended)
    print(f"filled {args.capacity:,} transitions in {time.time() - start:.0f} s: peak RSS {peak_rss_mb():,.0f} MB")
    start = time.time()
    for _ in range(1000):
        buffer.sample(32, rng)
    print(f"1000 batches of 32 sampled in {time.time() - start:.2f} s; peak RSS {peak_rss_mb():,.0f} MB")


if __name__ == "__main__":
    main()
