"""The tool-result cache: puts keep the first result per key, alone or several at once."""

from __future__ import annotations

import pytest
from django.db import connection

from checkpoints import storage
from checkpoints.models import ToolResult
from checkpoints.storage.errors import InvalidState, NotFound
from checkpoints.storage.tool_results import add_tool_results, get_tool_result, put_tool_result, put_tool_results
from quicksave_agents.models import Agent

pytestmark = pytest.mark.django_db


def test_a_batch_put_stores_new_keys_and_keeps_the_first_result_of_known_ones(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    put_tool_result(thread=thread, key="search:1", result={"hits": 1}, tool="search")

    stored = put_tool_results(
        thread=thread, tool="search", results=[("search:1", {"hits": 99}), ("search:2", {"hits": 2})]
    )

    assert [(row.key, row.result, created) for row, created in stored] == [
        ("search:1", {"hits": 1}, False),
        ("search:2", {"hits": 2}, True),
    ]
    found = get_tool_result(thread=thread, key="search:2")
    assert found is not None and found.result == {"hits": 2}


def test_keys_an_array_literal_would_quote_are_stored_as_given(agent: Agent) -> None:
    # The keys go to PostgreSQL as a binary array: nothing in them is quoted, escaped or read as NULL.
    thread, _ = storage.create_thread(agent=agent)
    keys = ["a,b", '"quoted"', "{braced}", "NULL", " spaced ", "back\\slash", "semi;colon", "ünï"]

    assert add_tool_results(thread=thread, results=[(key, {"key": key}) for key in keys]) == len(keys)

    for key in keys:
        found = get_tool_result(thread=thread, key=key)
        assert found is not None and found.result == {"key": key}


def test_a_batch_with_one_bad_result_writes_none_of_them(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)

    with pytest.raises(InvalidState, match="result"):
        put_tool_results(thread=thread, results=[("ok", {"a": 1}), ("bad", {"a": float("nan")})])

    assert not ToolResult.objects.filter(thread=thread).exists()


def test_puts_of_any_size_share_one_prepared_statement(agent: Agent) -> None:
    # LangGraph's pending writes make several puts a step, of one to a few results each: they must
    # not each be parsed and planned anew. psycopg prepares a statement once it has run
    # `prepare_threshold` times with the same parameter types, whatever the arrays' lengths.
    def prepared() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%INTO checkpoints_toolresult%"]
            )
            (count,) = cursor.fetchone()
        return int(count)

    thread, _ = storage.create_thread(agent=agent)
    put_tool_result(thread=thread, key="one", result={"n": 1})
    for n in range(connection.connection.prepare_threshold or 0):
        put_tool_result(thread=thread, key=f"warm-{n}", result=n)
    after_one = prepared()
    put_tool_results(thread=thread, results=[("two", 2), ("three", [3]), ("four", {"n": 4})])
    add_tool_results(thread=thread, results=[("two", "again"), ("five", None)])

    assert after_one >= 1 and prepared() == after_one
    stored = ToolResult.objects.filter(thread=thread).exclude(key__startswith="warm-")
    assert {row.key: row.result for row in stored} == {
        "one": {"n": 1}, "two": 2, "three": [3], "four": {"n": 4}, "five": None,
    }  # fmt: skip


def test_adding_results_counts_the_new_keys_and_keeps_the_first_result_of_known_ones(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    put_tool_result(thread=thread, key="w:1", result={"v": 1}, tool="write")

    added = add_tool_results(thread=thread, tool="write", results=[("w:1", {"v": 99}), ("w:2", b"x".hex())])

    assert added == 1
    assert {row.key: row.result for row in ToolResult.objects.filter(thread=thread)} == {"w:1": {"v": 1}, "w:2": "78"}
    with pytest.raises(InvalidState, match="result"):
        add_tool_results(thread=thread, results=[("w:3", {"a": float("inf")})])
    assert not ToolResult.objects.filter(thread=thread, key="w:3").exists()


@pytest.mark.django_db(transaction=True)
def test_a_put_into_a_thread_deleted_meanwhile_is_not_found(agent: Agent) -> None:
    thread, _ = storage.create_thread(agent=agent)
    storage.delete_thread(thread)  # by another request, after this one read the thread

    with pytest.raises(NotFound):
        put_tool_result(thread=thread, key="late", result={"n": 1})

    assert not ToolResult.objects.filter(thread_id=thread.pk).exists()
