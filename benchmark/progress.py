"""The live progress display: which runs are running (and where, and how far), and an ETA for
the sweep; a status block redrawn in place on a terminal, plain lines every `interval_s` in CI logs.

The ETA: a running run's time left is the steps it has left (from the progress line the algorithm
prints) at the speed it made over its last RATE_WINDOW_S of progress lines: a run that slows down
(DQN once learning starts) or resumed from a checkpoint halfway is not projected from its start.
Before two progress lines, it is the expected duration less its elapsed time. A queued run is
expected to last as long as the finished runs of its preset did on average (else as long as the
running ones would take at their current speed, else as all finished runs). The queue is then
dealt to the `slots` runs at once, each next run to the slot that frees first; the sweep ends
when the last slot does. "?" until any duration is known.
"""

from __future__ import annotations

import heapq
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from .runner import Job

TTY_REFRESH_S = 1.0
RATE_WINDOW_S = 600.0  # a running run's speed: over its progress lines of the last ten minutes


def duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def describe(record: dict[str, Any]) -> str:
    """One line for a finished run."""
    name = f"{record['preset']} seed{record['seed']}"
    if record["status"] == "ok":
        wall = record["wall_time_s"]  # None: an attempt of a resumed run was killed unmeasured
        took = "wall time unknown" if wall is None else f"{wall:.0f} s"
        return f"ok     {name}: eval {record['summary']['eval_mean']:.1f}, {took}"
    return f"FAILED {name}: {record['reason']}"


@dataclass
class Running:
    job: Job
    start: float
    where: str
    progress: tuple[int, int] | None = None
    # (time, step) of its progress lines: the last one before the window and all in it
    seen: deque[tuple[float, int]] = field(default_factory=deque)

    def seconds_per_step(self) -> float | None:
        """The run's recent speed, or None before it has made steps between two progress lines."""
        if len(self.seen) < 2 or self.seen[-1][1] <= self.seen[0][1]:
            return None
        (t0, s0), (t1, s1) = self.seen[0], self.seen[-1]
        return (t1 - t0) / (s1 - s0)


class Progress:
    """Counts runs done / running / queued / failed, shows each running run, and estimates the
    time left. `jobs` are the runs to do, `skipped` the runs finished in an earlier invocation."""

    def __init__(
        self,
        jobs: list[Job],
        skipped: int,
        slots: int,
        interval_s: float = 30.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.skipped, self.slots, self.interval_s = (
            len(jobs) + skipped,
            skipped,
            max(1, slots),
            interval_s,
        )
        self.stream, self.clock = stream or sys.stdout, clock
        self.queued = {job.key: job for job in sorted(jobs, key=lambda job: -job.timeout_s)}
        self.running: dict[str, Running] = {}
        self.durations: dict[str, list[float]] = {}
        self.done = self.failed = 0
        self.start = clock()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.output = threading.Lock()
        self.tty, self.drawn = (
            self.stream.isatty(),
            0,
        )  # on a terminal: the status block is redrawn in place

    def _expected(self, job: Job) -> float | None:
        """Expected duration of a run of `job`'s preset (see the module docstring)."""
        own = self.durations.get(job.preset.name)
        if own:
            return sum(own) / len(own)
        projected = [
            pace * r.progress[1]
            for r in self.running.values()
            if r.job.preset.name == job.preset.name
            and r.progress
            and (pace := r.seconds_per_step()) is not None
        ]
        if projected:
            return sum(projected) / len(projected)
        everything = [d for ds in self.durations.values() for d in ds]
        return sum(everything) / len(everything) if everything else None

    def _left(self, run: Running) -> float | None:
        now, pace = self.clock(), run.seconds_per_step()
        if run.progress and pace is not None:
            step, total = run.progress
            return max(0.0, pace * (total - step) - (now - run.seen[-1][0]))
        expected = self._expected(run.job)
        return None if expected is None else max(0.0, expected - (now - run.start))

    def eta(self) -> float | None:
        """Seconds until the sweep ends, or None while unknown."""
        lefts = [self._left(r) for r in self.running.values()]
        expected = [self._expected(job) for job in self.queued.values()]
        if None in lefts or None in expected:
            return None
        slots = sorted(lefts + [0.0] * max(0, self.slots - len(lefts)))  # type: ignore[operator]
        for duration in expected:
            heapq.heapreplace(slots, slots[0] + duration)  # type: ignore[operator]
        return max(slots, default=0.0)

    def _run_text(self, run: Running) -> str:
        left = self._left(run)
        done = (
            f"{100 * run.progress[0] / run.progress[1]:.0f}%"
            if run.progress and run.progress[1]
            else "starting"
        )
        return (
            f"{run.job.key} {done}"
            + (f", {duration(left)} left" if left is not None else "")
            + f" [{run.where}]"
        )

    def line(self) -> str:
        with self.lock:
            elapsed, eta = self.clock() - self.start, self.eta()
            head = (
                f"{self.skipped + self.done}/{self.total} done ({self.failed} failed, {self.skipped} from before)"
                f" | {len(self.running)} running, {len(self.queued)} queued | elapsed {duration(elapsed)}"
                f" | eta {'?' if eta is None else duration(eta)}"
            )
            runs = "; ".join(self._run_text(r) for r in self.running.values())
        return head + (f"\n  running: {runs}" if runs else "")

    def started(self, job: Job, where: str) -> None:
        with self.lock:
            self.queued.pop(job.key, None)
            self.running[job.key] = Running(job, self.clock(), where)

    def progressed(self, job: Job, progress: tuple[int, int] | None) -> None:
        with self.lock:
            run = self.running.get(job.key)
            if run is None or progress is None:
                return
            now, seen = self.clock(), run.seen
            run.progress = progress
            if not seen or progress[0] != seen[-1][1]:
                seen.append((now, progress[0]))
            while len(seen) > 2 and seen[1][0] <= now - RATE_WINDOW_S:
                seen.popleft()

    def finished(self, record: dict[str, Any]) -> None:
        key = f"{record['preset']}/seed{record['seed']}"
        with self.lock:
            self.queued.pop(key, None)
            self.running.pop(key, None)
            self.done += 1
            self.failed += record["status"] != "ok"
            if record.get("wall_time_s"):
                self.durations.setdefault(record["preset"], []).append(record["wall_time_s"])
        self._print(describe(record))

    def _print(self, text: str) -> None:
        """A line above the status block (on a terminal, the block is erased and drawn again below it)."""
        with self.output:
            self.stream.write(self._erase() + text + "\n")
            if self.tty:
                self._draw()
            self.stream.flush()

    def _erase(self) -> str:
        erase = (
            f"\x1b[{self.drawn}F\x1b[J" if self.drawn else ""
        )  # up to the block's first line, clear below
        self.drawn = 0
        return erase

    def _draw(self) -> None:
        text = self.line()
        self.stream.write(text + "\n")
        self.drawn = text.count("\n") + 1

    def _tick(self) -> None:
        while not self.stopped.wait(TTY_REFRESH_S if self.tty else self.interval_s):
            if self.tty:
                with self.output:
                    self.stream.write(self._erase())
                    self._draw()
                    self.stream.flush()
            else:
                self._print(self.line())

    def __enter__(self) -> Progress:
        threading.Thread(target=self._tick, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        with self.output:
            self.stream.write(self._erase())
        self.tty = False
        self._print(self.line())
