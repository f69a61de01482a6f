"""Where runs execute: local processes, or Ray tasks on a cluster that shares no folder with the driver.

Both honour each run's resource request: its preset's `num_cpus` (threads, and CPUs held while
the run runs) and `num_gpus` (dropped, with a note, where there is no GPU at all), and its
budget's `memory_gb`. A run
whose request no machine can meet fails at once with the reason, instead of waiting forever.
Both call `on_start(job, where)` when a run starts executing, `on_progress(job, (step, total))`
while it runs, and `on_finish(record)` when its record is written.

Ray: the sweep's Ray job carries the algorithms folder as its `working_dir` and the `benchmark`
package as a `py_modules` entry (plus a pip requirements file, when given), so no node needs a
checkout and no run reads the driver's folders. With a
`storage` folder or fsspec URI that outlives the nodes, each run's folder (its checkpoint
included) is copied there while it runs; a task retried after its node died, or a run of a later
invocation of the sweep, starts from that copy and resumes from its checkpoint. Cancelling the
sweep cancels the tasks, whose runs get SIGTERM (checkpoint, copy, exit).
"""

from __future__ import annotations

import bisect
import io
import math
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import provenance
from .manifest import ZooError
from .runner import (
    ATTEMPTS_NAME,
    CHECKPOINT,
    KILL_GRACE_S,
    LOG_NAME,
    RECORD_NAME,
    Job,
    check_run,
    end_attempt,
    execute,
    make_record,
    now,
    prepare_run_dir,
    relative,
    start_attempt,
    stop_all,
)

OnStart = Callable[[Job, str], None]
OnProgress = Callable[[Job, "tuple[int, int] | None"], None]
OnFinish = Callable[[dict[str, Any]], None]
# Left on the worker (and in storage): checkpoints and replay buffers are large, videos optional.
NOT_SHIPPED_DIRS = {"checkpoints", "videos"}
NOT_SHIPPED_SUFFIXES = {".pt", ".npz"}
RAY_RETRIES = 3  # attempts after a worker or node dies; each resumes from storage when there is one


@dataclass
class Callbacks:
    on_start: OnStart
    on_progress: OnProgress
    on_finish: OnFinish


@dataclass
class Machine:
    """What the local backend may fill: CPUs, GPUs (each of capacity 1) and memory in GB."""

    cpus: int
    memory_gb: float
    gpus: list[float] = field(default_factory=list)  # free capacity of each GPU

    def take(self, cpus: int, memory_gb: float, gpus: float) -> list[int] | None:
        """The GPU ids granted, if the request fits now (and then it is held), else None."""
        if cpus > self.cpus or memory_gb > self.memory_gb + 1e-9:
            return None
        if gpus == 0:
            ids = []
        elif gpus < 1:
            ids = [i for i, free in enumerate(self.gpus) if free >= gpus - 1e-9][:1]
        else:
            ids = [i for i, free in enumerate(self.gpus) if free >= 1 - 1e-9][: math.ceil(gpus)]
        if gpus and len(ids) < max(1, math.ceil(gpus)):
            return None
        self.cpus -= cpus
        self.memory_gb -= memory_gb
        for i in ids:
            self.gpus[i] -= min(gpus, 1)
        return ids

    def give(self, cpus: int, memory_gb: float, gpus: float, ids: list[int]) -> None:
        self.cpus += cpus
        self.memory_gb += memory_gb
        for i in ids:
            self.gpus[i] += min(gpus, 1)


