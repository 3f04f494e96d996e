"""Where LangGraph's checkpoints and pending writes are in Quicksave's tables, and the queries
that find them: a thread by (LangGraph thread id, namespace), a row by LangGraph checkpoint id
(through the checkpoint_langgraph_id index), the newest checkpoint with its pending writes in
one statement, a checkpoint's LangGraph ancestors, and pending writes read back in the order a
superstep applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Collate
from langgraph.checkpoint.base import writes_sort_key

from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import codec, cursors

PendingWrites = dict[str, list[tuple[str, str, Any]]]

# The tool name of the tool-result rows that hold pending writes.
WRITE_TOOL = "langgraph:write"


def write_tool(lg_id: str) -> str:
    """The tool name a pending write is stored under: results are sealed, so the LangGraph
    checkpoint id a write belongs to is kept in this clear column to select by."""
    return f"{WRITE_TOOL}:{lg_id}"


def external_id_for(thread_id: str, checkpoint_ns: str) -> str:
    """The Quicksave thread external id of a LangGraph thread and namespace."""
    return f"{thread_id}#{checkpoint_ns}" if checkpoint_ns else thread_id


# LangGraph reads a thread's newest checkpoint before every run. One statement finds the thread,
# the checkpoint and its pending writes: building the query with the ORM would take longer than
# running it. It is planned each time (`cursors.unprepared`): a plan made while the tables were
# young (PostgreSQL's generic plan, made once psycopg prepares the statement at its sixth run, and
# kept by a lent connection for the process's life) sorted every checkpoint of the thread to find
# the newest and joined the pending writes by thread alone, reading every write the thread ever
# made: 1.2 ms a read at 320 steps of bench/langgraph.py, growing with the thread, against 0.06 ms
# to run and about 0.2 ms to plan afresh (docs/langgraph-benchmark.md, 2026-11-26 21:20).
_CHECKPOINT_SQL = """
SELECT cp.id, t.id, cp.metadata, w.key, w.result FROM checkpoints_thread t
CROSS JOIN LATERAL (
    SELECT c.id, c.metadata FROM checkpoints_checkpoint c
    WHERE c.thread_id = t.id AND c.metadata ? 'lg_id' {at}
    ORDER BY (c.metadata ->> 'lg_id') COLLATE "C" DESC LIMIT 1
) cp
LEFT JOIN checkpoints_toolresult w ON w.thread_id = t.id AND w.tool = %(write_tool)s || (cp.metadata ->> 'lg_id')
WHERE t.agent_id = %(agent)s AND t.external_id = %(external_id)s
ORDER BY w.created_at, w.id
"""
_LATEST_CHECKPOINT_SQL = _CHECKPOINT_SQL.format(at="")
_CHECKPOINT_AT_SQL = _CHECKPOINT_SQL.format(at="""AND (c.metadata ->> 'lg_id') COLLATE "C" = %(lg_id)s""")


def checkpoint_with_writes(*, agent_id: int, thread_id: str, checkpoint_ns: str, lg_id: str | None) -> list[Any]:
    """The row of a LangGraph checkpoint (the thread's newest when `lg_id` is None), one result
    row per pending write: (row id, Quicksave thread id, metadata, write key, sealed write), the
    last two None when it has none; no rows when there is no such checkpoint."""
    params: dict[str, int | str | None] = {
        "agent": agent_id, "external_id": external_id_for(thread_id, checkpoint_ns), "lg_id": lg_id,
        "write_tool": write_tool(""),
    }  # fmt: skip
    # On a kept cursor, as the store's appends: a new cursor each read cost a tenth of the
    # read's instructions. Its results are binary: the metadata comes back parsed.
    cursor = cursors.kept_cursor("langgraph-read")
    with cursors.unprepared(cursor):
        cursor.execute(_CHECKPOINT_AT_SQL if lg_id else _LATEST_CHECKPOINT_SQL, params)
    return cursor.fetchall()


def by_lg_id(rows: Any) -> Any:
    """Newest LangGraph checkpoint first: its ids are time-ordered and compare as bytes.

    A checkpoint written in the thread by other means (a dashboard edit) has no LangGraph id
    and is not LangGraph's to see until a hydrator gives it one.
    """
    return (
        rows.filter(metadata__has_key="lg_id")
        .annotate(_lg_order=Collate(KT("metadata__lg_id"), "C"))
        .order_by("-_lg_order")
    )


def with_lg_id(thread: Thread, lg_id: str) -> QuerySet[Checkpoint]:
    """The thread's row of a LangGraph checkpoint id (through the checkpoint_langgraph_id index)."""
    return (
        Checkpoint.objects.filter(thread=thread, metadata__has_key="lg_id")
        .annotate(_lg_order=Collate(KT("metadata__lg_id"), "C"))
        .filter(_lg_order=lg_id)
    )


def pending_writes(results: Iterable[dict[str, Any]], decode: Callable[[Any], Any]) -> PendingWrites:
    """Pending writes per LangGraph checkpoint id from their rows' results, oldest rows first."""
    return {
        lg_id: [(w["task_id"], w["channel"], decode(w["value"])) for w in found]
        for lg_id, found in latest_writes(results).items()
    }


def latest_writes(results: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The stored writes per LangGraph checkpoint id from their rows' results, oldest rows first:
    the newest row wins per (task, index), and each checkpoint's come in the order a superstep
    applies them (LangGraph's `writes_sort_key`), which a DeltaChannel is rebuilt in."""
    latest: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for result in results:
        latest.setdefault(result["lg_id"], {})[(result["task_id"], result["idx"])] = result
    return {
        lg_id: sorted(found.values(), key=lambda w: writes_sort_key(w.get("task_path", ""), w["task_id"], w["idx"]))
        for lg_id, found in latest.items()
    }


# A checkpoint's LangGraph ancestors, from the checkpoint itself, up to `depth` parents: each row is
# found by thread and LangGraph id through the checkpoint_langgraph_id index.
_ANCESTORS_SQL = """
WITH RECURSIVE chain(id, lg_id, lg_parent, depth) AS (
    SELECT c.id, c.metadata ->> 'lg_id', c.metadata ->> 'lg_parent', 0 FROM checkpoints_checkpoint c
    WHERE c.thread_id = %(thread)s AND c.metadata ? 'lg_id' AND (c.metadata ->> 'lg_id') COLLATE "C" = %(lg_id)s
    UNION ALL
    SELECT p.id, p.lg_id, p.lg_parent, chain.depth + 1 FROM chain CROSS JOIN LATERAL (
        SELECT c.id, c.metadata ->> 'lg_id' AS lg_id, c.metadata ->> 'lg_parent' AS lg_parent
        FROM checkpoints_checkpoint c
        WHERE c.thread_id = %(thread)s AND c.metadata ? 'lg_id'
        AND (c.metadata ->> 'lg_id') COLLATE "C" = chain.lg_parent
        LIMIT 1
    ) p
    WHERE chain.depth < %(depth)s
)
SELECT id, lg_id, lg_parent FROM chain ORDER BY depth
"""
# How many ancestors one query reads: a DeltaChannel stores its value every 100 updates by default.
ANCESTORS_PAGE = 64


def ancestors(thread: Thread, lg_id: str) -> Iterator[tuple[UUID, str]]:
    """The (row, LangGraph id) of each LangGraph ancestor of a checkpoint, parent first, read a
    page at a time. Ends at the root, at a parent the thread no longer holds (pruned), or at a
    checkpoint seen already (a loop, which only a forged parent makes)."""
    seen, anchor, skip = {lg_id}, lg_id, 1  # the first page starts with the checkpoint itself
    while anchor:
        with connection.cursor() as cursor:
            cursor.execute(_ANCESTORS_SQL, {"thread": thread.pk, "lg_id": anchor, "depth": ANCESTORS_PAGE})
            page = cursor.fetchall()
        for row, ancestor, _ in page[skip:]:
            if ancestor in seen:
                return
            seen.add(ancestor)
            yield row, ancestor
        if len(page) <= ANCESTORS_PAGE:
            return
        anchor, skip = page[-1][2], 0


def jsonb(value: Any) -> Any:
    """A jsonb column read through Django's connection, which loads jsonb as text."""
    return codec.loads(value) if isinstance(value, str | bytes) else value


def row_of(thread: Thread, lg_id: str) -> UUID | None:
    """The id of the thread's row of a LangGraph checkpoint id, if it has one."""
    # No ORDER BY: the (thread, LangGraph id) index finds the row, an ordering would only cost.
    return next(iter(with_lg_id(thread, lg_id).order_by().values_list("id", flat=True)[:1]), None)
