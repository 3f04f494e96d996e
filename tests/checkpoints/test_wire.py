"""checkpoints.storage.wire: a prepared statement sent before its caller's work and answered after it,
and the store's append in autocommit, which goes through it."""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from psycopg.adapt import Transformer

from agents.models import Agent
from checkpoints import live, storage
from checkpoints.models import Checkpoint, Event
from checkpoints.storage import append, nodes, wire
from checkpoints.storage.errors import StaleParent

pytestmark = pytest.mark.django_db(transaction=True)


def psycopg_connection() -> psycopg.Connection:
    connection.ensure_connection()
    conn = connection.connection
    assert conn.autocommit  # outside any atomic block: the append's own path
    return conn


# Statements are made once per process: a name is taken for good.
SUM = wire.Statement.named("test_wire_sum", "SELECT %(a)s::bigint + %(b)s::bigint * %(a)s::bigint")
ECHO = wire.Statement.named("test_wire_echo", "SELECT %(n)s::bigint")
DIVIDE = wire.Statement.named("test_wire_divide", "SELECT 1 / %(n)s::bigint")
SCALE = wire.Statement.named("test_wire_scale", "SELECT %(x)s::float8 * 2, %(label)s::text")
SET = wire.Statement.named("test_wire_set", "SET application_name = 'test_wire'")
ADOPTED = wire.Statement.named("test_wire_adopted", "SELECT %(n)s::bigint + 1")
DOUBLE = wire.Statement.named("test_wire_double", "SELECT %(n)s::bigint * 2")  # only its test binds it


def test_a_named_parameter_used_twice_is_one_placeholder() -> None:
    with SUM.sent(psycopg_connection(), {"a": 3, "b": 5}) as reply:
        assert reply.rows() == [(b"18",)]


def test_an_unread_reply_is_read_before_the_block_ends_so_the_connection_stays_usable() -> None:
    with ECHO.sent(psycopg_connection(), {"n": 7}):
        pass
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_the_servers_error_is_raised_as_psycopgs_exception_when_the_reply_is_read() -> None:
    with DIVIDE.sent(psycopg_connection(), {"n": 0}) as reply, pytest.raises(psycopg.errors.DivisionByZero):
        reply.rows()
    with DIVIDE.sent(psycopg_connection(), {"n": 2}) as reply:
        assert reply.rows() == [(b"0",)]


def test_a_statement_refuses_a_connection_inside_a_transaction() -> None:
    with (
        transaction.atomic(),
        pytest.raises(psycopg.ProgrammingError, match="autocommit"),
        ECHO.sent(connection.connection, {"n": 1}),
    ):
        pass


def test_appends_go_on_after_the_connections_prepared_statements_are_deallocated(agent: Agent) -> None:
    # psycopg sends DEALLOCATE ALL after a rollback once it has prepared statements of its own
    # (a DEALLOCATE ALL of the test's own would leave psycopg's cache wrong for later tests).
    thread = storage.create_thread(agent=agent)[0]
    first = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    conn = psycopg_connection()
    psycopg.Cursor(conn).execute("SELECT 1", prepare=True)  # Django's own cursors bind client-side
    with contextlib.suppress(RuntimeError), transaction.atomic():
        conn.execute("SELECT 2")
        raise RuntimeError("roll back")
    assert conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = 'quicksave_append'").fetchone() == (
        0,
    )
    second = storage.append_checkpoint(thread=thread, parent=first, patch=[{"op": "replace", "path": "/n", "value": 2}])
    assert storage.state_at(second.pk) == {"n": 2}
    assert Event.objects.filter(thread=thread, type="checkpoint.created").count() == 2


