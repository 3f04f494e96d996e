"""An item's values as stored and its integrity chain.

A value is canonical JSON, framed by the engine's codec (zstd when it pays) and sealed under its
namespace's data key, bound to the item and version it belongs to. The item row's head value and
its version's snapshot are the same sealed bytes (one encryption per write).

Each version's MAC covers the MAC of the version before it, the item's identity (id, namespace,
key), its number, kind, time, who wrote it and from where, and its sealed payload: a version
edited, dropped or moved into another item breaks every MAC after it. The item row's `head_mac`
binds its head value to the head version's MAC, so a read checks one MAC, not the chain.
"""

from __future__ import annotations

import hmac
import struct
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from checkpoints.fields import associated_data
from checkpoints.storage import codec, crypto
from checkpoints.storage.errors import IntegrityFailure
from memory.spaces import Space

_VERSION = b"quicksave-memory-version-v1:"
_HEAD = b"quicksave-memory-head-v1:"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_NO_MAC = b"\x00" * 32


def value_ad(item_id: UUID, version: int) -> bytes:
    return associated_data("memory.value", item_id, version)


def seal(space: Space, item_id: UUID, version: int, canonical: bytes) -> bytes:
    """Canonical JSON bytes (a value, or RFC 6902 ops) as stored for version `version` of the item."""
    return crypto.seal_with(space.key, value_ad(item_id, version), codec.encode(canonical))


def open_value(space: Space, item_id: UUID, version: int, stored: bytes | memoryview) -> Any:
    return codec.decode(crypto.unseal_with(space.key, value_ad(item_id, version), stored, owner=space.name))


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


def version_mac(
    *,
    previous: bytes | None,
    item_id: UUID,
    namespace_id: int,
    key: str,
    version: int,
    kind: int,
    created_at: datetime,
    fields: dict[str, Any],
    payload: bytes,
) -> bytes:
    key_bytes = key.encode()
    fields_bytes = codec.to_canonical_bytes(fields)
    message = b"".join((
        previous or _NO_MAC, item_id.bytes,
        struct.pack(">qqBqII", namespace_id, version, kind, _micros(created_at), len(key_bytes), len(fields_bytes)),
        key_bytes, fields_bytes, payload,
    ))  # fmt: skip
    return codec.keyed_digest(_VERSION, message)


def head_mac(
    *, item_id: UUID, namespace_id: int, key: str, version: int, value: bytes | None, integrity: bytes
) -> bytes:
    key_bytes = key.encode()
    deleted = value is None
    message = b"".join((
        item_id.bytes, struct.pack(">qqBI", namespace_id, version, deleted, len(key_bytes)), key_bytes,
        integrity, value or b"",
    ))  # fmt: skip
    return codec.keyed_digest(_HEAD, message)


def check_head(
    stored: bytes | memoryview,
    *,
    item_id: UUID,
    namespace_id: int,
    key: str,
    version: int,
    value: bytes | None,
    integrity: bytes,
) -> None:
    expected = head_mac(
        item_id=item_id, namespace_id=namespace_id, key=key, version=version, value=value, integrity=integrity
    )
    if not hmac.compare_digest(expected, bytes(stored)):
        raise IntegrityFailure(
            f"Memory item {key!r} (version {version}) fails its integrity check: it was altered outside Quicksave.",
            detail={"item": str(item_id)},
        )
