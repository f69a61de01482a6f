"""The code is formatted and linted as pyproject.toml's [tool.ruff] says: `ruff format --check`
and `ruff check` over the repository fail this test (run `ruff format . && ruff check --fix .`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_passes(command):
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"ruff {' '.join(command)}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    )


def test_ruff_reports_an_unformatted_file(tmp_path):
    """The check can fail: a badly formatted, badly linted file is reported by both commands."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os, sys\nx = {  'a':1 }\n")
    for command in (["format", "--check"], ["check"]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "."],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 1 and "bad.py" in proc.stdout, proc.stdout
