"""How states and deltas become bytes: canonical JSON, optionally compressed, never pickle.

Also the checks every stored value passes (finite numbers, bounded nesting,
valid Unicode) and the integrity MAC chained from a checkpoint to its parent. A MAC made since
version 2 covers the checkpoint's created_at too; rows MAC'd before still verify (see
integrity_matches).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import zlib
from datetime import UTC, datetime, timedelta
from functools import cache, lru_cache
from typing import Any
from uuid import UUID

import orjson
import zstandard
from django.conf import settings

from checkpoints.storage import dictionaries
from checkpoints.storage.jsonpatch import canonical_json, canonical_json_plain, json_depth
from checkpoints.storage.pool import Pool

RAW = b"\x00"
ZLIB = b"\x01"
# 0x02 opens a sealed value (crypto.SEALED), so the next plain frame is 0x03.
ZSTD = b"\x03"
# zstd primed with one of the built-in dictionaries (checkpoints/storage/dictionaries.py), the
# frame without its magic number: the next byte names the dictionary. What every write of a value
# below DICTIONARY_BELOW makes: a delta of one chat message is some 80 bytes smaller than a plain
# zstd frame, and one of a short message compresses at all.
ZSTD_DICT = b"\x04"
# 0x05 is a snapshot in chunks stored apart (checkpoints/storage/chunks.py), which payloads.py opens.
# Below this size a frame header eats what compression saves, even with a dictionary.
COMPRESS_FROM = 32
# From this size on a dictionary saves nothing and zstd's parameters for the input's own size pack
# tighter (a snapshot of 800 KB: 5% smaller), so large values are plain ZSTD frames.
DICTIONARY_BELOW = 32 * 1024
# zstd level 3: a megabyte snapshot of a long thread packs as tightly as zlib level 6 in 8 ms
# instead of 63 and unpacks in 1.7 ms instead of 3.5; a kilobyte delta packs in 11 to 19 µs,
# where zlib, which sets up a new stream each call, takes 30 to 120 µs to pack it some 4%
# tighter. Payloads written before are zlib frames and still open.
ZSTD_LEVEL = 3
# json.dumps() with non-default options builds a new encoder per call; the MAC of every row
# replayed encodes its fields, so keep one (the bytes are the same: they are what MACs cover).
_FIELDS_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


class EncodingError(ValueError):
    """A value that cannot be stored as JSON (NaN, Infinity, lone surrogates, too deep).

    The message is a predicate that completes "The state ...", e.g. "contains NaN or Infinity".
    """


def to_canonical_bytes(value: Any) -> bytes:
    return to_canonical_bytes_plain(value)[0]


def to_canonical_bytes_plain(value: Any) -> tuple[bytes, bool]:
    """`to_canonical_bytes(value)`, and whether the value is plain JSON (no float, nothing orjson
    refuses: see jsonpatch.canonical_json_plain), whose bytes `loads(..., plain=True)` reads."""
    try:
        return canonical_json_plain(value)
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


def check_depth(value: Any, *, base: int = 0, canonical: bytes | None = None) -> None:
    """Refuse a value nested deeper than QUICKSAVE_MAX_DEPTH (less `base`). Given its `canonical`
    JSON, a value with too few brackets to nest that deep is not walked."""
    limit: int = settings.QUICKSAVE_MAX_DEPTH
    if canonical is not None and base + canonical.count(b"[") + canonical.count(b"{") <= limit:
        return
    try:
        depth = base + json_depth(value)
    except RecursionError:
        depth = limit + 1
    if depth > limit:
        raise EncodingError(f"is nested {depth} levels deep; the limit is {limit}")


def encode(canonical: bytes) -> bytes:
    """Frame canonical JSON bytes for storage: zstd-compressed with the current dictionary when
    that pays, else as they are."""
    if len(canonical) >= COMPRESS_FROM:
        tag, pool = (
            (_DICT_FRAME, _dictionary_compressors) if len(canonical) < DICTIONARY_BELOW else (ZSTD, _compressors)
        )
        compressor = pool.take()
        try:
            packed = compressor.compress(canonical)
        finally:
            pool.give_back(compressor)
        if len(packed) + len(tag) <= len(canonical):
            return tag + packed
    return RAW + canonical


def unframe(blob: bytes | memoryview) -> bytes:
    """The canonical JSON bytes inside a frame made by `encode`."""
    view = memoryview(blob)
    tag = bytes(view[:1])
    if tag == ZSTD_DICT:
        if len(view) < 2 or view[1] not in dictionaries.DICTIONARIES:
            raise ValueError("zstd payload names no known dictionary")
        return _unpack(_dictionary_decompressors(view[1]), view[2:])
    if tag == ZSTD:
        return _unpack(_decompressors, view[1:])
    if tag == ZLIB:
        return zlib.decompress(view[1:])
    if tag != RAW:
        raise ValueError(f"unknown payload encoding {tag!r}")
    return bytes(view[1:])


def _unpack(pool: Pool[zstandard.ZstdDecompressor], packed: memoryview) -> bytes:
    try:
        decompressor = pool.take()
        try:
            return decompressor.decompress(packed)
        finally:
            pool.give_back(decompressor)
    except zstandard.ZstdError as exc:
        raise ValueError(f"corrupt zstd payload: {exc}") from None


_DICT_FRAME = ZSTD_DICT + bytes([dictionaries.CURRENT])
# The frame of a dictionary: no magic number (the tag says what follows), no dictionary id (the
# next byte says which), the content size (the decompressor needs it).
_DICT_FORMAT = zstandard.FORMAT_ZSTD1_MAGICLESS


def _dictionary_compressor() -> zstandard.ZstdCompressor:
    params = zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, format=_DICT_FORMAT, write_content_size=1, write_dict_id=0, write_checksum=0
    )
    return zstandard.ZstdCompressor(dict_data=dictionaries.dictionary(dictionaries.CURRENT), compression_params=params)


@cache
def _dictionary_decompressors(number: int) -> Pool[zstandard.ZstdDecompressor]:
    return Pool(lambda: zstandard.ZstdDecompressor(dict_data=dictionaries.dictionary(number), format=_DICT_FORMAT))


# zstd's compressor and decompressor objects are not thread-safe: each is used by one thread
# at a time, and reused by the next (making a context costs several times a small frame).
_compressors = Pool(lambda: zstandard.ZstdCompressor(level=ZSTD_LEVEL))
_dictionary_compressors = Pool(_dictionary_compressor)
_decompressors = Pool(zstandard.ZstdDecompressor)


def dumps(value: Any) -> bytes:
    """JSON bytes for a value stored whole and read back by `loads`, never compared or hashed
    as canonical JSON (a materialised head): orjson's, or canonical JSON for what it refuses."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits
        return to_canonical_bytes(value)


