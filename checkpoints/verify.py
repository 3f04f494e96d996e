"""Walks stored checkpoints and recomputes their integrity MACs, without materialising states."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from uuid import UUID

from checkpoints import codec
from checkpoints.models import Checkpoint, Thread
from checkpoints.store import decode_payload, mac_fields


@dataclass(frozen=True)
class Problem:
    thread_id: UUID
    checkpoint_id: UUID
    seq: int
    branch: str
    reason: str


def verify_thread(thread: Thread) -> Iterator[Problem]:
    """Yield every checkpoint of `thread` whose MAC does not match its row and its parent's MAC."""
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
            yield Problem(thread.pk, row.id, row.seq, row.branch.name, "row does not match its integrity MAC")
            continue
        try:
            decode_payload(row)
        except ValueError as exc:
            yield Problem(thread.pk, row.id, row.seq, row.branch.name, f"payload does not decode: {exc}")


def mac_matches(row: Checkpoint, *, parent_integrity: bytes | None) -> bool:
    """Whether a stored row still matches its integrity MAC, chained from its parent's MAC."""
    expected = codec.integrity_mac(
        parent_integrity=parent_integrity, checkpoint_id=row.id, thread_id=row.thread_id, branch_id=row.branch_id,
        parent_id=row.parent_id, seq=row.seq, kind=row.kind, payload=bytes(row.payload), fields=mac_fields(row),
    )  # fmt: skip
    return expected == bytes(row.integrity)
