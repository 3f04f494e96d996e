"""Encryption at rest: AES-256-GCM under a data key per thread, wrapped by a master key.

The master keys come from `QUICKSAVE_ENCRYPTION_KEYS`, a keyring of `id:base64-key`
entries: the first wraps new data keys, every entry unwraps. A thread's data key is
made with the thread and kept, wrapped, in its own row (`ThreadKey`); the wrapped key
names its master key's id, so `rotate_keys` can re-wrap data keys under a new master
key while the service runs, and a process that already opened a data key keeps it.

Every sealed value carries associated data naming its table, field and row, so a
ciphertext copied into another row or field does not open. Deleting a thread's data
key (crypto-shredding) leaves every copy of its rows, backups included, unreadable.

A sealed value is framed `0x02 | nonce (12) | ciphertext | tag (16)`; the plain frames
of `checkpoints.storage.codec` start with 0x00, 0x01 or 0x03, so rows written before encryption was
turned on (or by a thread made with it off) still read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any
from uuid import UUID

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

from checkpoints.storage import codec, cursors
from checkpoints.storage.errors import IntegrityFailure
from checkpoints.storage.lru import LRU
from quicksave.keyring import MasterKey, parse_keyring

SEALED = 0x02
NONCE_BYTES = 12


class DecryptionFailure(IntegrityFailure):
    """A sealed value did not open: wrong row or field, altered bytes, or a destroyed key."""

    code = "decryption_failed"


@lru_cache(maxsize=4)
def _keyring(raw: str) -> tuple[MasterKey, ...]:
    return parse_keyring(raw)


def keyring() -> tuple[MasterKey, ...]:
    return _keyring(settings.QUICKSAVE_ENCRYPTION_KEYS)


def master_key(key_id: str) -> MasterKey:
    for key in keyring():
        if key.id == key_id:
            return key
    raise DecryptionFailure(
        f"The master key {key_id!r} that wraps this thread's data key is not in QUICKSAVE_ENCRYPTION_KEYS; "
        "keep retired keys in the keyring until `manage.py rotate_keys` has re-wrapped every data key.",
        detail={"master_key": key_id},
    )


def _wrap_ad(thread_id: UUID) -> bytes:
    return b"checkpoints_threadkey.wrapped/" + thread_id.bytes


def wrap(master: MasterKey, thread_id: UUID, data_key: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + master.aead.encrypt(nonce, data_key, _wrap_ad(thread_id))


def wrap_key(master: MasterKey, ad: bytes, data_key: bytes) -> bytes:
    """A data key that belongs to something other than a thread (a memory namespace), wrapped under
    `master` and bound to `ad`, which names its table and row as `_wrap_ad` does for a thread's."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + master.aead.encrypt(nonce, data_key, ad)


def unwrap_key(master: MasterKey, ad: bytes, wrapped: bytes, *, owner: str) -> bytes:
    """The data key `wrap_key` wrapped; `owner` names what it belongs to in the error."""
    try:
        return master.aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], ad)
    except InvalidTag:
        raise DecryptionFailure(
            f"The data key of {owner} does not unwrap under master key {master.id!r}.",
            detail={"master_key": master.id},
        ) from None


def unwrap(master: MasterKey, thread_id: UUID, wrapped: bytes) -> bytes:
    try:
        return master.aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _wrap_ad(thread_id))
    except InvalidTag:
        raise DecryptionFailure(
            f"Thread {thread_id}'s data key does not unwrap under master key {master.id!r}.",
            detail={"thread": str(thread_id), "master_key": master.id},
        ) from None


# Data keys by thread, unwrapped (None: the thread has none and stores plain rows); a data key never
# changes (rotation re-wraps it), so one read in any transaction is right for every other. The cache
# keeps the 32 key bytes, not an opened `AESGCM`: an opened one holds ~3.2 KB of OpenSSL's memory
# once used (cryptography 46), and a server that touched a thousand threads kept them scattered
# over glibc's heap, where they pinned pages the rest of its allocations had freed (bench/load.py's
# soak: see docs/benchmarks.md). Opening one for each seal or unseal costs ~2 µs. A miss costs one
# indexed read and an unwrap.
_data_keys: LRU[UUID, bytes | None] = LRU(1_000)


def remember_key(thread_id: UUID, key: bytes | None) -> None:
    """Note a thread's data key (None: it has none) as just created. A thread's data key never
    changes, and one made in a transaction that rolls back belongs to a thread id no one has."""
    _data_keys.put(thread_id, key)


def forget_key(thread_id: UUID) -> None:
    _data_keys.drop(thread_id)


_KEY_SQL = "SELECT master_key_id, wrapped FROM checkpoints_threadkey WHERE thread_id = %s"


