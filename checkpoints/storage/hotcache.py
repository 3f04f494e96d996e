"""The hot path: materialised states of branch heads, kept in Redis for every process.

Entries are keyed by checkpoint id. A checkpoint is immutable, so an entry can never
go stale: a reader learns the head of a branch from PostgreSQL (one index lookup, so
it never sees a state older than an acknowledged write) and takes that head's state
from here instead of replaying deltas. A write therefore has nothing to update or
invalidate; `store.latest_state` fills the entry of the head it read, and entries
expire after `QUICKSAVE_HOT_TTL_SECONDS`. Each entry is sealed under its thread's data
key (or MAC'd with the integrity key for a thread without one), so Redis holds no
readable state and a forged entry is refused.

Redis is an accelerator, never a dependency: any Redis error marks the cache degraded
for `QUICKSAVE_HOT_RETRY_SECONDS`, during which reads go straight to PostgreSQL, then
the next call tries again, so the cache recovers by itself when Redis returns.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import struct
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from uuid import UUID

import redis
from django.conf import settings

from checkpoints.fields import associated_data
from checkpoints.storage import codec, crypto

log = logging.getLogger(__name__)

PREFIX = "qs:hot:"
_FORGET_BATCH = 500  # keys per DEL
# seq, branch id, state bytes, chain length, chain bytes; then the 32-byte integrity MAC.
_HEADER = struct.Struct(">qqqqq")
_PLAIN, _SEALED = b"P", b"S"


@dataclass(frozen=True, slots=True)
class Entry:
    """What a hot entry restores: enough to rebuild the store's Node without the database."""

    seq: int
    branch_id: int
    state_bytes: int
    chain_length: int
    chain_bytes: int
    integrity: bytes
    state: dict[str, Any]


