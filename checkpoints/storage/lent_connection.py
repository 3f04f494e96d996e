"""A few database connections per process, lent to calls from threads that have none of their own.

LangGraph runs a sync graph's checkpoint writes on executor threads it starts for every run:
five saver calls a step, nearly each on a thread that has never touched the database, and
often two at once (a checkpoint and the pending writes of its tasks). Each such call would
build Django's connection object for its thread, take a connection from the pool, set it up
and give it back at the end. Instead it borrows one of the process's lent connections, which
stay open between calls, like PostgresSaver's own connection. When all LENT are out, a call
runs on a connection object of its own, taken from the pool and given back at the end, so no
call waits for another. A thread in a transaction (an atomic block, or autocommit turned off)
keeps using its own connection, whose transaction the call belongs to.

What is kept between calls is the open psycopg connection only, never Django's connection
object (`DatabaseWrapper`) around it: each borrow wraps the kept connection in a new one,
dropped when the block ends. A wrapper remembers things of the call it served, such as the
last exception that went through one of its atomic blocks (Django keeps it to explain a
broken transaction), and that exception's traceback holds the frames of the call that raised
it, up to the graph loop that called the saver. Kept for the process, a wrapper would keep
the last failed call's graph run alive (LangGraph's loop-refcount test finds it); dropped
after each call, it keeps nothing. For the same reason a thread outside a transaction borrows
even when it has a connection of its own open: the caller's wrapper, which Django keeps for
the thread's life, is not left holding the saver's exceptions.

Lent connections are opened outside Django's pool, so they never hold the pool's slots that
requests need. One idle for more than IDLE_CHECK_SECONDS is checked with a `SELECT 1` before
it is lent again (the server may have restarted since), and one left in a transaction, out of
autocommit or broken is closed when it comes back. `close()` closes those not out (the test
suite does so after every test). A child process made by fork starts with none: the
connections it inherited are its parent's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend
from psycopg import pq

# At most this many connections are lent at once (and kept open, idle, between calls).
LENT = 3
# A connection idle for longer than this is checked before it is lent again.
IDLE_CHECK_SECONDS = 1.0

_lock = threading.Lock()
_free: list[tuple[psycopg.Connection[Any], float]] = []  # open and idle, with when each came back
_out = 0  # how many are lent right now
# Bumped in a child made by fork: what its parent had lent is not the child's to give back.
_generation = 0
# Connections inherited through fork: kept referenced so that the child never closes them.
_inherited: list[psycopg.Connection[Any]] = []
# The connection objects `borrowed()` made, each for one block (lent, or of the pool when all are out).
_borrows: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()


@contextlib.contextmanager
def borrowed() -> Iterator[None]:
    """Run the block on a lent connection when this thread is not in a transaction and one is
    free; otherwise in the thread's transaction, or on a connection of its own, closed (given
    back to the pool) at the end."""
    own = _own()
    if own is not None and (own in _borrows or _in_transaction(own)):
        # Borrowed already further up this thread's stack, or the caller's transaction: a
        # thread inside a transaction whose connection was closed must fail there, not write
        # through another connection that commits regardless.
        yield
        return
    lent = _take()
    db: BaseDatabaseWrapper = lent[0] if lent is not None else connections.create_connection(DEFAULT_DB_ALIAS)
    _borrows.add(db)
    connections[DEFAULT_DB_ALIAS] = db
    try:
        yield
    finally:
        if own is None:
            del connections[DEFAULT_DB_ALIAS]
        else:
            connections[DEFAULT_DB_ALIAS] = own
        if lent is not None:
            _give_back(*lent)
        else:
            db.close()


def is_lent(db: BaseDatabaseWrapper) -> bool:
    """Whether `db` is the connection object of a borrow on a lent connection."""
    return getattr(db, "lent", False) is True


def close() -> None:
    """Close the lent connections that are not out (new ones open when next borrowed)."""
    with _lock:
        free = [raw for raw, _ in _free]
        _free.clear()
    for raw in free:
        raw.close()


def _own() -> BaseDatabaseWrapper | None:
    """This thread's connection object, if it has made one: a thread that never touched the
    database gets none made (Django builds a whole backend wrapper for each thread)."""
    return next((db for db in connections.all(initialized_only=True) if db.alias == DEFAULT_DB_ALIAS), None)


def _in_transaction(own: BaseDatabaseWrapper) -> bool:
    return own.in_atomic_block or (own.connection is not None and not own.get_autocommit())


def _take() -> tuple[Any, int] | None:
    """A new connection object on a lent connection (opened on first use if none is free), with
    the generation it was taken in; None when all LENT are out."""
    global _out
    with _lock:
        if _free:
            raw, returned_at = _free.pop()
        elif _out + len(_free) < LENT:
            raw, returned_at = None, 0.0
        else:
            return None
        _out += 1
        generation = _generation
    try:
        if raw is not None and time.monotonic() - returned_at > IDLE_CHECK_SECONDS and not _answers(raw):
            raw.close()
            raw = None
        settings: dict[str, Any] = dict(connections.settings[DEFAULT_DB_ALIAS])
        settings["OPTIONS"] = {key: value for key, value in settings["OPTIONS"].items() if key != "pool"}
        db = _lent_class(load_backend(settings["ENGINE"]).DatabaseWrapper)(settings, DEFAULT_DB_ALIAS)
    except BaseException:
        if raw is not None:
            raw.close()
        _give_back(None, generation)
        raise
    db.kept = raw
    return db, generation


@functools.cache
def _lent_class(backend: type[BaseDatabaseWrapper]) -> Any:
    """The backend's connection object, made to connect through a kept connection when it has one.

    Django connects on first use as always (`connect()` sets the wrapper's state and runs the
    backend's set-up of the connection, cheap on one set up before); only the backend's
    `get_new_connection`, which opens the database connection, hands over the kept one instead.
    """

    def get_new_connection(self: Any, conn_params: dict[str, Any]) -> Any:
        raw, self.kept = self.kept, None
        if raw is not None and not raw.closed:
            return raw
        return backend.get_new_connection(self, conn_params)

    return type(
        f"Lent{backend.__name__}", (backend,), {"lent": True, "kept": None, "get_new_connection": get_new_connection}
    )


def _answers(raw: psycopg.Connection[Any]) -> bool:
    try:
        raw.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _give_back(db: Any, generation: int) -> None:
    global _out
    raw: psycopg.Connection[Any] | None = None
    if db is not None:
        raw = db.connection if db.connection is not None else db.kept
    keep = (
        raw is not None
        and not raw.closed
        and not raw.broken
        and raw.autocommit
        and raw.info.transaction_status == pq.TransactionStatus.IDLE
    )
    with _lock:
        if generation != _generation:  # lent in the parent of this forked child: the parent's
            if raw is not None:
                _inherited.append(raw)
            return
        _out -= 1
        if keep and raw is not None:
            _free.append((raw, time.monotonic()))
    if not keep and raw is not None:
        # Lost during the block (the server restarted, say), or left in a transaction: the
        # next borrower opens a new one.
        raw.close()


def _forget_after_fork() -> None:
    global _lock, _out, _generation
    _inherited.extend(raw for raw, _ in _free)
    _free.clear()
    _out = 0
    _generation += 1
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
