"""The engine's cursors: Django's own, so the query log sees every statement, the kept append
cursor included, and set up for binary results."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import storage
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage import cursors, lent_connection
from quicksave_agents.models import Agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def thread() -> Thread:
    agent = Agent.objects.create(name="cursor-agent")
    created, _ = storage.create_thread(agent=agent)
    return created


def appends(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries if "INSERT INTO checkpoints_checkpoint" in query["sql"]]


def test_the_query_log_sees_an_append_made_after_appends_it_did_not_watch(thread: Thread) -> None:
    head = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})
    head = storage.append_checkpoint(thread=thread, parent=head, patch=[{"op": "replace", "path": "/n", "value": 1}])

    with CaptureQueriesContext(connection) as queries:
        head = storage.append_checkpoint(
            thread=thread, parent=head, patch=[{"op": "replace", "path": "/n", "value": 2}]
        )
    assert len(appends(queries)) == 1

    # And once the log is off again, appends go on (on a cursor that no longer logs).
    head = storage.append_checkpoint(thread=thread, parent=head, patch=[{"op": "replace", "path": "/n", "value": 3}])
    with CaptureQueriesContext(connection) as queries:
        storage.append_checkpoint(thread=thread, parent=head, patch=[{"op": "replace", "path": "/n", "value": 4}])
    assert len(appends(queries)) == 1
    assert Checkpoint.objects.filter(thread=thread).count() == 5


def test_appends_and_tool_result_inserts_taking_turns_each_keep_their_own_cursor(thread: Thread) -> None:
    # On one cursor each statement would find its dumpers and result loaders again after the other.
    used: dict[str, list[Any]] = {"append": [], "insert": []}

    def note(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if "INSERT INTO checkpoints_checkpoint" in sql:
            used["append"].append(context["cursor"])
        elif "INSERT INTO checkpoints_toolresult" in sql:
            used["insert"].append(context["cursor"])
        return execute(sql, params, many, context)

    head = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})
    with connection.execute_wrapper(note):
        for n in range(1, 4):
            head = storage.append_checkpoint(
                thread=thread, parent=head, patch=[{"op": "replace", "path": "/n", "value": n}]
            )
            storage.add_tool_results(thread=thread, results=[(f"key-{n}", {"n": n})], checkpoint=head)

    assert len(used["append"]) == len(used["insert"]) == 3
    assert len({id(cursor) for cursor in used["append"]}) == len({id(cursor) for cursor in used["insert"]}) == 1
    assert used["append"][0] is not used["insert"][0]


def test_an_append_after_the_connection_closed_runs_on_the_new_connection(thread: Thread) -> None:
    head = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})
    connection.close()  # what the end of a request does (the pool may hand the same connection back)

    head = storage.append_checkpoint(thread=thread, parent=head, patch=[{"op": "replace", "path": "/n", "value": 1}])

    assert cursors.kept_cursor().cursor.connection is connection.connection
    assert storage.state_at(head) == {"n": 1}


def test_each_thread_appends_on_a_cursor_of_its_own(thread: Thread) -> None:
    head = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})
    mine = cursors.kept_cursor()
    theirs: dict[str, Any] = {}

    def append_elsewhere() -> None:
        try:
            theirs["head"] = storage.append_checkpoint(
                thread=thread, parent=head, patch=[{"op": "replace", "path": "/n", "value": 1}]
            )
            theirs["cursor"] = cursors.kept_cursor()
        finally:
            connection.close()

    other = threading.Thread(target=append_elsewhere)
    other.start()
    other.join()

    assert theirs["cursor"] is not mine
    assert storage.state_at(theirs["head"]) == {"n": 1}


def test_engine_cursors_load_results_in_binary() -> None:
    with cursors.cursor(json=True) as cursor:
        cursor.execute("SELECT '\\x00ff'::bytea, now(), '{\"a\": [1, 2.5]}'::jsonb")
        payload, stamp, value = cursor.fetchone()
        assert cursor.cursor.pgresult is not None and cursor.cursor.pgresult.fformat(0) == 1  # binary
    assert payload == b"\x00\xff"
    assert stamp.tzinfo is not None
    assert value == {"a": [1, 2.5]}


def test_threads_that_borrow_the_same_lent_connection_in_turn_append_on_its_one_kept_cursor(thread: Thread) -> None:
    # LangGraph writes a graph's checkpoints from threads it starts for every run: a cursor kept by
    # the thread would be made afresh for each of them, one kept with the connection is not.
    head = storage.append_checkpoint(thread=thread, parent=None, state={"n": 0})

    def append_in_a_new_thread(n: int) -> tuple[Any, Any]:
        found: dict[str, Any] = {}

        def work() -> None:
            with lent_connection.borrowed():
                found["head"] = storage.append_checkpoint(
                    thread=thread, parent=found["parent"], patch=[{"op": "replace", "path": "/n", "value": n}]
                )
                found["cursor"] = cursors.kept_cursor()

        found["parent"] = head
        worker = threading.Thread(target=work)
        worker.start()
        worker.join(timeout=30)
        return found["head"], found["cursor"]

    head, first = append_in_a_new_thread(1)
    head, second = append_in_a_new_thread(2)

    assert first is second
    assert storage.state_at(head) == {"n": 2}
