"""Threads and branches: creating, naming, deleting them, and the thread's event log.

A checkpoint's `checkpoint.created` event is the checkpoint's row: the append numbers it
(`Checkpoint.event_seq`) from the thread's counter in its one statement, and everything the event
says is the row's own (its id, parent, branch, seq, step, label and status). `events_after` reads
those rows and the `Event` table merged by seq. Before compaction rewrites or deletes a checkpoint
row, `keep_checkpoint_events` writes its event into the `Event` table with what the row says, so
the event goes on saying what happened. (Checkpoints written before their rows were their events
have `Event` rows holding only their id, read back with the row's fields the same way.)
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction

from checkpoints import live
from checkpoints.models import (
    Branch,
    Checkpoint,
    CheckpointStatus,
    DeletedThread,
    Event,
    Thread,
)
from checkpoints.storage import cursors, keys
from checkpoints.storage.branches import MAIN_BRANCH, forget_thread
from checkpoints.storage.errors import (
    InvalidState,
    NotFound,
)
from checkpoints.storage.nodes import drop_thread
from checkpoints.storage.validation import checked_object
from quicksave_agents.models import Agent


def create_thread(
    *,
    agent: Agent,
    external_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    started_by: User | None = None,
) -> tuple[Thread, bool]:
    """Create a thread with its `main` branch, or return the agent's thread with `external_id`.
    `started_by` is the person it runs for (approval policies may keep them from approving it).

    Returns (thread, created).
    """
    metadata = checked_object(metadata or {}, field="metadata")
    if external_id is not None:
        existing = Thread.objects.filter(agent=agent, external_id=external_id).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            thread = Thread.objects.create(agent=agent, external_id=external_id, metadata=metadata,
                                           started_by=started_by)  # fmt: skip
            keys.create_thread_key(thread.pk)
            branch = Branch.objects.create(thread=thread, name=MAIN_BRANCH)
            thread.active_branch = branch
            thread.save(update_fields=["active_branch"])
            record_event(thread=thread, type="thread.created", data={"agent": agent.name, "status": thread.status})
    except IntegrityError:
        # Another request created the same (agent, external_id) first: theirs wins.
        existing = Thread.objects.filter(agent=agent, external_id=external_id).first()
        if existing is None:
            raise
        return existing, False
    return thread, True


def record_event(*, thread: Thread | UUID, type: str, data: dict[str, Any]) -> Event:
    """Append an event to the thread's log; call it inside the transaction making the change."""
    thread_id = thread.pk if isinstance(thread, Thread) else thread
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE checkpoints_thread SET event_seq = event_seq + 1, updated_at = now() "
            "WHERE id = %s RETURNING event_seq",
            [thread_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"Thread {thread_id} does not exist.")
    event = Event.objects.create(thread_id=thread_id, seq=row[0], type=type, data=data)
    live.publish_on_commit(thread_id=thread_id, seq=event.seq, type=type, data=data, agent=data.get("agent"))
    return event


def checkpoint_event(
    *, checkpoint_id: UUID, parent_id: UUID | None, branch: str, seq: int, step: int | None, label: str, status: str
) -> dict[str, Any]:
    """The data of a checkpoint's `checkpoint.created` event, as published and replayed."""
    return {
        "checkpoint": str(checkpoint_id), "parent": str(parent_id) if parent_id else None, "branch": branch,
        "seq": seq, "step": step, "label": label, "status": status,
    }  # fmt: skip


# An `Event` row of a checkpoint that holds only its id (written before checkpoint rows were their
# own events) is read with the row's fields; one stored whole (kept by compaction) as stored.
_IS_REFERENCE = "e.type = 'checkpoint.created' AND NOT e.data ? 'seq'"
_CHECKPOINT_FIELDS = "c.id, c.parent_id, b.name, c.seq, c.step, c.label, c.status"
# Each part reads at most `limit` rows through its index ((thread, seq) and (thread, event_seq)).
_EVENTS_SQL = f"""
(SELECT e.seq, e.type, e.data, {_CHECKPOINT_FIELDS}
FROM checkpoints_event e
LEFT JOIN checkpoints_checkpoint c
    ON c.id = CASE WHEN {_IS_REFERENCE} THEN (e.data ->> 'checkpoint')::uuid END AND c.thread_id = e.thread_id
LEFT JOIN checkpoints_branch b ON b.id = c.branch_id
WHERE e.thread_id = %(thread)s AND e.seq > %(seq)s
ORDER BY e.seq
LIMIT %(limit)s)
UNION ALL
(SELECT c.event_seq, 'checkpoint.created', NULL, {_CHECKPOINT_FIELDS}
FROM checkpoints_checkpoint c
JOIN checkpoints_branch b ON b.id = c.branch_id
WHERE c.thread_id = %(thread)s AND c.event_seq > %(seq)s
ORDER BY c.event_seq
LIMIT %(limit)s)
ORDER BY 1
LIMIT %(limit)s
"""


