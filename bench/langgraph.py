"""LangGraph benchmark: one compiled graph checkpointed by QuicksaveSaver vs LangGraph's PostgresSaver.

Usage (from /work/main)::

    .venv/bin/python bench/langgraph.py                 # 1,000 steps
    .venv/bin/python bench/langgraph.py --steps 300

The workload of ``bench/checkpoint_store.py`` (:func:`bench.peers.workload`: one
1,000-character assistant message appended, ``step`` and ``facts`` replaced per
step) is driven through the very same compiled LangGraph graph
(:func:`bench.peers.build_graph`, one ``graph.invoke`` per workload step), once
with :class:`integrations.langgraph.saver.QuicksaveSaver` and once with
``langgraph.checkpoint.postgres.PostgresSaver``, in this one process against one
PostgreSQL server, inside the dedicated ``quicksave_bench`` database (see
:mod:`bench.peers` for how the server is chosen).  Both use LangGraph's default
durability unless ``--durability`` says otherwise.

Measures
--------
* **checkpoints per second** -- counted as *workload steps* per second (wall
  clock over all ``graph.invoke`` calls).  Each invoke makes LangGraph write
  more than one checkpoint (its ``input`` and ``loop`` checkpoints, plus pending
  writes); the actual checkpoint rows are reported beside the figure.
* **bytes per checkpoint** -- ``pg_total_relation_size`` (heap + TOAST +
  indexes) of the saver's tables after the run, divided by the workload steps.
  PostgresSaver: LangGraph's tables (``bench.peers.LANGGRAPH_TABLES``), dropped
  and recreated before the run.  QuicksaveSaver: Quicksave's tables
  (``bench.quicksave_runs.TABLES``) plus ``checkpoints_toolresult``, which holds
  its pending writes, all emptied (``TRUNCATE``) before the run.

Three reference runs store no state in the database. Two need no database at all:
LangGraph's own ``InMemorySaver``, and ``LatestOnlySaver`` (:func:`latest_only_saver`),
which keeps the newest checkpoint of the thread in memory and nothing else -- the graph's
own cost per step with a checkpointer attached, which no saver can beat. The third,
``CommitOnlySaver`` (:func:`commit_only_saver`), is ``LatestOnlySaver`` plus one committed
INSERT of ids only for every ``put`` and every ``put_writes``: the durable floor, what the
commits LangGraph asks a saver for cost by themselves, which no saver that commits each
call can beat (the counterpart of ``bench/checkpoint_store.py``'s floor).

After each run the graph's own ``get_state`` must return every message, the
final step and the final facts.  A table and ratio lines (with the targets:
QuicksaveSaver at least half the rate of CommitOnlySaver, at least 2.5x the write
rate and at most 1/10 of the bytes of PostgresSaver) are printed; the very last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

# Run as a script, this file's folder heads sys.path and its name would shadow the real
# `langgraph` package: drop that folder and put the project root there instead.
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.peers import (  # noqa: E402
    LANGGRAPH_TABLES,
    THREAD_ID,
    Step,
    bench_conninfo,
    build_graph,
    ensure_bench_database,
    fresh_postgres_saver,
    median_ms,
    quiet_langchain_warnings,
    relation_bytes,
    server_settings,
    settle,
    window_cps,
    workload,
)
from bench.quicksave_runs import TABLES as QUICKSAVE_TABLES  # noqa: E402
from bench.quicksave_runs import _reset, setup_django  # noqa: E402

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

DEFAULT_STEPS = 1_000
CPS_TARGET = 2.5  # QuicksaveSaver's write rate >= 2.5x PostgresSaver's
FLOOR_TARGET = 0.5  # ... and >= half the durable floor's (CommitOnlySaver)
BYTES_TARGET = 0.1  # QuicksaveSaver's bytes per checkpoint <= 1/10 of PostgresSaver's
LATEST_READS = 5
QUICKSAVE_SAVER_TABLES: tuple[str, ...] = (*QUICKSAVE_TABLES, "checkpoints_toolresult")


@dataclass
class SaverRun:
    """One saver's figures at one workload size."""

    name: str
    steps: int
    cps: float
    total_bytes: int
    checkpoint_rows: int
    latest_read_ms: float
    table_bytes: dict[str, int]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def bytes_per_cp(self) -> float:
        return self.total_bytes / self.steps


