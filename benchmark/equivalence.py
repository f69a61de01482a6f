"""`python -m benchmark equivalence --against COMMIT`: proof that a change to the algorithm files
(a refactor) changed no behaviour.

Every selected preset's smoke run (its smoke budget and arguments, seed 1, `--device cpu`,
`--torch-deterministic`) runs twice through the sweep runner (`backends.run_local`, which builds
the command line and sets the threads and OpenMP's wait policy): once with the algorithm file as
it is at COMMIT, from a git worktree in a temporary folder (as `speed --against` takes it), and
once with the working tree's file, copied at the start so that an edit during the runs cannot
mix two versions. Each run has its own run directory, and the two are compared exactly:

- every checkpoint file (`checkpoints/latest.pt`, and any other `.pt` or `.npz` there), walked
  through its nested dicts and lists: tensors and arrays by dtype, shape and values (NaN equals
  NaN), numbers, strings and booleans by type and value, keys present on one side only;
- `summary.json`, every field (the evaluation returns and the other `eval_*` fields included);
- every TensorBoard scalar: tag, step and value.

Left out: what depends on the run's place or the clock, not on the algorithm. The stored
arguments' paths (`run_dir`, `resume`, `checkpoint` in the checkpoint's `args`), and every name
that TIMING matches, which covers what algos/*.py measure with a clock: `charts/SPS` and
summary.json's `sps` (every file), ppg.py's `charts/aux_phase_time_fraction`, its summary field
and its checkpoint counters `train_time_s` and `aux_time_s`. The runner's own wall times are
reported beside the verdict, never compared.

A preset is equivalent, DIFFERENT (with its first difference: a checkpoint's key path and
tensor with the largest absolute difference and the first differing index, a scalar's tag and
step with both values, or a summary field) or FAILED (a run failed: its reason and last log
lines). A DIFFERENT preset is run twice more with the commit's file: when those two runs differ
from each other as well, the preset does not repeat itself (appo.py's runs with two actor
processes take the actors' rollouts in the order they arrive) and its verdict is IRREPRODUCIBLE,
which says nothing either way; a file whose other presets are equivalent is then "equivalent
where reproducible". A flag the change added shows as one more stored argument; it is noted
with its default, not counted as a difference. The report (`results/equivalence-<commit>.md`) lists the commands, the commit, the
working tree's state and the table; beside it a `.json` of the same name records, per algorithm
file, the git blob ids of the two versions compared and the verdict, from which `python -m
benchmark readme` says whether the files changed since the sweep were proved equivalent.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .backends import Callbacks, Machine, physical_memory_gb, run_local
from .events import read_points
from .manifest import Preset, ZooError
from .runner import CHECKPOINT, Job, build_datasets, plan_jobs, relative, write_atomic, write_json
from .speed import git, resolve, terminate_unwinds, worktree

# A name measured with a clock (the last part of a key or tag): sps, SPS, *_time_s, *_time_fraction,
# wall_time*. Such values differ between any two runs; see the module docstring for where they are.
TIMING = re.compile(r"(?:^|[/_])sps$|time_s$|time_fraction$|wall_time", re.IGNORECASE)
RUN_PATHS = ("run_dir", "resume", "checkpoint")  # the checkpoint's stored args that name places
FORCED_ARGS = {"device": "cpu", "torch-deterministic": True}
CHECKPOINT_SUFFIXES = (".pt", ".npz")
TAIL_LINES = 8
EQUIVALENT, DIFFERENT, FAILED = "equivalent", "DIFFERENT", "FAILED"
# a preset whose smoke run, repeated with the commit's own file, does not repeat itself (runs that
# race, such as appo.py's with two actor processes): no verdict is possible
IRREPRODUCIBLE = "IRREPRODUCIBLE"
# a file's verdict when its other presets are equivalent and the rest irreproducible
EQUIVALENT_WHERE_REPRODUCIBLE = "equivalent where reproducible"


# --- the comparison -----------------------------------------------------------------------------


@dataclass
class Comparison:
    """The differences between two runs, in order, and how much was compared."""

    differences: list[str] = field(default_factory=list)
    tensors: int = 0
    values: int = 0
    points: int = 0
    tags: int = 0
    fields: int = 0
    new_flags: list[tuple[str, Any]] = field(default_factory=list)

    def extent(self) -> str:
        """How much was compared, and the flags only the working tree's file has."""
        text = (
            f"{self.tensors:,} tensors and {self.values:,} other values in the checkpoints, "
            f"{self.points:,} points of {self.tags} scalar tags, {self.fields} summary fields"
        )
        if self.new_flags:
            flags = ", ".join(
                f"--{name.replace('_', '-')} {value!r}" for name, value in self.new_flags
            )
            text += f"; new flags at their defaults: {flags}"
        return text