def events_after(*, thread_id: UUID | str, seq: int, limit: int) -> list[tuple[int, str, dict[str, Any]]]:
    """The thread's events after `seq`, oldest first, at most `limit` of them: (seq, type, data),
    with each checkpoint's event data as it was published."""
    with cursors.cursor(json=True) as cursor:
        cursor.execute(_EVENTS_SQL, {"thread": thread_id, "seq": seq, "limit": limit})
        rows = cursor.fetchall()
    return [
        (row[0], row[1], row[2] if row[3] is None else checkpoint_event(
            checkpoint_id=row[3], parent_id=row[4], branch=row[5], seq=row[6], step=row[7], label=row[8],
            status=row[9],
        ))
        for row in rows
    ]  # fmt: skip


# The events of checkpoints about to change move to the `Event` table whole, with the seq, type
# and time they were published with; rows that stay stop being events themselves.
_KEEP_SQL = f"""
WITH moved AS (
    INSERT INTO checkpoints_event (thread_id, seq, type, data, created_at)
    SELECT c.thread_id, c.event_seq, 'checkpoint.created', jsonb_build_object(
        'checkpoint', c.id::text, 'parent', c.parent_id::text, 'branch', b.name, 'seq', c.seq, 'step', c.step,
        'label', c.label, 'status', c.status), c.created_at
    FROM checkpoints_checkpoint c JOIN checkpoints_branch b ON b.id = c.branch_id
    WHERE c.thread_id = %(thread)s AND c.id = ANY(%(ids)s) AND c.event_seq IS NOT NULL
    RETURNING seq
), referenced AS (
    UPDATE checkpoints_event e SET data = jsonb_build_object(
        'checkpoint', c.id::text, 'parent', c.parent_id::text, 'branch', b.name, 'seq', c.seq, 'step', c.step,
        'label', c.label, 'status', c.status)
    FROM checkpoints_checkpoint c JOIN checkpoints_branch b ON b.id = c.branch_id
    WHERE e.thread_id = %(thread)s AND {_IS_REFERENCE} AND e.data ->> 'checkpoint' = c.id::text
        AND c.thread_id = %(thread)s AND c.id = ANY(%(ids)s)
)
UPDATE checkpoints_checkpoint SET event_seq = NULL
WHERE thread_id = %(thread)s AND event_seq IN (SELECT seq FROM moved)
"""


def keep_checkpoint_events(*, thread_id: UUID, checkpoint_ids: list[UUID]) -> None:
    """Store the events of checkpoints whose rows are about to be rewritten or deleted (compaction)
    whole in the `Event` table, so that they replay as they were published."""
    if checkpoint_ids:
        with connection.cursor() as cursor:
            cursor.execute(_KEEP_SQL, {"thread": thread_id, "ids": checkpoint_ids})


def set_thread_status(*, thread: Thread | UUID, status: str) -> None:
    """Set a thread's status without a checkpoint (a LangGraph graph that ran to its end),
    with a `thread.updated` event in the same transaction."""
    if status not in CheckpointStatus.values:
        raise InvalidState(f"`status` must be one of {', '.join(CheckpointStatus.values)}.", detail={"field": "status"})
    thread_id = thread.pk if isinstance(thread, Thread) else thread
    with transaction.atomic():
        # A cancellation stands: an agent finishing afterwards does not undo it.
        if Thread.objects.filter(pk=thread_id).exclude(status=CheckpointStatus.CANCELLED).update(status=status):
            record_event(thread=thread_id, type="thread.updated", data={"status": status})


def start_branch(*, thread: Thread, at: Checkpoint | UUID, name: str) -> Branch:
    """Open a new, empty branch whose first checkpoint will follow `at`."""
    at_id = at.pk if isinstance(at, Checkpoint) else at
    if not Checkpoint.objects.filter(pk=at_id, thread=thread).exists():
        raise NotFound(f"Checkpoint {at_id} is not in thread {thread.pk}.", detail={"field": "at"})
    if not name or len(name) > 100:
        raise InvalidState("A branch name must be 1 to 100 characters.", detail={"field": "name"})
    try:
        with transaction.atomic():
            branch = Branch.objects.create(thread=thread, name=name, fork_point_id=at_id)
            record_event(thread=thread, type="branch.created", data={"branch": name, "fork_point": str(at_id)})
    except IntegrityError:
        raise InvalidState(
            f"Thread {thread.pk} already has a branch named '{name}'.", detail={"field": "name"}
        ) from None
    return branch


def delete_thread(thread: Thread) -> None:
    """Delete a thread with everything in it, and destroy its data key (crypto-shredding):
    any copy of its rows left elsewhere, a backup included, can no longer be decrypted."""
    with transaction.atomic():
        # The checkpoint tree and the branches' fork points protect their rows one by one;
        # the whole thread goes, so unlink them first and let the cascade do the rest.
        Thread.objects.filter(pk=thread.pk).update(active_branch=None, head=None)
        Branch.objects.filter(thread=thread).update(fork_point=None)
        Checkpoint.objects.filter(thread=thread).update(parent=None)
        keys.shred(thread.pk)
        Thread.objects.filter(pk=thread.pk).delete()
        DeletedThread.objects.get_or_create(thread_id=thread.pk)  # its blob files go at the next prune
    forget_thread(thread.pk)
    drop_thread(thread.pk)
