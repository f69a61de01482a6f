"""benchmark.events: a resumed run's scalars come back in the order they were written, with the
steps the resume dropped left out, whatever the event files' names."""

from __future__ import annotations

import os
import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from benchmark.events import read_points, read_scalars, timeline


def write(run_dir: Path, steps: range, value: float, purge_step: int | None = None) -> Path:
    """One writer's event file: `x` = value + step at each step (tensor-encoded `y` beside it)."""
    before = set(run_dir.glob("events.out.tfevents.*"))
    writer = SummaryWriter(str(run_dir), purge_step=purge_step)
    for step in steps:
        writer.add_scalar("x", value + step, step)
        writer.add_scalar("y", value + step, step, new_style=True)
    writer.close()
    (path,) = set(run_dir.glob("events.out.tfevents.*")) - before
    return path


def test_a_resume_drops_the_steps_after_its_checkpoint_even_when_its_file_sorts_first(tmp_path):
    first = write(tmp_path, range(1, 6), 100.0)  # ran to step 5, checkpointed at 3
    time.sleep(0.01)
    second = write(tmp_path, range(4, 8), 200.0, purge_step=4)  # resumed from the checkpoint
    # Names from one second with a smaller process id in the resumed file: it sorts first.
    os.rename(first, tmp_path / "events.out.tfevents.1700000000.host.9999.0")
    os.rename(second, tmp_path / "events.out.tfevents.1700000000.host.10000.0")

    expected = [(1, 101.0), (2, 102.0), (3, 103.0), (4, 204.0), (5, 205.0), (6, 206.0), (7, 207.0)]
    assert read_scalars(tmp_path, ["x", "y", "never"]) == {
        "x": expected,
        "y": expected,
        "never": [],
    }
    assert [step for step, _ in timeline(tmp_path)] == list(range(1, 8))


def test_a_run_without_a_resume_reads_as_written(tmp_path):
    write(tmp_path, range(0, 3), 0.0)
    points = read_points(tmp_path)
    assert sorted(points) == ["x", "y"]
    assert [(step, value) for step, _, value in points["x"]] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    times = [wall for _, wall, _ in points["x"]]
    assert times == sorted(times)
    assert read_points(tmp_path / "missing") == {}