def _invoke_kwargs(durability: str | None) -> dict[str, Any]:
    return {"durability": durability} if durability else {}


def _drive(
    graph: Any, work: Sequence[Step], config: RunnableConfig, durability: str | None
) -> tuple[float, list[float]]:
    """One ``graph.invoke`` per workload step; returns (t0, end time of each step)."""
    kwargs = _invoke_kwargs(durability)
    gc.collect()
    stamps: list[float] = []
    t0 = time.perf_counter()
    for _ in work:
        graph.invoke({}, config=config, **kwargs)
        stamps.append(time.perf_counter())
    return t0, stamps


def _verify(graph: Any, work: Sequence[Step], config: RunnableConfig, name: str) -> None:
    """The graph's own view of the thread must hold every message, the final step and facts."""
    values = graph.get_state(config).values
    steps = len(work)
    if values.get("step") != steps:
        raise AssertionError(f"{name}: final step {values.get('step')!r}, expected {steps}")
    if values.get("messages") != [s.message for s in work]:
        got = len(values.get("messages") or [])
        raise AssertionError(f"{name}: messages differ from the workload ({got} stored, {steps} expected)")
    if values.get("facts") != work[-1].facts:
        raise AssertionError(f"{name}: final facts {values.get('facts')!r}, expected {work[-1].facts!r}")


def run_quicksave_saver(steps: int, seed: int = 7, durability: str | None = None) -> SaverRun:
    """The graph checkpointed by ``QuicksaveSaver(agent="langgraph")`` on emptied Quicksave tables."""
    setup_django()  # Django must point at the bench database before the saver is imported
    with quiet_langchain_warnings():
        from integrations.langgraph.saver import QuicksaveSaver
    from checkpoints.models import Checkpoint, Thread, ToolResult

    _reset()  # TRUNCATE the Quicksave tables and checkpoints_toolresult
    work = list(workload(steps, seed))
    config: RunnableConfig = {"configurable": {"thread_id": THREAD_ID}}
    saver = QuicksaveSaver(agent="langgraph")
    graph = build_graph(work, saver)

    t0, stamps = _drive(graph, work, config, durability)
    elapsed = stamps[-1] - t0

    with psycopg.connect(bench_conninfo(), autocommit=True) as conn:
        sizes = relation_bytes(conn, QUICKSAVE_SAVER_TABLES)
    _verify(graph, work, config, "QuicksaveSaver")
    latest_ms = median_ms(lambda: graph.get_state(config), LATEST_READS)
    threads = Thread.objects.filter(agent__name="langgraph").count()
    rows = Checkpoint.objects.count()
    writes = ToolResult.objects.count()
    return SaverRun(
        name="QuicksaveSaver",
        steps=steps,
        cps=steps / elapsed,
        total_bytes=sum(sizes.values()),
        checkpoint_rows=rows,
        latest_read_ms=latest_ms,
        table_bytes=sizes,
        extra={"threads": threads, "write_rows": writes, **window_cps(t0, stamps)},
    )


def latest_only_saver() -> Any:
    """``LatestOnlySaver``: a checkpointer that keeps the newest checkpoint it was given and
    drops everything else.

    Not a saver anyone should use: a reference for the cost of LangGraph's own loop per step
    with a checkpointer attached (it still copies each checkpoint, as its savers must).
    """
    latest_only, _ = _reference_savers()
    return latest_only()


def commit_only_saver(conn: psycopg.Connection[Any]) -> Any:
    """``CommitOnlySaver``: :func:`latest_only_saver` plus one committed INSERT of ids only
    (no state, no written values) on ``conn`` for every ``put`` and every ``put_writes``.

    Not a saver anyone should use: the durable floor of this graph. A saver that commits
    what each call hands it pays at least this; everything it stores costs on top.
    ``conn`` must be in autocommit; LangGraph's threads share it under a lock, as they
    share PostgresSaver's connection.
    """
    _, commit_only = _reference_savers()
    return commit_only(conn)


