"""An endpoint's credentials (its URL and signing secret) sealed at rest.

They belong to no thread, so they are sealed under the master keyring itself (AES-256-GCM, the
keyring's first key), bound to the endpoint's id: `<key id>:` then nonce, ciphertext and tag. Any
key still in QUICKSAVE_ENCRYPTION_KEYS opens them; after a new key heads the keyring the
dispatcher seals them again under it (`notifications.endpoints.reseal_stale`), so a retired key
can leave the keyring once that has run (it runs when a dispatcher starts, then hourly).
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any
from uuid import UUID

from cryptography.exceptions import InvalidTag

from checkpoints.storage import crypto

NONCE_BYTES = 12
SECRET_PREFIX = "whsec_"  # noqa: S105  (a prefix, not a secret)


class UnreadableCredentials(Exception):
    """The sealed credentials do not open: altered, moved from another endpoint, or their master key is gone."""


def new_signing_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _ad(endpoint_id: UUID) -> bytes:
    return b"notifications_endpoint.credentials/" + endpoint_id.bytes


def seal(endpoint_id: UUID, credentials: dict[str, Any]) -> bytes:
    master = crypto.keyring()[0]
    nonce = os.urandom(NONCE_BYTES)
    plain = json.dumps(credentials, sort_keys=True).encode()
    return master.id.encode() + b":" + nonce + master.aead.encrypt(nonce, plain, _ad(endpoint_id))


def sealed_under(sealed: bytes | memoryview) -> str:
    """The id of the master key that sealed these credentials."""
    return bytes(sealed).partition(b":")[0].decode(errors="replace")


def is_current(sealed: bytes | memoryview) -> bool:
    return sealed_under(sealed) == crypto.keyring()[0].id


def open_sealed(endpoint_id: UUID, sealed: bytes | memoryview) -> dict[str, Any]:
    blob = bytes(sealed)
    key_id, sep, rest = blob.partition(b":")
    if not sep or len(rest) <= NONCE_BYTES:
        raise UnreadableCredentials(f"The credentials of endpoint {endpoint_id} are not sealed values.")
    try:
        master = crypto.master_key(key_id.decode())
        found = json.loads(master.aead.decrypt(rest[:NONCE_BYTES], rest[NONCE_BYTES:], _ad(endpoint_id)))
    except (InvalidTag, UnicodeDecodeError, ValueError, crypto.DecryptionFailure) as exc:
        raise UnreadableCredentials(f"The credentials of endpoint {endpoint_id} do not open: {exc}") from None
    if not isinstance(found, dict):
        raise UnreadableCredentials(f"The credentials of endpoint {endpoint_id} are not an object.")
    return found
