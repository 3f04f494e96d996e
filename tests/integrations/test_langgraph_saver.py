"""A compiled LangGraph graph checkpointing into Quicksave: history, deltas and time travel."""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.types import INTERRUPT
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from checkpoints import store
from checkpoints.langgraph_saver import TYPED, WRITE_TOOL, QuicksaveSaver
from checkpoints.models import Branch, Checkpoint, PayloadKind, Thread, ToolResult
from tests.conftest import message

pytestmark = pytest.mark.django_db(transaction=True)


class ChatState(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def respond(state: ChatState) -> dict[str, Any]:
    return {"messages": [message(len(state["messages"]))]}


def chat_graph(saver: QuicksaveSaver) -> Any:
    builder = StateGraph(ChatState)
    builder.add_node("respond", respond)
    builder.add_edge(START, "respond")
    builder.add_edge("respond", END)
    return builder.compile(checkpointer=saver)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def quicksave_thread(thread_id: str) -> Thread:
    return Thread.objects.get(agent__name="langgraph", external_id=thread_id)


def test_graph_state_and_history_come_from_quicksave() -> None:
    graph = chat_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-1"}}
    for turn in range(5):
        graph.invoke({"messages": [user(f"turn {turn}")]}, config)

    state = graph.get_state(config)
    assert len(state.values["messages"]) == 10
    assert state.values["messages"][-2] == user("turn 4")

    history = list(graph.get_state_history(config))
    thread = quicksave_thread("chat-1")
    rows = list(Checkpoint.objects.filter(thread=thread).order_by("seq"))
    # Each invoke writes an input checkpoint, the loop's first step and the step after `respond`.
    assert len(history) == len(rows) == 15
    assert history[0].config["configurable"]["checkpoint_id"] == state.config["configurable"]["checkpoint_id"]
    assert [h.config["configurable"]["checkpoint_id"] for h in history] == [r.metadata["lg_id"] for r in rows][::-1]
    assert [len(h.values.get("messages", [])) for h in history][:3] == [10, 9, 8]


def test_a_growing_message_list_is_stored_as_deltas() -> None:
    graph = chat_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-deltas"}}
    for turn in range(20):
        graph.invoke({"messages": [user(f"turn {turn}")]}, config)

    rows = list(Checkpoint.objects.filter(thread=quicksave_thread("chat-deltas")).order_by("seq"))
    deltas = [row for row in rows if row.kind == PayloadKind.DELTA]
    assert len(rows) == 60
    assert rows[0].kind == PayloadKind.SNAPSHOT
    assert len(deltas) > len(rows) / 2
    # A delta holds the change (at most the new message), never the 40-message list.
    one_message = len(json.dumps(message(0)))
    assert max(len(bytes(row.payload)) for row in deltas) < 2 * one_message
    stored = sum(len(bytes(row.payload)) for row in rows)
    assert stored < sum(row.state_bytes for row in rows) / 10


def test_update_state_on_an_old_checkpoint_forks_a_quicksave_branch() -> None:
    graph = chat_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-fork"}}
    for turn in range(3):
        graph.invoke({"messages": [user(f"turn {turn}")]}, config)
    # Rewind to the second turn, just before `respond` answered it.
    old = next(h for h in graph.get_state_history(config) if h.next == ("respond",) and len(h.values["messages"]) == 3)
    old_id = old.config["configurable"]["checkpoint_id"]

    forked_config = graph.update_state(old.config, {"messages": [user("a different question")]})
    graph.invoke(None, forked_config)

    thread = quicksave_thread("chat-fork")
    fork = Branch.objects.get(thread=thread, fork_point__isnull=False)
    assert fork.fork_point is not None
    assert fork.fork_point.metadata["lg_id"] == old_id
    forked = list(Checkpoint.objects.filter(branch=fork).order_by("seq"))
    assert [row.metadata["lg_metadata"]["source"] for row in forked] == ["update", "loop"]
    assert forked[0].metadata["lg_parent"] == old_id

    state = graph.get_state(config)
    assert state.config["configurable"]["checkpoint_id"] == forked[-1].metadata["lg_id"]
    assert state.values["messages"] == [user("turn 0"), message(1), user("turn 1"), user("a different question"),
                                        message(4)]  # fmt: skip
    history = list(graph.get_state_history(config))
    assert [h.config["configurable"]["checkpoint_id"] for h in history[:2]] == [r.metadata["lg_id"] for r in forked][
        ::-1
    ]
    assert len(history) == Checkpoint.objects.filter(thread=thread).count() == 9 + 2
    # The main branch is untouched: its head is still the third turn's answer.
    main_head = Checkpoint.objects.filter(thread=thread, branch__name="main").order_by("-seq").first()
    assert main_head is not None
    at_main_head: RunnableConfig = {
        "configurable": {**config["configurable"], "checkpoint_id": main_head.metadata["lg_id"]}
    }
    assert graph.get_state(at_main_head).values["messages"][-1] == message(5)


class MessagesState(TypedDict):
    messages: Annotated[list[Any], add_messages]


def test_langchain_messages_round_trip_through_typed_envelopes() -> None:
    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"answer {len(state['messages'])}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    graph: Any = builder.compile(checkpointer=QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-messages"}}
    for turn in range(3):
        graph.invoke(MessagesState(messages=[HumanMessage(content=f"question {turn}")]), config)

    messages = graph.get_state(config).values["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage] * 3
    assert messages[-1].content == "answer 5"
    # Each message is its own typed envelope inside a plain list, so a step appends one.
    rows = list(Checkpoint.objects.filter(thread=quicksave_thread("chat-messages")).order_by("seq"))
    appended = [op for row in rows if row.kind == PayloadKind.DELTA for op in store.decode_payload(row)
                if op["path"] == "/channel_values/messages/-"]  # fmt: skip
    assert appended and all(TYPED in op["value"] for op in appended)


def approval_graph(saver: QuicksaveSaver) -> Any:
    def book(state: ChatState) -> dict[str, Any]:
        decision = interrupt({"action": "book_flight", "args": {"to": "Lisbon"}})
        return {"messages": [{"role": "tool", "content": f"booking {decision}"}]}

    builder = StateGraph(ChatState)
    builder.add_node("book", book)
    builder.add_edge(START, "book")
    builder.add_edge("book", END)
    return builder.compile(checkpointer=saver)


def test_an_interrupt_is_kept_as_a_pending_write_and_resumes() -> None:
    graph = approval_graph(QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-interrupt"}}

    result = graph.invoke({"messages": [user("book me a flight")]}, config)

    assert [i.value for i in result["__interrupt__"]] == [{"action": "book_flight", "args": {"to": "Lisbon"}}]
    waiting = graph.get_state(config)
    assert waiting.next == ("book",)
    assert [i.value["action"] for task in waiting.tasks for i in task.interrupts] == ["book_flight"]
    thread = quicksave_thread("chat-interrupt")
    writes = ToolResult.objects.filter(thread=thread, tool__startswith=f"{WRITE_TOOL}:")
    channels = {write.result["channel"] for write in writes}
    assert INTERRUPT in channels

    # A fresh saver (another process, say) sees the same interrupt and resumes the graph.
    resumed = approval_graph(QuicksaveSaver()).invoke(Command(resume="approved"), config)

    assert resumed["messages"][-1] == {"role": "tool", "content": "booking approved"}
    assert graph.get_state(config).next == ()


def test_a_subgraph_checkpoints_into_its_own_namespace_thread() -> None:
    inner = approval_graph(QuicksaveSaver()).builder.compile()
    builder = StateGraph(ChatState)
    builder.add_node("inner", inner)
    builder.add_edge(START, "inner")
    builder.add_edge("inner", END)
    graph: Any = builder.compile(checkpointer=QuicksaveSaver())
    config: RunnableConfig = {"configurable": {"thread_id": "chat-subgraph"}}

    graph.invoke({"messages": [user("book me a flight")]}, config)

    namespaces = Thread.objects.filter(metadata__langgraph__thread_id="chat-subgraph").exclude(
        external_id="chat-subgraph"
    )
    assert [(t.external_id or "").startswith("chat-subgraph#inner:") for t in namespaces] == [True]
    state = graph.get_state(config, subgraphs=True)
    sub_state = state.tasks[0].state
    assert sub_state.config["configurable"]["checkpoint_ns"].startswith("inner:")
    assert sub_state.next == ("book",)

    resumed = graph.invoke(Command(resume="approved"), config)

    assert resumed["messages"][-1] == {"role": "tool", "content": "booking approved"}
    # Deleting the LangGraph thread removes every namespace of it.
    graph.checkpointer.delete_thread("chat-subgraph")
    assert not Thread.objects.filter(metadata__langgraph__thread_id="chat-subgraph").exists()
