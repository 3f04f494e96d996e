"""Walks stored checkpoints and recomputes their integrity MACs, without materialising states."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from uuid import UUID

from django.db import connection

from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import codec, crypto
from checkpoints.storage.errors import StoreError
from checkpoints.storage.payloads import decode_payload, mac_fields


@dataclass(frozen=True)
class Problem:
    """One failed check: of a checkpoint, or (`checkpoint_id` None) of the thread as a whole."""

    thread_id: UUID
    reason: str
    checkpoint_id: UUID | None = None
    seq: int | None = None
    branch: str | None = None


def verify_thread(thread: Thread) -> Iterator[Problem]:
    """Yield every checkpoint of `thread` whose MAC does not match its row and its parent's MAC,
    or whose payload does not open; and the thread itself when its data key does not unwrap."""
    try:
        crypto.data_key(thread.pk)
    except crypto.DecryptionFailure as exc:
        # No payload of the thread opens, but every MAC can still be checked without the key.
        yield Problem(thread.pk, f"its data key is unreadable: {exc.message}")
        key_opens = False
    else:
        key_opens = True
    macs: dict[UUID, bytes] = {}
    rows = (
        Checkpoint.objects.filter(thread=thread)
        .select_related("branch")
        .order_by("created_at", "id")
        .iterator(chunk_size=500)
    )
    for row in rows:
        parent_mac = None
        if row.parent_id is not None:
            parent_mac = macs.get(row.parent_id)
            if parent_mac is None:
                parent_mac = bytes(Checkpoint.objects.values_list("integrity", flat=True).get(pk=row.parent_id))
        macs[row.id] = bytes(row.integrity)
        if not mac_matches(row, parent_integrity=parent_mac):
            yield _row_problem(row, "row does not match its integrity MAC")
            continue
        if not key_opens:
            continue
        try:
            decode_payload(row)
        except (ValueError, OSError, StoreError) as exc:
            yield _row_problem(row, f"payload does not decode: {exc}")
    moved = moved_head(thread.pk)
    if moved is not None:
        yield Problem(thread.pk, moved)


# The thread's head pointer and the newest checkpoint of its active branch in one statement, so
# one snapshot: an append moves both in one statement too, and never lets them disagree.
_HEADS_SQL = """
SELECT t.head_id, h.id, h.seq, b.name
FROM checkpoints_thread t
JOIN checkpoints_branch b ON b.id = t.active_branch_id
CROSS JOIN LATERAL (
    SELECT c.id, c.seq FROM checkpoints_checkpoint c
    WHERE c.thread_id = t.id AND c.branch_id = t.active_branch_id ORDER BY c.seq DESC LIMIT 1
) h
WHERE t.id = %s
"""


def moved_head(thread_id: UUID) -> str | None:
    """Why the thread's head pointer is not the newest checkpoint of its active branch (it was
    moved outside Quicksave: the store only ever moves it to a new checkpoint of that branch),
    or None when it is."""
    with connection.cursor() as cursor:
        cursor.execute(_HEADS_SQL, [thread_id])
        found = cursor.fetchone()
    if found is None or found[0] == found[1]:  # an empty active branch has no head to move
        return None
    head_id, newest_id, newest_seq, branch = found
    return (
        f"its head points to checkpoint {head_id}, but the newest checkpoint of its active branch '{branch}' "
        f"is {newest_id} (seq {newest_seq}): the head pointer was moved outside Quicksave"
    )


def _row_problem(row: Checkpoint, reason: str) -> Problem:
    return Problem(row.thread_id, reason, checkpoint_id=row.id, seq=row.seq, branch=row.branch.name)


def mac_matches(row: Checkpoint, *, parent_integrity: bytes | None) -> bool:
    """Whether a stored row still matches its integrity MAC, chained from its parent's MAC."""
    return codec.integrity_matches(
        bytes(row.integrity), parent_integrity=parent_integrity, checkpoint_id=row.id, thread_id=row.thread_id,
        branch_id=row.branch_id, parent_id=row.parent_id, seq=row.seq, kind=row.kind, payload=bytes(row.payload),
        fields=mac_fields(row), created_at=row.created_at,
    )  # fmt: skip