COMMIT_ONLY_DDL = """
CREATE TABLE bench_commit_only (
    id bigserial PRIMARY KEY,
    call text NOT NULL,
    thread_id text NOT NULL,
    checkpoint_id text NOT NULL,
    task_id text,
    created_at timestamptz DEFAULT now()
)
"""


@functools.cache
def _reference_savers() -> tuple[type[Any], type[Any]]:
    """The reference saver classes, defined on first use like every LangGraph import here."""
    with quiet_langchain_warnings():
        from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, copy_checkpoint

    class LatestOnlySaver(BaseCheckpointSaver):  # type: ignore[type-arg]
        latest: CheckpointTuple | None = None

        def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
            return self.latest

        def put(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            stored: RunnableConfig = {"configurable": {
                "thread_id": config["configurable"]["thread_id"],
                "checkpoint_ns": config["configurable"].get("checkpoint_ns", ""),
                "checkpoint_id": checkpoint["id"],
            }}  # fmt: skip
            self.latest = CheckpointTuple(stored, copy_checkpoint(checkpoint), metadata, config, [])
            return stored

        def put_writes(self, config: RunnableConfig, writes: Any, task_id: str, task_path: str = "") -> None:
            return None

    class CommitOnlySaver(LatestOnlySaver):
        def __init__(self, conn: psycopg.Connection[Any]) -> None:
            super().__init__()
            self._conn = conn
            self._lock = threading.Lock()

        def put(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            stored = super().put(config, checkpoint, metadata, new_versions)
            self._commit("put", config, checkpoint["id"], None)
            return stored

        def put_writes(self, config: RunnableConfig, writes: Any, task_id: str, task_path: str = "") -> None:
            self._commit("put_writes", config, config["configurable"]["checkpoint_id"], task_id)

        def _commit(self, call: str, config: RunnableConfig, checkpoint_id: str, task_id: str | None) -> None:
            thread_id = str(config["configurable"]["thread_id"])
            with self._lock:  # autocommit: one committed transaction, one round trip
                self._conn.execute(
                    "INSERT INTO bench_commit_only (call, thread_id, checkpoint_id, task_id) VALUES (%s, %s, %s, %s)",
                    (call, thread_id, checkpoint_id, task_id),
                )

    return LatestOnlySaver, CommitOnlySaver


def run_in_memory(steps: int, seed: int = 7, durability: str | None = None, *, latest_only: bool = False) -> SaverRun:
    """A reference run with no database: LangGraph's ``InMemorySaver``, or :func:`latest_only_saver`."""
    with quiet_langchain_warnings():
        from langgraph.checkpoint.memory import InMemorySaver

    saver = latest_only_saver() if latest_only else InMemorySaver()
    return _reference_run("LatestOnlySaver" if latest_only else "InMemorySaver", saver, steps, seed, durability)


def run_commit_only(steps: int, seed: int = 7, durability: str | None = None) -> SaverRun:
    """The durable-floor reference: :func:`commit_only_saver` on a freshly created table."""
    with psycopg.connect(ensure_bench_database(), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_commit_only")
        conn.execute(COMMIT_ONLY_DDL)
        run = _reference_run("CommitOnlySaver", commit_only_saver(conn), steps, seed, durability)
        row = conn.execute("SELECT count(*) FROM bench_commit_only").fetchone()
    assert row is not None
    run.extra["commits"] = int(row[0])
    return run


def _reference_run(name: str, saver: Any, steps: int, seed: int, durability: str | None) -> SaverRun:
    work = list(workload(steps, seed))
    config: RunnableConfig = {"configurable": {"thread_id": THREAD_ID}}
    graph = build_graph(work, saver)
    t0, stamps = _drive(graph, work, config, durability)
    _verify(graph, work, config, name)
    return SaverRun(
        name=name, steps=steps, cps=steps / (stamps[-1] - t0), total_bytes=0, checkpoint_rows=0,
        latest_read_ms=median_ms(lambda: graph.get_state(config), LATEST_READS), table_bytes={},
        extra=window_cps(t0, stamps),
    )  # fmt: skip


def run_postgres_saver(steps: int, seed: int = 7, durability: str | None = None) -> SaverRun:
    """The graph checkpointed by LangGraph's ``PostgresSaver`` on freshly created tables.

    The saver gets a psycopg connection opened with ``autocommit=True,
    prepare_threshold=0, row_factory=dict_row``, as its documentation requires
    (the same set-up as ``bench.peers.run_langgraph``).
    """
    work = list(workload(steps, seed))
    config: RunnableConfig = {"configurable": {"thread_id": THREAD_ID}}

    with fresh_postgres_saver() as (conn, saver):
        graph = build_graph(work, saver)

        t0, stamps = _drive(graph, work, config, durability)
        elapsed = stamps[-1] - t0

        sizes = relation_bytes(conn, LANGGRAPH_TABLES)
        counts: dict[str, int] = {}
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            row = conn.execute(sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(table))).fetchone()
            assert row is not None
            counts[table] = int(row["n"])
        _verify(graph, work, config, "PostgresSaver")
        latest_ms = median_ms(lambda: graph.get_state(config), LATEST_READS)

    return SaverRun(
        name="PostgresSaver",
        steps=steps,
        cps=steps / elapsed,
        total_bytes=sum(sizes.values()),
        checkpoint_rows=counts["checkpoints"],
        latest_read_ms=latest_ms,
        table_bytes=sizes,
        extra={"blob_rows": counts["checkpoint_blobs"], "write_rows": counts["checkpoint_writes"],
               **window_cps(t0, stamps)},
    )  # fmt: skip


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def _fmt_bytes(n: float) -> str:
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.2f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n:.0f} B"


def format_table(runs: Sequence[SaverRun]) -> str:
    """A fixed-width table of the runs, then each run's table sizes and extras."""
    headers = ("saver", "steps", "cp/s (steps/s)", "bytes/cp", "total bytes", "checkpoint rows", "latest read ms")
    rows = [
        (
            r.name,
            str(r.steps),
            f"{r.cps:,.1f}",
            _fmt_bytes(r.bytes_per_cp) if r.table_bytes else "-",
            _fmt_bytes(r.total_bytes) if r.table_bytes else "-",
            f"{r.checkpoint_rows:,}" if r.table_bytes else "-",
            f"{r.latest_read_ms:,.2f}",
        )
        for r in runs
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [line(headers), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]
    for r in runs:
        if r.table_bytes:
            tables = ", ".join(f"{t}={_fmt_bytes(b)}" for t, b in r.table_bytes.items())
            out.append(f"  {r.name} tables: {tables}")
        if r.extra:
            out.append(f"  {r.name}: " + ", ".join(f"{k}={v}" for k, v in r.extra.items()))
    return "\n".join(out)


def ratios(quicksave: SaverRun, postgres: SaverRun) -> tuple[float, float]:
    """(write-rate ratio QuicksaveSaver/PostgresSaver, bytes ratio QuicksaveSaver/PostgresSaver)."""
    return quicksave.cps / postgres.cps, quicksave.bytes_per_cp / postgres.bytes_per_cp


def ratio_lines(quicksave: SaverRun, postgres: SaverRun) -> list[str]:
    cps_ratio, bytes_ratio = ratios(quicksave, postgres)
    cps_met = "target met" if cps_ratio >= CPS_TARGET else "target missed"
    bytes_met = "target met" if bytes_ratio <= BYTES_TARGET else "target missed"
    return [
        f"write rate: QuicksaveSaver is {cps_ratio:.2f}x PostgresSaver (target >= {CPS_TARGET:g}x): {cps_met}",
        f"bytes/cp:   QuicksaveSaver is {bytes_ratio:.4f} of PostgresSaver, 1/{1 / bytes_ratio:.1f}"
        f" (target <= 1/{1 / BYTES_TARGET:g}): {bytes_met}",
    ]


def reference_lines(references: Sequence[SaverRun], quicksave: SaverRun, postgres: SaverRun) -> list[str]:
    """How the savers' rates compare with the references that store no state."""
    lines = [
        "reference runs that store no state (LatestOnlySaver: no checkpointer makes a step cheaper;"
        " CommitOnlySaver: none that commits each call does):"
    ]
    for ref in references:
        lines.append(
            f"  {ref.name}: {ref.cps:,.1f} steps/s, {ref.cps / postgres.cps:.2f}x PostgresSaver;"
            f" QuicksaveSaver runs at {quicksave.cps / ref.cps:.0%} of it"
        )
        if ref.name == "CommitOnlySaver":
            met = "target met" if quicksave.cps / ref.cps >= FLOOR_TARGET else "target missed"
            lines.append(f"  (target: at least {FLOOR_TARGET:.0%} of CommitOnlySaver: {met})")
    return lines


def summary(quicksave: SaverRun, postgres: SaverRun, references: Sequence[SaverRun] = ()) -> dict[str, Any]:
    """The final JSON object."""
    cps_ratio, bytes_ratio = ratios(quicksave, postgres)
    by_name = {ref.name: ref for ref in references}
    floor: dict[str, Any] = {}
    if "CommitOnlySaver" in by_name:
        floor_ratio = quicksave.cps / by_name["CommitOnlySaver"].cps
        floor = {"floor_ratio": round(floor_ratio, 3), "floor_target_met": floor_ratio >= FLOOR_TARGET}
    reference_cps = {
        key: round(by_name[name].cps, 1)
        for key, name in (
            ("in_memory_saver_cps", "InMemorySaver"),
            ("latest_only_saver_cps", "LatestOnlySaver"),
            ("commit_only_saver_cps", "CommitOnlySaver"),
        )
        if name in by_name
    }
    return {
        "steps": quicksave.steps,
        "quicksave_saver_cps": round(quicksave.cps, 1),
        "postgres_saver_cps": round(postgres.cps, 1),
        "quicksave_saver_bytes_per_cp": round(quicksave.bytes_per_cp, 1),
        "postgres_saver_bytes_per_cp": round(postgres.bytes_per_cp, 1),
        "cps_ratio": round(cps_ratio, 3),
        "bytes_ratio": round(bytes_ratio, 5),
        "cps_target_met": cps_ratio >= CPS_TARGET,
        **floor,
        "bytes_target_met": bytes_ratio <= BYTES_TARGET,
        **reference_cps,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="workload steps (default: 1000)")
    parser.add_argument("--seed", type=int, default=7, help="workload seed (default: 7)")
    parser.add_argument(
        "--durability",
        choices=("async", "sync", "exit"),
        default=None,
        help="LangGraph durability mode for both savers (default: LangGraph's own default)",
    )
    parser.add_argument("--no-reference", action="store_true", help="skip the three reference runs that store no state")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps must be >= 2, got {args.steps}")

    ensure_bench_database()
    shown = re.sub(r"password=\S+", "password=***", bench_conninfo())
    print(f"database: {shown}", flush=True)
    settings = server_settings(bench_conninfo())
    print("server: " + ", ".join(f"{k}={v}" for k, v in settings.items()), flush=True)
    print(f"durability: {args.durability or 'LangGraph default'}", flush=True)
    print(f"\n== {args.steps} steps (cp/s counts workload steps, one graph.invoke each) ==", flush=True)

    runners: tuple[Callable[[int, int, str | None], SaverRun], ...] = (run_quicksave_saver, run_postgres_saver)
    runs: list[SaverRun] = []
    for runner in runners:  # PostgresSaver last: it leaves the most dirty pages and WAL behind
        settle()
        runs.append(runner(args.steps, args.seed, args.durability))
    quicksave, postgres = runs
    references: list[SaverRun] = []
    if not args.no_reference:
        for latest_only in (False, True):
            references.append(run_in_memory(args.steps, args.seed, args.durability, latest_only=latest_only))
        settle()
        references.append(run_commit_only(args.steps, args.seed, args.durability))
    print(format_table([*runs, *references]))
    for text in ratio_lines(quicksave, postgres):
        print(text)
    if references:
        for text in reference_lines(references, quicksave, postgres):
            print(text)
    print(json.dumps(summary(quicksave, postgres, references)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
