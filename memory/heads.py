"""What this process knows of items' newest versions, so a write does not read before it writes.

A head cached here may be stale (another process wrote since, a transaction rolled back): the
write that uses it names the version it expects (compare-and-set), and on a miss reads the item
again. Large values are kept apart, weighed by size, for the delta of the next version.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from checkpoints.storage.lru import LRU


@dataclass(frozen=True, slots=True)
class Head:
    item_id: UUID
    version: int
    integrity: bytes
    deleted: bool
    created_at: datetime
    updated_at: datetime
    since_snapshot: int
    indexed: bool


_heads: LRU[tuple[int, str], Head] = LRU(100_000)
# Values at least store.DELTA_FROM bytes long, by item: (version, value, canonical size).
_values: LRU[UUID, tuple[int, Any, int]] = LRU(64 * 1024 * 1024, weigh=lambda entry: entry[2])


def get(namespace_id: int, key: str) -> Head | None:
    return _heads.get((namespace_id, key))


def keep(namespace_id: int, key: str, head: Head) -> None:
    _heads.put((namespace_id, key), head)


def drop(namespace_id: int, key: str) -> None:
    _heads.drop((namespace_id, key))


def value(item_id: UUID, version: int) -> Any:
    """The value of version `version` if it is the one kept for the item, else None."""
    found = _values.get(item_id)
    if found is None or found[0] != version:
        return None
    return found[1]


def keep_value(item_id: UUID, version: int, value: Any, size: int) -> None:
    _values.put(item_id, (version, value, size))


def clear() -> None:
    _heads.clear()
    _values.clear()
