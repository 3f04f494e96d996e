"""A checkpoint's payload as stored: canonical JSON with large values offloaded, framed,
sealed under the thread's data key and covered by the row's integrity MAC."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from checkpoints.fields import associated_data
from checkpoints.models import (
    Checkpoint,
)
from checkpoints.storage import blobs, chunks, codec, crypto
from checkpoints.storage.errors import (
    IntegrityFailure,
)


class Row(NamedTuple):
    """The columns a replay reads: enough to verify a row's MAC and apply its payload."""

    id: UUID
    thread_id: UUID
    branch_id: int
    parent_id: UUID | None
    seq: int
    step: int | None
    label: str
    status: str
    source: str
    model_name: str
    model_version: str
    temperature: float | None
    top_p: float | None
    seed: int | None
    metadata: dict[str, Any]
    schema_version: int
    kind: int
    payload: bytes
    chain_length: int
    chain_bytes: int
    state_bytes: int
    integrity: bytes
    created_at: datetime
    parent_integrity: bytes | None


def mac_fields(checkpoint: Checkpoint | Row) -> dict[str, Any]:
    """The recorded fields an integrity MAC covers, read back from a stored row."""
    return {
        "step": checkpoint.step, "label": checkpoint.label, "status": checkpoint.status,
        "source": checkpoint.source, "schema_version": checkpoint.schema_version, "metadata": checkpoint.metadata,
        "model_name": checkpoint.model_name, "model_version": checkpoint.model_version,
        "temperature": checkpoint.temperature, "top_p": checkpoint.top_p, "seed": checkpoint.seed,
        "state_bytes": checkpoint.state_bytes,
    }  # fmt: skip


def payload_ad(checkpoint_id: UUID) -> bytes:
    """What a checkpoint's sealed payload is bound to: its table, column and row."""
    return associated_data("checkpoints_checkpoint.payload", checkpoint_id)


def encode_payload(*, thread_id: UUID, checkpoint_id: UUID, value: Any) -> bytes:
    """A payload as stored: `value` (a full state or RFC 6902 ops) as canonical JSON with its
    large values offloaded to blob storage, framed (zstd when it pays) and sealed under the
    thread's data key, bound to the checkpoint's row.

    The inverse of decode_payload; the store's writes and compaction both go through it.
    """
    canonical = codec.to_canonical_bytes(value)
    if len(canonical) > blobs.limit():
        canonical = offloaded(thread_id, value, canonical)
    return seal_payload(thread_id, checkpoint_id, canonical)


def offloaded(thread_id: UUID, value: Any, canonical: bytes) -> bytes:
    """`canonical` again with every value above QUICKSAVE_OFFLOAD_BYTES moved to blob storage."""
    stored, refs = blobs.offload(thread_id, value)
    return codec.to_canonical_bytes(stored) if refs else canonical


def seal_payload(thread_id: UUID, checkpoint_id: UUID, canonical: bytes, *, snapshot: bool = False) -> bytes:
    """`canonical` framed and sealed to its row; a large `snapshot` in chunks it shares with the
    thread's other snapshots (chunks.py), stored before the row that will name them."""
    framed = chunks.frame(thread_id, canonical) if snapshot else codec.encode(canonical)
    return crypto.seal(thread_id, lambda: payload_ad(checkpoint_id), framed)


def decode_payload(row: Checkpoint | Row, *, restore: bool = True) -> Any:
    """A stored row's payload as JSON: its full state (snapshot) or its RFC 6902 ops (delta).

    The one place a payload is opened (decrypted, decompressed, parsed, its offloaded values
    read back unless `restore` is False); callers check the row's MAC first (see verify.py),
    which covers the stored, sealed bytes and so the references to offloaded values.
    """
    return open_payload(row.thread_id, bytes(row.payload), lambda: payload_ad(row.id), restore=restore)


def open_payload(thread_id: UUID, stored: bytes, ad: Callable[[], bytes], *, restore: bool = True) -> Any:
    """The JSON value in a sealed (or, in a thread without a data key, plain) framed payload,
    with its offloaded values read back unless `restore` is False. `ad` gives what a sealed
    payload is bound to; it is only computed for one (a replay opens hundreds of plain ones)."""
    framed = crypto.unseal(thread_id, ad() if crypto.is_sealed(stored) else b"", stored)
    canonical = chunks.unframe(thread_id, framed) if chunks.is_chunked(framed) else codec.unframe(framed)
    value = codec.loads(canonical)
    if restore and blobs.has_refs(canonical):
        value = blobs.restore(thread_id, value)
    return value


def chunk_digests(row: Checkpoint | Row) -> list[bytes]:
    """The snapshot chunks a stored row's payload names (none unless it is a chunked snapshot)."""
    stored = bytes(row.payload)
    framed = crypto.unseal(row.thread_id, payload_ad(row.id) if crypto.is_sealed(stored) else b"", stored)
    return chunks.digests_in(framed) if chunks.is_chunked(framed) else []


def verify_row(row: Row, *, parent_integrity: bytes | None) -> None:
    if not codec.integrity_matches(
        row.integrity, parent_integrity=parent_integrity, checkpoint_id=row.id, thread_id=row.thread_id,
        branch_id=row.branch_id, parent_id=row.parent_id, seq=row.seq, kind=row.kind,
        payload=row.payload, fields=mac_fields(row), created_at=row.created_at,
    ):  # fmt: skip
        raise IntegrityFailure(
            f"Checkpoint {row.id} (thread {row.thread_id}, seq {row.seq}) fails its integrity check: "
            "it was altered outside Quicksave.",
            detail={"checkpoint": str(row.id)},
        )
