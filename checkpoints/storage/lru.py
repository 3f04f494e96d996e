"""The one process-wide cache helper: bounded (least recently used goes first), thread-safe, and
told about transactions, so what a rolled-back transaction wrote never outlives it here.

Every cache of the engine is one of these: materialised states (`nodes`), branch ids
(`branches`), opened data keys (`crypto`), blob contents (`blobs`). A value learnt inside an
atomic block may be one that block wrote and that a rollback will take back; `remember`
therefore keeps it only once the transaction commits (`transaction.on_commit`, which Django
drops with the savepoint or transaction it was registered in). Outside a transaction, and for
values that are true whatever the transaction does (`put`), it keeps it at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections, transaction

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
# A hit takes one lookup fewer than `in` and then an index: most keys are UUIDs, whose hash is
# Python code (1,300 instructions each time).
_ABSENT: Any = object()


class LRU(Generic[K, V]):
    """At most `size` entries, or entries whose `weigh`ts add up to at most `size`."""

    def __init__(self, size: int | Callable[[], int], *, weigh: Callable[[V], int] | None = None) -> None:
        self._size = size
        self._weigh = weigh
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def limit(self) -> int:
        return self._size() if callable(self._size) else self._size

    def get(self, key: K) -> V | None:
        return self.find(key)[1]

    def find(self, key: K) -> tuple[bool, V | None]:
        """(True, value) when `key` is cached, even with None as its value; else (False, None)."""
        with self._lock:
            value = self._entries.get(key, _ABSENT)
            if value is _ABSENT:
                return False, None
            self._entries.move_to_end(key)
            return True, value

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def put(self, key: K, value: V, *, replacing: K | None = None) -> None:
        """Keep `value` now: it does not depend on the caller's transaction (or there is none).
        `replacing`: a key `value` supersedes, dropped with the same lock held."""
        weight = self._weigh(value) if self._weigh is not None else 1
        limit = self.limit()
        with self._lock:
            if replacing is not None:
                self._pop(replacing)
            if weight > limit:
                return
            self._pop(key)
            self._entries[key] = value
            self._weight += weight
            while self._weight > limit and self._entries:
                _, evicted = self._entries.popitem(last=False)
                self._weight -= self._weigh(evicted) if self._weigh is not None else 1

    def remember(self, key: K, value: V, *, replacing: K | None = None, using: str = DEFAULT_DB_ALIAS) -> None:
        """Keep `value`, read or written in the caller's transaction, once that transaction commits
        (and only then drop the key it is `replacing`: a rollback leaves the cache as it was)."""
        if connections[using].in_atomic_block:
            transaction.on_commit(lambda: self.put(key, value, replacing=replacing), using=using)
        else:
            self.put(key, value, replacing=replacing)

    def drop(self, key: K) -> None:
        with self._lock:
            self._pop(key)

    def _pop(self, key: K) -> None:
        """Forget `key` (the lock held)."""
        value = self._entries.pop(key, _ABSENT)
        if value is not _ABSENT:
            self._weight -= self._weigh(value) if self._weigh is not None else 1

    def drop_where(self, doomed: Callable[[K, V], bool]) -> None:
        with self._lock:
            for key, value in [(key, value) for key, value in self._entries.items() if doomed(key, value)]:
                del self._entries[key]
                self._weight -= self._weigh(value) if self._weigh is not None else 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._weight = 0
