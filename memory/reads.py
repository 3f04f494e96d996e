"""Reads of memory made from a thread, recorded: which thread (and which of its checkpoints) read
which version of an item, and when, so an item's page shows who read it beside who wrote it.

A read names its thread one of two ways (`Reader`): by id, with a checkpoint in it or none (the
REST API and the SDK), or as a LangGraph run knows it, its agent and external id, which the read's
own statement resolves to the thread and its head checkpoint then (memory.selectors); a read
with neither is not recorded.

Recording costs the reader no round trip: `record` queues the read, and one daemon thread per
process writes what queued up in one statement a round (at most every FLUSH_SECONDS). So reads
are recorded a moment after they happen, and those queued when a process dies are not (a read is
provenance, not an acknowledged write); a read of an item deleted meanwhile is dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import close_old_connections, connection

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.5
BATCH = 1000


@dataclass(frozen=True, slots=True)
class Reader:
    """The thread a read is made from: `thread_id` (and `checkpoint_id`, if known), or the
    LangGraph thread `external_id` of the store's agent `agent_id`, resolved by the read."""

    thread_id: UUID | None = None
    checkpoint_id: UUID | None = None
    agent_id: int | None = None
    external_id: str | None = None

    @property
    def by_external_id(self) -> bool:
        return self.thread_id is None and self.agent_id is not None and self.external_id is not None


@dataclass(frozen=True, slots=True)
class Read:
    item_id: UUID
    version: int
    thread_id: UUID
    checkpoint_id: UUID | None
    read_at: datetime


def record(read: Read) -> None:
    """Queue a read for the recording thread. Never blocks, never raises."""
    _recorder.put(read)


def flush(timeout: float = 10.0) -> bool:
    """Wait until every read queued so far is written (tests use it)."""
    return _recorder.flush(timeout)


_INSERT = """
    INSERT INTO memory_itemread (item_id, version, thread_id, checkpoint_id, read_at)
    SELECT r.item, r.version, r.thread, r.checkpoint, r.read_at
    FROM unnest(%s::uuid[], %s::int[], %s::uuid[], %s::uuid[], %s::timestamptz[])
        AS r(item, version, thread, checkpoint, read_at)
    WHERE EXISTS (SELECT 1 FROM memory_item i WHERE i.id = r.item)
"""


def write(reads: list[Read]) -> None:
    """Write `reads` (one statement), those of the same version by the same checkpoint once."""
    unique = list({(r.item_id, r.version, r.thread_id, r.checkpoint_id): r for r in reads}.values())
    if not unique:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            _INSERT,
            [
                [r.item_id for r in unique],
                [r.version for r in unique],
                [r.thread_id for r in unique],
                [r.checkpoint_id for r in unique],
                [r.read_at for r in unique],
            ],
        )


class _Recorder:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Read | threading.Event] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, item: Read | threading.Event) -> None:
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="memory-reads", daemon=True)
                    self._thread.start()
        self._queue.put(item)

    def flush(self, timeout: float) -> bool:
        done = threading.Event()
        self.put(done)
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if not isinstance(first, threading.Event):
                time.sleep(FLUSH_SECONDS)  # let the reads of the next moments join this one's statement
            reads, flushed = self._drain(first)
            self._write(reads)
            if self._queue.empty():
                connection.close()  # idle until the next read: hold no connection meanwhile
            for done in flushed:
                done.set()

    def _drain(self, first: Read | threading.Event) -> tuple[list[Read], list[threading.Event]]:
        reads: list[Read] = []
        flushed: list[threading.Event] = []
        item: Read | threading.Event | None = first
        while item is not None:
            (flushed if isinstance(item, threading.Event) else reads).append(item)  # type: ignore[arg-type]
            if len(reads) >= BATCH:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                item = None
        return reads, flushed

    @staticmethod
    def _write(reads: list[Read]) -> None:
        try:
            close_old_connections()
            write(reads)
        except Exception:  # the database is down, or the tables are gone (a test database): logged, dropped
            log.warning("could not record %d reads of memory", len(reads), exc_info=True)


_recorder = _Recorder()