def test_a_stale_append_in_autocommit_names_the_head_and_leaves_nothing_behind(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    first = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    head = storage.append_checkpoint(thread=thread, parent=first, state={"n": 2})
    cached = len(nodes.states._nodes)
    with pytest.raises(StaleParent) as raised:
        storage.append_checkpoint(thread=thread, parent=first, state={"n": 3})
    assert raised.value.detail["head"] == str(head.pk)
    assert Checkpoint.objects.filter(thread=thread).count() == 2
    # The node cached while the server answered is dropped again.
    assert len(nodes.states._nodes) == cached


def test_the_cached_append_cursor_does_not_keep_a_replaced_connection_alive() -> None:
    db = settings.DATABASES["default"]
    params = {"host": db["HOST"], "port": db["PORT"] or None, "user": db["USER"], "password": db["PASSWORD"] or None}

    def connect() -> psycopg.Connection:
        return psycopg.connect(dbname=db["NAME"], **{k: v for k, v in params.items() if v})

    first = connect()
    assert append._append_cursor(first) is append._append_cursor(first)  # reused on its connection
    gone = weakref.ref(first)
    first.close()
    del first
    with connect() as second:
        assert append._append_cursor(second).connection is second
        gc.collect()
        assert gone() is None


def test_a_value_of_another_type_than_its_cast_is_refused_before_it_is_sent() -> None:
    # Sent anyway, the int's eight bytes would be read as a float8.
    with SCALE.sent(psycopg_connection(), {"x": 1.5, "label": "a"}) as reply:
        assert reply.rows() == [(b"3", b"a")]
    with (
        pytest.raises(
            psycopg.ProgrammingError, match="'x' dumps to type oid 20, but the statement casts it to oid 701"
        ),
        SCALE.sent(psycopg_connection(), {"x": 3, "label": "a"}),
    ):
        pass
    with SCALE.sent(psycopg_connection(), {"x": None, "label": None}) as reply:  # a NULL fits any type
        assert reply.rows() == [(None, None)]


def test_two_statements_cannot_share_a_name() -> None:
    with pytest.raises(ValueError, match="test_wire_echo"):
        wire.Statement.named("test_wire_echo", "SELECT %(m)s::text")


def test_an_append_whose_caller_fails_after_it_went_out_still_publishes_its_event(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = storage.create_thread(agent=agent)[0]
    first = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    published: list[int] = []
    monkeypatch.setattr(live, "publish", lambda **event: published.append(event["seq"]))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the model instance could not be built")

    monkeypatch.setattr(Checkpoint, "from_db", broken)
    with pytest.raises(RuntimeError):
        storage.append_checkpoint(thread=thread, parent=first.pk, state={"n": 2})
    event = Event.objects.get(thread=thread, type="checkpoint.created", data__seq=2)
    assert published == [event.seq]  # it landed, and its event went out


def test_a_command_that_returns_no_rows_gives_an_empty_list() -> None:
    with SET.sent(psycopg_connection(), {}) as reply:
        assert reply.rows() == []


def test_a_statement_already_prepared_under_its_name_on_the_connection_is_used() -> None:
    # As when an earlier prepare reached the server but its caller was interrupted before noting it.
    with connection.cursor() as cursor:
        cursor.execute("PREPARE test_wire_adopted AS SELECT $1::bigint + 1")
    with ADOPTED.sent(psycopg_connection(), {"n": 41}) as reply:
        assert reply.rows() == [(b"42",)]


def test_calls_from_threads_that_come_one_after_another_bind_with_one_transformer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # LangGraph starts new executor threads for every run: a binder per thread would be made per call.
    made: list[object] = []

    def counted(*args: Any) -> Any:
        made.append(transformer := Transformer(*args))
        return transformer

    monkeypatch.setattr(wire, "Transformer", counted)
    answers: list[list[tuple[bytes | None, ...]]] = []

    def call(n: int) -> None:
        try:
            with DOUBLE.sent(psycopg_connection(), {"n": n}) as reply:
                answers.append(reply.rows())
        finally:
            connection.close()  # this thread's own

    for n in range(4):
        thread = threading.Thread(target=call, args=(n,))
        thread.start()
        thread.join()

    assert answers == [[(str(2 * n).encode(),)] for n in range(4)]
    assert len(made) == 1
