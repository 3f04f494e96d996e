"""Rewriting a thread's checkpoint chain in place (compaction): the engine's second way in for the
integrity chain, beside the append, so that only the engine computes and stores MACs.

The caller (`checkpoints.retention`) decides which checkpoints stay and how each is stored from
now on (its parent, snapshot or delta, payload and chain sizes); this module chains each kept
row's MAC from its new parent's, writes the rows, deletes the others and the thread's materialised
heads, and drops this process's cached states of the thread. Another process's in-memory cache
may still hold an old row; an append after it fails its parent-MAC check and retries from the
stored row (see `append`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from uuid import UUID

from django.db import connection

from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import codec
from checkpoints.storage.nodes import drop_thread
from checkpoints.storage.payloads import mac_fields
from checkpoints.storage.threads import keep_checkpoint_events

# (parent_id, kind, payload, chain_length, chain_bytes, integrity, id, thread_id) of a rewritten row.
_Update = tuple[UUID | None, int, bytes, int, int, bytes, UUID, UUID]


@dataclass(frozen=True, slots=True)
class Relinked:
    """How one kept checkpoint is stored from now on; its recorded fields do not change."""

    row: Checkpoint  # as stored now
    parent_id: UUID | None
    kind: int
    payload: bytes  # as stored: the row's own, or one from encode_payload
    chain_length: int
    chain_bytes: int


def rewrite_chain(
    *, thread: Thread, kept: Sequence[Relinked], removed: Collection[UUID], dry_run: bool = False
) -> list[UUID]:
    """Store `kept` (every parent before its children) and delete `removed`, in the caller's
    transaction, which holds the thread's row lock. Returns the ids whose rows change: the kept
    ones whose MAC, chain or payload is new, and the removed ones. `dry_run` writes nothing."""
    macs: dict[UUID, bytes] = {}
    updates: list[_Update] = []
    for relinked in kept:
        row = relinked.row
        macs[row.pk] = codec.integrity_mac(
            parent_integrity=macs[relinked.parent_id] if relinked.parent_id is not None else None,
            checkpoint_id=row.pk, thread_id=row.thread_id, branch_id=row.branch_id, parent_id=relinked.parent_id,
            seq=row.seq, kind=relinked.kind, payload=relinked.payload, fields=mac_fields(row),
            created_at=row.created_at,
        )  # fmt: skip
        now = (relinked.parent_id, relinked.kind, relinked.payload, relinked.chain_length, relinked.chain_bytes)
        stored = (row.parent_id, row.kind, bytes(row.payload), row.chain_length, row.chain_bytes)
        if now != stored or macs[row.pk] != bytes(row.integrity):
            updates.append((*now, macs[row.pk], row.pk, thread.pk))
    changed = [update[6] for update in updates] + list(removed)
    if dry_run:
        return changed
    _write(thread, updates=updates, removed=list(removed))
    drop_thread(thread.pk)
    return changed


def _write(thread: Thread, *, updates: list[_Update], removed: list[UUID]) -> None:
    with connection.cursor() as cursor:
        # FOR UPDATE, the one row lock an append's check of its parent's MAC (FOR KEY SHARE) waits
        # for: an append after one of these rows then chains from the rewritten row, not the old.
        cursor.execute(
            "SELECT 1 FROM checkpoints_checkpoint WHERE thread_id = %s AND id = ANY(%s) ORDER BY id FOR UPDATE",
            [thread.pk, [update[6] for update in updates]],
        )
        # A checkpoint's event refers to its row for what it says: it keeps that before the row changes.
        keep_checkpoint_events(thread_id=thread.pk, checkpoint_ids=[update[6] for update in updates] + removed)
        if updates:
            cursor.executemany(
                "UPDATE checkpoints_checkpoint SET parent_id = %s, kind = %s, payload = %s, chain_length = %s, "
                "chain_bytes = %s, integrity = %s WHERE id = %s AND thread_id = %s",
                updates,
            )
        cursor.execute(
            "UPDATE checkpoints_toolresult SET checkpoint_id = NULL WHERE thread_id = %s AND checkpoint_id = ANY(%s)",
            [thread.pk, removed],
        )
        cursor.execute("DELETE FROM checkpoints_checkpoint WHERE thread_id = %s AND id = ANY(%s)", [thread.pk, removed])
        # Materialised heads of the old rows go too: their MACs cover rows that changed.
        cursor.execute(
            "DELETE FROM checkpoints_materialisedhead WHERE branch_id IN "
            "(SELECT id FROM checkpoints_branch WHERE thread_id = %s)",
            [thread.pk],
        )
        # Check the deferred foreign keys now, inside this block, rather than at some later commit.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
