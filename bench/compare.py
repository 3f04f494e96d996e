"""Old against new: every figure the benchmarks in bench/ report, for two revisions in one run.

Usage (from the repository root, with the project's venv, DATABASE_URL and REDIS_URL set)::

    .venv/bin/python bench/compare.py --quick          # 8787e87 against the working tree (10-20 min, 2 busy cores)
    .venv/bin/python bench/compare.py                  # every bench at its own default size (not timed: 1-2 h)
    .venv/bin/python bench/compare.py --quick --old 8787e87 --new main --only tool_calls,storage
    .venv/bin/python bench/compare.py --quick --repeats 3   # old, new, new, old, old, new: medians of 3

``--quick`` runs each bench at its smallest sensible size (the ``quick`` arguments in BENCHES:
checkpoint_store at 100 and 300 steps, 3 rounds; langgraph 300 steps; langgraph_ablation 200
steps, 1 round; tool_calls 300 steps, 3 rounds; storage 300 steps; dashboard at its 10,000
checkpoints, 15 GETs; approvals 30; LangGraph's test_interruption.py with the in-memory saver and
QuicksaveSaver). Without it each bench runs with its own defaults, the sizes the README reports.
A bench with a ratio flagged WORSE runs ``--recheck`` (2) more times a side before the table is
printed, so one slow minute cannot fail the comparison alone; ``--recheck 0`` for a single pass.

With a checkout of LangGraph's tests (see bench/langgraph_own_tests.py), their pass counts are
compared too::

    .venv/bin/python bench/compare.py --quick --langgraph-checkout /tmp/lgcheckout \\
        --langgraph-deps /tmp/lgdeps    # `pip install --target /tmp/lgdeps` of the packages its docstring names

This script imports no application code: each bench runs as ``python bench/<name>.py`` in its
own process, with the tree it measures as the working directory and first on PYTHONPATH, so
each tree's benches measure that tree's code however its modules are laid out. A revision
(``--old``, and ``--new`` when given) is checked out as a detached git worktree under
``--trees`` (made once, reused while it stays at that commit); without ``--new`` the new side is
this working tree, uncommitted changes included. All trees run with this interpreter (the
project's venv): a revision whose requirements differ fails with an ImportError in its log.

Each tree gets its own database, ``<prefix>_<label>`` on DATABASE_URL's server (prefix: the
database DATABASE_URL names, else ``quicksave_bench``), dropped and made again at the start
unless ``--reuse-db``, so two schemas never meet. Benches read the name from
``BENCH_DATABASE_NAME``; a revision older than that variable has the name written into its
checkout's bench/ files instead (the checkout is this script's own; nothing is committed).

Runs take turns per bench: old then new, and with ``--repeats`` the next pair the other way
round (old, new, new, old, ...), so a slow minute of the machine falls on both. Each run's
figures are the last line it prints (one JSON object; LangGraph's test counts are read from
its text when the tree's script has no ``--json``); the table shows the median of each figure
over a side's runs. A ratio is flagged ``WORSE`` when the new value is more than 10%
(``--tolerance``) worse than the old; absolute times and rates are flagged ``(worse)`` for
information only, since they follow the machine's load; a test count is flagged when it moves
the wrong way at all. Where a side ran more than once, ``spread`` is how far that figure moved
between runs of the same code; a flag within it says so, and is worth a quieter run. Every
run's output is kept under ``--logs``; ``--json-out`` writes all figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OLD = "8787e87"
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
DB_NAME_ENV = "BENCH_DATABASE_NAME"
# The literal the benches used before BENCH_DATABASE_NAME existed.
LEGACY_DB_NAME = re.compile(r"\bquicksave_bench\b")

Better = Literal["higher", "lower"]
Kind = Literal["ratio", "absolute", "count"]
Figures = dict[str, float]


# --------------------------------------------------------------------------
# What each bench reports
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    better: Better
    kind: Kind


@dataclass(frozen=True)
class Bench:
    """One script in bench/: its arguments at each size and the figures read from its JSON line."""

    name: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    figures: Callable[[dict[str, Any]], list[Figure]]
    needs_checkout: bool = False


def _present(data: dict[str, Any], key: str) -> bool:
    return isinstance(data.get(key), int | float) and not isinstance(data.get(key), bool)


def _ratio(data: dict[str, Any], name: str, num: str, den: str, better: Better) -> list[Figure]:
    if _present(data, num) and _present(data, den) and data[den]:
        return [Figure(name, data[num] / data[den], better, "ratio")]
    return []


def _given(data: dict[str, Any], key: str, better: Better, kind: Kind, name: str | None = None) -> list[Figure]:
    return [Figure(name or key, float(data[key]), better, kind)] if _present(data, key) else []


def checkpoint_store_figures(data: dict[str, Any]) -> list[Figure]:
    """The ratio lines of checkpoint_store.py (each Quicksave contender against the floor and
    LangGraph's PostgresSaver), from the per-contender figures of its JSON line."""
    out: list[Figure] = []
    contenders = sorted(key.removesuffix("_cps") for key in data if key.endswith("_cps") and key.count("_") >= 1)
    contenders = [c for c in contenders if c.startswith("quicksave") and f"{c}_bytes_per_cp" in data]
    measures: tuple[tuple[str, str, Better], ...] = (
        ("cps", "writes", "higher"),
        ("bytes_per_cp", "bytes/cp", "lower"),
        ("latest_read_ms", "latest read ms", "lower"),
        ("state_at_ms", "state-at read ms", "lower"),
        ("history_ms", "history ms", "lower"),
    )
    for base in ("floor", "langgraph"):
        for contender in contenders:
            for key, label, better in measures:
                out += _ratio(data, f"{contender} / {base}: {label}", f"{contender}_{key}", f"{base}_{key}", better)
    out += _given(data, "encrypted_over_plain_cps", "higher", "ratio")
    for key in data:
        if key.startswith("rate_"):  # the rate at the largest size over the smallest
            out += _given(data, key, "higher", "ratio")
    out += _given(data, "quicksave_cps", "higher", "absolute")
    out += _given(data, "http_p99_ms", "lower", "absolute")
    return out


def dashboard_figures(data: dict[str, Any]) -> list[Figure]:
    out = [Figure(k, float(v), "lower", "ratio") for k, v in data.items() if k.startswith("thread_page_ratio_")]
    out += _ratio(data, "diff page cold / warm", "diff_page_ms", "diff_page_ms_warm", "lower")
    for key in sorted(data):
        if key.startswith("thread_page_ms_") or key.startswith("diff_page_ms"):
            out += _given(data, key, "lower", "absolute")
    return out


def approvals_figures(data: dict[str, Any]) -> list[Figure]:
    out = _ratio(data, "p95 / target", "decision_to_resume_p95_ms", "target_p95_ms", "lower")
    out += _given(data, "decision_to_resume_p50_ms", "lower", "absolute")
    out += _given(data, "decision_to_resume_p95_ms", "lower", "absolute")
    return out


def langgraph_figures(data: dict[str, Any]) -> list[Figure]:
    out = _given(data, "cps_ratio", "higher", "ratio", "QuicksaveSaver / PostgresSaver: writes")
    out += _given(data, "bytes_ratio", "lower", "ratio", "QuicksaveSaver / PostgresSaver: bytes/cp")
    out += _given(data, "floor_ratio", "higher", "ratio", "QuicksaveSaver / CommitOnlySaver: writes")
    out += _ratio(data, "QuicksaveSaver / LatestOnlySaver: writes", "quicksave_saver_cps", "latest_only_saver_cps",
                  "higher")  # fmt: skip
    out += _given(data, "quicksave_saver_cps", "higher", "absolute")
    return out


def langgraph_ablation_figures(data: dict[str, Any]) -> list[Figure]:
    return [
        Figure(f"{stage} / PostgresSaver: writes", float(figures["ratio"]), "higher", "ratio")
        for stage, figures in data.items()
        if isinstance(figures, dict) and _present(figures, "ratio")
    ]


def storage_figures(data: dict[str, Any]) -> list[Figure]:
    out = _ratio(data, "PostgreSQL bytes, no offload / offload", "no_offload_pg_bytes", "offload_pg_bytes", "higher")
    out += _ratio(data, "writes, offload / no offload", "offload_cps", "no_offload_cps", "higher")
    out += _given(data, "pg_read_ms", "lower", "absolute")
    return out


def tool_calls_figures(data: dict[str, Any]) -> list[Figure]:
    out = _given(data, "tool_call_over_no_tool", "higher", "ratio", "logged tool call / none: steps/s")
    out += _given(data, "steps_per_s_no_tool", "higher", "absolute")
    return out


def langgraph_own_tests_figures(data: dict[str, Any]) -> list[Figure]:
    out: list[Figure] = []
    for key in sorted(data):
        if _present(data, key):
            better: Better = "higher" if key.endswith("_passed") else "lower"
            out.append(Figure(key, float(data[key]), better, "count"))
    return out


BENCHES: tuple[Bench, ...] = (
    Bench("checkpoint_store", ("--steps", "100,300", "--rounds", "3"), (), checkpoint_store_figures),
    Bench("langgraph", ("--steps", "300"), (), langgraph_figures),
    Bench("langgraph_ablation", ("--steps", "200", "--rounds", "1"), (), langgraph_ablation_figures),
    Bench("tool_calls", ("--steps", "300", "--rounds", "3"), (), tool_calls_figures),
    Bench("storage", ("--steps", "300"), (), storage_figures),
    Bench("dashboard", ("--repeats", "15"), (), dashboard_figures),
    Bench("approvals", ("--n", "30"), (), approvals_figures),
    Bench(
        "langgraph_own_tests",
        ("--files", "test_interruption.py", "--savers", "memory,quicksave"),
        (),
        langgraph_own_tests_figures,
        needs_checkout=True,
    ),
)


# --------------------------------------------------------------------------
# Trees and databases
# --------------------------------------------------------------------------


@dataclass
class Tree:
    side: str  # "old" or "new"
    path: Path
    label: str  # a short commit hash, or "worktree"
    database: str = ""


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def revision_tree(side: str, revision: str, trees: Path) -> Tree:
    """A detached worktree at `revision` under `trees`, made once and reused; its bench/ files are
    reset to the commit's, then told the bench database's name if they predate BENCH_DATABASE_NAME."""
    sha = git("rev-parse", "--verify", f"{revision}^{{commit}}")
    path = trees / sha[:12]
    if path.exists() and git("rev-parse", "HEAD", cwd=path) != sha:
        raise SystemExit(f"{path} is a checkout of another commit: remove it (git worktree remove {path})")
    if not path.exists():
        trees.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(path), sha)
    git("checkout", "--", "bench", cwd=path)
    return Tree(side=side, path=path, label=sha[:8])


