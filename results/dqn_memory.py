"""Measure dqn_atari's replay memory (results/dqn_atari-measurements.md). Fill its
frame-deduplicated buffer to capacity with random 84x84 frames (every page touched, unlike a fresh
np.zeros) and report the resident memory it added over the baseline (imports and the source
frames) and the sampling speed. A full buffer of N transitions should add about N x 84 x 84 bytes
(each frame stored once) plus 15 bytes of action, reward and flags per transition.

Usage (until it moved here from benchmark/, `python -m benchmark dqn-memory`):
    python results/dqn_memory.py [--capacity 1000000] [--script algos/dqn_atari.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

SOURCE_FRAMES = 4096
ROOT = Path(__file__).resolve().parents[1]


class InputError(Exception):
    """Bad input: printed as one line, exit status 2."""


def rss_mb() -> float:
    """Resident memory of this process now. The peak (`ru_maxrss`) is not enough: importing torch
    can leave a transient peak above what the buffer later adds, which hides the growth."""
    statm = Path("/proc/self/statm")
    if statm.is_file():
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    peak = resource.getrusage(
        resource.RUSAGE_SELF
    ).ru_maxrss  # no /proc (macOS): the peak, in bytes
    return peak / 2**20


def load_dqn(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("dqn_atari", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise InputError(f"cannot import {path}: pass the path of dqn_atari.py with --script")
    module = importlib.util.module_from_spec(spec)
    sys.modules["dqn_atari"] = module  # dataclasses in the file look their module up by name
    spec.loader.exec_module(module)
    return module


def measure(capacity: int, script: Path) -> dict[str, Any]:
    """Fill a buffer of `capacity` transitions; print and return the memory and timing numbers."""
    if capacity < 1:
        raise InputError(f"--capacity must be positive, got {capacity}")
    dqn = load_dqn(script)
    imported = rss_mb()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (SOURCE_FRAMES, 1, 84, 84), dtype=np.uint8)
    baseline = rss_mb()
    print(
        f"after imports: RSS {imported:,.0f} MB; with {SOURCE_FRAMES:,} source frames: {baseline:,.0f} MB"
    )
    start = time.time()
    buffer = dqn.FrameReplayBuffer(capacity, 1)
    action, reward, done = np.zeros(1, np.int64), np.ones(1, np.float32), np.zeros(1, bool)
    for i in range(capacity):
        ended = np.array(
            [i % 5000 == 4999]
        )  # games of 5,000 steps, so episode boundaries are stored too
        buffer.add(
            frames[i % SOURCE_FRAMES], action, reward, frames[(i + 1) % SOURCE_FRAMES], done, ended
        )
    filled = rss_mb()
    fill_s = time.time() - start
    print(
        f"filled {capacity:,} transitions in {fill_s:.0f} s: RSS {filled:,.0f} MB, "
        f"+{filled - baseline:,.1f} MB over the baseline ({capacity * 84 * 84 / 2**20:,.1f} MB of frames)"
    )
    start = time.time()
    for _ in range(1000):
        buffer.sample(32, rng)
    sample_s = time.time() - start
    print(f"1000 batches of 32 sampled in {sample_s:.2f} s; RSS {rss_mb():,.0f} MB")
    return {
        "imported_mb": imported,
        "baseline_mb": baseline,
        "filled_mb": filled,
        "fill_s": fill_s,
        "sample_s": sample_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python results/dqn_memory.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--capacity", type=int, default=1_000_000, help="transitions in the buffer (default 1M)"
    )
    parser.add_argument("--script", type=Path, default=ROOT / "algos" / "dqn_atari.py")
    args = parser.parse_args(argv)
    try:
        measure(args.capacity, args.script)
    except InputError as e:
        print(f"dqn_memory.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
