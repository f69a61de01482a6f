"""`python -m benchmark sizes`: an informational table of each algorithm file's sizes beside its
CleanRL counterpart. Nothing is a budget: a file may grow where a name, a docstring or a step
written out helps its reader.

Code is every non-blank line that is not only a comment, outside the module docstring and the run
harness; its characters include indentation. The algorithm section runs from the docstring's end
to the end of `train()`: what a reader meets before the file's own plumbing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from .harness import harness_span

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


def report(algos_dir: Path) -> int:
    """Print the table of every algorithm file's sizes."""
    sizes = [measure(p) for p in sorted(algos_dir.glob("*.py"))]
    print("\n".join(table(sizes)))
    return 0