def name_database(tree: Tree, *, editable: bool) -> None:
    """Make the tree's benches use `tree.database`: through BENCH_DATABASE_NAME when its bench/peers.py
    reads it, else (only in a checkout this script made) by writing the name over the old literal."""
    peers = tree.path / "bench" / "peers.py"
    if DB_NAME_ENV in peers.read_text():
        return
    if not editable:
        raise SystemExit(f"{peers} does not read {DB_NAME_ENV}: the two trees would share one database")
    for script in (tree.path / "bench").glob("*.py"):
        text = script.read_text()
        if LEGACY_DB_NAME.search(text):
            script.write_text(LEGACY_DB_NAME.sub(tree.database, text))
    if tree.database not in peers.read_text():
        raise SystemExit(f"{peers}: found no database name to replace")


def server_url() -> str:
    """The PostgreSQL server the benches use, as bench/peers.py chooses it."""
    return os.environ.get("BENCH_DATABASE_URL") or os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def database_prefix() -> str:
    name = urlsplit(os.environ.get("DATABASE_URL", "")).path.lstrip("/")
    return name if name and name != "postgres" else "quicksave_bench"


def prepare_database(name: str, *, fresh: bool) -> None:
    with psycopg.connect(with_database(server_url(), "postgres"), autocommit=True) as conn:
        if fresh:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------


