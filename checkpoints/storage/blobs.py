"""Large values: strings and objects above `QUICKSAVE_OFFLOAD_BYTES` live in object storage.

On the way in, the store hands each payload's JSON (a snapshot's state, a delta's ops) to
`offload`: every string or JSON object larger than the limit is written once per thread
to the `quicksave_blobs` storage (django-storages: the filesystem under var/blobs by
default, S3-compatible when configured) and replaced in the payload by a reference

    {"$qs_blob": {"sha256": <hex of the value's canonical JSON>, "size": n, "type": "string"|"object",
                  "preview": <first characters>}}

On the way out, `restore` puts the values back, so a materialised state never shows a
reference. A blob is sealed under its thread's data key (crypto-shredded with it) and
checked against its SHA-256 when read back; the payload's MAC covers the reference.
Blobs are content-addressed per thread: a value carried through a thousand checkpoints
is stored once. `collect_garbage` (run by `manage.py prune`) deletes blobs no payload
refers to any more.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import connection

from checkpoints.fields import associated_data
from checkpoints.storage import codec, crypto
from checkpoints.storage.errors import IntegrityFailure
from checkpoints.storage.lru import LRU

log = logging.getLogger(__name__)

MARKER = "$qs_blob"
MARKER_BYTES = b'"$qs_blob"'
PREVIEW_CHARS = 160
STORAGE_ALIAS = "quicksave_blobs"


def storage() -> Storage:
    return storages[STORAGE_ALIAS]


def limit() -> int:
    return int(settings.QUICKSAVE_OFFLOAD_BYTES)


def blob_name(thread_id: UUID, digest: str) -> str:
    """Where a thread's blob lives: keyed, so the name does not reveal the content's hash."""
    key = hashlib.sha256(b"quicksave-blob-name:" + settings.QUICKSAVE_INTEGRITY_KEY.encode()).digest()
    return f"t/{thread_id}/{hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()}"


def _ad(thread_id: UUID, digest: str) -> bytes:
    return associated_data("blob", thread_id, digest)


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True, slots=True)
class Ref:
    sha256: str
    size: int
    type: str
    preview: str

    def as_json(self) -> dict[str, Any]:
        return {MARKER: {"sha256": self.sha256, "size": self.size, "type": self.type, "preview": self.preview}}


def _preview(value: Any, canonical: bytes) -> str:
    text = value if isinstance(value, str) else canonical.decode()
    return text[:PREVIEW_CHARS]


def _approx_size(value: Any) -> int:
    """The canonical JSON size of a value, closely enough to compare with the limit."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return 2 + sum(len(key) + 4 + _approx_size(item) for key, item in value.items())
    if isinstance(value, list):
        return 2 + sum(1 + _approx_size(item) for item in value)
    return 8


def offload(thread_id: UUID, value: Any, *, root: bool = True) -> tuple[Any, list[Ref]]:
    """`value` with every large string and object below the root replaced by a reference,
    each stored (once) in the blob storage; returns the new value and the references made."""
    refs: list[Ref] = []
    # The limit is read once: a snapshot's walk meets every string of the state, and a settings
    # lookup for each made walking a 1,000-message state take 1.3 ms instead of 0.46.
    return _offload(thread_id, value, refs, root=root, largest=limit())[0], refs


def _offload(thread_id: UUID, value: Any, refs: list[Ref], *, root: bool, largest: int) -> tuple[Any, int]:
    if isinstance(value, str):
        size = len(value) + 2
        if not root and size > largest and len(value.encode()) + 2 > largest:
            return _store(thread_id, value, refs), 60
        return value, size
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        size = 2
        for key, item in value.items():
            out[key], item_size = _offload(thread_id, item, refs, root=False, largest=largest)
            size += len(key) + 4 + item_size
        if not root and size > largest:
            return _store(thread_id, out, refs), 60
        return out, size
    if isinstance(value, list):
        items, size = [], 2
        for item in value:
            new, item_size = _offload(thread_id, item, refs, root=False, largest=largest)
            items.append(new)
            size += item_size + 1
        return items, size
    return value, 8


def _store(thread_id: UUID, value: Any, refs: list[Ref]) -> dict[str, Any]:
    canonical = codec.to_canonical_bytes(value)
    digest = hashlib.sha256(canonical).hexdigest()
    ref = Ref(sha256=digest, size=len(canonical), type="string" if isinstance(value, str) else "object",
              preview=_preview(value, canonical))  # fmt: skip
    if not _touch(thread_id, digest):
        sealed = crypto.seal(thread_id, _ad(thread_id, digest), codec.encode(canonical))
        # Written before its row: a row never names a missing file (an orphaned file is collected).
        storage().save(blob_name(thread_id, digest), ContentFile(sealed))
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO checkpoints_blob (thread_id, sha256, size, type, created_at, used_at) "
                "VALUES (%s, %s, %s, %s, now(), now()) ON CONFLICT (thread_id, sha256) DO UPDATE SET used_at = now()",
                [thread_id, digest, ref.size, ref.type],
            )
        _contents.put((thread_id, digest), value)
    refs.append(ref)
    return ref.as_json()


