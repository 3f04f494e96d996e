"""A few database connections per process, lent to calls from threads that have none of their own.

LangGraph runs a sync graph's checkpoint writes on executor threads it starts for every run:
five saver calls a step, nearly each on a thread that has never touched the database, and
often two at once (a checkpoint and the pending writes of its tasks). Each such call would
build Django's connection object for its thread, take a connection from the pool, set it up
and give it back at the end. Instead it borrows one of the process's lent connections, which
stay open between calls, like PostgresSaver's own connection. When all LENT are out, a call
opens its own as before, so no call waits for another; a thread with a connection of its own
(a request, a caller's transaction) keeps using that one.

Lent connections are opened outside Django's pool, so they never hold the pool's slots that
requests need. One idle for more than IDLE_CHECK_SECONDS, or that saw an error, is checked
with a `SELECT 1` before it is lent again (the server may have restarted since), and one
left in a transaction or broken is closed when it comes back. `close()` closes those not out
(the test suite does so after every test). A child process made by fork starts with none:
the connections it inherited are its parent's.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend
from psycopg import pq

# At most this many connections are lent at once (and kept open, idle, between calls).
LENT = 3
# A connection idle for longer than this is checked before it is lent again.
IDLE_CHECK_SECONDS = 1.0

_lock = threading.Lock()
_lent: set[BaseDatabaseWrapper] = set()
_free: list[tuple[BaseDatabaseWrapper, float]] = []  # with when each came back
# Connections inherited through fork: kept referenced so that the child never closes them.
_inherited: list[BaseDatabaseWrapper] = []


@contextlib.contextmanager
def borrowed() -> Iterator[None]:
    """Run the block on a lent connection when this thread has no connection open and one is
    free; otherwise on the thread's own, closed at the end if the block opened it."""
    own = _own()
    if own in _lent:  # borrowed already, further up this thread's stack
        yield
        return
    # A thread inside a transaction whose connection was closed must fail there, not write
    # through a connection of its own that commits regardless.
    lendable = own is None or (own.connection is None and not own.in_atomic_block)
    lent = _take() if lendable else None
    if lent is None:
        with _closing_if_opened(connections[DEFAULT_DB_ALIAS]):
            yield
        return
    connections[DEFAULT_DB_ALIAS] = lent
    try:
        yield
    finally:
        if own is None:
            del connections[DEFAULT_DB_ALIAS]
        else:
            connections[DEFAULT_DB_ALIAS] = own
        _give_back(lent)


def close() -> None:
    """Close the lent connections that are not out (each opens again when next borrowed)."""
    with _lock:
        for lent, _ in _free:
            lent.close()


def _own() -> BaseDatabaseWrapper | None:
    """This thread's connection object, if it has made one: a thread that never touched the
    database gets none made (Django builds a whole backend wrapper for each thread)."""
    return next((db for db in connections.all(initialized_only=True) if db.alias == DEFAULT_DB_ALIAS), None)


def _take() -> BaseDatabaseWrapper | None:
    with _lock:
        if _free:
            lent, returned_at = _free.pop()
        elif len(_lent) < LENT:
            lent, returned_at = _unpooled_wrapper(), time.monotonic()
            _lent.add(lent)
        else:
            return None
    if lent.connection is not None and (lent.errors_occurred or time.monotonic() - returned_at > IDLE_CHECK_SECONDS):
        if lent.is_usable():
            lent.errors_occurred = False
        else:
            lent.close()
    return lent


def _unpooled_wrapper() -> BaseDatabaseWrapper:
    """A connection object for the default database that connects outside Django's pool."""
    settings: dict[str, Any] = dict(connections.settings[DEFAULT_DB_ALIAS])
    settings["OPTIONS"] = {key: value for key, value in settings["OPTIONS"].items() if key != "pool"}
    lent: BaseDatabaseWrapper = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, DEFAULT_DB_ALIAS)
    lent.inc_thread_sharing()  # used by one thread at a time: whichever borrowed it
    return lent


def _give_back(lent: BaseDatabaseWrapper) -> None:
    try:
        raw = lent.connection
        if raw is not None and (raw.closed or raw.broken or raw.info.transaction_status != pq.TransactionStatus.IDLE):
            # Lost during the block (the server restarted, say), or left in a transaction:
            # the next borrower opens a new one.
            lent.close()
    finally:
        with _lock:
            if lent in _lent:  # not a connection inherited by a fork meanwhile
                _free.append((lent, time.monotonic()))


@contextlib.contextmanager
def _closing_if_opened(own: BaseDatabaseWrapper) -> Iterator[None]:
    opened_here = own.connection is None
    try:
        yield
    finally:
        if opened_here and not own.in_atomic_block:
            own.close()


def _forget_after_fork() -> None:
    global _lock
    _inherited.extend(_lent)
    _lent.clear()
    _free.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