@dataclass
class Run:
    bench: str
    side: str
    seconds: float
    log: Path
    figures: list[Figure] = field(default_factory=list)
    error: str = ""


def last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def own_tests_counts(stdout: str) -> dict[str, Any] | None:
    """The counts langgraph_own_tests.py prints as text (for trees whose script has no --json)."""
    counts: dict[str, Any] = {}
    for saver, passed, failed, skipped in re.findall(r"^  (\w+)\s+(\d+) /\s+(\d+) /\s+(\d+)$", stdout, re.M):
        if saver != "-":
            counts.update({f"{saver}_passed": int(passed), f"{saver}_failed": int(failed),
                           f"{saver}_skipped": int(skipped)})  # fmt: skip
    only = re.search(r"^failed with QuicksaveSaver only \((\d+)\):", stdout, re.M)
    if only:
        counts["quicksave_only_failed"] = int(only.group(1))
    return counts or None


@dataclass(frozen=True)
class Settings:
    quick: bool
    timeout: float
    logs: Path
    redis_url: str
    checkout: Path | None
    lg_deps: Path | None


def command(bench: Bench, tree: Tree, settings: Settings) -> list[str]:
    script = tree.path / "bench" / f"{bench.name}.py"
    args = list(bench.quick if settings.quick else bench.full)
    if bench.needs_checkout:
        assert settings.checkout is not None
        workdir = settings.logs / f"lgtests-{tree.side}"
        args = [str(settings.checkout), "--workdir", str(workdir), "--test-database", f"test_{tree.database}_lg", *args]
        if "--json" in script.read_text():
            args.append("--json")
    return [sys.executable, str(script), *args]


