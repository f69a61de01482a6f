"""The Ray backend on a real multi-node cluster on this machine (ray.cluster_utils.Cluster: a head
without CPUs and two worker nodes of one CPU each, one with a GPU as far as Ray knows): code shipped with each task (no run reads
the driver's folders), outputs brought back, resource requests, a dataset built by the driver before
submitting and read by the run (a relative root refused), a killed node's run resumed from
storage, a run lost before its first save started afresh in an emptied folder, and no training
process left by a cancelled sweep or a lost driver.

Heavy on a 2-core machine (a cluster takes about half a minute to start), so `slow`, and one test
on one cluster: test workers (pytest -n) cannot split it into several clusters at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_benchmark import FAKE, _processes_with, _wait_for, preset_toml, record

sys.path.insert(0, str(ROOT))  # the package, when the project is not pip-installed
from benchmark.__main__ import main
from benchmark.backends import Storage, resume_from_storage

ray = pytest.importorskip("ray")


@pytest.fixture
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    cluster.add_node(
        num_cpus=1, num_gpus=1
    )  # a GPU Ray believes in: enough to see requests honoured
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch, cluster):
    """Write the fake script and a manifest; return the arguments of a Ray sweep on the cluster."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "algos").mkdir()
    (tmp_path / "algos/fake.py").write_text(FAKE)

    def make(*entries: str) -> list[str]:
        (tmp_path / "zoo.toml").write_text("\n".join(entries))
        return [
            "--zoo",
            "zoo.toml",
            "--algos-dir",
            "algos",
            "--runs-dir",
            "runs",
            "--results-dir",
            "results",
            "--progress-interval-s",
            "600",
            "--backend",
            "ray",
            "--ray-address",
            cluster.address,
            "--ray-requirements",
            "none",
            "--storage",
            str(tmp_path / "storage"),
            "--sync-interval-s",
            "1",
        ]

    return make


def _driver(tmp_path: Path, args: list[str], name: str) -> subprocess.Popen:
    # A suite started from a background shell (`cmd &`, nohup) runs with SIGINT ignored, which a child
    # inherits, and Python then installs no KeyboardInterrupt handler: the Ctrl-C sent below would be lost
    # and the driver would run on. Start it as from a terminal: with SIGINT caught here, exec resets it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "benchmark", "full", *args, "--name", name],
            cwd=tmp_path,
            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def _stored_log(tmp_path: Path, sweep: str, preset: str, seed: int = 1) -> str:
    path = tmp_path / "storage" / sweep / preset / f"seed{seed}" / "benchmark.log"
    return path.read_text(errors="replace") if path.exists() else ""


def runs_ship_their_code_and_bring_outputs_back(tmp_path: Path, sweep) -> None:
    data = tmp_path / "data"  # absolute, as a folder every node mounts would be
    args = sweep(
        preset_toml("a"),
        preset_toml("b", args="score = 7", full_extra="memory_gb = 1"),
        preset_toml("huge", full_extra="memory_gb = 100000"),
        preset_toml("gpu", extra="num_gpus = 1"),
        preset_toml(
            "data",
            env="MountainCarContinuous-v0",
            args=f'dataset-path = "{data}/mc/expert-v0"',
            extra=f'dataset = {{ dataset_id = "mc/expert-v0", episodes = 1, root = "{data}" }}',
        ),
        preset_toml(
            "relative",
            env="Pendulum-v1",
            extra='dataset = { dataset_id = "pend/x-v0", root = "data" }',
        ),
    )
    assert (
        main(["full", *args, "--name", "ray"]) == 1
    )  # 'huge' fits no node; 'relative' has no dataset
    assert json.loads((tmp_path / "runs/ray/data/seed1/config.json").read_text())[
        "dataset_ready"
    ]  # built first
    assert record(tmp_path, "ray", "data")["status"] == "ok"
    relative = record(tmp_path, "ray", "relative")
    assert relative["status"] == "failed" and "its root data is relative" in relative["reason"]
    assert not (data / "pend").exists()
    assert record(tmp_path, "ray", "gpu")["status"] == "ok"
    assert (
        json.loads((tmp_path / "runs/ray/gpu/seed1/config.json").read_text())["gpus"] == "0"
    )  # Ray gave it one
    for preset, score in (("a", 101.0), ("b", 8.0)):
        run_dir = tmp_path / "runs/ray" / preset / "seed1"
        rec = record(tmp_path, "ray", preset)
        assert rec["status"] == "ok" and rec["summary"]["eval_mean"] == score, rec
        log = (run_dir / "benchmark.log").read_text()
        # The script ran from the copy Ray shipped (working_dir), not from the driver's folder.
        assert (
            "attempt on node" in log
            and "fake run" in log
            and f"from {tmp_path / 'algos'}\n" not in log
        )
        assert list(run_dir.glob("events.out.tfevents.*")) and (run_dir / "config.json").exists()
        assert not (
            run_dir / "checkpoints"
        ).exists()  # big files stay on the worker, and in storage
        assert (tmp_path / f"storage/ray/{preset}/seed1/checkpoints/latest.pt").exists()
        assert rec["command"][:1] == ["algos/fake.py"] and rec["provenance"]["device"] == "cpu"
        assert rec["provenance"]["host"] and rec["provenance"]["versions"]["torch"]
    huge = record(tmp_path, "ray", "huge")
    assert (
        huge["status"] == "failed"
        and "asks for 100000 GB of memory; a node of the Ray cluster" in huge["reason"]
    )
    assert (tmp_path / "results/ray/plots/b.png").exists()


