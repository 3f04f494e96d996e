"""How states and deltas become bytes: canonical JSON, optional zlib, never pickle.

Also the checks every stored value passes (finite numbers, bounded nesting,
valid Unicode) and the integrity MAC chained from a checkpoint to its parent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import zlib
from functools import lru_cache
from typing import Any
from uuid import UUID

from django.conf import settings

from checkpoints.jsonpatch import canonical_json, json_depth

RAW = b"\x00"
ZLIB = b"\x01"
# Below this size zlib's header eats what it saves.
COMPRESS_FROM = 200


class EncodingError(ValueError):
    """A value that cannot be stored as JSON (NaN, Infinity, lone surrogates, too deep).

    The message is a predicate that completes "The state ...", e.g. "contains NaN or Infinity".
    """


def to_canonical_bytes(value: Any) -> bytes:
    try:
        return canonical_json(value).encode("utf-8")
    except UnicodeEncodeError:
        raise EncodingError("contains a string that is not valid Unicode (a lone surrogate)") from None
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise EncodingError("contains NaN or Infinity, which JSON cannot represent") from None
        raise EncodingError(f"is not valid JSON ({exc})") from None
    except RecursionError:
        raise EncodingError(f"is nested deeper than {settings.QUICKSAVE_MAX_DEPTH} levels") from None
    except TypeError as exc:
        raise EncodingError(f"is not JSON-serialisable ({exc})") from None


def check_depth(value: Any, *, base: int = 0) -> None:
    limit: int = settings.QUICKSAVE_MAX_DEPTH
    try:
        depth = base + json_depth(value)
    except RecursionError:
        depth = limit + 1
    if depth > limit:
        raise EncodingError(f"is nested {depth} levels deep; the limit is {limit}")


def encode(canonical: bytes) -> bytes:
    """Frame canonical JSON bytes for storage, compressed when that pays."""
    if len(canonical) >= COMPRESS_FROM:
        packed = zlib.compress(canonical, 6)
        if len(packed) < len(canonical):
            return ZLIB + packed
    return RAW + canonical


def unframe(blob: bytes | memoryview) -> bytes:
    """The canonical JSON bytes inside a frame made by `encode`."""
    data = bytes(blob)
    tag, body = data[:1], data[1:]
    if tag == ZLIB:
        return zlib.decompress(body)
    if tag != RAW:
        raise ValueError(f"unknown payload encoding {tag!r}")
    return body


def decode(blob: bytes | memoryview) -> Any:
    return json.loads(unframe(blob))


@lru_cache(maxsize=4)
def _mac_key(secret: str) -> bytes:
    return hashlib.sha256(b"quicksave-integrity:" + secret.encode()).digest()


def integrity_mac(
    *,
    parent_integrity: bytes | None,
    checkpoint_id: UUID,
    thread_id: UUID,
    branch_id: int,
    parent_id: UUID | None,
    seq: int,
    kind: int,
    payload: bytes,
    fields: dict[str, Any],
) -> bytes:
    """HMAC-SHA256 over the parent's MAC, this row's identity, payload and recorded fields.

    Cost is O(payload): a delta's MAC never touches the full state, yet any edit to
    a row (or to an ancestor) changes the MAC a reader recomputes.
    """
    mac = hmac.new(_mac_key(settings.QUICKSAVE_INTEGRITY_KEY), digestmod=hashlib.sha256)
    mac.update(parent_integrity or b"\x00" * 32)
    mac.update(checkpoint_id.bytes + thread_id.bytes + (parent_id.bytes if parent_id else b"\x00" * 16))
    mac.update(struct.pack(">qqB", branch_id, seq, kind))
    fields_bytes = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()
    mac.update(struct.pack(">I", len(fields_bytes)) + fields_bytes)
    mac.update(payload)
    return mac.digest()
