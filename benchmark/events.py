"""Read a run's TensorBoard scalars the way the run wrote them, resumes included.

A resumed run writes a second event file whose first events say "start again from step s"
(`SummaryWriter(purge_step=s)`). TensorBoard's own reader takes the files in name order, and a
name starts with the creation time in whole seconds and then the process id, so two files made
within one second can be read in the wrong order: the resumed part first, and the steps the
restart should have dropped kept. Here the files are ordered by the time their first event was
written, and the restart drops what it should.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

# One scalar point: (step, wall time, value).
Point = tuple[int, float, float]


def _events(path: Path) -> list[Any]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return list(EventFileLoader(str(path)).Load())


def _value(value: Any, plugin: str) -> float | None:
    """A scalar summary's number, from the old (simple_value) or the tensor encoding, whose
    plugin name a writer may give only with a tag's first value."""
    from tensorboard.util import tensor_util

    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and plugin == "scalars":
        return tensor_util.make_ndarray(value.tensor).item()
    return None  # text, histograms, images


def read_points(run_dir: str | Path) -> dict[str, list[Point]]:
    """Every scalar tag's points in `run_dir`, in the order the run (and its resumes) wrote them."""
    from tensorboard.compat.proto.event_pb2 import SessionLog

    files = [_events(p) for p in Path(run_dir).glob("events.out.tfevents.*") if p.is_file()]
    files = [events for events in files if events]
    files.sort(key=lambda events: events[0].wall_time)
    points: dict[str, list[Point]] = {}
    plugins: dict[str, str] = {}
    for events in files:
        for event in events:
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                for tag, series in points.items():  # a restart drops what came at or after it
                    points[tag] = [p for p in series if p[0] < event.step]
            for value in event.summary.value if event.HasField("summary") else ():
                if value.metadata.plugin_data.plugin_name:
                    plugins[value.tag] = value.metadata.plugin_data.plugin_name
                number = _value(value, plugins.get(value.tag, ""))
                if number is not None:
                    points.setdefault(value.tag, []).append((event.step, event.wall_time, number))
    return points


def read_scalars(run_dir: str | Path, tags: Iterable[str]) -> dict[str, list[tuple[int, float]]]:
    """The (step, value) series of each of `tags` (empty where the run never logged it)."""
    points = read_points(run_dir)
    return {tag: [(step, value) for step, _, value in points.get(tag, [])] for tag in tags}


def timeline(run_dir: str | Path) -> list[tuple[int, float]]:
    """(step, wall time) of a run's scalar events: per step, the latest time logged."""
    latest: dict[int, float] = {}
    for series in read_points(run_dir).values():
        for step, wall_time, _ in series:
            latest[step] = max(latest.get(step, 0.0), wall_time)
    return sorted(latest.items())