def local_gpus() -> int:
    """GPUs `nvidia-smi -L` lists (0 without the tool)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return (
        sum(line.startswith("GPU ") for line in out.stdout.splitlines())
        if out.returncode == 0
        else 0
    )


def physical_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def _threads(job: Job) -> int:
    return max(1, math.floor(job.preset.num_cpus))


def wait_policy(side_by_side: bool) -> dict[str, str]:
    """OpenMP's wait policy for a run. The algorithm files leave OpenMP's default (idle threads
    spin a while), fastest alone; beside other runs spinning threads take their cores (three
    2-thread runs on 2 cores ran 3x slower), so runs that share a machine sleep instead. A policy
    set by the user wins."""
    if not side_by_side or "OMP_WAIT_POLICY" in os.environ:
        return {}
    return {"OMP_WAIT_POLICY": "PASSIVE"}


def _gpu_note(jobs: list[Job], gpus: float) -> None:
    if not gpus and any(job.preset.num_gpus for job in jobs):
        print("no GPU here: presets that ask for one run on CPU", flush=True)


def unfit(job: Job, cpus: float, memory_gb: float, gpus: float, where: str) -> str | None:
    """Why no machine can run `job` (None when one can); a GPU request counts only where there are GPUs."""
    preset = job.preset
    if preset.num_cpus > cpus:
        return f"asks for {preset.num_cpus:g} CPUs; {where} has at most {cpus:g}"
    if job.memory_gb > memory_gb:
        return f"asks for {job.memory_gb:g} GB of memory; {where} has at most {memory_gb:.1f} GB"
    if gpus and preset.num_gpus > gpus:
        return f"asks for {preset.num_gpus:g} GPUs; {where} has at most {gpus:g}"
    return None


def _failed(
    job: Job, reason: str, code: dict[str, Any], keep_checkpoint: bool = False
) -> dict[str, Any]:
    """Record a run that fails before it starts; `keep_checkpoint`: a checkpoint of an earlier
    attempt stays for the next invocation (the run did not get its chance)."""
    if keep_checkpoint and (job.run_dir / CHECKPOINT).is_file():
        for name in ("summary.json", RECORD_NAME):
            (job.run_dir / name).unlink(missing_ok=True)
    else:
        prepare_run_dir(job, resume=False)
    checked = check_run(
        job,
        job.run_dir,
        {
            "returncode": None,
            "timed_out": False,
            "wall_time_s": None,
            "timeout_s": job.timeout_s,
            "error": reason,
        },
    )
    return make_record(job, checked, job.command(), {**code, "host": None})


def fail_before_running(
    jobs: list[Job], reasons: dict[str, str], repo: Path, calls: Callbacks
) -> list[Job]:
    """Record as failed the jobs whose preset has a reason in `reasons` (by preset name: its dataset
    was not built), keeping their checkpoints; return the others."""
    code = provenance.code_version(repo) if any(job.preset.name in reasons for job in jobs) else {}
    for job in jobs:
        if job.preset.name in reasons:
            calls.on_start(job, "driver")
            calls.on_finish(_failed(job, reasons[job.preset.name], code, keep_checkpoint=True))
    return [job for job in jobs if job.preset.name not in reasons]


def run_local(jobs: list[Job], machine: Machine, repo: Path, calls: Callbacks) -> None:
    """Run jobs as local processes, each holding its preset's CPUs (at most all of them), memory
    and GPUs while it runs. CUDA_VISIBLE_DEVICES gives a run its GPUs, and none to a run that
    asked for none, where the machine has GPUs."""
    has_gpus, total_cpus, memory = bool(machine.gpus), machine.cpus, machine.memory_gb
    _gpu_note(jobs, len(machine.gpus))
    turn = threading.Condition()
    cancelled = threading.Event()
    # The places (in the sweep's order) of the jobs waiting for resources. Only the first may
    # take them: otherwise a thread that has just given back one CPU takes it again for its next
    # 1-CPU job before a job waiting for two can, and that job waits until the queue is empty.
    waiting: list[int] = []

    def run(place: int, job: Job) -> dict[str, Any] | None:
        request = (
            min(math.ceil(job.preset.num_cpus), total_cpus),
            job.memory_gb,
            job.preset.num_gpus if has_gpus else 0,
        )
        with turn:
            bisect.insort(waiting, place)
            while not cancelled.is_set() and (
                waiting[0] != place or (ids := machine.take(*request)) is None
            ):
                turn.wait()
            waiting.remove(place)
            turn.notify_all()  # the next in line may fit beside this one
            if cancelled.is_set():
                return None
        try:
            calls.on_start(job, "local")
            code = provenance.code_version(repo)
            ckpt = prepare_run_dir(job)
            start_attempt(job.run_dir, code)
            env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))} if has_gpus else {}
            env |= wait_policy(len(jobs) > 1 and total_cpus > request[0])
            result = execute(
                job.command(ckpt),
                Path.cwd(),
                job.run_dir / LOG_NAME,
                job.timeout_s,
                _threads(job),
                env,
                lambda progress: calls.on_progress(job, progress),
            )
            end_attempt(job.run_dir, result)
            host = provenance.run_host(job.run_dir, {**os.environ, **env})
            return make_record(
                job,
                check_run(job, job.run_dir, result),
                job.command(ckpt),
                {**code, **host},
                resumed=ckpt is not None,
            )
        finally:
            with turn:
                machine.give(*request, ids)
                turn.notify_all()

    runnable = []
    for job in jobs:
        reason = unfit(
            job, math.inf, memory, len(machine.gpus), "this machine (--memory-gb, --gpus)"
        )
        if reason:
            calls.on_start(job, "local")
            calls.on_finish(_failed(job, reason, provenance.code_version(repo)))
        else:
            runnable.append(job)
    # Longest budgets first (the time limit is the manifest's size estimate), so that a
    # sweep does not end with one long run alone on an otherwise idle machine.
    ordered = sorted(runnable, key=lambda job: -job.timeout_s)
    pool = ThreadPoolExecutor(max_workers=max(1, machine.cpus))
    try:
        for future in as_completed([pool.submit(run, i, job) for i, job in enumerate(ordered)]):
            calls.on_finish(future.result())  # type: ignore[arg-type]  # None only once cancelled
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


def _unpack(archive: bytes, run_dir: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            member.name = str(Path(*Path(member.name).parts[1:])) if member.name != "run" else "."
        tar.extractall(run_dir, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))


class Storage:
    """A run's folder in storage that outlives the node (a folder every node mounts, or any
    fsspec URI): files are uploaded when they change, each under a temporary name then
    renamed, so a node that dies mid-copy leaves the previous copy whole."""

    def __init__(self, url: str):
        import fsspec

        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.sent: dict[str, tuple[int, int]] = {}

    def restore(self, run_dir: Path) -> bool:
        """Copy the stored folder into `run_dir`; whether there was one."""
        if not self.fs.isdir(self.root):
            return False
        self.fs.get(self.root.rstrip("/") + "/", str(run_dir), recursive=True)
        return True

    def has_checkpoint(self) -> bool:
        return self.fs.isfile(f"{self.root.rstrip('/')}/{CHECKPOINT.as_posix()}")

    def clear(self) -> None:
        """Delete the stored folder (and forget what was sent)."""
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)
        self.sent.clear()

    def upload(self, run_dir: Path) -> None:
        for path in run_dir.rglob("*"):
            stat = path.stat() if path.is_file() and not path.name.endswith(".tmp") else None
            if stat is None or self.sent.get(str(path)) == (stat.st_size, stat.st_mtime_ns):
                continue
            target = f"{self.root}/{path.relative_to(run_dir).as_posix()}"
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(path), target + ".part")
            self.fs.mv(target + ".part", target)
            self.sent[str(path)] = (stat.st_size, stat.st_mtime_ns)


def resume_from_storage(stored: Storage | None, run_dir: Path) -> bool:
    """Ready a Ray run's folder `run_dir` from its stored copy, as the local backend readies a run
    folder (`prepare_run_dir`): with a checkpoint in storage, the stored folder is copied in and
    the run resumes from it (True); without one (no copy, or a node lost after a copy but before
    the run's first save) the run starts afresh in an empty folder, and the stored copy is
    deleted, so that no output of the lost attempt (event files, curves) is taken for the new
    one's (False)."""
    if stored is not None and stored.has_checkpoint():
        stored.restore(run_dir)
        if (run_dir / CHECKPOINT).is_file():
            return True
    if stored is not None:
        stored.clear()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    return False


def _tell(events: Any, event: tuple[str, str, Any]) -> None:
    """Report to the driver's display; best effort (its queue may be restarting after a node died)."""
    try:
        events.put(event, timeout=10)
    except Exception:  # noqa: BLE001  # the display must not fail a run
        pass


def ray_task(
    job: Job, argv: list[str], storage: str | None, sync_s: float, events: Any, code: dict[str, Any]
) -> dict[str, Any]:
    """On a Ray worker, in the algorithms folder the job shipped: run the algorithm in a temporary
    folder (from its stored copy and checkpoint, if any), keep the stored copy current, and return
    the result, the host's provenance and the run's outputs (without checkpoints) as a tar archive."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    script = Path.cwd() / job.preset.script.name
    with tempfile.TemporaryDirectory(prefix="benchmark-") as tmp:
        run_dir = Path(tmp) / "run"
        stored = Storage(storage) if storage else None
        resumed = resume_from_storage(stored, run_dir)
        for name in (
            "summary.json",
            RECORD_NAME,
            *(() if resumed else (ATTEMPTS_NAME,)),
        ):  # not this attempt's
            (run_dir / name).unlink(missing_ok=True)
        start_attempt(run_dir, code)
        with open(run_dir / LOG_NAME, "a") as log:
            log.write(
                f"\n--- attempt on node {node[:12]} ({platform.node()}) at {now()}"
                + (f", resumed from {storage}/{CHECKPOINT.as_posix()}" if resumed else "")
                + " ---\n"
            )
        _tell(events, ("start", job.key, f"{platform.node()}:{node[:8]}"))
        last_sync = time.monotonic()

        def poll(progress: tuple[int, int] | None) -> None:
            nonlocal last_sync
            _tell(events, ("progress", job.key, progress))
            if stored is not None and time.monotonic() - last_sync >= sync_s:
                stored.upload(run_dir)
                last_sync = time.monotonic()

        resume = ["--resume", f"run/{CHECKPOINT.as_posix()}"] if resumed else []
        try:
            result = execute(
                [str(script), *argv, *resume],
                Path(tmp),
                run_dir / LOG_NAME,
                job.timeout_s,
                _threads(job),
                wait_policy(side_by_side=True),  # Ray packs several runs on a node
                on_poll=poll,
            )
            end_attempt(run_dir, result)
        finally:
            if stored is not None:
                stored.upload(run_dir)
        host = provenance.run_host(run_dir, dict(os.environ))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(run_dir, arcname="run", filter=_keep)
        return {"result": result, "host": host, "resumed": resumed, "archive": buffer.getvalue()}


def _cluster_limits(ray: Any) -> tuple[float, float, float]:
    """The largest CPU, memory (GB) and GPU amounts any one live node offers."""
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    return (
        max((n.get("CPU", 0) for n in nodes), default=0),
        max((n.get("memory", 0) for n in nodes), default=0) / 1e9,
        max((n.get("GPU", 0) for n in nodes), default=0),
    )


def run_ray(
    jobs: list[Job],
    *,
    address: str | None,
    local_cpus: int,
    algos_dir: Path,
    repo: Path,
    storage: str | None,
    requirements: Path | None,
    sync_s: float,
    calls: Callbacks,
) -> None:
    """One Ray task per run, with the preset's CPU, GPU and memory request, in a Ray job this
    function starts (on the cluster at `address`, else on a local instance with `local_cpus`
    CPUs) so that the job carries the code: Ray accepts folders to upload only for a whole job.
    `storage`: see the module docstring; `requirements`: a pip requirements file each node
    installs (in a virtualenv of Ray's) before running."""
    import ray
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import benchmark

    if ray.is_initialized():
        raise ZooError(
            "Ray is already initialized in this process; the runner starts its own Ray job, which "
            "ships the code: call ray.shutdown() first"
        )
    runtime_env: dict[str, Any] = {
        "working_dir": str(algos_dir),
        "py_modules": [str(Path(benchmark.__file__).parent)],
        "excludes": ["__pycache__", "*.pyc"],
    }
    if requirements is not None:
        runtime_env["pip"] = [
            line.strip()
            for line in requirements.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
    ray.init(
        address=address,
        num_cpus=None if address else local_cpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=runtime_env,
    )
    if storage and "://" not in storage:
        storage = str(Path(storage).resolve())  # the workers run in their own folders
    code = provenance.code_version(repo)
    # The display's queue lives on the driver's node (restarted, empty, should that node be lost).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    events = Queue(actor_options={"num_cpus": 0, "max_restarts": -1, "scheduling_strategy": here})
    pending: dict[Any, Job] = {}
    try:
        cpus, memory_gb, gpus = _cluster_limits(ray)
        _gpu_note(jobs, gpus)
        task = ray.remote(ray_task)
        by_key = {job.key: job for job in jobs}
        for job in jobs:
            reason = unfit(job, cpus, memory_gb, gpus, "a node of the Ray cluster")
            if reason:
                calls.on_start(job, "nowhere")
                calls.on_finish(_failed(job, reason, code))
                continue
            prepare_run_dir(job, resume=False)  # the outputs come back from the worker
            options = {
                "num_cpus": job.preset.num_cpus,
                "num_gpus": job.preset.num_gpus if gpus else 0,
                "memory": int(job.memory_gb * 1e9),
                "max_retries": RAY_RETRIES,
            }
            stored = (
                f"{storage.rstrip('/')}/{job.run_dir.parent.parent.name}/{job.preset.name}/seed{job.seed}"
                if storage
                else None
            )
            argv = job.argv("unused", "run")[1:]
            pending[task.options(**options).remote(job, argv, stored, sync_s, events, code)] = job
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            try:
                news = events.get_nowait_batch(events.qsize())
            except ray.exceptions.RayError:
                news = []
            for kind, key, value in news:
                (calls.on_start if kind == "start" else calls.on_progress)(by_key[key], value)
            for ref in done:
                job = pending.pop(ref)
                try:
                    out = ray.get(ref)
                    _unpack(out["archive"], job.run_dir)
                    result, host, resumed = out["result"], out["host"], out["resumed"]
                except ray.exceptions.RayError as e:
                    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    result = {
                        "returncode": None,
                        "timed_out": False,
                        "wall_time_s": None,
                        "timeout_s": job.timeout_s,
                        "error": f"Ray task failed: {first_line}",
                    }
                    host, resumed = {"host": None}, False
                command = job.command(relative(job.run_dir / CHECKPOINT) if resumed else None)
                calls.on_finish(
                    make_record(
                        job,
                        check_run(job, job.run_dir, result),
                        command,
                        {**code, **host},
                        resumed=resumed,
                    )
                )
    except BaseException:
        # Ctrl-C or SIGTERM: cancelled tasks get KeyboardInterrupt, which stops their runs with
        # SIGTERM (checkpoint, copy to storage); force-cancel what has not stopped by then.
        for ref in pending:
            ray.cancel(ref)
        stopped, _ = ray.wait(list(pending), num_returns=len(pending), timeout=KILL_GRACE_S + 15)
        for ref in set(pending) - set(stopped):
            ray.cancel(ref, force=True)
        raise
    finally:
        ray.shutdown()
