"""Where runs execute: local processes, or Ray tasks on a cluster without a shared file system.

Only local runs resume from the checkpoint of an unfinished attempt: Ray workers do not ship
checkpoints back (they are large), so a Ray run that did not finish starts again from scratch.

Both call `on_start(job)` when a run starts (is submitted, for Ray) and
`on_finish(record)` when its record is written.
"""

from __future__ import annotations

import io
import math
import tarfile
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

from .runner import LOG_NAME, Job, execute, make_record, prepare_run_dir, stop_all

OnStart = Callable[[Job], None]
OnFinish = Callable[[dict[str, Any]], None]
# Left on the worker: checkpoints and replay buffers are large, videos optional.
NOT_SHIPPED_DIRS = {"checkpoints", "videos"}
NOT_SHIPPED_SUFFIXES = {".pt", ".npz"}


def _threads(job: Job) -> int:
    return max(1, math.floor(job.preset.num_cpus))


def run_local(jobs: list[Job], cpus: int, on_start: OnStart, on_finish: OnFinish) -> None:
    """Run jobs as local processes on `cpus` CPUs: each run holds its preset's num_cpus
    (at most all of them) while it runs."""
    free = cpus
    turn = threading.Condition()
    cancelled = threading.Event()

    def run(job: Job) -> dict[str, Any] | None:
        nonlocal free
        need = min(math.ceil(job.preset.num_cpus), cpus)
        with turn:
            turn.wait_for(lambda: free >= need or cancelled.is_set())
            if cancelled.is_set():
                return None
            free -= need
        try:
            on_start(job)
            ckpt = prepare_run_dir(job)
            argv = job.argv(job.preset.script.resolve(), job.run_dir.resolve())
            if ckpt is not None:
                argv += ["--resume", str(ckpt)]
            result = execute(argv, Path.cwd(), job.run_dir / LOG_NAME, job.timeout_s, _threads(job))
            return make_record(job, result, argv, resumed=ckpt is not None)
        finally:
            with turn:
                free += need
                turn.notify_all()

    # Longest budgets first (the time limit is the manifest's size estimate), so that a
    # sweep does not end with one long run alone on an otherwise idle machine.
    ordered = sorted(jobs, key=lambda job: -job.timeout_s)
    pool = ThreadPoolExecutor(max_workers=cpus)
    try:
        for future in as_completed([pool.submit(run, job) for job in ordered]):
            on_finish(future.result())  # type: ignore[arg-type]  # None only once cancelled
    except BaseException:
        cancelled.set()
        with turn:
            turn.notify_all()
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all()
        raise
    pool.shutdown()


def _keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    if NOT_SHIPPED_DIRS & set(parts[1:]) or Path(info.name).suffix in NOT_SHIPPED_SUFFIXES:
        return None
    return info


def ray_task(script_name: str, script_text: str, argv: list[str], timeout_s: float,
             threads: int) -> tuple[dict[str, Any], bytes]:
    """On a Ray worker: write the script into a temp dir, run it there, return the result and
    the run's outputs (without checkpoints) as a tar archive."""
    with tempfile.TemporaryDirectory(prefix="benchmark-") as tmp:
        root = Path(tmp)
        (root / script_name).write_text(script_text)
        run_dir = root / "run"
        result = execute([script_name, *argv], root, run_dir / LOG_NAME, timeout_s, threads)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(run_dir, arcname="run", filter=_keep)
        return result, buffer.getvalue()


def _unpack(archive: bytes, run_dir: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            member.name = str(Path(*Path(member.name).parts[1:])) if member.name != "run" else "."
        tar.extractall(run_dir, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))


def run_ray(jobs: list[Job], address: str | None, local_cpus: int, on_start: OnStart,
            on_finish: OnFinish) -> None:
    """One Ray task per run, with the preset's CPU/GPU request. Without `address`, start a
    local Ray instance with `local_cpus` CPUs. Presets asking for a GPU run on CPU when the
    cluster has none."""
    import ray

    import benchmark

    package = str(Path(benchmark.__file__).parent)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, num_cpus=None if address else local_cpus, include_dashboard=False,
                 runtime_env={"py_modules": [package]}, log_to_driver=False)
    try:
        has_gpu = ray.cluster_resources().get("GPU", 0) > 0
        if not has_gpu and any(job.preset.num_gpus for job in jobs):
            print("the Ray cluster has no GPU: presets that ask for one run on CPU", flush=True)
        task = ray.remote(ray_task)
        pending = {}
        for job in jobs:
            prepare_run_dir(job, resume=False)  # no checkpoint comes back from a worker
            script = job.preset.script
            options = {"num_cpus": job.preset.num_cpus, "num_gpus": job.preset.num_gpus if has_gpu else 0}
            argv = job.argv(script.name, "run")[1:]
            ref = task.options(**options).remote(script.name, script.read_text(), argv, job.timeout_s, _threads(job))
            pending[ref] = (job, argv)
            on_start(job)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            job, argv = pending.pop(done[0])
            try:
                result, archive = ray.get(done[0])
                _unpack(archive, job.run_dir)
            except ray.exceptions.RayError as e:
                first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
                result = {"returncode": None, "timed_out": False, "wall_time_s": None,
                          "timeout_s": job.timeout_s, "error": f"Ray task failed: {first_line}"}
            on_finish(make_record(job, result, [job.preset.script.name, *argv]))
    finally:
        if started_here:
            ray.shutdown()
