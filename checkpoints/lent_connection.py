"""A few database connections per process, lent to calls from threads that have none of their own.

LangGraph runs a sync graph's checkpoint writes on executor threads it starts for every run:
five saver calls a step, nearly each on a thread that has never touched the database, and
often two at once (a checkpoint and the pending writes of its tasks). Each such call would
build Django's connection object for its thread, take a connection from the pool, set it up
and give it back at the end. Instead it borrows one of the process's lent connections, which
stay open between calls, like PostgresSaver's own connection. When all LENT are out, a call
opens its own as before, so no call waits for another; a thread with a connection of its own
(a request, a caller's transaction) keeps using that one.

`close()` closes the lent connections (the test suite does so before it drops its database).
A child process made by fork neither uses nor closes the connections it inherited: their
sockets are its parent's.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

# At most this many connections are lent at once (and held, idle, between calls).
LENT = 3

_lock = threading.Lock()
_lent: set[BaseDatabaseWrapper] = set()
_free: list[BaseDatabaseWrapper] = []
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
    lent = _take() if own is None or own.connection is None else None
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


def _own() -> BaseDatabaseWrapper | None:
    """This thread's connection object, if it has made one: a thread that never touched the
    database gets none made (Django builds a whole backend wrapper for each thread)."""
    return next((db for db in connections.all(initialized_only=True) if db.alias == DEFAULT_DB_ALIAS), None)


def close() -> None:
    """Close the lent connections that are not out (each opens again when next borrowed)."""
    with _lock:
        for lent in _free:
            lent.close()


def _take() -> BaseDatabaseWrapper | None:
    with _lock:
        if _free:
            return _free.pop()
        if len(_lent) >= LENT:
            return None
        lent = connections.create_connection(DEFAULT_DB_ALIAS)
        lent.inc_thread_sharing()  # used by one thread at a time: whichever borrowed it
        _lent.add(lent)
        return lent


def _give_back(lent: BaseDatabaseWrapper) -> None:
    raw = lent.connection
    if raw is not None and (raw.closed or raw.broken):
        lent.close()  # lost during the block (the server restarted, say): the next borrower reopens it
    with _lock:
        if lent in _lent:  # not a connection inherited by a fork meanwhile
            _free.append(lent)


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
