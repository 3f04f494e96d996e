"""Threads whose channel versions are strings, as LangGraph's own savers (InMemorySaver,
PostgresSaver) write them, go on running once moved into QuicksaveSaver."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from integrations.langgraph.saver import QuicksaveSaver

pytestmark = pytest.mark.django_db(transaction=True)


class Trip(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    decision: str


def trip_graph(saver: BaseCheckpointSaver[Any]) -> Any:
    """plan -> approve (interrupts) -> book."""

    def plan(state: Trip) -> Trip:
        return {"log": ["planned"]}

    def approve(state: Trip) -> Trip:
        return {"decision": interrupt("book it?"), "log": ["asked"]}

    def book(state: Trip) -> Trip:
        return {"log": [f"booked: {state['decision']}"]}

    builder: Any = StateGraph(Trip)
    builder.add_node("plan", plan)
    builder.add_node("approve", approve)
    builder.add_node("book", book)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "approve")
    builder.add_edge("approve", "book")
    builder.add_edge("book", END)
    return builder.compile(checkpointer=saver)


def copy_thread_between(source: BaseCheckpointSaver[Any], target: BaseCheckpointSaver[Any], thread_id: str) -> None:
    """Put every checkpoint and pending write of a thread into another saver, oldest first, as
    a migration between savers does."""
    for found in reversed(list(source.list({"configurable": {"thread_id": thread_id}}))):
        parent = found.parent_config["configurable"]["checkpoint_id"] if found.parent_config else None
        config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_id": parent}}
        checkpoint = found.checkpoint
        written = target.put(config, checkpoint, found.metadata, checkpoint["channel_versions"])
        for task_id, channel, value in found.pending_writes or []:
            target.put_writes(written, [(channel, value)], task_id)


def interrupted_on_langgraphs_saver(thread_id: str) -> QuicksaveSaver:
    """A thread run on InMemorySaver up to its interrupt, then moved into a QuicksaveSaver."""
    memory = InMemorySaver()
    trip_graph(memory).invoke({"log": []}, {"configurable": {"thread_id": thread_id}})
    head = memory.get_tuple({"configurable": {"thread_id": thread_id}})
    assert head is not None and head.checkpoint["channel_versions"]
    assert all(type(version) is str for version in head.checkpoint["channel_versions"].values())
    saver = QuicksaveSaver()
    copy_thread_between(memory, saver, thread_id)
    return saver


def test_a_thread_with_string_versions_resumes_on_quicksave() -> None:
    saver = interrupted_on_langgraphs_saver("moved-resume")
    graph = trip_graph(saver)
    config: RunnableConfig = {"configurable": {"thread_id": "moved-resume"}}
    assert graph.get_state(config).next == ("approve",)

    result = graph.invoke(Command(resume="yes"), config)

    assert result["log"] == ["planned", "asked", "booked: yes"]
    assert graph.get_state(config).next == ()
    # The new versions keep the string form, so LangGraph can still compare them with the old ones.
    head = saver.get_tuple(config)
    assert head is not None
    assert all(type(version) is str for version in head.checkpoint["channel_versions"].values())


def test_a_thread_with_string_versions_takes_update_state_on_quicksave() -> None:
    saver = interrupted_on_langgraphs_saver("moved-update")
    graph = trip_graph(saver)
    config: RunnableConfig = {"configurable": {"thread_id": "moved-update"}}

    graph.update_state(config, {"log": ["edited by hand"]})
    result = graph.invoke(Command(resume="no"), config)

    assert result["log"] == ["planned", "edited by hand", "asked", "booked: no"]


def test_next_versions_follow_the_form_of_the_current_one() -> None:
    saver = QuicksaveSaver()

    assert saver.get_next_version(None, None) == 1
    assert saver.get_next_version(41, None) == 42
    after = saver.get_next_version("00000000000000000000000000000002.0.2437", None)
    assert isinstance(after, str) and after.split(".")[0] == f"{3:032}"
    assert after > "00000000000000000000000000000002.0.2437"
