"""The master keyring: `QUICKSAVE_ENCRYPTION_KEYS`, parsed and checked (no Django needed).

Entries are `id:base64key`, comma-separated; the first wraps new data keys, all unwrap.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from quicksave.env import ConfigError

KEY_BYTES = 32
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")


@dataclass(frozen=True, slots=True)
class MasterKey:
    id: str
    aead: AESGCM


def parse_keyring(raw: str) -> tuple[MasterKey, ...]:
    """`id:base64key,id2:base64key` into master keys, first first; a bad entry names itself."""
    keys: list[MasterKey] = []
    for index, entry in enumerate(item.strip() for item in raw.split(",") if item.strip()):
        key_id, sep, encoded = entry.partition(":")
        where = f"QUICKSAVE_ENCRYPTION_KEYS entry {index + 1}"
        if not sep or not _KEY_ID.fullmatch(key_id):
            raise ConfigError(f"{where} must look like id:base64key, with an id of 1-32 letters, digits, . _ -")
        try:
            secret = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise ConfigError(f"{where} ({key_id}) is not valid base64") from None
        if len(secret) != KEY_BYTES:
            raise ConfigError(f"{where} ({key_id}) must decode to {KEY_BYTES} bytes, got {len(secret)}")
        if any(key.id == key_id for key in keys):
            raise ConfigError(f"{where} repeats the key id {key_id!r}")
        keys.append(MasterKey(key_id, AESGCM(secret)))
    if not keys:
        raise ConfigError("QUICKSAVE_ENCRYPTION_KEYS holds no key")
    return tuple(keys)


def new_master_key_entry(key_id: str) -> str:
    """A fresh keyring entry, `id:base64key`."""
    return f"{key_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"