def environment(bench: Bench, tree: Tree, settings: Settings) -> dict[str, str]:
    paths = [str(tree.path)]
    if bench.needs_checkout and settings.lg_deps:
        paths.append(str(settings.lg_deps))  # after the tree: the venv's packages still come first
    url = with_database(server_url(), tree.database)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "DATABASE_URL": url,
        "BENCH_DATABASE_URL": url,
        DB_NAME_ENV: tree.database,
        "REDIS_URL": settings.redis_url,
        "BENCH_REDIS_URL": settings.redis_url,
        "PYTHONUNBUFFERED": "1",
    }


def run_one(bench: Bench, tree: Tree, settings: Settings, attempt: int) -> Run:
    log = settings.logs / f"{bench.name}-{tree.side}-{attempt}.log"
    started = time.monotonic()
    cmd = command(bench, tree, settings)
    print(f"  {bench.name} [{tree.side}] ...", end="", flush=True)
    with log.open("w") as out:
        out.write(f"$ {' '.join(cmd)}\n(cwd {tree.path})\n\n")
        out.flush()
        # The bench writes straight into its log (tail -f it to follow a run), in a session of its
        # own, so that one that times out goes with the worker or server it started.
        proc = subprocess.Popen(cmd, cwd=tree.path, env=environment(bench, tree, settings), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -1
    stdout = log.read_text(errors="replace")
    run = Run(bench=bench.name, side=tree.side, seconds=time.monotonic() - started, log=log)
    data = last_json(stdout) or (own_tests_counts(stdout) if bench.needs_checkout else None)
    if data is not None:
        run.figures = bench.figures(data)
    # LangGraph's own tests exit non-zero when any test fails: the counts are the result.
    if code != 0 and not (bench.needs_checkout and data):
        run.error = "timed out" if code == -1 else f"exit {code}: {last_error(log)}"
    elif not run.figures:
        run.error = "no JSON line with known figures"
    print(f" {run.seconds:.0f} s" + (f"  FAILED ({run.error})" if run.error else ""), flush=True)
    return run


def last_error(log: Path) -> str:
    """The last line of a traceback (or of the output) in `log`, for the summary."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b", line)]
    last = (errors or lines or ["(no output)"])[-1][:160]
    if last.startswith("ModuleNotFoundError"):
        last += f" (a moved module, or a package this tree needs that {sys.executable} lacks)"
    return last


def requirement_differences(old: Tree, new: Tree) -> list[str]:
    """The requirements files that differ between the trees: both run with this one interpreter."""

    def text(tree: Tree, name: str) -> list[str] | None:
        """The file's requirement lines, comments left out."""
        path = tree.path / name
        if not path.is_file():
            return None
        return [kept for line in path.read_text().splitlines() if (kept := line.split("#", 1)[0].strip())]

    names = {path.name for tree in (old, new) for path in tree.path.glob("requirements*.txt")}
    return sorted(name for name in names if text(old, name) != text(new, name))


def turns(attempts: range) -> Iterator[tuple[int, tuple[str, str]]]:
    """(attempt, order): old, new; then new, old; ... so neither side always runs first."""
    for attempt in attempts:
        yield attempt, (("old", "new") if attempt % 2 == 1 else ("new", "old"))


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------


@dataclass
class Row:
    bench: str
    figure: str
    kind: Kind
    better: Better
    old: float | None
    new: float | None
    # The widest (max - min) / median of either side's runs: how far this figure moved between
    # runs of the very same code, against which to read `change`.
    spread: float | None = None

    def change(self) -> float | None:
        if self.old is None or self.new is None or self.old == 0:
            return None
        return (self.new - self.old) / abs(self.old)

    def flag(self, tolerance: float) -> str:
        if self.old is None or self.new is None:
            return "missing"
        if self.kind == "count":
            moved_wrong_way = self.new < self.old if self.better == "higher" else self.new > self.old
            return "WORSE" if moved_wrong_way else ""
        change = self.change()
        if change is None:
            return ""
        worse = -change if self.better == "higher" else change
        if worse > tolerance:
            return "WORSE" if self.kind == "ratio" else "(worse)"
        return ""


def rows(runs: Sequence[Run]) -> list[Row]:
    """One row per (bench, figure): the median over each side's runs, in the order first seen."""
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    meta: dict[tuple[str, str], Figure] = {}
    for run in runs:
        for figure in run.figures:
            key = (run.bench, figure.name)
            meta.setdefault(key, figure)
            values.setdefault(key, {"old": [], "new": []})[run.side].append(figure.value)
    return [
        Row(bench, name, meta[(bench, name)].kind, meta[(bench, name)].better,
            statistics.median(sides["old"]) if sides["old"] else None,
            statistics.median(sides["new"]) if sides["new"] else None,
            max((spread(side) for side in sides.values() if len(side) > 1), default=None))
        for (bench, name), sides in values.items()
    ]  # fmt: skip


def spread(values: Sequence[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / abs(middle) if middle else 0.0


def number(value: float | None) -> str:
    if value is None:
        return "-"
    if value == int(value) and abs(value) >= 10:
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) < 10 else f"{value:,.1f}"


def print_table(table: Sequence[Row], tolerance: float) -> None:
    header = f"{'bench':<20} {'figure':<48} {'kind':<8} {'old':>10} {'new':>10} {'change':>8} {'spread':>7}  flag"
    print(header)
    print("-" * len(header))
    for row in table:
        change = row.change()
        shown = "-" if change is None else f"{change:+.1%}"
        better = "↑" if row.better == "higher" else "↓"
        noise = "" if row.spread is None else f"{row.spread:.0%}"
        flag = row.flag(tolerance)
        if flag == "WORSE" and change is not None and row.spread is not None and row.spread >= abs(change):
            flag += " (within spread)"  # runs of the same code moved as much: run it again, quieter
        print(f"{row.bench:<20} {row.figure[:46] + ' ' + better:<48} {row.kind:<8} {number(row.old):>10} "
              f"{number(row.new):>10} {shown:>8} {noise:>7}  {flag}")  # fmt: skip
    print(
        "(↑ higher is better, ↓ lower is better; change is new against old; spread: the widest (max - min) /"
        " median among one side's runs, where a side ran more than once)"
    )


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", default=DEFAULT_OLD, help=f"the revision before the change (default {DEFAULT_OLD})")
    parser.add_argument("--new", help="the revision after it (default: this working tree as it is)")
    parser.add_argument("--quick", action="store_true", help="each bench at its smallest sensible size")
    parser.add_argument("--only", help="comma-separated bench names (default: all)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each bench per tree (default 1)")
    parser.add_argument("--recheck", type=int, default=2,
                        help="more runs a side of each bench with a ratio flagged WORSE (default 2)")  # fmt: skip
    parser.add_argument("--tolerance", type=float, default=0.10, help="worse than this flags a ratio (default 0.10)")
    parser.add_argument("--trees", type=Path, default=Path(tempfile.gettempdir()) / "quicksave-bench-trees",
                        help="where revisions are checked out (default: $TMPDIR/quicksave-bench-trees)")  # fmt: skip
    parser.add_argument("--logs", type=Path, help="where each run's output goes (default: a new temporary directory)")
    parser.add_argument("--json-out", type=Path, help="also write every run's figures and the table here")
    parser.add_argument("--reuse-db", action="store_true", help="keep each tree's bench database from an earlier run")
    parser.add_argument("--timeout", type=float, help="seconds one bench run may take (default 1800 quick, 14400 full)")
    parser.add_argument("--langgraph-checkout", type=Path, default=os.environ.get("LANGGRAPH_CHECKOUT"),
                        help="a langgraph checkout for langgraph_own_tests (default $LANGGRAPH_CHECKOUT; "
                             "without one that bench is skipped)")  # fmt: skip
    parser.add_argument("--langgraph-deps", type=Path,
                        help="extra packages LangGraph's tests import (a pip --target directory)")  # fmt: skip
    args = parser.parse_args(argv)

    chosen = [b for b in BENCHES if not args.only or b.name in args.only.split(",")]
    if args.only and (unknown := set(args.only.split(",")) - {b.name for b in BENCHES}):
        parser.error(f"unknown benches: {', '.join(sorted(unknown))}")
    if not args.langgraph_checkout:
        skipped = [b.name for b in chosen if b.needs_checkout]
        chosen = [b for b in chosen if not b.needs_checkout]
        if skipped:
            print(f"[note] skipped {', '.join(skipped)}: no --langgraph-checkout", flush=True)

    logs = args.logs or Path(tempfile.mkdtemp(prefix="quicksave-bench-compare-"))
    logs.mkdir(parents=True, exist_ok=True)
    old = revision_tree("old", args.old, args.trees)
    new = revision_tree("new", args.new, args.trees) if args.new else Tree("new", REPO, "worktree")
    if old.path == new.path:
        parser.error("--old and --new are the same commit")
    prefix = database_prefix()
    for tree in (old, new):
        tree.database = f"{prefix}_{tree.label}"
        name_database(tree, editable=tree.path != REPO)
        prepare_database(tree.database, fresh=not args.reuse_db)
        print(f"{tree.side}: {tree.path} (database {tree.database})", flush=True)
    if differing := requirement_differences(old, new):
        print(f"[note] {', '.join(differing)} differ between the trees; both run with {sys.executable}", flush=True)
    settings = Settings(
        quick=args.quick, timeout=args.timeout or (1800 if args.quick else 14400), logs=logs,
        redis_url=os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL, checkout=args.langgraph_checkout,
        lg_deps=args.langgraph_deps,
    )  # fmt: skip
    print(f"logs: {logs}\n", flush=True)

    trees = {"old": old, "new": new}
    runs: list[Run] = []
    started = time.monotonic()

    def take_turns(bench: Bench, attempts: range) -> None:
        for attempt, order in turns(attempts):
            for side in order:
                runs.append(run_one(bench, trees[side], settings, attempt))

    for bench in chosen:
        # Test counts do not move with the machine's load: one run per side is enough.
        take_turns(bench, range(1, 2 if bench.needs_checkout else args.repeats + 1))
    flagged = {row.bench for row in rows(runs) if row.flag(args.tolerance) == "WORSE"}
    again = [bench for bench in chosen if bench.name in flagged and not bench.needs_checkout]
    if args.recheck and again:
        print(f"\nflagged: {args.recheck} more run(s) a side of {', '.join(b.name for b in again)}", flush=True)
        for bench in again:
            take_turns(bench, range(args.repeats + 1, args.repeats + args.recheck + 1))
    elapsed = time.monotonic() - started

    table = rows(runs)
    size = "quick" if args.quick else "full"
    print(f"\nold = {args.old} ({old.path}), new = {args.new or 'working tree'} ({new.path}); {size} sizes, "
          f"{args.repeats} run(s) a side (+{args.recheck} if flagged), {elapsed / 60:.1f} min\n")  # fmt: skip
    print_table(table, args.tolerance)
    failures = [run for run in runs if run.error]
    for run in failures:
        print(f"FAILED {run.bench} [{run.side}]: {run.error} (log: {run.log})")
    worse = [row for row in table if row.flag(args.tolerance) == "WORSE"]
    print(f"\n{len(worse)} figure(s) flagged WORSE, {len(failures)} failed run(s).")
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "old": {"revision": args.old, "path": str(old.path)},
            "new": {"revision": args.new or "working tree", "path": str(new.path)},
            "quick": args.quick, "repeats": args.repeats, "recheck": args.recheck, "minutes": round(elapsed / 60, 1),
            "runs": [{"bench": r.bench, "side": r.side, "seconds": round(r.seconds, 1), "log": str(r.log),
                      "error": r.error, "figures": {f.name: f.value for f in r.figures}} for r in runs],
            "table": [{"bench": r.bench, "figure": r.figure, "kind": r.kind, "better": r.better, "old": r.old,
                       "new": r.new, "change": r.change(), "spread": r.spread, "flag": r.flag(args.tolerance)}
                      for r in table],
        }, indent=1))  # fmt: skip
    return 1 if worse or failures else 0


if __name__ == "__main__":
    sys.exit(main())
