"""Reading ADK sessions back from their threads: the session's head, its scopes' heads and its
newest events in one statement, and each event from its own checkpoint row (no replay).

A session's events are the checkpoints of its branch that carry `adk_event` in their metadata,
back to the branch's fork point, then the fork point's branch, and so on. Every row read has its
MAC checked against its parent's, as the storage engine's own reader does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import OuterRef, Subquery
from google.adk.events.event import Event

from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, PayloadKind
from checkpoints.storage import IntegrityFailure, codec

COLUMNS = tuple(field.attname for field in Checkpoint._meta.concrete_fields)
EVENT = 10  # where an event's columns begin in a row of SESSION_SQL

# The session's thread and head, its scopes' heads, and its newest events with their parents' MACs.
# LIMIT NULL is no limit; with no event the LATERAL join still yields the one row of the thread.
SESSION_SQL = f"""
SELECT t.id, t.agent_id, t.status, h.id, h.step, h.metadata, h.created_at, b.fork_point_id,
       (SELECT s.head_id FROM checkpoints_thread s WHERE s.agent_id = t.agent_id AND s.external_id = %(app_scope)s),
       (SELECT s.head_id FROM checkpoints_thread s WHERE s.agent_id = t.agent_id AND s.external_id = %(user_scope)s),
       e.*
FROM checkpoints_thread t
JOIN agents_agent a ON a.id = t.agent_id
JOIN checkpoints_checkpoint h ON h.id = t.head_id
JOIN checkpoints_branch b ON b.id = h.branch_id
LEFT JOIN LATERAL (
    SELECT {", ".join(f"c.{name}" for name in COLUMNS)}, p.integrity AS parent_integrity
    FROM checkpoints_checkpoint c
    LEFT JOIN checkpoints_checkpoint p ON p.id = c.parent_id
    WHERE c.thread_id = t.id AND c.branch_id = h.branch_id AND c.seq <= h.seq AND c.metadata ? 'adk_event'
      AND (%(after)s::float8 IS NULL OR (c.metadata ->> 'ts')::float8 >= %(after)s::float8)
    ORDER BY c.seq DESC
    LIMIT %(limit)s
) e ON TRUE
WHERE a.name = %(app)s AND t.external_id = %(key)s
ORDER BY e.seq DESC
"""


@dataclass(frozen=True)
class StoredSession:
    """What one read of a session finds: its thread and head, its scopes' heads and its newest events."""

    thread_id: UUID
    agent_id: int
    status: str
    head_id: UUID
    head_step: int
    head_metadata: dict[str, Any]
    head_created_at: datetime
    app_head: UUID | None
    user_head: UUID | None
    events: list[Event]  # oldest first

    @property
    def updated_at(self) -> float:
        ts = self.head_metadata.get("ts")
        return float(ts) if isinstance(ts, (int, float)) else self.head_created_at.timestamp()


def read_session(
    *, app_name: str, key: str, app_scope: str, user_scope: str, limit: int | None, after: float | None
) -> StoredSession | None:
    """The session whose thread has external id `key`, with at most `limit` newest events (all when
    None) from `after` on; None when there is no such session."""
    params = {"app": app_name, "key": key, "app_scope": app_scope, "user_scope": user_scope,
              "limit": limit, "after": after}  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(SESSION_SQL, params)
        rows = cursor.fetchall()
    if not rows:
        return None
    thread_id, agent_id, status, head_id, step, metadata, created_at, fork, app_head, user_head = rows[0][:EVENT]
    newest = []
    for row in rows:
        if row[EVENT] is None:  # the thread's row when it has no event
            continue
        checkpoint = Checkpoint(**dict(zip(COLUMNS, row[EVENT:-1], strict=True)))
        checkpoint.metadata = _json(checkpoint.metadata)
        verify(checkpoint, parent_integrity=row[-1])
        newest.append(Event.model_validate(event_of(checkpoint)))
    left = None if limit is None else limit - len(newest)
    if fork is not None and (left is None or left > 0):
        # The session began on another branch: its older events are on the path to the fork point.
        fork_branch, fork_seq = Checkpoint.objects.filter(pk=fork).values_list("branch_id", "seq").get()
        newest += recent_events(thread_id=thread_id, branch_id=fork_branch, top=fork_seq, limit=left, after=after)
    return StoredSession(
        thread_id=thread_id, agent_id=agent_id, status=status, head_id=head_id, head_step=step or 0,
        head_metadata=_json(metadata), head_created_at=created_at, app_head=app_head, user_head=user_head,
        events=newest[::-1],
    )  # fmt: skip


def recent_events(
    *, thread_id: UUID, branch_id: int, top: int, limit: int | None, after: float | None
) -> Iterator[Event]:
    """The events on the path to checkpoint `top` of `branch_id`, newest first, back through fork points."""
    left = limit
    parent_mac = Checkpoint.objects.filter(pk=OuterRef("parent_id")).order_by().values("integrity")
    while left is None or left > 0:
        rows = (
            Checkpoint.objects.filter(thread_id=thread_id, branch_id=branch_id, seq__lte=top,
                                      metadata__has_key="adk_event")
            .annotate(parent_integrity=Subquery(parent_mac))
            .order_by("-seq")
        )  # fmt: skip
        if after is not None:
            rows = rows.filter(metadata__ts__gte=after)
        for row in rows[:left] if left is not None else rows.iterator(chunk_size=500):
            verify(row, parent_integrity=row.parent_integrity)
            yield Event.model_validate(event_of(row))
            if left is not None:
                left -= 1
        if left == 0:
            return
        fork = Branch.objects.filter(pk=branch_id).values_list("fork_point_id", flat=True).first()
        if fork is None:
            return
        branch_id, top = Checkpoint.objects.filter(pk=fork).values_list("branch_id", "seq").get()


def verify(row: Checkpoint, *, parent_integrity: Any) -> None:
    """Refuse a row whose MAC does not match its fields, its payload and its parent's MAC."""
    parent = bytes(parent_integrity) if parent_integrity is not None else None
    if not storage.mac_matches(row, parent_integrity=parent):
        raise IntegrityFailure(f"Checkpoint {row.id} fails its integrity check: it was altered outside Quicksave.",
                               detail={"checkpoint": str(row.id)})  # fmt: skip


def event_of(row: Checkpoint) -> Any:
    """The event a checkpoint appended, read from its own payload (no replay)."""
    payload = storage.decode_payload(row)
    if row.kind == PayloadKind.SNAPSHOT:
        return payload["event"]
    return next(op["value"] for op in payload if op.get("path") == "/event")


def _json(value: Any) -> dict[str, Any]:
    """A jsonb column as a raw cursor returns it: parsed already, or as text."""
    parsed = codec.loads(value) if isinstance(value, (str, bytes)) else value
    return parsed if isinstance(parsed, dict) else {}