def a_run_on_a_killed_node_resumes_from_storage(tmp_path: Path, sweep, cluster) -> None:
    args = sweep(
        preset_toml("stall", args='behaviour = "stall-once"', timeout=300, env="Killed-v0")
    )
    driver = _driver(tmp_path, args, "kill")
    _wait_for(
        lambda: (tmp_path / "storage/kill/stall/seed1/checkpoints/latest.pt").exists(),
        driver,
        timeout=180,
    )
    node_id = _stored_log(tmp_path, "kill", "stall").split("attempt on node ")[1][:12]
    (node,) = [n for n in cluster.worker_nodes if n.node_id.startswith(node_id)]
    cluster.remove_node(node, allow_graceful=False)
    try:
        out, err = driver.communicate(timeout=240)
        assert driver.returncode == 0, (out, err)
        rec = record(tmp_path, "kill", "stall")
        assert (
            rec["status"] == "ok"
            and rec["resumed"]
            and rec["command"][-1].endswith("checkpoints/latest.pt")
        )
        (earlier,) = rec["provenance"]["earlier_attempts"]  # the attempt on the killed node
        assert earlier["host"] and earlier["started"] < rec["provenance"]["finished"]
        # the killed attempt noted no wall time, so the run's total is unknown, not understated
        assert "wall_time_s" not in earlier and rec["wall_time_s"] is None
        assert rec["attempt_wall_time_s"] > 0
        log = (tmp_path / "runs/kill/stall/seed1/benchmark.log").read_text()
        assert (
            log.count("attempt on node") == 2
            and "resumed from" in log
            and "resumed at step 100" in log
        ), log
        assert [step for step, _ in rec["curves"]["train"]] == list(
            range(10, 201, 10)
        )  # both attempts' points
        _wait_for(lambda: not _processes_with("Killed-v0"), timeout=60)
    finally:
        cluster.add_node(num_cpus=1)  # two worker nodes again, for the two runs of what follows
        cluster.wait_for_nodes()


def a_run_lost_before_its_first_save_starts_afresh(tmp_path: Path, sweep, cluster) -> None:
    """The node dies after the run's folder (event files, log) was copied to storage but before
    any checkpoint: the retried task must not restore that folder beside its new outputs (the
    curve would hold both attempts' points, 30 for a 20-point run)."""
    marker = tmp_path / "unsaved-marker"  # the first attempt creates it; the retry then finishes
    args = sweep(
        preset_toml(
            "lost",
            args=f'behaviour = "stall-unsaved", marker = "{marker}"',
            timeout=300,
            env="LostUnsaved-v0",
        )
    )
    driver = _driver(tmp_path, args, "unsaved")
    stored = tmp_path / "storage/unsaved/lost/seed1"
    _wait_for(
        lambda: (
            "stalling unsaved" in _stored_log(tmp_path, "unsaved", "lost")
            and any(stored.glob("events.out.tfevents.*"))
        ),
        driver,
        timeout=180,
    )
    assert not (stored / "checkpoints").exists()
    node_id = _stored_log(tmp_path, "unsaved", "lost").split("attempt on node ")[1][:12]
    (node,) = [n for n in cluster.worker_nodes if n.node_id.startswith(node_id)]
    cluster.remove_node(node, allow_graceful=False)
    try:
        out, err = driver.communicate(timeout=240)
        assert driver.returncode == 0, (out, err)
        rec = record(tmp_path, "unsaved", "lost")
        assert rec["status"] == "ok" and not rec["resumed"]
        assert [step for step, _ in rec["curves"]["train"]] == list(range(10, 201, 10))
        run_dir = tmp_path / "runs/unsaved/lost/seed1"
        assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
        assert len(list(stored.glob("events.out.tfevents.*"))) == 1  # storage emptied too
        assert "stalling unsaved" not in (run_dir / "benchmark.log").read_text()
        _wait_for(lambda: not _processes_with("LostUnsaved-v0"), timeout=60)
    finally:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()


