"""`python -m benchmark dqn-memory`: measure dqn_atari's replay memory. Fill its frame-deduplicated
buffer to capacity with random 84x84 frames (every page touched, unlike a fresh np.zeros) and
report the resident memory it added over the baseline (imports and the source frames) and the
sampling speed. A full buffer of N transitions should add about N x 84 x 84 bytes (each frame
stored once) plus 15 bytes of action, reward and flags per transition.
"""

from __future__ import annotations

import importlib.util
import resource
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .manifest import ZooError

SOURCE_FRAMES = 4096


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (the tool only grows, so it is also the current)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def load_dqn(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("dqn_atari", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ZooError(f"cannot import {path}: pass the path of dqn_atari.py with --script")
    module = importlib.util.module_from_spec(spec)
    sys.modules["dqn_atari"] = module
    spec.loader.exec_module(module)
    return module


def measure(capacity: int, script: Path) -> dict[str, Any]:
    """Fill a buffer of `capacity` transitions; print and return the memory and timing numbers."""
    if capacity < 1:
        raise ZooError(f"--capacity must be positive, got {capacity}")
    dqn = load_dqn(script)
    imported = peak_rss_mb()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (SOURCE_FRAMES, 1, 84, 84), dtype=np.uint8)
    baseline = peak_rss_mb()
    print(f"after imports: RSS {imported:,.0f} MB; with {SOURCE_FRAMES:,} source frames: {baseline:,.0f} MB")
    start = time.time()
    buffer = dqn.FrameReplayBuffer(capacity, 1)
    action, reward, done = np.zeros(1, np.int64), np.ones(1, np.float32), np.zeros(1, bool)
    for i in range(capacity):
        ended = np.array([i % 5000 == 4999])  # games of 5,000 steps, so episode boundaries are stored too
        buffer.add(frames[i % SOURCE_FRAMES], action, reward, frames[(i + 1) % SOURCE_FRAMES], done, ended)
    filled = peak_rss_mb()
    fill_s = time.time() - start
    print(f"filled {capacity:,} transitions in {fill_s:.0f} s: RSS {filled:,.0f} MB, "
          f"+{filled - baseline:,.1f} MB over the baseline ({capacity * 84 * 84 / 2**20:,.1f} MB of frames)")
    start = time.time()
    for _ in range(1000):
        buffer.sample(32, rng)
    sample_s = time.time() - start
    print(f"1000 batches of 32 sampled in {sample_s:.2f} s; peak RSS {peak_rss_mb():,.0f} MB")
    return {"imported_mb": imported, "baseline_mb": baseline, "filled_mb": filled, "fill_s": fill_s,
            "sample_s": sample_s}
