"""checkpoints.storage.lent_connection: threads without a connection of their own borrow one the
process keeps open, instead of each setting one up and tearing it down."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction

from checkpoints.storage import lent_connection
from quicksave_agents.models import Agent

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(work: Callable[[], Any]) -> Any:
    """Run `work` in a new thread (which has never touched the database) and return its result."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def initialized_here() -> bool:
    return any(db.alias == DEFAULT_DB_ALIAS for db in connections.all(initialized_only=True))


def test_threads_without_a_connection_borrow_the_same_open_one_and_leave_none_behind() -> None:
    def borrow() -> tuple[int, bool, bool]:
        with lent_connection.borrowed():
            pid = backend_pid()
            lent = lent_connection.is_lent(connections[DEFAULT_DB_ALIAS])
        return pid, lent, initialized_here()

    first_pid, first_lent, first_left = in_thread(borrow)
    second_pid, second_lent, second_left = in_thread(borrow)

    assert first_lent and second_lent
    assert first_pid == second_pid  # the connection stayed open between the two threads
    assert not first_left and not second_left  # neither thread was given a connection object of its own


def test_a_thread_in_a_transaction_keeps_its_own_connection() -> None:
    def borrow_in_transaction() -> tuple[int, int, bool]:
        with transaction.atomic():
            own_pid = backend_pid()
            with lent_connection.borrowed():
                pid = backend_pid()
                lent = lent_connection.is_lent(connections[DEFAULT_DB_ALIAS])
        connection.close()
        return own_pid, pid, lent

    own_pid, pid, lent = in_thread(borrow_in_transaction)

    assert pid == own_pid and not lent


def test_a_thread_with_its_own_connection_open_outside_a_transaction_borrows_and_keeps_its_own() -> None:
    def borrow_beside_own() -> tuple[int, int, bool, bool]:
        own = connections[DEFAULT_DB_ALIAS]
        own_pid = backend_pid()
        with lent_connection.borrowed():
            pid = backend_pid()
            lent = lent_connection.is_lent(connections[DEFAULT_DB_ALIAS])
        same_after = connections[DEFAULT_DB_ALIAS] is own and backend_pid() == own_pid
        connection.close()
        return own_pid, pid, lent, same_after

    own_pid, pid, lent, same_after = in_thread(borrow_beside_own)

    assert lent and pid != own_pid
    assert same_after  # the thread's own connection is back, open, untouched


def test_a_connection_object_that_served_a_call_cleanly_serves_the_next_borrow() -> None:
    def borrow(name: str) -> tuple[weakref.ref[Any], int]:
        with lent_connection.borrowed():
            pid = backend_pid()
            with transaction.atomic():  # a transaction opened and committed leaves nothing behind
                Agent.objects.create(name=name)
            return weakref.ref(connections[DEFAULT_DB_ALIAS]), pid

    first, first_pid = in_thread(lambda: borrow("first"))
    second, second_pid = in_thread(lambda: borrow("second"))

    assert first() is not None and first() is second()
    assert first_pid == second_pid


def test_a_connection_object_that_met_an_error_is_dropped_and_keeps_no_exception() -> None:
    """What a call leaves on Django's connection object (the last exception that went through an
    atomic block, and through its traceback every frame up the stack) goes with the object: the
    open connection is kept, the object is not."""

    class Frame:
        pass

    def fail_in_a_transaction() -> tuple[weakref.ref[Any], weakref.ref[Frame], int]:
        marker = Frame()  # a local of a frame that the exception's traceback holds
        with lent_connection.borrowed():
            pid = backend_pid()
            db = weakref.ref(connections[DEFAULT_DB_ALIAS])
            with pytest.raises(IntegrityError), transaction.atomic():
                Agent.objects.create(name="twice")
                Agent.objects.create(name="twice")  # through Django's mark_for_rollback_on_error
        return db, weakref.ref(marker), pid

    db, marker, pid = in_thread(fail_in_a_transaction)
    gc.collect()

    assert db() is None
    assert marker() is None
    assert in_thread(_borrowed_pid) == pid  # the connection itself stayed open for the next call


def test_a_borrow_inside_a_borrow_keeps_the_connection_it_has() -> None:
    def nested() -> tuple[int, int]:
        with lent_connection.borrowed():
            with lent_connection.borrowed():  # before the outer block has opened its connection
                inner = backend_pid()
            return inner, backend_pid()

    inner, outer = in_thread(nested)

    assert inner == outer


def test_when_every_lent_connection_is_out_a_thread_opens_its_own_and_closes_it() -> None:
    out = threading.Barrier(lent_connection.LENT + 1)
    done = threading.Event()

    def hold() -> None:
        with lent_connection.borrowed():
            backend_pid()
            out.wait(timeout=10)
            done.wait(timeout=10)

    holders = [threading.Thread(target=hold) for _ in range(lent_connection.LENT)]
    for holder in holders:
        holder.start()
    out.wait(timeout=10)  # every lent connection is out now

    def borrow() -> tuple[bool, bool, Any, bool]:
        with lent_connection.borrowed():
            pid = backend_pid()
            db = connections[DEFAULT_DB_ALIAS]
            lent = lent_connection.is_lent(db)
            with lent_connection.borrowed():
                same_inside = connections[DEFAULT_DB_ALIAS] is db and backend_pid() == pid
        return lent, same_inside, db.connection, initialized_here()

    try:
        lent, same_inside, raw_after, left = in_thread(borrow)
    finally:
        done.set()
        for holder in holders:
            holder.join(timeout=10)

    assert not lent
    assert same_inside  # a borrow inside it keeps the connection it has
    assert raw_after is None  # its own connection went back when the block ended
    assert not left  # and its connection object with it


def test_a_lent_connection_lost_during_a_block_is_reopened_for_the_next_borrower() -> None:
    def lose_it() -> int:
        with lent_connection.borrowed():
            pid = backend_pid()
            killer = connections.create_connection(DEFAULT_DB_ALIAS)
            with killer.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            killer.close()
            with pytest.raises(Exception):  # noqa: B017 - Django's or psycopg's, whichever notices
                backend_pid()
        return pid

    lost_pid = in_thread(lose_it)
    next_pid = in_thread(lambda: _borrowed_pid())

    assert next_pid != lost_pid


def test_a_lent_connection_that_died_while_idle_is_checked_and_reopened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lent_connection, "IDLE_CHECK_SECONDS", 0.0)
    idle_pid = in_thread(_borrowed_pid)
    with connection.cursor() as cursor:  # the server restarts, a proxy drops idle sockets...
        cursor.execute("SELECT pg_terminate_backend(%s)", [idle_pid])

    next_pid = in_thread(_borrowed_pid)

    assert next_pid != idle_pid


def test_lent_connections_are_not_taken_from_the_pool() -> None:
    def borrow() -> tuple[dict[str, Any], object]:
        with lent_connection.borrowed():
            backend_pid()
            lent = connections[DEFAULT_DB_ALIAS]
            return lent.settings_dict["OPTIONS"], getattr(lent, "pool", None)  # PostgreSQL's wrapper has it

    options, pool = in_thread(borrow)

    assert "pool" not in options and pool is None


def _borrowed_pid() -> int:
    with lent_connection.borrowed():
        return backend_pid()


def test_a_forked_child_borrows_connections_of_its_own() -> None:
    parent_pid = in_thread(_borrowed_pid)

    child = os.fork()
    if child == 0:  # the child: report through the exit code only, and never run pytest's exit
        try:
            code = 0 if in_thread(_borrowed_pid) != parent_pid else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(child, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert in_thread(_borrowed_pid) == parent_pid  # the parent's is still open and its own