def a_stopped_sweep_leaves_no_training_process(tmp_path: Path, sweep, stop: str) -> None:
    env, name = f"Stopped{stop.title().replace(' ', '')}-v0", f"stop-{stop.replace(' ', '-')}"
    args = sweep(preset_toml("slow", seeds=2, args='behaviour = "sleep"', timeout=300, env=env))
    driver = _driver(tmp_path, args, name)
    _wait_for(
        lambda: all("fake run" in _stored_log(tmp_path, name, "slow", seed) for seed in (1, 2)),
        driver,
        timeout=180,
    )
    assert len(_processes_with(env)) >= 2
    if stop == "cancel":
        driver.send_signal(signal.SIGINT)  # Ctrl-C
        # The driver waits at most KILL_GRACE_S + 15 s for the cancelled runs, then Ray shuts down
        # (the limit leaves room for a loaded 2-core machine).
        out, err = driver.communicate(timeout=240)
        assert driver.returncode == 130 and "interrupted" in err, (out, err)
    else:
        driver.kill()
        driver.communicate()
    start = time.monotonic()
    _wait_for(lambda: not _processes_with(env), timeout=90)
    print(
        f"{stop}: training processes gone {time.monotonic() - start:.0f} s after the driver stopped"
    )
    if (
        stop == "cancel"
    ):  # stopped by SIGTERM, so they leave their run folder as a checkpointing run would
        assert (
            json.loads((tmp_path / f"storage/{name}/slow/seed1/config.json").read_text())["env_id"]
            == env
        )


@pytest.mark.slow
def test_ray_cluster(tmp_path: Path, sweep, cluster):
    runs_ship_their_code_and_bring_outputs_back(tmp_path, sweep)
    a_run_on_a_killed_node_resumes_from_storage(tmp_path, sweep, cluster)
    a_run_lost_before_its_first_save_starts_afresh(tmp_path, sweep, cluster)
    for stop in ("cancel", "lost driver"):
        a_stopped_sweep_leaves_no_training_process(tmp_path, sweep, stop)


@pytest.mark.parametrize("url", ["folder", "memory://bench/unsaved"])
def test_a_stored_folder_without_a_checkpoint_is_emptied_before_the_run(tmp_path: Path, url: str):
    """What a Ray task does with its stored copy before it starts the run, as the local backend
    does with a run folder: resume from a checkpoint, else start in an empty folder."""
    url = str(tmp_path / "store") if url == "folder" else url
    lost = tmp_path / "lost"  # a node lost after a copy, before the first save
    lost.mkdir()
    (lost / "events.out.tfevents.1.old").write_text("ten points")
    (lost / "benchmark.log").write_text("first attempt\n")
    stored = Storage(url)
    stored.upload(lost)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "leftover").write_text("x")
    assert resume_from_storage(Storage(url), run_dir) is False
    assert list(run_dir.iterdir()) == []
    assert not Storage(url).restore(tmp_path / "again")  # the stored copy is gone too

    (lost / "checkpoints").mkdir()
    (lost / "checkpoints/latest.pt").write_text("step 100")
    Storage(url).upload(lost)
    resumed = tmp_path / "resumed"
    assert resume_from_storage(Storage(url), resumed) is True
    assert (resumed / "events.out.tfevents.1.old").exists()  # a resumed run keeps its curve
    assert resume_from_storage(None, tmp_path / "fresh") is False
    assert (tmp_path / "fresh").is_dir()
