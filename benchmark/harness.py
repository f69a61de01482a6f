"""`python -m benchmark harness`: write the run harness from its one source into every algorithm file.

The harness is the block of each file of algos/ from the line starting with `# ===== run harness`
to the line before `if __name__ == "__main__":`. Its only editable copy is the same block of
benchmark/run_harness.py; `--check` writes nothing and fails when a file's copy differs.
"""

from __future__ import annotations

from pathlib import Path

MARKER = "# ===== run harness"
MAIN = 'if __name__ == "__main__":'
SOURCE = Path(__file__).with_name("run_harness.py")


def harness_span(lines: list[str], name: str) -> tuple[int, int]:
    """Indexes of the harness's first line and of the `if __name__` line after it."""
    starts = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    ends = [i for i, line in enumerate(lines) if line.startswith(MAIN)]
    if len(starts) != 1 or len(ends) != 1 or starts[0] > ends[0]:
        raise ValueError(f"{name}: expected one {MARKER!r} line before one {MAIN!r} line")
    return starts[0], ends[0]


def source_block(source: Path = SOURCE) -> str:
    """The harness as it belongs in an algorithm file: the source from its marker line to its
    end, and the two blank lines before the main guard."""
    lines = source.read_text().splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    if len(starts) != 1:
        raise ValueError(f"{source}: expected one {MARKER!r} line")
    return "".join(lines[starts[0] :]).rstrip("\n") + "\n\n\n"


def file_block(path: Path) -> str:
    """The harness block of one algorithm file, as it is."""
    lines = path.read_text().splitlines(keepends=True)
    start, end = harness_span(lines, path.name)
    return "".join(lines[start:end])


def with_harness(path: Path, block: str) -> str:
    """The text of `path` with its harness block replaced by `block`."""
    lines = path.read_text().splitlines(keepends=True)
    start, end = harness_span(lines, path.name)
    return "".join(lines[:start]) + block + "".join(lines[end:])


def write(algos_dir: Path, check: bool, source: Path = SOURCE) -> int:
    """Write the source's harness into every algorithm file (or, with `check`, list the files
    whose copy differs); the exit status: 1 when a checked file differs."""
    block = source_block(source)
    stale = []
    for path in sorted(algos_dir.glob("*.py")):
        if file_block(path) == block:
            continue
        stale.append(path)
        if not check:
            path.write_text(with_harness(path, block))
    verb = "differs from" if check else "rewritten from"
    for path in stale:
        print(f"{path}: harness {verb} {source.name}")
    if not stale:
        print(f"every file's harness is {source.name}'s")
    return 1 if check and stale else 0