def decode(blob: bytes | memoryview) -> Any:
    return loads(unframe(blob))


def loads(data: bytes | bytearray | memoryview | str, *, plain: bool = False) -> Any:
    """Parse stored JSON exactly as json.loads would, with orjson doing most of the work.

    orjson refuses a few things json.loads accepts (a lone surrogate escape, NaN) and reads an
    integer beyond 64 bits as a float: both go to the standard library, so a value parses to
    what json.loads gives, or fails as it fails. `plain`: the bytes are what
    `to_canonical_bytes_plain` made of a plain value, which holds no float to look through.
    """
    if plain:
        return orjson.loads(data)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)
    if (type(value) is dict or type(value) is list) and _has_float_beyond_int64(value):
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)
    return value


# orjson reads an integer outside [-2**63, 2**64) as a float at least this large.
_INT64_EDGE = float(2**63)


def _has_float_beyond_int64(value: dict[str, Any] | list[Any]) -> bool:
    """Whether a parsed value holds a float of magnitude >= 2**63: perhaps an integer orjson
    rounded (a float written that large is merely parsed twice)."""
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is dict or kind is list:
                stack.append(item)
            elif kind is float and not -_INT64_EDGE < item < _INT64_EDGE:
                return True
    return False


@lru_cache(maxsize=8)
def _mac_key(secret: str, domain: bytes) -> bytes:
    return hashlib.sha256(domain + secret.encode()).digest()


def _fields_json(fields: dict[str, Any]) -> bytes:
    """A row's recorded fields as its MAC covers them: the standard library's sorted, compact,
    ASCII-only JSON (`_FIELDS_ENCODER`).

    canonical_json writes the same bytes (orjson's, fast, for plain values) whenever they come
    out ASCII without DEL: it differs only in leaving other characters and DEL unescaped, and
    in refusing what `_FIELDS_ENCODER` writes anyway (NaN, values it turns into strings).
    """
    try:
        encoded = canonical_json(fields)
    except (TypeError, ValueError, RecursionError):
        pass
    else:
        if encoded.isascii() and b"\x7f" not in encoded:
            return encoded
    return _FIELDS_ENCODER.encode(fields).encode()


# Version 2 MACs (created_at covered) are keyed apart from version 1 MACs, so neither verifies as
# the other: a row written as version 2 cannot be passed off as a version 1 row to drop its time.
_V1 = b"quicksave-integrity:"
_V2 = b"quicksave-integrity-v2:"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


# HMAC's pads (RFC 2104), as translation tables of a key's bytes.
_INNER_PAD = bytes(byte ^ 0x36 for byte in range(256))
_OUTER_PAD = bytes(byte ^ 0x5C for byte in range(256))


