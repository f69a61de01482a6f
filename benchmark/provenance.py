"""What a run ran: the code (commit, dirty tree) and where (host, device, library versions).

The code is stamped by the process that starts the run (the driver, which ships its tree to
Ray workers); the host, device and versions by the machine the run executes on, when it runs.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ("torch", "gymnasium", "ale-py")
# Run with the run's environment (CUDA_VISIBLE_DEVICES): what the algorithm's `--device auto` sees.
CUDA_PROBE = (
    "import json, torch; ok = torch.cuda.is_available(); "
    "print(json.dumps(torch.cuda.get_device_name(0) if ok else None))"
)
_cuda_names: dict[str | None, str | None] = {}


def git(repo: Path, *args: str) -> str | None:
    """git's stripped output in `repo`; None where git is missing, times out or fails."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_version(repo: Path) -> dict[str, Any]:
    """The commit checked out at `repo` and whether tracked files differ from it (None for both
    outside a git checkout)."""
    commit = git(repo, "rev-parse", "HEAD")
    status = git(repo, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else status != ""}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cuda_device(env: dict[str, str]) -> str | None:
    """Name of the first GPU torch sees under `env`, None without one (no probe at all where
    there is no NVIDIA driver, so CPU machines pay nothing)."""
    key = env.get("CUDA_VISIBLE_DEVICES")
    if key not in _cuda_names:
        name = None
        if shutil.which("nvidia-smi") and key != "":
            try:
                out = subprocess.run(
                    [sys.executable, "-c", CUDA_PROBE],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=120,
                )
                name = json.loads(out.stdout) if out.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
                name = None
        _cuda_names[key] = name
    return _cuda_names[key]


def run_host(run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Where a run executed: host, platform, versions, and its device (from the `device` of its
    config.json: cpu, or cuda / auto with a GPU visible)."""
    try:
        asked = json.loads((run_dir / "config.json").read_text()).get("device", "auto")
    except (OSError, json.JSONDecodeError):
        asked = "auto"
    gpu = cuda_device(env) if asked in ("auto", "cuda") else None
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "device": f"cuda ({gpu})" if gpu else "cpu",
        "versions": {name: _version(name) for name in LIBRARIES},
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