def _key(key: Any) -> str:
    return f"[{json.dumps(key)}]" if isinstance(key, str) else f"[{key!r}]"


def _as_array(value: Any) -> Any:
    """A torch tensor or numpy array as a numpy array (bfloat16 widened: numpy has none)."""
    import numpy as np
    import torch

    if isinstance(value, np.ndarray):
        return value
    tensor = value.detach().cpu().resolve_conj().resolve_neg()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _is_array(value: Any) -> bool:
    import numpy as np
    import torch

    return isinstance(value, (np.ndarray, torch.Tensor))


def _number(value: Any) -> str:
    return repr(value.item() if hasattr(value, "item") else value)


def compare_arrays(a: Any, b: Any, where: str) -> str | None:
    """The first difference of two tensors or arrays (dtype, shape, values), or None."""
    import numpy as np

    if type(a) is not type(b) or str(a.dtype) != str(b.dtype):
        return f"{where}: {type(a).__name__} {a.dtype} vs {type(b).__name__} {b.dtype}"
    if tuple(a.shape) != tuple(b.shape):
        return f"{where}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    x, y = _as_array(a), _as_array(b)
    same = x == y
    if x.dtype.kind in "fc":
        same |= np.isnan(x) & np.isnan(y)
    if same.all():
        return None
    first = np.unravel_index(int(np.argmin(same.ravel())), x.shape) if x.shape else ()
    index = tuple(int(i) for i in first)
    if x.dtype.kind == "b":
        x, y = x.astype(np.int8), y.astype(np.int8)
    gaps = np.abs(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64) - y)[~same]
    finite = gaps[np.isfinite(gaps)]
    largest = f"{float(finite.max()):.6g}" if finite.size else "inf (NaN or inf on one side)"
    at = f" at index {index}" if index else ""
    return (
        f"{where}: {int((~same).sum()):,} of {x.size:,} values differ, max abs difference "
        f"{largest}; first{at}: {_number(x[first])} vs {_number(y[first])}"
    )


