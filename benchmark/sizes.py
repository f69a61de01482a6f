"""`python -m benchmark sizes`: how much an algorithm file asks of its reader, against its CleanRL
counterpart, and whether it keeps the budgets of CONTRIBUTING.md.

Code is every non-blank line that is not only a comment, outside the module docstring and the run
harness; its characters include indentation. The algorithm section runs from the docstring's end
to the end of `train()`: what a reader meets before the file's own plumbing. The budgets hold on
formatted code (`ruff format`), so a wide line cannot dodge them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

MARKER = "# ===== run harness"
MAIN = 'if __name__ == "__main__":'

# Code characters of the nearest CleanRL file (counted as above, at CleanRL fe8d8a0).
COUNTERPARTS = {
    "appo.py": ("ppo.py", 11_851),
    "d4pg.py": ("td3_continuous_action.py", 11_529),
    "dqn_atari.py": ("dqn_atari.py", 9_306),
    "naf.py": ("ddpg_continuous_action.py", 9_527),
    "ppg.py": ("ppg_procgen.py", 19_833),
    "ppo_atari.py": ("ppo_atari.py", 12_427),
    "recurrent_ppo_atari.py": ("ppo_atari_lstm.py", 14_458),
    "rlpd.py": ("sac_continuous_action.py", 11_828),
}
# Budgets as multiples of the counterpart's code characters: (whole file, algorithm section).
# appo.py carries V-trace, the actor processes and value normalisation that CleanRL's ppo.py has not.
RATIO_LIMITS = {"appo.py": (2.5, 2.0)}
DEFAULT_RATIO_LIMITS = (2.0, 1.6)
DOCSTRING_LINES, TRAIN_LINES = 110, 70
# The run harness, formatted like the rest, blank lines included. Its earlier text was 219 lines
# as written and 327 once formatted at 100 columns; 180 was asked of the 219 (82%). Formatted,
# with every feature kept (W&B, eval-only output, the resume checks), it was held at 232 (71%);
# --compile's compiled() and a non-finite check that does not wait for a GPU at every update
# brought it to 249.
HARNESS_LINES = 249


@dataclass
class Size:
    name: str
    lines: int
    docstring_lines: int
    code_lines: int
    code_chars: int
    algorithm_chars: int
    counterpart: str
    counterpart_chars: int
    widest_line: int
    train_lines: int
    first_def_line: int
    harness_lines: int

    @property
    def ratio(self) -> float:
        return self.code_chars / self.counterpart_chars

    @property
    def algorithm_ratio(self) -> float:
        return self.algorithm_chars / self.counterpart_chars


def _is_code(line: str) -> bool:
    return bool(line.strip()) and not line.strip().startswith("#")


def harness_span(lines: list[str], name: str) -> tuple[int, int]:
    """Indexes of the harness's first line and of the `if __name__` line after it."""
    starts = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    ends = [i for i, line in enumerate(lines) if line.startswith(MAIN)]
    if len(starts) != 1 or len(ends) != 1 or starts[0] > ends[0]:
        raise ValueError(f"{name}: expected one {MARKER!r} line before one {MAIN!r} line")
    return starts[0], ends[0]


def measure(path: Path) -> Size:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    first = tree.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    doc_end = first.end_lineno if has_doc else 0
    start, end = harness_span(lines, path.name)
    code = [line for line in lines[doc_end:start] + lines[end:] if _is_code(line)]
    train = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    if not train:
        raise ValueError(f"{path.name}: no top-level train()")
    algorithm = [line for line in lines[doc_end : train[0].end_lineno] if _is_code(line)]
    defs = [n.lineno for n in tree.body if isinstance(n, ast.FunctionDef)]
    counterpart, counterpart_chars = COUNTERPARTS.get(path.name, ("?", 0))
    return Size(
        name=path.name,
        lines=len(lines),
        docstring_lines=doc_end,
        code_lines=len(code),
        code_chars=sum(map(len, code)),
        algorithm_chars=sum(map(len, algorithm)),
        counterpart=counterpart,
        counterpart_chars=counterpart_chars,
        widest_line=max(map(len, lines)),
        train_lines=train[0].end_lineno - train[0].lineno + 1,
        first_def_line=min(defs),
        harness_lines=end - start,
    )


def problems(size: Size) -> list[str]:
    """The budgets this file breaks, one line each."""
    if size.counterpart_chars == 0:
        return [f"{size.name}: no CleanRL counterpart listed in benchmark/sizes.py"]
    whole, section = RATIO_LIMITS.get(size.name, DEFAULT_RATIO_LIMITS)
    checks = [
        (size.docstring_lines <= DOCSTRING_LINES, f"docstring {size.docstring_lines} lines"),
        (size.ratio <= whole, f"code {size.ratio:.2f}x {size.counterpart}, over {whole}x"),
        (
            size.algorithm_ratio <= section,
            f"algorithm section {size.algorithm_ratio:.2f}x {size.counterpart}, over {section}x",
        ),
        (size.train_lines <= TRAIN_LINES, f"train() {size.train_lines} lines"),
        (size.harness_lines <= HARNESS_LINES, f"run harness {size.harness_lines} lines"),
    ]
    return [f"{size.name}: {message}" for ok, message in checks if not ok]


def table(sizes: list[Size]) -> list[str]:
    head = (
        "| file | lines | docstring | code lines | code chars | CleanRL counterpart | ratio "
        "| algorithm chars | ratio | widest line | train() lines | first def | harness lines |"
    )
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for s in sizes:
        rows.append(
            f"| {s.name} | {s.lines} | {s.docstring_lines} | {s.code_lines} | {s.code_chars:,} "
            f"| {s.counterpart} {s.counterpart_chars:,} | {s.ratio:.2f} | {s.algorithm_chars:,} "
            f"| {s.algorithm_ratio:.2f} | {s.widest_line} | {s.train_lines} | {s.first_def_line} "
            f"| {s.harness_lines} |"
        )
    return rows


def report(algos_dir: Path, check: bool) -> int:
    sizes = [measure(p) for p in sorted(algos_dir.glob("*.py"))]
    print("\n".join(table(sizes)))
    broken = [line for s in sizes for line in problems(s)]
    for line in broken:
        print(f"over budget: {line}")
    return 1 if check and broken else 0