def _load(thread_id: UUID) -> bytes | None:
    # Every new process reads this before its first payload: one statement the server prepares
    # (prepare_threshold), not the ORM's.
    with cursors.cursor() as cursor:
        cursor.execute(_KEY_SQL, [thread_id])
        row = cursor.fetchone()
    if row is None:
        return None
    return unwrap(master_key(row[0]), thread_id, bytes(row[1]))


def _key_bytes(thread_id: UUID) -> bytes | None:
    found, key = _data_keys.find(thread_id)
    if not found:
        key = _load(thread_id)
        _data_keys.put(thread_id, key)
    return key


def has_data_key(thread_id: UUID) -> bool:
    """Whether the thread has a data key (False: encryption was off, or the key was shredded)."""
    return _key_bytes(thread_id) is not None


def data_key(thread_id: UUID) -> AESGCM | None:
    """The thread's data key, opened for one seal or unseal (None: the thread has none)."""
    key = _key_bytes(thread_id)
    return None if key is None else AESGCM(key)


def seal(thread_id: UUID, ad: bytes | Callable[[], bytes], framed: bytes) -> bytes:
    """Encrypt a codec-framed value under the thread's data key, bound to `ad`; plain if it has none.

    `ad` may be a function giving it, called only when there is a key (hot writes skip building it).
    """
    key = data_key(thread_id)
    if key is None:
        return framed
    nonce = os.urandom(NONCE_BYTES)
    return bytes((SEALED,)) + nonce + key.encrypt(nonce, framed, ad if isinstance(ad, bytes) else ad())


def is_sealed(blob: bytes | memoryview) -> bool:
    return len(blob) > 0 and blob[0] == SEALED


def unseal(thread_id: UUID, ad: bytes, blob: bytes | memoryview) -> bytes:
    """The codec-framed value inside `blob` (returned as is when it was stored plain, which only
    a thread without a data key may do: a plain value in place of a sealed one is refused)."""
    key = data_key(thread_id)
    if not is_sealed(blob):
        if key is not None:
            raise DecryptionFailure(
                f"A value of thread {thread_id} is stored unencrypted although the thread has a data key: "
                "it was replaced outside Quicksave.",
                detail={"thread": str(thread_id)},
            )
        return bytes(blob)
    if key is None:
        raise DecryptionFailure(
            f"Thread {thread_id} has no data key: it was deleted (crypto-shredded), so its rows cannot be read.",
            detail={"thread": str(thread_id)},
        )
    try:
        return key.decrypt(blob[1 : 1 + NONCE_BYTES], blob[1 + NONCE_BYTES :], ad)
    except InvalidTag:
        raise DecryptionFailure(
            f"A value of thread {thread_id} does not decrypt: it was altered or moved from another row or field.",
            detail={"thread": str(thread_id)},
        ) from None


def seal_with(key: AESGCM | None, ad: bytes, framed: bytes) -> bytes:
    """`seal` under a data key the caller holds (one per memory namespace, not per thread); plain
    when `key` is None (stored with encryption off)."""
    if key is None:
        return framed
    nonce = os.urandom(NONCE_BYTES)
    return bytes((SEALED,)) + nonce + key.encrypt(nonce, framed, ad)


def unseal_with(key: AESGCM | None, ad: bytes, blob: bytes | memoryview, *, owner: str) -> bytes:
    """`unseal` under a data key the caller holds; `owner` names what the key belongs to in errors.
    As with a thread, a plain value where the owner has a key is refused, and a sealed one
    without a key (destroyed: crypto-shredded) does not open."""
    if not is_sealed(blob):
        if key is not None:
            raise DecryptionFailure(
                f"A value of {owner} is stored unencrypted although it has a data key: "
                "it was replaced outside Quicksave."
            )
        return bytes(blob)
    if key is None:
        raise DecryptionFailure(
            f"{owner} has no data key: it was deleted (crypto-shredded), so its values cannot be read."
        )
    try:
        return key.decrypt(blob[1 : 1 + NONCE_BYTES], blob[1 + NONCE_BYTES :], ad)
    except InvalidTag:
        raise DecryptionFailure(
            f"A value of {owner} does not decrypt: it was altered or moved from another row or field."
        ) from None


def forget_keys() -> None:
    """Drop every opened data key from this process (tests use it to force a reload)."""
    _data_keys.clear()


class JSONSealer:
    """SealedJSONField's sealer (see checkpoints.fields): canonical JSON, framed by `codec`, sealed
    under the row's thread data key."""

    failure: type[Exception] = IntegrityFailure

    def seal(self, thread_id: UUID, ad: bytes, value: Any) -> bytes:
        return seal(thread_id, ad, codec.encode(codec.to_canonical_bytes(value)))

    def open(self, thread_id: UUID, ad: bytes, blob: bytes) -> Any:
        return codec.decode(unseal(thread_id, ad, blob))
