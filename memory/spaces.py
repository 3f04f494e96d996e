"""Namespaces as rows: found by path or id, made on first write with their data key, which the
keyring's master key wraps as it wraps a thread's (checkpoints.storage.crypto).

A namespace's id, path, owner and data key never change, so each process keeps the ones it
has seen (`_by_path`, `_by_id`); one made in a transaction joins them when it commits. Ids are
never reused, so a namespace remembered by id cannot be another; one remembered by path may have
been deleted since (and made again, under a new id, by another owner). The statements that use a
remembered namespace say when its row is gone (memory.store's writes, memory.selectors' get), and
a refusal is decided on the row read again (`find(..., fresh=True)`): then the path is looked up
again, so the cache costs no query and never decides a write, a read or a refusal alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.db import connection

from checkpoints.fields import associated_data
from checkpoints.storage import codec, crypto
from checkpoints.storage.lru import LRU
from memory.paths import Path, dotted


@dataclass(frozen=True, slots=True)
class Space:
    """A namespace as the store uses it: id, path, owning agent (None: people's), data key, and
    whether it is a blackboard (memory.boards)."""

    id: int
    path: Path
    agent_id: int | None
    key: AESGCM | None
    board: bool = False

    @property
    def name(self) -> str:
        return f"memory namespace {dotted(self.path)}"


_by_path: LRU[Path, Space] = LRU(20_000)
_by_id: LRU[int, Space] = LRU(20_000)


def _wrap_ad(path: Path) -> bytes:
    # Bound to the path (unique and never changed): the id is not known until the row is inserted.
    return associated_data("memory_namespace.wrapped_key", codec.to_canonical_bytes(list(path)).decode())


_COLUMNS = "id, path, agent_id, master_key_id, wrapped_key, is_board"


def _space(row: tuple[Any, ...]) -> Space:
    namespace_id, path, agent_id, master_key_id, wrapped, board = row
    labels: Path = tuple(path)
    key = None
    if wrapped is not None:
        master = crypto.master_key(str(master_key_id))
        owner = f"memory namespace {dotted(labels)}"
        key = AESGCM(crypto.unwrap_key(master, _wrap_ad(labels), bytes(wrapped), owner=owner))
    return Space(id=int(namespace_id), path=labels, agent_id=agent_id, key=key, board=bool(board))


def _keep(space: Space) -> None:
    _by_path.remember(space.path, space)
    _by_id.remember(space.id, space)


def find(path: Path, *, fresh: bool = False) -> Space | None:
    """The namespace at `path`, or None when nothing was ever written there; with `fresh`, as
    the database has it now, never as this process remembers it."""
    if fresh:
        _by_path.drop(path)
    elif (found := _by_path.get(path)) is not None:
        return found
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_COLUMNS} FROM memory_namespace WHERE path = %s::text[]", [list(path)])
        row = cursor.fetchone()
    if row is None:
        return None
    space = _space(row)
    _keep(space)
    return space


def by_id(namespace_id: int) -> Space:
    found = _by_id.get(namespace_id)
    if found is not None:
        return found
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_COLUMNS} FROM memory_namespace WHERE id = %s", [namespace_id])
        row = cursor.fetchone()
    if row is None:
        raise LookupError(f"No memory namespace has id {namespace_id}.")
    space = _space(row)
    _keep(space)
    return space


def ensure(path: Path, *, agent_id: int | None, board: bool = False) -> tuple[Space, bool]:
    """The namespace at `path`, made now (owned by `agent_id`, with a new data key unless
    encryption is off, a blackboard if `board`) if it does not exist; and whether it was made."""
    found = find(path)
    if found is not None:
        return found, False
    master_key_id, wrapped, data_key = None, None, None
    if settings.QUICKSAVE_ENCRYPT:
        master = crypto.keyring()[0]
        data_key = AESGCM.generate_key(bit_length=256)
        master_key_id, wrapped = master.id, crypto.wrap_key(master, _wrap_ad(path), data_key)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO memory_namespace (path, agent_id, master_key_id, wrapped_key, created_at, is_board, "
            "board_seq) VALUES (%s::text[], %s, %s, %s, now(), %s, 0) ON CONFLICT (path) DO NOTHING RETURNING id",
            [list(path), agent_id, master_key_id, wrapped, board],
        )
        row = cursor.fetchone()
    if row is None:  # another writer made it first
        made = find(path)
        assert made is not None
        return made, False
    space = Space(id=int(row[0]), path=path, agent_id=agent_id, key=AESGCM(data_key) if data_key else None, board=board)
    _keep(space)
    return space, True


def forget(space: Space) -> None:
    _by_path.drop(space.path)
    _by_id.drop(space.id)


def clear() -> None:
    """Forget every namespace this process has seen (tests, and after a namespace is deleted)."""
    _by_path.clear()
    _by_id.clear()
