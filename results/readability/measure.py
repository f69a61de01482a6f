"""What a reader of each algorithm file meets, at a commit or in the working tree.

    python results/readability/measure.py               # the working tree's algos/
    python results/readability/measure.py --commit 2e7d560

Per file: its lines; the line of the first network class (a subclass of nn.Module); the harness's
top-level names the code above the harness uses, and the members it reaches through the harness's
logger or Run object (distinct names, and how many uses); the functions and classes without a
docstring (outside the harness; __init__ aside); assignments that pack several values on one line
(`a, b = x, y`, not unpacking a call's result).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "# ===== run harness"


def sources(commit: str | None) -> dict[str, str]:
    """Each algorithm file's text, at `commit` or in the working tree."""
    if commit is None:
        return {p.name: p.read_text() for p in sorted((ROOT / "algos").glob("*.py"))}
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", commit, "algos/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        Path(n).name: subprocess.run(
            ["git", "show", f"{commit}:{n}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        for n in names
        if n.endswith(".py")
    }


def harness_names(harness: ast.Module) -> set[str]:
    """The top-level names the harness defines."""
    names = set()
    for node in harness.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
    return names


def measure(text: str) -> dict:
    """The figures of one file."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(MARKER))
    main = next(i for i, line in enumerate(lines) if line.startswith("if __name__"))
    above = ast.parse("\n".join(lines[:start]))
    harness = ast.parse("\n".join(lines[start:main]))
    defined = harness_names(harness)
    # the names a reader meets: the harness's own top-level names (SCRIPT and ALGO aside), and
    # the members reached through a RunLogger (`log.x`) or a Run (`run.x`, `Run.x`)
    top_level: dict[str, int] = {}
    members: dict[str, int] = {}
    for node in ast.walk(above):
        if isinstance(node, ast.Name) and node.id in defined and node.id not in ("SCRIPT", "ALGO"):
            top_level[node.id] = top_level.get(node.id, 0) + 1
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = node.value.id
            if owner == "log" or (owner in ("run", "Run") and "Run" in defined):
                name = f"{'run' if owner == 'Run' else owner}.{node.attr}"
                members[name] = members.get(name, 0) + 1
    # every function and class, but __init__ (its class's docstring covers it)
    functions = [
        n
        for n in ast.walk(above)
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name != "__init__"
    ]
    undocumented = [n.name for n in functions if ast.get_docstring(n) is None]
    packed = 0
    assignments = 0
    for n in ast.walk(above):
        if isinstance(n, ast.Assign):
            assignments += 1
            target, value = n.targets[0], n.value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                packed += 1
    network = next(
        (
            n.lineno
            for n in above.body
            if isinstance(n, ast.ClassDef)
            and any(ast.unparse(b).endswith("Module") for b in n.bases)
        ),
        None,
    )
    return {
        "lines": len(lines),
        "first_network_line": network,
        "top_level": f"{len(top_level)} ({sum(top_level.values())})",
        "members": f"{len(members)} ({sum(members.values())})",
        "undocumented": f"{len(undocumented)} of {len(functions)}",
        "packed_assignments": f"{packed} of {assignments}",
    }


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", help="a commit (default: the working tree)")
    commit = parser.parse_args().commit
    head = (
        "| file | lines | first network line | harness top-level names used above it (uses) "
        "| harness members used through log. / run. (uses) "
        "| functions and classes without a docstring | packed assignments |"
    )
    print(f"algos/ at {commit or 'the working tree'}\n\n{head}\n|---|---|---|---|---|---|---|")
    for name, text in sources(commit).items():
        m = measure(text)
        print(
            f"| {name} | {m['lines']} | {m['first_network_line']} | {m['top_level']} "
            f"| {m['members']} | {m['undocumented']} | {m['packed_assignments']} |"
        )


if __name__ == "__main__":
    main()