def _touch(thread_id: UUID, digest: str) -> bool:
    """Mark a stored blob as used now (so garbage collection spares it); False if there is none.

    A collection deleting the row holds its lock until the file is gone too, so this either
    finds the row before (and the collection then spares it) or finds none and uploads again.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE checkpoints_blob SET used_at = now() WHERE thread_id = %s AND sha256 = %s", [thread_id, digest]
        )
        return cursor.rowcount > 0


# --------------------------------------------------------------------------- reading


# Values read back, by (thread, digest), bounded by their total size (64 MiB). A blob's content
# is its digest's: it never changes, whatever transaction read it.
_contents: LRU[tuple[UUID, str], Any] = LRU(64 * 1024 * 1024, weigh=lambda value: _approx_size(value))


def forget() -> None:
    _contents.clear()


def has_refs(canonical: bytes) -> bool:
    return MARKER_BYTES in canonical


def restore(thread_id: UUID, value: Any) -> Any:
    """`value` with every reference replaced by the stored value (checked against its SHA-256)."""
    if isinstance(value, dict):
        ref = value.get(MARKER)
        if ref is not None and len(value) == 1 and isinstance(ref, dict):
            return restore(thread_id, read(thread_id, str(ref.get("sha256"))))
        return {key: restore(thread_id, item) for key, item in value.items()}
    if isinstance(value, list):
        return [restore(thread_id, item) for item in value]
    return value


def read(thread_id: UUID, digest: str) -> Any:
    """A stored value (with references of its own still in it), integrity-checked."""
    cached = _contents.get((thread_id, digest))
    if cached is not None:
        return cached
    try:
        with storage().open(blob_name(thread_id, digest), "rb") as handle:
            sealed = handle.read()
    except (FileNotFoundError, OSError) as exc:
        raise IntegrityFailure(
            f"The large value {digest[:12]}… of thread {thread_id} is missing from blob storage ({exc}).",
            detail={"blob": digest},
        ) from None
    canonical = codec.unframe(crypto.unseal(thread_id, _ad(thread_id, digest), sealed))
    if hashlib.sha256(canonical).hexdigest() != digest:
        raise IntegrityFailure(f"The large value {digest[:12]}… of thread {thread_id} fails its SHA-256 check.",
                               detail={"blob": digest})  # fmt: skip
    value = codec.loads(canonical)
    _contents.put((thread_id, digest), value)
    return value


def refs_in(value: Any) -> Iterator[dict[str, Any]]:
    """Every reference in a stored payload's JSON."""
    if isinstance(value, dict):
        ref = value.get(MARKER)
        if ref is not None and len(value) == 1 and isinstance(ref, dict):
            yield ref
            return
        for item in value.values():
            yield from refs_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from refs_in(item)


# --------------------------------------------------------------------------- showing


@dataclass(frozen=True, slots=True)
class Shown:
    path: str
    sha256: str
    size: int
    type: str
    preview: str


def large_values(thread_id: UUID, state: dict[str, Any]) -> tuple[dict[str, Any], list[Shown]]:
    """For pages: the state with each offloaded value replaced by a short placeholder, and the list
    of those values (path, digest, size, preview) for download links."""
    found: list[Shown] = []
    largest = limit()

    def walk(value: Any, path: str, root: bool) -> Any:
        if isinstance(value, dict):
            out = {key: walk(item, f"{path}/{_escape(key)}", False) for key, item in value.items()}
            if root or _approx_size(value) <= largest:
                return out
        elif isinstance(value, list):
            return [walk(item, f"{path}/{index}", False) for index, item in enumerate(value)]
        elif not isinstance(value, str) or len(value) + 2 <= largest:
            return value
        canonical = codec.to_canonical_bytes(value)
        if len(canonical) <= largest:
            return value
        shown = Shown(path or "/", hashlib.sha256(canonical).hexdigest(), len(canonical),
                      "string" if isinstance(value, str) else "object", _preview(value, canonical))  # fmt: skip
        found.append(shown)
        return f"⟨{shown.type} of {shown.size:,} bytes in blob storage: {shown.preview[:60]}…⟩"

    return walk(state, "", True), found


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
