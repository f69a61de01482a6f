"""Import an algorithm file by path (the files in algos/ are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from .manifest import ZooError


def load_script(path: Path, name: str) -> ModuleType:
    """The module `name` from the file at `path`, or a one-line ZooError naming the --script flag."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ZooError(f"cannot import {path}: pass the path of {name}.py with --script")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses in the file look their module up by name
    spec.loader.exec_module(module)
    return module