@lru_cache(maxsize=8)
def _keyed_mac(secret: str, domain: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256 already keyed for integrity MACs, as RFC 2104 builds it: SHA-256 states that
    have hashed the key's inner and outer pads, to copy for each message. Two copies of a plain
    SHA-256 state cost a third less than a copy of an `hmac` object (OpenSSL 3 copies three
    digest contexts), and the MACs are the same bytes `hmac` makes."""
    padded = _mac_key(secret, domain).ljust(hashlib.sha256().block_size, b"\0")  # 32 bytes: never hashed first
    return hashlib.sha256(padded.translate(_INNER_PAD)), hashlib.sha256(padded.translate(_OUTER_PAD))


def _digest(domain: bytes, message: bytes) -> bytes:
    return _mac(_keyed_mac(settings.QUICKSAVE_INTEGRITY_KEY, domain), message)


def _mac(keyed: tuple[Any, Any], message: bytes) -> bytes:
    """HMAC-SHA256 of `message` from `_keyed_mac`'s two keyed states (RFC 2104)."""
    inner, outer = keyed[0].copy(), keyed[1].copy()
    inner.update(message)
    outer.update(inner.digest())
    digest: bytes = outer.digest()
    return digest


def keyed_digest(domain: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of `message` under a key derived from QUICKSAVE_INTEGRITY_KEY for `domain`: the
    integrity MAC of a record kept outside the checkpoint chain (a memory item's versions). Each
    kind of record names its own domain, so a MAC made for one never verifies as another's."""
    return _digest(domain, message)


def keyed_digests(domain: bytes, messages: list[bytes]) -> list[bytes]:
    """`keyed_digest` of each message, the key looked up once."""
    keyed = _keyed_mac(settings.QUICKSAVE_INTEGRITY_KEY, domain)
    return [_mac(keyed, message) for message in messages]


def _message(
    *,
    parent_integrity: bytes | None,
    checkpoint_id: UUID,
    thread_id: UUID,
    branch_id: int,
    parent_id: UUID | None,
    seq: int,
    kind: int,
    payload: bytes,
    fields_bytes: bytes,
    created_at: datetime | None,
) -> bytes:
    # One message, hashed by a copy of an HMAC keyed once: the same bytes separate update()
    # calls would see in turn, at a fraction of the per-row cost of a replay's many small MACs.
    if created_at is None:  # version 1
        numbers = struct.pack(">qqBI", branch_id, seq, kind, len(fields_bytes))
    else:  # PostgreSQL keeps microseconds: the stored time, exactly, as an integer
        numbers = struct.pack(">qqBqI", branch_id, seq, kind, (created_at - _EPOCH) // _MICROSECOND, len(fields_bytes))
    return b"".join((
        parent_integrity or b"\x00" * 32,
        checkpoint_id.bytes, thread_id.bytes, parent_id.bytes if parent_id else b"\x00" * 16,
        numbers, fields_bytes, payload,
    ))  # fmt: skip


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
    created_at: datetime,
) -> bytes:
    """HMAC-SHA256 over the parent's MAC, this row's identity, creation time, payload and recorded
    fields (version 2, what every write makes).

    Cost is O(payload): a delta's MAC never touches the full state, yet any edit to
    a row (or to an ancestor) changes the MAC a reader recomputes.
    """
    return _digest(_V2, _message(
        parent_integrity=parent_integrity, checkpoint_id=checkpoint_id, thread_id=thread_id, branch_id=branch_id,
        parent_id=parent_id, seq=seq, kind=kind, payload=payload, fields_bytes=_fields_json(fields),
        created_at=created_at,
    ))  # fmt: skip


def legacy_integrity_mac(
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
    """The version 1 MAC, which rows written before created_at was covered carry: the same
    message without the creation time, under a key of its own."""
    return _digest(_V1, _message(
        parent_integrity=parent_integrity, checkpoint_id=checkpoint_id, thread_id=thread_id, branch_id=branch_id,
        parent_id=parent_id, seq=seq, kind=kind, payload=payload, fields_bytes=_fields_json(fields), created_at=None,
    ))  # fmt: skip


def integrity_matches(
    stored: bytes,
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
    created_at: datetime,
) -> bool:
    """Whether a row's stored MAC is its version 2 MAC or, for a row written before version 2,
    its version 1 MAC (whose creation time nothing vouches for; compaction rewrites it as version 2)."""
    arguments: dict[str, Any] = {
        "parent_integrity": parent_integrity, "checkpoint_id": checkpoint_id, "thread_id": thread_id,
        "branch_id": branch_id, "parent_id": parent_id, "seq": seq, "kind": kind, "payload": payload,
        "fields_bytes": _fields_json(fields),
    }  # fmt: skip
    if hmac.compare_digest(_digest(_V2, _message(**arguments, created_at=created_at)), stored):
        return True
    return hmac.compare_digest(_digest(_V1, _message(**arguments, created_at=None)), stored)


def head_mac(
    *,
    thread_id: UUID,
    branch_id: int,
    checkpoint_id: UUID,
    seq: int,
    integrity: bytes,
    state_bytes: int,
    chain_length: int,
    chain_bytes: int,
    payload: bytes,
) -> bytes:
    """HMAC-SHA256 binding a materialised head's payload to its checkpoint as it was: identity,
    integrity MAC and recorded sizes."""
    numbers = struct.pack(">qqqqq", branch_id, seq, state_bytes, chain_length, chain_bytes)
    message = b"".join((thread_id.bytes, checkpoint_id.bytes, numbers, integrity, payload))
    return hmac.digest(_head_key(settings.QUICKSAVE_INTEGRITY_KEY), message, "sha256")


@lru_cache(maxsize=4)
def _head_key(secret: str) -> bytes:
    return hashlib.sha256(b"quicksave-head:" + secret.encode()).digest()
