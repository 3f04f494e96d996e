"""The tool-result cache: puts keep the first result per key, alone or several at once."""

from __future__ import annotations

import pytest

from agents.models import Agent
from checkpoints import store
from checkpoints.errors import InvalidState
from checkpoints.models import ToolResult
from checkpoints.tools import get_tool_result, put_tool_result, put_tool_results

pytestmark = pytest.mark.django_db


def test_a_batch_put_stores_new_keys_and_keeps_the_first_result_of_known_ones(agent: Agent) -> None:
    thread, _ = store.create_thread(agent=agent)
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


def test_a_batch_with_one_bad_result_writes_none_of_them(agent: Agent) -> None:
    thread, _ = store.create_thread(agent=agent)

    with pytest.raises(InvalidState, match="result"):
        put_tool_results(thread=thread, results=[("ok", {"a": 1}), ("bad", {"a": float("nan")})])

    assert not ToolResult.objects.filter(thread=thread).exists()
