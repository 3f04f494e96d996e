"""Reads that the API and the dashboard share."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.db import connection
from django.db.models import Count, Q, QuerySet

from checkpoints.models import Branch, Checkpoint, Thread, ThreadStatus
from quicksave.jsontext import UnstorableText, loads_strict, unstorable_character

if TYPE_CHECKING:
    from approvals.models import ApprovalRequest

log = logging.getLogger(__name__)

SUMMARY_DEFER = ("payload", "integrity")
# A failure reason longer than this is cut on the page (the head checkpoint's metadata has it whole).
FAILURE_CHARS = 500


@dataclass(frozen=True)
class Attention:
    """What a person looking at a thread should act on: the approval it waits for, or why it failed."""

    approval: ApprovalRequest | None = None
    failure: str | None = None


def attention(thread: Thread, *, failure: bool = True) -> Attention:
    """The thread's pending approval (a thread waits on one at a time), or, for a failed thread and
    unless `failure` is False, the error its head checkpoint recorded (`metadata.error`; "" when it
    recorded none)."""
    from approvals.models import ApprovalStatus

    waiting = thread.approvals.filter(status=ApprovalStatus.PENDING)
    approval = waiting.only("id", "action", "message", "created_at", "checkpoint")
    if (pending := approval.first()) is not None:
        return Attention(approval=pending)
    if not failure or thread.status != ThreadStatus.FAILED or thread.head_id is None:
        return Attention()
    metadata = Checkpoint.objects.filter(pk=thread.head_id).values_list("metadata", flat=True).first() or {}
    error = metadata.get("error")
    return Attention(failure=str(error)[:FAILURE_CHARS] if error is not None else "")


def timeline(*, thread: Thread, branch: Branch, after_seq: int = 0, limit: int = 100) -> list[Checkpoint]:
    """Checkpoint summaries of one branch, oldest first, from `after_seq` (no state loaded)."""
    return list(
        Checkpoint.objects.filter(thread=thread, branch=branch, seq__gt=after_seq)
        .defer(*SUMMARY_DEFER)
        .order_by("seq")[:limit]
    )


def branch_heads(thread: Thread) -> dict[int, tuple[Any, int]]:
    """{branch id: (head checkpoint id, head seq)} for every non-empty branch of a thread."""
    # One index probe per branch (the newest seq), however long the branches are.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT b.id, h.id, h.seq FROM checkpoints_branch b CROSS JOIN LATERAL ("
            "  SELECT c.id, c.seq FROM checkpoints_checkpoint c"
            "  WHERE c.thread_id = b.thread_id AND c.branch_id = b.id ORDER BY c.seq DESC LIMIT 1"
            ") h WHERE b.thread_id = %s",
            [thread.pk],
        )
        return {branch_id: (checkpoint_id, seq) for branch_id, checkpoint_id, seq in cursor.fetchall()}


def correct_head(thread: Thread, heads: dict[int, tuple[Any, int]]) -> None:
    """Point `thread` (in memory) at the newest checkpoint of its active branch, as `heads` (from
    branch_heads) has it, should its stored head pointer say otherwise: the store only ever moves
    the pointer to a new checkpoint of the active branch, so a pointer elsewhere was moved
    outside Quicksave (verify_integrity reports it), and a reader must not be rolled back with it."""
    newest = heads.get(thread.active_branch_id) if thread.active_branch_id is not None else None
    if newest is None or newest[0] == thread.head_id:
        return
    log.warning("thread %s: head pointer %s is not its active branch's newest checkpoint %s; serving that",
                thread.pk, thread.head_id, newest[0])  # fmt: skip
    head = Checkpoint.objects.defer(*SUMMARY_DEFER).get(pk=newest[0])
    thread.head, thread.step = head, head.step


def filter_threads(
    threads: QuerySet[Thread],
    *,
    agent: str | None = None,
    status: str | None = None,
    step: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    metadata: list[dict[str, Any]] | None = None,
) -> QuerySet[Thread]:
    if agent:
        threads = threads.filter(agent__name=agent)
    if status:
        threads = threads.filter(status=status)
    if step is not None:
        threads = threads.filter(step=step)
    if since:
        threads = threads.filter(updated_at__gte=since)
    if until:
        threads = threads.filter(updated_at__lt=until)
    for contained in metadata or []:
        threads = threads.filter(metadata__contains=contained)
    return threads


def parse_metadata_query(raw: str) -> dict[str, Any]:
    """`q` is either a JSON object (containment) or `key:value` (value read as JSON when it parses,
    as text otherwise: `k:NaN` looks for the string "NaN").

    Raises ValueError naming what `q` must be; that includes holding nothing PostgreSQL's jsonb
    cannot (a NUL character, a lone surrogate), which would fail the query.
    """
    raw = raw.strip()
    if raw.startswith("{"):
        try:
            value = loads_strict(raw)
        except ValueError:
            raise ValueError("a JSON object (no NaN or Infinity, no NUL character or lone surrogate)") from None
        if not isinstance(value, dict):
            raise ValueError("a JSON object")
        return value
    key, sep, text = raw.partition(":")
    if not sep or not key:
        raise ValueError("`key:value` or a JSON object")
    try:
        parsed: Any = loads_strict(text)
    except UnstorableText:
        raise ValueError(_STORABLE_TEXT) from None
    except ValueError:
        parsed = text
    query = {key.strip(): parsed}
    if unstorable_character(query) is not None:  # in the key, or in text that is not JSON
        raise ValueError(_STORABLE_TEXT)
    return query


_STORABLE_TEXT = "text without a NUL character or lone surrogate"


THREAD_SORTS: dict[str, tuple[str, str]] = {
    # key: (field, direction); ties are broken by id in the same direction.
    "-updated": ("updated_at", "desc"),
    "updated": ("updated_at", "asc"),
    "-created": ("created_at", "desc"),
    "created": ("created_at", "asc"),
}


def status_counts(threads: QuerySet[Thread]) -> dict[str, int]:
    """How many of these threads are in each status (one GROUP BY)."""
    rows = threads.order_by().values_list("status").annotate(n=Count("id"))
    return {status: n for status, n in rows}


def thread_page(
    threads: QuerySet[Thread], *, sort: str, after: tuple[datetime, UUID | str] | None, size: int
) -> tuple[list[Thread], tuple[datetime, str] | None]:
    """One page of threads in `sort` order after the keyset position `after`, and the next position.

    Keyset pagination on (sort field, id): a page deep in thousands of threads costs
    the same as the first.
    """
    field, direction = THREAD_SORTS[sort]
    if after is not None:
        value, last_id = after
        before_or_after = "lt" if direction == "desc" else "gt"
        threads = threads.filter(
            Q(**{f"{field}__{before_or_after}": value}) | Q(**{field: value, f"id__{before_or_after}": last_id})
        )
    prefix = "-" if direction == "desc" else ""
    rows = list(threads.order_by(f"{prefix}{field}", f"{prefix}id")[: size + 1])
    if len(rows) <= size:
        return rows, None
    rows = rows[:size]
    return rows, (getattr(rows[-1], field), str(rows[-1].pk))


@dataclass(frozen=True)
class EnvironmentStop:
    """A resume from a fork of a checkpoint that stopped because the world had changed."""

    checkpoint: Checkpoint  # the failed checkpoint the stop wrote
    changes: list[str]


def environment_of(checkpoint: Checkpoint) -> list[dict[str, str]]:
    """The environment references a checkpoint recorded (`metadata.environment`, checked when
    written; a row from before that check shows only well-formed ones)."""
    references = checkpoint.metadata.get("environment") if isinstance(checkpoint.metadata, dict) else None
    if not isinstance(references, list):
        return []
    return [r for r in references if isinstance(r, dict) and all(isinstance(r.get(k), str) for k in _REFERENCE_KEYS)]


_REFERENCE_KEYS = ("kind", "locator", "digest")


def environment_stop(checkpoint: Checkpoint) -> EnvironmentStop | None:
    """The latest resume from a fork of `checkpoint` that the environment check stopped, if any
    (no query for a checkpoint that recorded no environment: nothing could have stopped)."""
    if not environment_of(checkpoint):
        return None
    stopped = (
        Checkpoint.objects.defer(*SUMMARY_DEFER)
        .filter(
            thread_id=checkpoint.thread_id,
            metadata__has_key="environment_mismatch",
            parent__metadata__forked_from=str(checkpoint.pk),
        )
        .order_by("-created_at")
        .first()
    )
    if stopped is None:
        return None
    changes = stopped.metadata.get("environment_mismatch")
    return EnvironmentStop(stopped, [str(c) for c in changes] if isinstance(changes, list) else [])
