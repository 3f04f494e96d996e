"""The changes of items that the memory browser's open pages follow: every committed put or delete
goes to one channel-layer group (`GROUP`) through checkpoints.live's publisher. A process holds
its changes for FLUSH_SECONDS and hands them over together, which the publisher sends as one
message: a busy writer costs a few sends a second, not one per write (a page a quarter of a
second late is not one anybody notices, a put that pays for a send is).

A page asks for the changes under its namespace (and of its item) only (memory.consumers). Pages
keep no sequence of these: a page that connects, or reconnects, asks whether anything it shows
changed since it was rendered (`changed_since`), and fetches itself again if so. A message names
the namespace, key, version and writer, never the value (that stays sealed in the item).
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from checkpoints import live
from memory.paths import Path

GROUP = "memory.items"
ITEM_WRITTEN = "item.written"
ITEM_DELETED = "item.deleted"
CHANGED = "memory.changed"
# What `changed_since` allows for: a version's time is taken by its writer before its commit, on
# that process's clock, so a write a page missed may carry a time a little before the page's.
MARGIN = timedelta(seconds=2)
FLUSH_SECONDS = 0.25


class _Outbox:
    """This process's committed changes not yet handed to the publisher, and the daemon thread
    that hands them over FLUSH_SECONDS after the first of them (a writer only appends to a list)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self._waiting = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(payload)
            first = len(self._pending) == 1
            if first and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="memory-changes", daemon=True)
                self._thread.start()
        if first:
            self._waiting.set()

    def _run(self) -> None:
        while True:
            self._waiting.wait()
            time.sleep(FLUSH_SECONDS)
            self._waiting.clear()
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for payload in pending:
            live.send(GROUP, payload)


_outbox = _Outbox()


def announce_on_commit(*, path: Path, key: str, version: int, deleted: bool, writer: dict[str, Any]) -> None:
    """Once the current transaction commits, tell the pages watching that the item changed."""
    payload = message(path=path, key=key, version=version, deleted=deleted, writer=writer)
    if connection.in_atomic_block:
        transaction.on_commit(functools.partial(_outbox.add, payload))
    else:
        _outbox.add(payload)  # committed already (autocommit)


def message(*, path: Path, key: str, version: int, deleted: bool, writer: dict[str, Any]) -> dict[str, Any]:
    """A change as the pages' socket sends it."""
    kind = ITEM_DELETED if deleted else ITEM_WRITTEN
    return {"type": kind, "seq": 0, "namespace": list(path), "key": key, "data": {"version": version, **writer}}


def concerns(event: dict[str, Any], *, prefix: Path, key: str | None) -> bool:
    """Whether a change is of an item under `prefix` (and is `key`, if given)."""
    namespace = event.get("namespace") or []
    return tuple(namespace[: len(prefix)]) == prefix and (key is None or event.get("key") == key)


def changed_since(*, prefix: Path, key: str | None, since: datetime) -> bool:
    """Whether an item under `prefix` (`key`, if given) was written or deleted after `since`
    (less MARGIN)."""
    conditions = ["i.updated_at > %s"]
    params: list[Any] = [since - MARGIN]
    if key is not None:
        conditions.append("n.path = %s::text[] AND i.key = %s")
        params.extend([list(prefix), key])
    elif prefix:
        conditions.append(f"n.path[1:{len(prefix)}] = %s::text[]")
        params.append(list(prefix))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM memory_item i JOIN memory_namespace n ON n.id = i.namespace_id "
            f"WHERE {' AND '.join(conditions)})",
            params,
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def flush() -> None:
    """Hand this process's held changes to the publisher now (tests use it, with live.flush)."""
    _outbox.flush()
