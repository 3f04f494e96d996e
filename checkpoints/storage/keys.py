"""Thread data keys as rows (`ThreadKey`): made with a thread, destroyed with it (crypto-shredding),
re-wrapped under a new master key by `rotate`. The cryptography itself is `crypto`'s."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from checkpoints.models import ThreadKey
from checkpoints.storage.crypto import forget_key, keyring, master_key, remember_key, unwrap, wrap


def create_thread_key(thread_id: UUID) -> None:
    """Give a new thread its data key (inside the transaction creating the thread), unless
    encryption is off (`QUICKSAVE_ENCRYPT=false`), in which case its rows are stored plain."""
    if not settings.QUICKSAVE_ENCRYPT:
        remember_key(thread_id, None)
        return
    master = keyring()[0]
    data_key = AESGCM.generate_key(bit_length=256)
    ThreadKey.objects.create(thread_id=thread_id, master_key_id=master.id, wrapped=wrap(master, thread_id, data_key))
    remember_key(thread_id, data_key)


def shred(thread_id: UUID) -> None:
    """Destroy a thread's data key; call it in the transaction deleting the thread."""
    ThreadKey.objects.filter(thread_id=thread_id).delete()
    forget_key(thread_id)


@dataclass(frozen=True, slots=True)
class Rotation:
    rewrapped: int
    current: int
    total: int


def stale_key_count() -> int:
    return ThreadKey.objects.exclude(master_key_id=keyring()[0].id).count()


def rotate(*, batch: int = 500, progress: Callable[[Rotation], None] | None = None) -> Rotation:
    """Re-wrap every data key not under the keyring's first master key, `batch` rows per transaction.

    Data keys themselves do not change, so no sealed row is rewritten and processes that
    opened a key keep using it. Rows locked by another rotation are skipped, then retried.
    """
    primary = keyring()[0]
    total = ThreadKey.objects.count()
    stale = stale_key_count()
    rewrapped = 0
    while True:
        with transaction.atomic():
            rows = list(
                ThreadKey.objects.exclude(master_key_id=primary.id)
                .select_for_update(skip_locked=True)
                .order_by("thread_id")[:batch]
            )
            for row in rows:
                data = unwrap(master_key(row.master_key_id), row.thread_id, bytes(row.wrapped))
                row.master_key_id, row.wrapped = primary.id, wrap(primary, row.thread_id, data)
                row.rotated_at = timezone.now()
            ThreadKey.objects.bulk_update(rows, ["master_key_id", "wrapped", "rotated_at"])
        rewrapped += len(rows)
        if progress is not None:
            progress(Rotation(rewrapped=rewrapped, current=total - stale + rewrapped, total=total))
        if not rows:
            break
    return Rotation(rewrapped=rewrapped, current=total - stale_key_count(), total=total)
