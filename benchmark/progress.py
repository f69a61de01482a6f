"""The live progress display: a rich status line on a terminal, plain lines in CI logs."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from .runner import Job


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def describe(record: dict[str, Any]) -> str:
    """One line for a finished run."""
    name = f"{record['preset']} seed{record['seed']}"
    if record["status"] == "ok":
        return f"ok     {name}: eval {record['summary']['eval_mean']:.1f}, {record['wall_time_s']:.0f} s"
    return f"FAILED {name}: {record['reason']}"


class Progress:
    """Counts runs done / running / failed and estimates the time left from the runs finished
    so far. `skipped` runs finished in an earlier invocation of the sweep."""

    def __init__(self, total: int, skipped: int, interval_s: float = 30.0, stream: TextIO | None = None):
        self.total, self.skipped, self.interval_s = total, skipped, interval_s
        self.stream = stream or sys.stdout
        self.done = self.failed = self.running = 0
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.live: Any = None

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        left = self.total - self.skipped - self.done
        eta = _duration(elapsed / self.done * left) if self.done and left else "?" if left else "0m00s"
        return (f"{self.skipped + self.done}/{self.total} done ({self.failed} failed, {self.skipped} from before)"
                f" | {self.running} running | elapsed {_duration(elapsed)} | eta {eta}")

    def started(self, job: Job) -> None:
        with self.lock:
            self.running += 1

    def finished(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.running -= 1
            self.done += 1
            self.failed += record["status"] != "ok"
        self._print(describe(record))

    def _print(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def _tick(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self._print(self.line())

    def __enter__(self) -> Progress:
        if self.stream.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(get_renderable=self.line, console=Console(file=self.stream), refresh_per_second=2,
                             transient=True)
            self.live.start()
        else:
            threading.Thread(target=self._tick, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.live is not None:
            self.live.stop()
        self._print(self.line())