def compare_values(
    a: Any, b: Any, where: str, result: Comparison, skip: Callable[[tuple], bool], path: tuple = ()
) -> None:
    """Walk two nested values (dicts, lists, tuples, tensors, arrays, numbers, strings) and append
    each difference to `result.differences`; `skip(path)` leaves out a key path."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            if skip((*path, key)):
                continue
            here = where + _key(key)
            if key not in a or key not in b:
                side = "the commit's run" if key in a else "the working tree's run"
                result.differences.append(f"{here}: only in {side}")
            else:
                compare_values(a[key], b[key], here, result, skip, (*path, key))
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        if len(a) != len(b):
            result.differences.append(f"{where}: {len(a)} items vs {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            compare_values(x, y, f"{where}[{i}]", result, skip, (*path, i))
        return
    if _is_array(a) or _is_array(b):
        result.tensors += 1
        problem = (
            compare_arrays(a, b, where)
            if _is_array(a) and _is_array(b)
            else f"{where}: {type(a).__name__} vs {type(b).__name__}"
        )
        if problem:
            result.differences.append(problem)
        return
    result.values += 1
    nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    if type(a) is not type(b) or not (nan or a == b):
        result.differences.append(f"{where}: {a!r} vs {b!r}")


def _checkpoint_skip(path: tuple) -> bool:
    last = path[-1]
    return (len(path) == 2 and path[0] == "args" and last in RUN_PATHS) or (
        isinstance(last, str) and bool(TIMING.search(last))
    )


def _load(path: Path) -> Any:
    if path.suffix == ".npz":
        import numpy as np

        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def compare_checkpoints(before: Path, after: Path, result: Comparison) -> None:
    files = {
        p.name
        for run in (before, after)
        for p in (run / CHECKPOINT.parent).glob("*")
        if p.suffix in CHECKPOINT_SUFFIXES
    }
    if CHECKPOINT.name not in files:
        result.differences.append(f"{CHECKPOINT}: in neither run")
    for name in sorted(files):
        a, b = before / CHECKPOINT.parent / name, after / CHECKPOINT.parent / name
        where = str(CHECKPOINT.parent / name)
        if not (a.is_file() and b.is_file()):
            side = "the commit's run" if a.is_file() else "the working tree's run"
            result.differences.append(f"{where}: only in {side}")
            continue
        old, new = _load(a), _load(b)
        set_aside_new_flags(old, new, result)
        compare_values(old, new, where, result, _checkpoint_skip)


def set_aside_new_flags(old: Any, new: Any, result: Comparison) -> None:
    """A stored argument that only the working tree's checkpoint has is a flag the change added,
    at its default (a smoke run passes only the preset's flags): noted, and left out of the
    comparison, since the arguments record the run's configuration, not its behaviour. Whether
    the new flag's default keeps the old behaviour is what every other value compared shows."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return
    old_args, new_args = old.get("args"), new.get("args")
    if not (isinstance(old_args, dict) and isinstance(new_args, dict)):
        return
    for name in [k for k in new_args if k not in old_args]:
        result.new_flags.append((name, new_args.pop(name)))


def _same(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


def compare_scalars(before: Path, after: Path, result: Comparison) -> None:
    """Every TensorBoard scalar but the timings: one difference per tag, the earliest step first."""
    a, b = read_points(before), read_points(after)
    found: list[tuple[int, str, str]] = []
    for tag in sorted({*a, *b}):
        if TIMING.search(tag):
            continue
        result.tags += 1
        if tag not in a or tag not in b:
            side = "the commit's run" if tag in a else "the working tree's run"
            series = a.get(tag) or b[tag]
            found.append((series[0][0], tag, f"scalar {tag}: only in {side}"))
            continue
        xs, ys = [(s, v) for s, _, v in a[tag]], [(s, v) for s, _, v in b[tag]]
        result.points += len(xs)
        for (s, x), (t, y) in zip(xs, ys):
            if s != t:
                found.append((min(s, t), tag, f"scalar {tag}: a point at step {s:,} vs {t:,}"))
                break
            if not _same(x, y):
                found.append((s, tag, f"scalar {tag} at step {s:,}: {x!r} vs {y!r}"))
                break
        else:
            if len(xs) != len(ys):
                extra = (xs if len(xs) > len(ys) else ys)[min(len(xs), len(ys))][0]
                text = f"scalar {tag}: {len(xs):,} points vs {len(ys):,} (from step {extra:,})"
                found.append((extra, tag, text))
    result.differences += [text for _, _, text in sorted(found)]


def compare_summaries(before: Path, after: Path, result: Comparison) -> None:
    a, b = (json.loads((run / "summary.json").read_text()) for run in (before, after))
    kept = [k for k in {**a, **b} if not TIMING.search(k)]
    result.fields = len(kept)
    compare_values(a, b, "summary.json", result, lambda path: bool(TIMING.search(str(path[-1]))))


def compare_runs(before: Path, after: Path) -> Comparison:
    """Everything two finished runs left that the algorithm decides, checkpoints first."""
    result = Comparison()
    compare_checkpoints(before, after, result)
    compare_scalars(before, after, result)
    compare_summaries(before, after, result)
    return result


# --- the runs -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One preset's verdict."""

    preset: str
    algo: str
    verdict: str
    detail: str
    differences: list[str] = field(default_factory=list)
    wall_s: dict[str, float | None] = field(default_factory=dict)
    log: str = ""

    def line(self) -> str:
        times = " and ".join("?" if s is None else f"{s:.0f} s" for s in self.wall_s.values())
        took = f" [{times}]" if times else ""
        more = len(self.differences) - 1
        extra = f" (and {more} more difference{'s' * (more > 1)})" if more > 0 else ""
        return f"{self.verdict:<10} {self.preset}: {self.detail}{extra}{took}"


@dataclass(frozen=True)
class Side:
    name: str  # "commit" or "working tree"
    folder: Path  # where its algorithm files are


@dataclass(frozen=True)
class Options:
    workers: int = 1
    """CPUs the runs may hold at once (`backends.Machine`)."""
    keep: Path | None = None
    """Where the run folders go and stay (default: a temporary folder)."""
    out: Path | None = None
    """The report (default: results/equivalence-<commit>.md), its record beside it as .json."""
    timeout_scale: float = 1.0
    command: str = "python -m benchmark equivalence"
    """As the report lists it."""


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _judge(preset: Preset, records: dict[str, dict[str, Any]], runs: dict[str, Path]) -> Outcome:
    wall = {side: records[side].get("wall_time_s") for side in records}
    failed = [(side, r) for side, r in records.items() if r["status"] != "ok"]
    if failed:
        side, record = failed[0]
        tail = _tail(record.get("log_tail") or "")
        detail = f"the {side}'s run: {record['reason']}" + (
            " | " + " | ".join(tail.splitlines()[-3:]) if tail else ""
        )
        return Outcome(preset.name, preset.algo, FAILED, detail, wall_s=wall, log=tail)
    first, second = list(records)
    try:
        result = compare_runs(runs[first], runs[second])
    except Exception as e:  # an unreadable output: the runs cannot be said to agree
        detail = f"cannot compare: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        return Outcome(preset.name, preset.algo, FAILED, detail, wall_s=wall)
    if result.differences:
        return Outcome(
            preset.name, preset.algo, DIFFERENT, result.differences[0], result.differences, wall
        )
    return Outcome(preset.name, preset.algo, EQUIVALENT, result.extent(), wall_s=wall)


def _run_pairs(
    presets: list[Preset],
    sides: list[Side],
    root: Path,
    algos_dir: Path,
    options: Options,
    report: Callable[[Outcome], None],
) -> None:
    """Each preset's smoke run with each side's file; `report` each preset's outcome as its
    second run ends (or at once, when its dataset could not be built)."""
    unbuilt = build_datasets([p for p in presets if p.dataset], algos_dir, root / "datasets.log")
    jobs: dict[tuple[str, ...], tuple[Preset, Side, Job]] = {}
    for preset in presets:
        if preset.name in unbuilt:
            report(Outcome(preset.name, preset.algo, FAILED, unbuilt[preset.name]))
            continue
        for side in sides:
            job = _job(preset, side, root, options.timeout_scale)
            jobs[tuple(job.command())] = (preset, side, job)
    records: dict[str, dict[str, dict[str, Any]]] = {}
    lock = threading.Lock()

    def finished(record: dict[str, Any]) -> None:
        preset, side, job = jobs[tuple(record["command"])]
        with lock:
            mine = records.setdefault(preset.name, {})
            mine[side.name] = record
            done = len(mine) == len(sides)
        if done:
            runs = {
                s.name: j.run_dir for p, s, j in jobs.values() if p.name == preset.name
            }  # both sides' run folders
            report(_judge(preset, {s.name: mine[s.name] for s in sides}, runs))

    calls = Callbacks(lambda job, where: None, lambda job, progress: None, finished)
    machine = Machine(options.workers, physical_memory_gb(), [])
    run_local([job for _, _, job in jobs.values()], machine, algos_dir, calls)


def _recheck_the_commit(
    presets: list[Preset],
    commit: Side,
    root: Path,
    algos_dir: Path,
    options: Options,
    outcomes: dict[str, Outcome],
    lock: threading.Lock,
) -> None:
    """Run each DIFFERENT preset twice more with the commit's own file: where the commit's three
    runs are not all the same, the preset does not repeat itself and its difference says nothing
    of the change (IRREPRODUCIBLE); where they agree, DIFFERENT stands."""
    print(
        f"checking that the commit's runs repeat themselves: {', '.join(p.name for p in presets)}",
        flush=True,
    )

    recheck = root / "reproducibility"

    def report(check: Outcome) -> None:
        if check.verdict == EQUIVALENT:  # the two new runs agree: does the first one too?
            preset = next(p for p in presets if p.name == check.preset)
            first = _run_dir(preset, commit, root, options.timeout_scale)
            again = _run_dir(preset, commit, recheck, options.timeout_scale)
            differences = compare_runs(first, again).differences
            if not differences:
                return
            check = replace(
                check, verdict=DIFFERENT, detail=differences[0], differences=differences
            )
        if check.verdict != DIFFERENT:
            return
        with lock:
            first = outcomes[check.preset]
            detail = f"the commit's own runs differ too: {check.detail}"
            outcomes[check.preset] = Outcome(
                first.preset, first.algo, IRREPRODUCIBLE, detail, check.differences, first.wall_s
            )
            print(outcomes[check.preset].line(), flush=True)

    sides = [commit, Side("commit again", commit.folder)]
    _run_pairs(presets, sides, recheck, algos_dir, options, report)


def _job(preset: Preset, side: Side, root: Path, timeout_scale: float) -> Job:
    """The smoke run of `preset` with `side`'s file, in its folder under `root`."""
    mine = replace(preset, script=side.folder / preset.script.name)
    (job,) = plan_jobs([mine], "smoke", root / _slug(side), timeout_scale=timeout_scale)
    return replace(job, args={**job.args, **FORCED_ARGS})


def _run_dir(preset: Preset, side: Side, root: Path, timeout_scale: float) -> Path:
    """Where `_job` runs."""
    return _job(preset, side, root, timeout_scale).run_dir


def _slug(side: Side) -> str:
    return side.name.replace(" ", "-")


# --- the command --------------------------------------------------------------------------------


def check_patterns(patterns: tuple[str, ...], presets: dict[str, Preset]) -> None:
    import fnmatch

    unknown = [p for p in patterns if not fnmatch.filter(presets, p)]
    if unknown:
        raise ZooError(
            f"--preset {' '.join(unknown)}: no such preset; the zoo has: " + ", ".join(presets)
        )


def _blob(repo: Path, spec: str) -> str | None:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", spec)
    except ZooError:
        return None


@dataclass
class Plan:
    """What one invocation compares: the commit, the working tree's copy, and the files."""

    repo: Path
    sha: str
    folder: str  # the algorithm folder, relative to the repository
    head: str
    files: dict[str, dict[str, Any]]  # per algorithm file: blobs and dirty


def _plan(algos_dir: Path, against: str, presets: list[Preset], copy: Path) -> Plan:
    """Resolve the commit and copy the working tree's files the presets run into `copy`."""
    repo = Path(git(algos_dir, "rev-parse", "--show-toplevel"))
    sha = resolve(repo, against)
    folder = algos_dir.resolve().relative_to(repo.resolve()).as_posix()
    if _blob(repo, f"{sha}:{folder}") is None:
        raise ZooError(f"--against {against}: commit {sha[:10]} has no {folder}/ folder")
    copy.mkdir(parents=True)
    files = {}
    for name in sorted({p.script.name for p in presets}):
        shutil.copy2(algos_dir / name, copy / name)  # what runs, and what the blob id names
        after = git(repo, "hash-object", str(copy / name))
        files[name] = {
            "before": _blob(repo, f"{sha}:{folder}/{name}"),
            "after": after,
            "dirty": after != _blob(repo, f"HEAD:{folder}/{name}"),
        }
    return Plan(repo, sha, folder, git(repo, "rev-parse", "HEAD"), files)


def equivalence(
    against: str, chosen: list[Preset], zoo: dict[str, Preset], algos_dir: Path, options: Options
) -> int:
    """Run and compare (module docstring); print one line per preset and write the report.
    0 when every preset compared is equivalent, 1 otherwise."""
    keep = options.keep
    if options.workers < 1 or options.timeout_scale <= 0:
        raise ZooError("--workers and --timeout-scale must be positive")
    if keep is not None and keep.exists() and (not keep.is_dir() or any(keep.iterdir())):
        raise ZooError(f"--keep {keep}: not an empty folder (a run there would resume, not start)")
    with tempfile.TemporaryDirectory(prefix="equivalence-") as tmp, terminate_unwinds():
        plan = _plan(algos_dir, against, chosen, Path(tmp) / "working-tree")
        root = keep if keep is not None else Path(tmp) / "runs"
        with worktree(plan.repo, plan.sha) as tree:
            sides = [
                Side("commit", tree / plan.folder),
                Side("working tree", Path(tmp) / "working-tree"),
            ]
            return _compare_all(plan, sides, chosen, zoo, algos_dir, root, options)


def _compare_all(
    plan: Plan,
    sides: list[Side],
    chosen: list[Preset],
    zoo: dict[str, Preset],
    algos_dir: Path,
    root: Path,
    options: Options,
) -> int:
    short = plan.sha[:7]
    outcomes: dict[str, Outcome] = {}
    lock = threading.Lock()

    def report(outcome: Outcome) -> None:
        with lock:
            outcomes[outcome.preset] = outcome
            print(outcome.line(), flush=True)

    dirty = [name for name, f in plan.files.items() if f["dirty"]]
    state = f"working tree at {plan.head[:10]}: " + (
        f"uncommitted changes to {', '.join(dirty)}" if dirty else "the compared files as committed"
    )
    print(
        f"comparing {len(chosen)} presets' smoke runs: {plan.folder}/ at commit {plan.sha[:10]} "
        f"against the {state}; --workers {options.workers}",
        flush=True,
    )
    runnable = []
    for preset in chosen:
        if plan.files[preset.script.name]["before"] is None:
            text = f"no {plan.folder}/{preset.script.name} at commit {short}"
            report(Outcome(preset.name, preset.algo, FAILED, text))
        else:
            runnable.append(preset)
    started = time.monotonic()
    try:
        _run_pairs(runnable, sides, root, algos_dir, options, report)
        different = [p for p in runnable if outcomes[p.name].verdict == DIFFERENT]
        if different:
            _recheck_the_commit(different, sides[0], root, algos_dir, options, outcomes, lock)
    except KeyboardInterrupt:
        print("interrupted: no report written", flush=True)
        return 130
    seconds = time.monotonic() - started
    ordered = [outcomes[p.name] for p in chosen]
    verdicts = (EQUIVALENT, DIFFERENT, FAILED, IRREPRODUCIBLE)
    counts = {v: sum(o.verdict == v for o in ordered) for v in verdicts}
    out = options.out or Path("results") / f"equivalence-{short}.md"
    write_atomic(out, render(plan, ordered, zoo, state, seconds, options))
    write_json(out.with_suffix(".json"), record(plan, ordered, zoo, seconds, options.command))
    print(
        f"{counts[EQUIVALENT]} equivalent, {counts[DIFFERENT]} different, {counts[FAILED]} failed, "
        f"{counts[IRREPRODUCIBLE]} irreproducible of {len(ordered)} presets in "
        f"{seconds / 60:.1f} min; report: {out}",
        flush=True,
    )
    return 0 if counts[EQUIVALENT] + counts[IRREPRODUCIBLE] == len(ordered) else 1


# --- the report ---------------------------------------------------------------------------------


def file_verdicts(
    ordered: list[Outcome], zoo: dict[str, Preset]
) -> dict[str, tuple[str, list[str]]]:
    """Per algorithm file: (verdict, its presets compared). Equivalent only when every preset of
    the zoo that runs the file was compared and found equivalent; equivalent where reproducible
    when the others are and the rest repeat themselves at neither version."""
    verdicts = {}
    for name in sorted({o.algo for o in ordered}):
        mine = [o for o in ordered if o.algo == name]
        total = sum(p.algo == name for p in zoo.values())
        if any(o.verdict == DIFFERENT for o in mine):
            verdict = DIFFERENT
        elif any(o.verdict == FAILED for o in mine):
            verdict = FAILED
        elif len(mine) < total:
            verdict = f"equivalent on {len(mine)} of its {total} presets"
        elif all(o.verdict == IRREPRODUCIBLE for o in mine):
            verdict = IRREPRODUCIBLE
        elif any(o.verdict == IRREPRODUCIBLE for o in mine):
            verdict = EQUIVALENT_WHERE_REPRODUCIBLE
        else:
            verdict = EQUIVALENT
        verdicts[f"{name}.py"] = (verdict, [o.preset for o in mine])
    return verdicts


def record(
    plan: Plan, ordered: list[Outcome], zoo: dict[str, Preset], seconds: float, command: str
) -> dict[str, Any]:
    """The report's machine-readable half (`python -m benchmark readme` reads its files)."""
    return {
        "against": plan.sha,
        "head": plan.head,
        "command": command,
        "wall_time_s": round(seconds, 1),
        "files": {
            name: {**plan.files[name], "verdict": verdict, "presets": presets}
            for name, (verdict, presets) in file_verdicts(ordered, zoo).items()
        },
        "presets": [
            {
                "preset": o.preset,
                "algo": o.algo,
                "verdict": o.verdict,
                "detail": o.detail,
                "differences": o.differences[:20],
                "wall_time_s": o.wall_s,
            }
            for o in ordered
        ],
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(
    plan: Plan,
    ordered: list[Outcome],
    zoo: dict[str, Preset],
    state: str,
    seconds: float,
    options: Options,
) -> str:
    short = plan.sha[:7]
    lines = [
        f"# Behaviour equivalence: {plan.folder}/ at `{short}` against the working tree",
        "",
        f"Made by `{options.command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{seconds / 60:.1f} min.",
        "",
        f"- commit: `{plan.sha}`",
        f"- {state}",
        "- each preset's smoke run (seed 1), once with the file at the commit (a git worktree) and "
        "once with the working tree's copy, with `--device cpu --torch-deterministic`: checkpoints "
        "(tensors exactly, NaN = NaN), TensorBoard scalars and summary.json compared, leaving out "
        "timings (`sps`, `charts/SPS`, `*_time_s`, `*_time_fraction`) and the stored arguments' "
        "paths (`run_dir`, `resume`, `checkpoint`); see benchmark/equivalence.py",
    ]
    if options.keep is not None:
        lines.append(f"- run folders kept in `{relative(options.keep)}`")
    lines += [
        "- each preset's two runs (the smoke run's command as the runner builds it; `algos/` is the "
        "commit's worktree or the working tree's copy, `<run-dir>` each run's own folder):",
        "",
    ]
    for preset in (zoo[o.preset] for o in ordered):
        (job,) = plan_jobs([preset], "smoke", Path("<run-dir>"))
        argv = replace(job, args={**job.args, **FORCED_ARGS}).argv(
            f"{plan.folder}/{preset.script.name}", "<run-dir>"
        )
        lines.append(f"      python {shlex.join(argv)}")
    lines += ["", "| file | at the commit | in the working tree | verdict |", "|---|---|---|---|"]
    for name, (verdict, _) in file_verdicts(ordered, zoo).items():
        f = plan.files[name]
        same = " (same text)" if f["before"] == f["after"] else ""
        blobs = [f"`{b[:10]}`" if b else "—" for b in (f["before"], f["after"])]
        lines.append(f"| {name} | {blobs[0]} | {blobs[1]}{same} | {verdict} |")
    lines += [
        "",
        "| preset | verdict | first difference, or what was compared | wall time (commit, "
        "working tree) |",
        "|---|---|---|---|",
    ]
    for o in ordered:
        times = ", ".join("?" if s is None else f"{s:.0f} s" for s in o.wall_s.values()) or "—"
        more = f" (and {len(o.differences) - 1} more)" if len(o.differences) > 1 else ""
        lines.append(f"| {o.preset} | {o.verdict} | {_cell(o.detail)}{more} | {times} |")
    for o in ordered:
        if o.verdict in (DIFFERENT, IRREPRODUCIBLE) and len(o.differences) > 1:
            lines += ["", f"{o.preset}: the first differences", ""]
            lines += [f"- {_cell(d)}" for d in o.differences[:10]]
        if o.verdict == FAILED and o.log:
            lines += ["", f"{o.preset}: the failed run's last lines", "", "```", o.log, "```"]
    return "\n".join(lines) + "\n"


# --- what the README says -----------------------------------------------------------------------


def committed_reports(repo: Path, results_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(path relative to the repository, record) of every equivalence record git tracks in
    `results_dir`, oldest name first."""
    import os

    from .provenance import git as git_or_none

    folder = os.path.relpath(results_dir.resolve(), repo.resolve())
    names = git_or_none(repo, "ls-files", "--", f"{folder}/equivalence-*.json") or ""
    found = []
    for name in sorted(names.splitlines()):
        try:
            data = json.loads((repo / name).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and isinstance(data.get("files"), dict):
            found.append((name, data))
    return found


def proof(
    start: str | None, end: str | None, name: str, reports: list[tuple[str, dict[str, Any]]]
) -> tuple[str, list[str]]:
    """Whether the reports prove the file `name`'s version `start` (a git blob) behaves as
    `end`: ("equivalent", the reports of a chain of equivalent versions from one to the other;
    "equivalent where reproducible" when a report of the chain left irreproducible presets out),
    ("DIFFERENT", the report that compared these two versions and found them different) or
    ("not checked", [])."""
    if start is None or end is None:
        return "not checked", []
    edges: dict[str, list[tuple[str, str]]] = {}
    partial: set[str] = set()  # reports that left a file's irreproducible presets out
    different = []
    for path, data in reports:
        f = data["files"].get(name) or {}
        a, b = f.get("before"), f.get("after")
        if not (a and b):
            continue
        if f.get("verdict") in (EQUIVALENT, EQUIVALENT_WHERE_REPRODUCIBLE):
            edges.setdefault(a, []).append((b, path))
            edges.setdefault(b, []).append((a, path))
            if f.get("verdict") == EQUIVALENT_WHERE_REPRODUCIBLE:
                partial.add(path)
        elif f.get("verdict") == DIFFERENT and {a, b} == {start, end}:
            different.append(path)
    seen: dict[str, list[str]] = {start: []}
    queue = [start]
    for blob in queue:  # breadth first: the shortest chain of reports
        for nxt, path in edges.get(blob, []):
            if nxt not in seen:
                seen[nxt] = [*seen[blob], path]
                queue.append(nxt)
    if end in seen:
        chain = list(dict.fromkeys(seen[end]))
        verdict = EQUIVALENT_WHERE_REPRODUCIBLE if partial & set(chain) else EQUIVALENT
        return verdict, chain
    if different:
        return DIFFERENT, different[-1:]
    return "not checked", []


def equivalence_line(
    repo: Path, commit: str, folder: str, changed: list[str], results_dir: Path
) -> str:
    """The README's line under a list of changed files: which ones committed equivalence reports
    prove to behave as at `commit` (the sweep's)."""
    reports = committed_reports(repo, results_dir)
    groups: dict[str, list[tuple[str, list[str]]]] = {}
    for name in changed:
        start = _blob(repo, f"{commit}:{folder}/{name}")
        end = _blob(repo, f"HEAD:{folder}/{name}")
        verdict, paths = proof(start, end, name, reports)
        groups.setdefault(verdict, []).append((name, paths))
    cited = list(dict.fromkeys(p for pairs in groups.values() for _, paths in pairs for p in paths))
    where = f" ({', '.join(cited)})" if cited else ""
    head = f"  - behaviour-equivalent by `python -m benchmark equivalence`{where}: "
    if set(groups) == {EQUIVALENT}:
        return head + "all"
    if set(groups) == {"not checked"}:
        return head + "not checked"
    parts = [", ".join(f"`{n}`" for n, _ in groups[EQUIVALENT]) if EQUIVALENT in groups else "none"]
    if EQUIVALENT_WHERE_REPRODUCIBLE in groups:
        names = ", ".join(f"`{n}`" for n, _ in groups[EQUIVALENT_WHERE_REPRODUCIBLE])
        parts.append(
            f"{names} on every preset whose runs repeat themselves (the others race, at the "
            "sweep's version too)"
        )
    if DIFFERENT in groups:
        parts.append("found DIFFERENT: " + ", ".join(f"`{n}`" for n, _ in groups[DIFFERENT]))
    if "not checked" in groups:
        parts.append("not checked: " + ", ".join(f"`{n}`" for n, _ in groups["not checked"]))
    return head + "; ".join(parts)
