"""Garbage collection (`manage.py prune`): deletes the blobs and snapshot chunks no remaining checkpoint refers to."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from checkpoints.models import Blob, Checkpoint, DeletedThread, PayloadKind, SnapshotChunk, Thread
from checkpoints.storage import cursors
from checkpoints.storage.blobs import blob_name, refs_in, storage
from checkpoints.storage.chunks import TOUCH_SECONDS
from checkpoints.storage.payloads import chunk_digests, decode_payload

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Collected:
    rows: int
    files: int
    bytes: int
    # Snapshot chunks deleted (their bytes are counted in `bytes`).
    chunks: int = 0


def collect_garbage(*, dry_run: bool = False, grace_seconds: int = 3600) -> Collected:
    """Delete blobs no remaining checkpoint refers to.

    First the rows whose digest no payload of their thread names (compaction removed the last
    checkpoint holding it) and that no write used within the grace period (one in flight may
    be about to refer to it); then the files of threads deleted here, and files of live threads
    without a row that are older than the grace period (a write uploads its file before its row
    commits). Files of threads this installation does not know are left alone: the storage may
    be shared with another installation.
    """
    rows = files = freed = 0
    cutoff_time = timezone.now() - timedelta(seconds=grace_seconds)
    for thread_id in Blob.objects.values_list("thread_id", flat=True).distinct():
        referenced: set[str] = set()
        for row in Checkpoint.objects.filter(thread_id=thread_id).only("id", "thread_id", "payload").iterator():
            referenced.update(str(ref.get("sha256")) for ref in refs_in(decode_payload(row, restore=False)))
        stale = Blob.objects.filter(thread_id=thread_id, used_at__lt=cutoff_time).exclude(sha256__in=referenced)
        for blob in stale:
            if dry_run:
                rows, freed = rows + 1, freed + blob.size
                continue
            with transaction.atomic():
                # The row stays locked until its file is gone: a write touching it waits, then
                # finds no row and uploads the value again.
                if Blob.objects.filter(pk=blob.pk, used_at__lt=cutoff_time).select_for_update().exists():
                    _delete_file(blob_name(thread_id, blob.sha256))
                    Blob.objects.filter(pk=blob.pk).delete()
                    rows, freed = rows + 1, freed + blob.size
    known = {blob_name(thread_id, digest) for thread_id, digest in Blob.objects.values_list("thread_id", "sha256")}
    deleted = {str(thread_id) for thread_id in DeletedThread.objects.values_list("thread_id", flat=True)}
    cutoff = time.time() - grace_seconds
    for thread_dir, names in _stored_names():
        if thread_dir in deleted:
            files += len(names)
            if not dry_run:
                for name in names:
                    _delete_file(name)
            continue
        if not _is_uuid(thread_dir) or not Thread.objects.filter(pk=thread_dir).exists():
            continue  # not ours
        for name in names:
            if name not in known and _modified_before(name, cutoff):
                files += 1
                if not dry_run:
                    _delete_file(name)
    if not dry_run:
        DeletedThread.objects.filter(thread_id__in=deleted).delete()
    chunks, chunk_bytes = _collect_chunks(dry_run=dry_run, grace_seconds=grace_seconds)
    return Collected(rows=rows, files=files, bytes=freed + chunk_bytes, chunks=chunks)


# A snapshot being written refreshes its chunks' use time at most every TOUCH_SECONDS, so a chunk
# it names may look that old: the grace period is never shorter than twice that.
_CHUNK_DELETE_SQL = f"""
DELETE FROM checkpoints_snapshotchunk
WHERE thread_id = %(thread)s AND NOT (digest = ANY(%(referenced)s::bytea[]))
  AND used_at < now() - make_interval(secs => greatest(%(grace)s, {2 * TOUCH_SECONDS}))
RETURNING octet_length(data)
"""
_CHUNK_COUNT_SQL = _CHUNK_DELETE_SQL.replace("DELETE FROM", "SELECT octet_length(data) FROM").replace(
    "RETURNING octet_length(data)", ""
)


def _collect_chunks(*, dry_run: bool, grace_seconds: int) -> tuple[int, int]:
    """Delete the snapshot chunks no snapshot of their thread names any more (compaction rewrote
    or removed it, or the write that stored them lost its race); returns (chunks, bytes)."""
    count = freed = 0
    for thread_id in SnapshotChunk.objects.values_list("thread_id", flat=True).distinct():
        referenced: set[bytes] = set()
        snapshots = Checkpoint.objects.filter(thread_id=thread_id, kind=PayloadKind.SNAPSHOT)
        for row in snapshots.only("id", "thread_id", "payload").iterator():
            referenced.update(chunk_digests(row))
        params: dict[str, Any] = {"thread": thread_id, "referenced": list(referenced), "grace": grace_seconds}
        with transaction.atomic(), cursors.cursor() as cursor:
            cursor.execute(_CHUNK_COUNT_SQL if dry_run else _CHUNK_DELETE_SQL, params)
            sizes = [int(row[0]) for row in cursor.fetchall()]
        count, freed = count + len(sizes), freed + sum(sizes)
    return count, freed


def _modified_before(name: str, cutoff: float) -> bool:
    try:
        return storage().get_modified_time(name).timestamp() < cutoff
    except (NotImplementedError, OSError):
        return True


def _is_uuid(text: str) -> bool:
    try:
        UUID(text)
    except ValueError:
        return False
    return True


def _stored_names() -> Iterator[tuple[str, list[str]]]:
    """(thread id, its blob file names) for every thread folder in blob storage."""
    try:
        thread_dirs, _ = storage().listdir("t")
    except (FileNotFoundError, OSError):
        return
    for thread_dir in thread_dirs:
        _, names = storage().listdir(f"t/{thread_dir}")
        yield thread_dir, [f"t/{thread_dir}/{name}" for name in names]


def _delete_file(name: str) -> None:
    try:
        storage().delete(name)
    except (FileNotFoundError, OSError):
        log.warning("could not delete blob %s", name, exc_info=True)