class _Health:
    """Whether Redis answered lately; a failure opens a short window in which nobody tries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error = ""
        self.down_since = 0.0
        self.retry_at = 0.0
        self.checked_at = 0.0

    def may_try(self) -> bool:
        return not self.down_since or time.monotonic() >= self.retry_at

    def ok(self) -> None:
        with self._lock:
            if self.down_since:
                log.warning("hot cache: Redis is back after %.1f s", time.monotonic() - self.down_since)
            self.error, self.down_since, self.checked_at = "", 0.0, time.monotonic()

    def failed(self, exc: Exception) -> None:
        with self._lock:
            now = time.monotonic()
            if not self.down_since:
                log.warning("hot cache degraded, reading from PostgreSQL: %s", exc)
                self.down_since = now
            self.error = str(exc) or type(exc).__name__
            self.retry_at = now + settings.QUICKSAVE_HOT_RETRY_SECONDS
            self.checked_at = now


_health = _Health()


@lru_cache(maxsize=2)
def _client(url: str) -> redis.Redis:
    timeout = settings.QUICKSAVE_HOT_TIMEOUT_MS / 1000
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False)


def enabled() -> bool:
    return bool(settings.REDIS_URL) and settings.QUICKSAVE_HOT_TTL_SECONDS > 0


def _key(checkpoint_id: UUID) -> str:
    return f"{PREFIX}{checkpoint_id}"


def _ad(thread_id: UUID, checkpoint_id: UUID) -> bytes:
    return associated_data("redis.hot", thread_id, checkpoint_id)


def _pack(thread_id: UUID, checkpoint_id: UUID, entry: Entry, canonical_state: bytes) -> bytes:
    """tag | thread id (16) | sealed body, or tag | thread id | MAC (32) | body; the thread id is
    in the associated data, so an entry moved to another thread or checkpoint does not open."""
    body = (
        _HEADER.pack(entry.seq, entry.branch_id, entry.state_bytes, entry.chain_length, entry.chain_bytes)
        + entry.integrity
        + canonical_state
    )
    ad = _ad(thread_id, checkpoint_id)
    if crypto.data_key(thread_id) is not None:
        return _SEALED + thread_id.bytes + crypto.seal(thread_id, ad, body)
    return _PLAIN + thread_id.bytes + _mac(ad, body) + body


def _unpack(checkpoint_id: UUID, blob: bytes) -> tuple[UUID, Entry] | None:
    # Views, not slices: a head's state can be megabytes, and every copy of it costs.
    view = memoryview(blob)
    tag, thread_id, rest = blob[:1], UUID(bytes=blob[1:17]), view[17:]
    ad = _ad(thread_id, checkpoint_id)
    body: bytes | memoryview
    if tag == _SEALED and crypto.is_sealed(rest):
        try:
            body = crypto.unseal(thread_id, ad, rest)
        except crypto.DecryptionFailure:
            return None
    elif tag == _PLAIN and hmac.compare_digest(rest[:32], _mac(ad, rest[32:])):
        body = rest[32:]
    else:
        return None
    seq, branch_id, state_bytes, chain_length, chain_bytes = _HEADER.unpack_from(body)
    start = _HEADER.size
    integrity, state = bytes(body[start : start + 32]), codec.loads(memoryview(body)[start + 32 :])
    return thread_id, Entry(seq, branch_id, state_bytes, chain_length, chain_bytes, integrity, state)


def _mac(ad: bytes, body: bytes | memoryview) -> bytes:
    key = hashlib.sha256(b"quicksave-hot:" + settings.QUICKSAVE_INTEGRITY_KEY.encode()).digest()
    return hmac.new(key, ad + b"\x00" + body, hashlib.sha256).digest()


def get(checkpoint_id: UUID) -> tuple[UUID, Entry] | None:
    """(thread id, entry) of a cached checkpoint, or None (not cached, forged, or Redis unavailable)."""
    if not enabled() or not _health.may_try():
        return None
    try:
        blob = _client(settings.REDIS_URL).get(_key(checkpoint_id))
    except redis.RedisError as exc:
        _health.failed(exc)
        return None
    _health.ok()
    if blob is None:
        return None
    try:
        found = _unpack(checkpoint_id, blob)  # type: ignore[arg-type]
    except (ValueError, struct.error):  # too short, or a body that is not ours
        found = None
    if found is None:
        log.warning("hot cache: refused an entry for checkpoint %s that does not authenticate", checkpoint_id)
    return found


def put(thread_id: UUID, checkpoint_id: UUID, entry: Entry) -> None:
    """Cache a head's state for `QUICKSAVE_HOT_TTL_SECONDS` (best effort)."""
    if not enabled() or not _health.may_try():
        return
    blob = _pack(thread_id, checkpoint_id, entry, codec.to_canonical_bytes(entry.state))
    try:
        _client(settings.REDIS_URL).set(_key(checkpoint_id), blob, ex=settings.QUICKSAVE_HOT_TTL_SECONDS)
    except redis.RedisError as exc:
        _health.failed(exc)
        return
    _health.ok()


def forget(checkpoint_ids: list[UUID], *, strict: bool = False) -> None:
    """Drop the entries of checkpoints whose rows were rewritten: best effort, or raising Redis's
    error when `strict` (a rewrite must not go ahead while Redis may still serve the old rows)."""
    if not checkpoint_ids or not enabled() or not (strict or _health.may_try()):
        return
    try:
        client = _client(settings.REDIS_URL)
        for start in range(0, len(checkpoint_ids), _FORGET_BATCH):
            client.delete(*[_key(checkpoint_id) for checkpoint_id in checkpoint_ids[start : start + _FORGET_BATCH]])
    except redis.RedisError as exc:
        _health.failed(exc)
        if strict:
            raise


def status(*, probe: bool = False) -> dict[str, Any]:
    """`disabled`, `ok` or `degraded` (with the error); `probe` pings Redis unless it did lately."""
    if not enabled():
        return {"status": "disabled", "detail": "REDIS_URL is not set; states are read from PostgreSQL."}
    if probe and time.monotonic() - _health.checked_at > 2:
        try:
            _client(settings.REDIS_URL).ping()
            _health.ok()
        except redis.RedisError as exc:
            _health.failed(exc)
    if _health.down_since:
        return {
            "status": "degraded",
            "error": _health.error,
            "down_for_seconds": round(time.monotonic() - _health.down_since, 1),
            "detail": "Redis is unreachable; every read and write goes to PostgreSQL until it answers again.",
        }
    return {"status": "ok"}


def reset() -> None:
    """Forget the health state (tests use it between Redis servers)."""
    _client.cache_clear()
    _health.ok()
